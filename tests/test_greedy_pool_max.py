"""Greedy at a pool's max_instances: it buys one job at a time, the cheapest per item, so the pool's last instance
could be a type too small for the work that comes after. Where the pool's max alone keeps a job out, greedy swaps the
small instance it bought for a larger type of the pool that holds both (greedy._place_upgrading; fleet140's greedy
plan, tests/test_open_findings.py, had kept t3's critical job waiting beside a g5.xlarge)."""

from __future__ import annotations

import pytest

from tests.fleetkit import job, plan_for, pool, tenant, topology

A10G = {"gpus": 1, "gpu_type": "A10G", "cpu": 4, "mem": 16}


@pytest.mark.parametrize("hi", [1, 2])
def test_greedy_swaps_its_small_instance_for_a_larger_one_where_the_pool_max_keeps_work_out(tmp_path, hi):
    """Pool p (g5.xlarge: 1 A10G; g5.12xlarge: 4) allows `hi` instances; 1 + hi new 1-GPU jobs. Greedy (--time-limit
    0) bought a g5.xlarge for each job until the pool was full, and the last job waited "pools at max_instances"; it
    swaps the last g5.xlarge for a g5.12xlarge now, and every job runs."""
    jobs = [job(f"j{k}", "t", priority="critical" if k == 0 else "low", **A10G) for k in range(hi + 1)]
    plan = plan_for(tmp_path, [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], hi=hi),
                               *jobs], time_limit=0)
    assert {j.job: j.action for j in plan.jobs} == {f"j{k}": "place" for k in range(hi + 1)}, plan.jobs
    assert sorted(c.site.instance_type for c in plan.creates) == sorted(["g5.xlarge"] * (hi - 1) + ["g5.12xlarge"])
