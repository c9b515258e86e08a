"""Greedy and the fleet's spot share (SpotPolicy.max_spot_fraction): on-demand capacity placed later in the pass makes
room for spot work ranked before it, and that work is asked again then. Greedy refused a spot-required job ranked
first ("spot share"), then bought on-demand capacity for the work after it, and left the job pending; the plan right
after the apply placed it (the lifecycle machine, greedy alone, seed 99): the fleet did not converge."""

from __future__ import annotations

import pytest

from reconciler.greedy import greedy
from reconciler.load import load
from reconciler.problem import build_problem
from tests.fleetkit import assert_converges, catalog_observed, doc, job, plan_for, pool, tenant, topology, write_config

A10G = dict(gpus=1, gpu_type="A10G", cpu=4, mem=16)  # one g5.xlarge each


def docs() -> list[dict]:
    """A high spot-required job and a normal on-demand one, one GPU each, under a 50% spot share: the spot job ranks
    first, and its spot instance is within the share only beside the on-demand one."""
    return [topology(), tenant("t"),
            pool("gpu", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"], market="either", hi=4),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5}),
            job("spot-job", **A10G, priority="high", spot="required"),
            job("od-job", **A10G, priority="normal", spot="never")]


@pytest.mark.parametrize("time_limit", [0, 10])  # greedy's plan (the fallback), CP-SAT's
def test_spot_work_the_share_refused_first_is_placed_beside_the_on_demand_work_placed_after_it(tmp_path, time_limit):
    plan = plan_for(tmp_path, docs(), time_limit=time_limit, workers=1)
    where = {j.job: (j.action, j.reason) for j in plan.jobs}
    assert where["spot-job"][0] == "place" and where["od-job"][0] == "place", where
    assert sorted(c.market for c in plan.creates) == ["on-demand", "spot"]


def test_greedy_alone_converges_under_the_spot_share(tmp_path):
    """Plan and apply with greedy alone, then plan again, nothing changed: a no-op."""
    assert_converges(write_config(tmp_path / "c", docs()), time_limit=0)


def test_the_room_the_on_demand_work_makes_goes_to_the_spot_job_ranked_first(tmp_path):
    """Greedy's own answer: a low spot-required job ranked after the on-demand one does not take the room the high one
    was refused (greedy gave it to the low one). The low one is placed too, beside idle on-demand capacity bought for
    the share, as CP-SAT places it (greedy bought such ballast only for an on-demand buffer before fleet111's)."""
    desired = load(write_config(tmp_path, [*docs(), job("low-spot-job", **A10G, priority="low", spot="required")]))
    problem = build_problem(desired, catalog_observed(desired))
    a = greedy(problem)
    assert {d.key.split(":")[1]: a.placed[d.key] for d in problem.demands} == {"spot-job": 1, "od-job": 1, "low-spot-job": 1}
    assert not a.refused
    assert sorted(c.market for c in problem.offers() for _ in range(a.use.get(c.key, 0))) == ["on-demand", "on-demand", "spot", "spot"]


def test_greedy_buys_a_spot_only_pools_minimum_beside_the_on_demand_capacity_the_share_asks_for(tmp_path):
    """A spot-only MIG pool at min_instances 2 (one GPU each) under max_spot_fraction 0.25, and an on-demand A10G pool
    (max 3): the two spot GPUs need six on-demand ones beside them. Greedy's plan (`--time-limit 0`) bought nothing,
    the share refusing each spot instance, and left the pool under its minimum (the h7 hunt, reduced from a random
    fleet); CP-SAT's bought a g5.12xlarge and two g5.xlarge to stand idle. Greedy buys the minimum's spot instances
    together with that ballast now (`_Greedy._open_with_ballast`): the same five instances, $8.57/h."""
    mig = pool("az-mig", "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"], market="spot", lo=2, hi=3)
    mig["spec"]["mig"] = ["4g.40gb", "3g.40gb"]
    plan = plan_for(tmp_path, [topology(), tenant("t1"), mig, pool("aws-a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], hi=3),
                               doc("SpotPolicy", "sp", {"max_spot_fraction": 0.25})], time_limit=0)
    assert sorted((c.pool, c.instance_type, c.market) for c in plan.creates) == [
        ("aws-a10g", "g5.12xlarge", "on-demand"), ("aws-a10g", "g5.xlarge", "on-demand"), ("aws-a10g", "g5.xlarge", "on-demand"),
        ("az-mig", "Standard_NC24ads_A100_v4", "spot"), ("az-mig", "Standard_NC24ads_A100_v4", "spot")], plan.creates
    assert plan.cost_after == pytest.approx(8.5729), plan.cost_after


def test_greedy_keeps_a_spot_only_pools_idle_host_for_its_minimum_and_spot_diversity(tmp_path):
    """A spot-only MIG pool at min_instances 1 runs an idle spot A100 (i0), a CPU pool an idle spot n2 (i2); the SpotPolicy
    asks min_instance_types 2, which the two keep. Greedy's plan deleted both (it opens no idle spot host while it
    restrains spot) and left the pool under its minimum (the h7 hunt, reduced from a random fleet); with the minimum
    bought beside its ballast, it bought an A100 again in i0's place and broke diversity. It keeps both now, as CP-SAT."""
    from dataclasses import replace

    from tests.fleetkit import instance

    mig = pool("az-mig", "azure", "eastus", ["eastus-1", "eastus-2"], ["Standard_NC24ads_A100_v4"], market="spot", lo=1, hi=1)
    mig["spec"]["mig"] = ["3g.40gb", "2g.20gb", "2g.20gb"]
    i0 = instance("i0", "az-mig", "azure", "eastus", "eastus-2", "Standard_NC24ads_A100_v4", "spot")
    insts = [replace(i0, tags={**i0.tags, "fleetops.io/mig": "3g.40gb-2g.20gb-2g.20gb"}),
             instance("i2", "gcp-cpu", "gcp", "us-central1", "us-central1-a", "n2-standard-16", "spot")]
    plan = plan_for(tmp_path, [topology(), tenant("t1"), mig,
                               pool("gcp-cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="either", hi=2),
                               doc("SpotPolicy", "sp", {"min_instance_types": 2})], insts, time_limit=0)
    assert not plan.creates and not plan.deletes, (plan.creates, plan.deletes)


def test_greedy_buys_a_spot_only_pools_minimum_with_the_spot_diversity_asks_beside_it(tmp_path):
    """A spot-only n2 pool (one zone) at min_instances 1 under min_zones 2, beside an `either` m6i pool in another
    cloud's zone: greedy's plan bought nothing (one spot zone breaks diversity) and left the pool under its minimum (the
    h7 hunt); it buys the n2 and a spot m6i beside it now, $0.53/h as CP-SAT's."""
    plan = plan_for(tmp_path, [topology(), tenant("t1"),
                               pool("gcp-cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="spot", lo=1, hi=2),
                               pool("aws-cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], market="either", hi=2),
                               doc("SpotPolicy", "sp", {"min_zones": 2})], time_limit=0)
    assert sorted((c.pool, c.instance_type, c.market) for c in plan.creates) == [
        ("aws-cpu", "m6i.4xlarge", "spot"), ("gcp-cpu", "n2-standard-16", "spot")], plan.creates


def _kept_fleet(insts: list, *extra: dict) -> tuple[list[dict], list]:
    """A GPU fleet under max_spot_fraction 0.5 and a 25% on-demand buffer, consolidation WhenEmpty: t2's spot-required job
    on a spot A100 (a2) and on-demand A10Gs; as it runs, the fleet keeps every rule. Its kept fleet, before settle_spot
    keeps the idle on-demand A10Gs, reads the share and the buffer broken."""
    from tests.fleetkit import instance

    docs = [topology(), tenant("t2"), tenant("t3"),
            pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"], market="either", hi=4),
            pool("a100", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="either", hi=3),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5, "on_demand_buffer_percent": 25}),
            doc("PlacementPolicy", "pp", {"consolidation": "WhenEmpty"}),
            job("gpu-spot", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60, spot="required"), *extra]
    where = {"a2": ("a100", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "spot"),
             "g5": ("a10g", "aws", "us-east-1", "us-east-1a", "g5.xlarge", "on-demand"),
             "g5b": ("a10g", "aws", "us-east-1", "us-east-1a", "g5.xlarge", "on-demand"),
             "g5s": ("a10g", "aws", "us-east-1", "us-east-1a", "g5.xlarge", "spot"),
             "n2": ("cpu-spot", "gcp", "us-central1", "us-central1-a", "n2-standard-16", "spot"),
             "m6i": ("cpu", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge", "on-demand")}
    return docs, [instance(i, *where[i]) for i in ["a2", *insts]]


def _assert_kept(tmp_path, docs, insts, placements, gpu_indices):
    for time_limit in (0, 5):  # greedy's plan (the fallback), CP-SAT's
        plan = plan_for(tmp_path / str(time_limit), docs, insts, {"gpu-spot": ["a2"], **placements},
                        gpu_indices={"gpu-spot": [[0]], **gpu_indices}, time_limit=time_limit)
        assert not plan.has_changes, (time_limit, [(j.job, j.action, j.instances, j.reason) for j in plan.jobs], plan.deletes)


def test_greedy_moves_no_cpu_work_off_spot_where_no_rule_the_fleet_breaks_licenses_it(tmp_path):
    """fleet146 reduced by hand: beside the A100s, an idle on-demand A10G, t3's critical spot-eligible 12-vCPU job on a
    spot n2-standard-16 and t2's 4-vCPU job on an on-demand m6i.4xlarge with 12 vCPU free. Greedy's pass moving spot
    work moved the critical job onto the m6i and deleted the n2, "the plan cannot name the rule or saving that moves it"
    (a CPU host counts 0 GPUs in the share: the move mended nothing even of the kept fleet); the plan right after an
    apply that had kept it. Greedy keeps it now, as CP-SAT."""
    docs, insts = _kept_fleet(["g5", "n2", "m6i"],
                              job("cpu-crit", "t3", cpu=12, mem=48, priority="critical", spot="eligible"),
                              job("cpu-od", "t2", cpu=4, mem=16, priority="low", spot="never"))
    docs[3:3] = [pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=1),
                 pool("cpu-spot", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="spot", hi=3)]
    _assert_kept(tmp_path, docs, insts, {"cpu-crit": ["n2"], "cpu-od": ["m6i"]}, {})


def test_greedy_moves_no_gpu_work_off_spot_where_no_rule_the_fleet_breaks_licenses_it(tmp_path):
    """The same with a GPU job: t3's critical spot-eligible A10G job on a spot g5.xlarge beside two idle on-demand ones
    (the fleet 2 of 4 GPUs spot, 2 idle on-demand: both rules hold). Greedy's pass moved it onto an idle on-demand
    A10G and deleted its spot host, a saving consolidation WhenEmpty does not allow and no broken rule licenses."""
    docs, insts = _kept_fleet(["g5", "g5b", "g5s"],
                              job("a10-crit", "t3", gpus=1, gpu_type="A10G", cpu=4, mem=16, priority="critical", spot="eligible"))
    _assert_kept(tmp_path, docs, insts, {"a10-crit": ["g5s"]}, {"a10-crit": [[0]]})
