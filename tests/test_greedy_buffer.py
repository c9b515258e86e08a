"""Greedy and the on-demand buffer (SpotPolicy.on_demand_buffer_percent): the idle room on the on-demand instances it
buys for work is idle on-demand capacity the buffer counts, during the pass as in the finished plan and the next plan
(where they are hosts kept). Counted only at the end of the pass, it was not there for a spot-required job ranked
after the work that left it: greedy found no pool room to buy idle on-demand capacity beside the job's spot instance
and left it pending, and the plan right after the apply placed it (the lifecycle machine, greedy alone, seed 99):
the fleet did not converge."""

from __future__ import annotations

import pytest

from reconciler import api
from reconciler.greedy import greedy
from reconciler.load import load
from reconciler.problem import build_problem
from tests.fleetkit import assert_converges, catalog_observed, doc, job, pool, tenant, topology, write_config

A100 = dict(gpu_type="A100", cpu=8, mem=60)  # per GPU: an a2-highgpu-1g holds one, an a2-highgpu-4g four


def docs(a100_max: int = 3, gang: int = 3) -> list[dict]:
    """The lifecycle machine's case: a 3 x 2-GPU gang (two on-demand a2-highgpu-4g hold it, 2 GPUs idle), a 1-GPU
    spot-required A100 job, and a 1-GPU A10G job, all low, under a 50% spot share and a 25% buffer; the A10G pool holds
    one instance."""
    return [topology("life"), tenant("t1"),
            pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], market="either", hi=1),
            pool("a100", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-4g"],
                 market="either", hi=a100_max),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5, "on_demand_buffer_percent": 25}),
            job("j3", tenant="t1", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=gang, gang="zone", priority="low", spot="eligible"),
            job("j2", tenant="t1", gpus=1, **A100, priority="low", spot="required"),
            job("j1", tenant="t1", gpus=1, gpu_type="A10G", cpu=4, mem=16, priority="low", spot="eligible")]


@pytest.mark.parametrize("time_limit", [0, 10])  # greedy's plan (the fallback), CP-SAT's
def test_the_spot_job_is_placed_beside_the_idle_room_of_on_demand_bought_for_work(tmp_path, time_limit):
    plan = api.plan(write_config(tmp_path / "c", docs()), time_limit=time_limit).plan
    where = {j.job: (j.action, j.reason) for j in plan.jobs}
    assert {j: a for j, (a, _) in where.items()} == {"j1": "place", "j2": "place", "j3": "place"}, where


def test_greedy_alone_converges_beside_the_buffer(tmp_path):
    """Plan and apply with greedy alone, then plan again, nothing changed: a no-op."""
    assert_converges(write_config(tmp_path / "c", docs()), time_limit=0)


def test_a_spot_job_the_buffer_keeps_waiting_says_so(tmp_path):
    """A 2 x 2-GPU gang fills its a2-highgpu-4g, and the A100 pool at most 2 has no room for idle on-demand capacity
    beside the spot job's instance, nor the A10G pool beside j1's: greedy leaves the spot job pending and names the
    rule that refused it (Assignment.refused), the on-demand buffer its plan's ledger names too, not () ("nothing it
    fits had room", which it said before). (CP-SAT places it, by buying a g5.12xlarge for j1, whose 3 idle GPUs are the
    buffer: greedy does not weigh a dearer instance for work ranked first for the room it leaves later work.)"""
    cfg = write_config(tmp_path / "c", docs(a100_max=2, gang=2))
    desired = load(cfg)
    problem = build_problem(desired, catalog_observed(desired))
    a = greedy(problem)
    assert {d.key.split(":")[1]: a.placed[d.key] for d in problem.demands} == {"j1": 1, "j2": 0, "j3": 1}
    (j2,) = [d.key for d in problem.demands if d.jobs == ("j2",)]
    assert a.refused == {j2: ("spot-buffer",)}
    plan = api.plan(cfg, time_limit=0).plan
    (pending,) = [j for j in plan.jobs if j.action == "pending"]
    assert pending.job == "j2" and pending.reason.startswith("on-demand buffer"), pending.reason
