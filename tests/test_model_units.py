"""The CP-SAT model counts vCPU and GiB in thousandths (solve/variables.scale). A request with more decimals counts up to
the next thousandth and a quota or an instance's capacity down (solve/variables.units, room), so the model never admits
what the ledger (quota_ok, exact floats: greedy, apply's re-check, explain) refuses. Rounding a request to the nearest
thousandth had counted 0.0625 GiB as 0.062: ten such jobs fit a 0.62 GiB quota in the model, the plan carried all ten
(0.625 GiB) with status OPTIMAL, and apply's re-check refused it."""

from __future__ import annotations

import pytest

from reconciler.ledger import quota_ok
from reconciler.solve.variables import room, units
from tests.fleetkit import job, plan_for, pool, tenant, topology
from tests.test_solve_families import admits, demand, model_of, new_items, offer


@pytest.mark.parametrize(("amount", "dim", "counted"), [
    (0.0625, "memory_gib", 63), (0.001, "cpu", 1), (0.1, "cpu", 100), (1.1, "cpu", 1100), (3.2, "memory_gib", 3200),
    (0.0015, "cpu", 2), (999_999.999, "memory_gib", 999_999_999), (8, "gpus", 8)])
def test_a_request_counts_up_to_the_next_whole_unit_and_a_written_thousandth_as_itself(amount, dim, counted):
    assert units(amount, dim) == counted


@pytest.mark.parametrize(("limit", "dim", "counted"), [
    (62.4, "memory_gib", 62400), (0.62, "memory_gib", 620), (0.0625, "cpu", 62), (16, "memory_gib", 16000), (2.5, "gpus", 2),
    (0.3 - 0.1, "cpu", 200)])
def test_a_limit_counts_down_to_a_whole_unit_and_a_written_thousandth_as_itself(limit, dim, counted):
    assert room(limit, dim) == counted


def _quota_docs(quota_gib: float, ask_gib: float, jobs: int = 10) -> list[dict]:
    return [topology(), tenant("t", memory_gib=quota_gib, cpu=1),
            pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], hi=3),
            *[job(f"j{i}", cpu=0.001, mem=ask_gib) for i in range(jobs)]]


@pytest.mark.parametrize(("quota_gib", "ask_gib", "most"), [(1.25, 0.125, 10), (1.249, 0.125, 9), (0.62, 0.0625, 9),
                                                          (0.6249, 0.0625, 9), (0.625, 0.0625, 9)])
def test_the_quota_row_never_admits_a_job_quota_ok_refuses(tmp_path, quota_gib, ask_gib, most):
    """Exact thousandths exactly as quota_ok (10 x 0.125 GiB at a 1.25 GiB quota, not at 1.249); four decimals never past
    it, and at most one job short of it: 0.0625 counts as 0.063, so 10 x 0.0625 at exactly 0.625 GiB, which quota_ok
    admits, is one job past the model's row (stricter, never more lenient)."""
    assert quota_ok(most * ask_gib, 0.0, quota_gib)
    model = model_of(tmp_path, _quota_docs(quota_gib, ask_gib, most + 1), ("tenants",))
    placed = model.placed[demand(model, "j0").key]
    assert admits(model, [(placed, most)])
    assert not admits(model, [(placed, most + 1)])
    assert quota_ok((most + 1) * ask_gib, 0.0, quota_gib) == (quota_gib == 0.625)


def test_the_plan_keeps_a_quota_of_requests_with_four_decimals(tmp_path):
    """Ten jobs of 0.0625 GiB under a 0.62 GiB quota: nine fit (0.5625 GiB), the tenth would be 0.625. plan_for checks
    every rule on the plan (tests/invariants.py), the tenant's quota among them."""
    plan = plan_for(tmp_path, _quota_docs(0.62, 0.0625), workers=1)
    assert sum(1 for j in plan.jobs if j.action == "place") == 9


def test_the_capacity_row_holds_an_instance_to_what_it_has_for_requests_with_four_decimals(tmp_path):
    """An m6i.xlarge has 16 GiB: 256 jobs of 0.0625 GiB fill it, 257 do not fit, and the row had admitted 257 (257 x 0.062
    = 15.934 GiB). Counted as 0.063 GiB, 253 fit the row (15.939 GiB), 254 do not."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], hi=3),
            *[job(f"j{i}", cpu=0.001, mem=0.0625) for i in range(257)]]
    model = model_of(tmp_path, docs, ("capacity",))
    xl = offer(model, instance_type="m6i.xlarge")
    new, items = model.use[xl.key], new_items(model, "j0", xl.key)
    assert admits(model, [(new, 1), (items, 253)])
    assert not admits(model, [(new, 1), (items, 254)])
    assert not admits(model, [(new, 1), (items, 257)])


def test_the_packers_exact_passes_count_as_the_model_does():
    """pack's exact passes (the re-pack of leftovers, the pattern rows patterns.py reads) count in the model's units
    (reconciler.units), so what the model holds on an instance they pack: jobs asking 2.007 and 13.993 vCPU fill a
    16-vCPU instance in both. (Their own ceil, with no tolerance, counted 2.007 as 2008: the pair did not fit there.)"""
    from dataclasses import replace

    from reconciler.pack import _needs, _room
    from tests.test_plan_tenant_spot import cpu_job

    dims, need = _needs([replace(cpu_job("a"), cpu=2.007), replace(cpu_job("b"), cpu=13.993)])
    assert [n["cpu"] for n in need] == [units(2.007, "cpu"), units(13.993, "cpu")] == [2007, 13993]
    assert sum(n["cpu"] for n in need) <= _room(16, "cpu") == room(16, "cpu")
