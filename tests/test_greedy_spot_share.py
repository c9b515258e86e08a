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
