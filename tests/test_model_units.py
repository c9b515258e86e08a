"""The CP-SAT model's vCPU and GiB rows count in integer units per row (reconciler.units.scale): thousandths, or finer
where a request has more decimals, so a row admits exactly what the ledger (quota_ok, has_room: greedy, apply's
re-check, explain) admits. Rounding a request to the nearest thousandth had counted 0.0625 GiB as 0.062 (ten such jobs
fit a 0.62 GiB quota in the model, apply's re-check refused the plan); counting it up to 0.063 refused the tenth job
under a quota of exactly 0.625 GiB that the ledger admits (the plan's bound claimed nine was the most)."""

from __future__ import annotations

import pytest

from reconciler.ledger import quota_ok
from reconciler.problem.rules import has_room
from reconciler.solve.variables import room, scale, units
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


@pytest.mark.parametrize(("quota_gib", "ask_gib", "most"), [
    (1.25, 0.125, 10), (1.249, 0.125, 9), (0.62, 0.0625, 9), (0.6249, 0.0625, 9), (0.625, 0.0625, 10),
    (0.6875, 0.0625, 11), (0.9999, 0.3333, 3), (0.9998, 0.3333, 2), (0.999999, 0.333333, 3), (0.999998, 0.333333, 2)])
def test_the_quota_row_admits_exactly_what_quota_ok_admits(tmp_path, quota_gib, ask_gib, most):
    """Exact for the decimals written (to 6): 10 x 0.0625 GiB at a 0.625 GiB quota, 3 x 0.3333 at 0.9999, as quota_ok
    (greedy, apply's re-check, explain) admits them, and one more job refused. Counted up to the thousandth (0.0625 as
    0.063) the row had refused the tenth job quota_ok admits, and the plan said OPTIMAL without it."""
    assert quota_ok(most * ask_gib, 0.0, quota_gib) and not quota_ok((most + 1) * ask_gib, 0.0, quota_gib)
    model = model_of(tmp_path, _quota_docs(quota_gib, ask_gib, most + 1), ("tenants",))
    placed = model.placed[demand(model, "j0").key]
    assert admits(model, [(placed, most)])
    assert not admits(model, [(placed, most + 1)])


def test_the_plan_keeps_a_quota_of_requests_with_four_decimals(tmp_path):
    """Ten jobs of 0.0625 GiB under a 0.62 GiB quota: nine fit (0.5625 GiB), the tenth would be 0.625. plan_for checks
    every rule on the plan (tests/invariants.py), the tenant's quota among them."""
    plan = plan_for(tmp_path, _quota_docs(0.62, 0.0625), workers=1)
    assert sum(1 for j in plan.jobs if j.action == "place") == 9


def test_an_optimal_plan_places_every_job_a_quota_exactly_at_their_sum_admits(tmp_path):
    """Ten jobs of 0.0625 GiB under a quota of exactly 0.625 GiB: all ten are lawful (quota_ok), and a plan that says
    OPTIMAL places all ten (it had placed nine and said OPTIMAL: a false claim)."""
    plan = plan_for(tmp_path, _quota_docs(0.625, 0.0625), workers=1)
    assert plan.solver.status == "OPTIMAL"
    assert sum(1 for j in plan.jobs if j.action == "place") == 10


def _capacity_model(tmp_path, jobs: int, cpu: float, mem: float):
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], hi=3),
            *[job(f"j{i}", cpu=cpu, mem=mem) for i in range(jobs)]]
    model = model_of(tmp_path, docs, ("capacity",))
    xl = offer(model, instance_type="m6i.xlarge")
    return model, model.use[xl.key], new_items(model, "j0", xl.key)


def test_the_capacity_row_holds_an_instance_to_exactly_what_it_has_for_requests_with_four_decimals(tmp_path):
    """An m6i.xlarge has 16 GiB: 256 jobs of 0.0625 GiB fill it exactly, 257 do not fit. Counted as 0.063 GiB the row had
    held 253 (15.939 GiB); rounded to 0.062 it had admitted 257."""
    model, new, items = _capacity_model(tmp_path, 257, 0.001, 0.0625)
    assert admits(model, [(new, 1), (items, 256)])
    assert not admits(model, [(new, 1), (items, 257)])


@pytest.mark.parametrize(("cpu", "most"), [(1.3333, 3), (1.3334, 2), (1.333333, 3), (1.333334, 2)])
def test_the_capacity_row_holds_vcpu_with_six_decimals_exactly(tmp_path, cpu, most):
    """An m6i.xlarge has 4 vCPU: three jobs of 1.3333 (3.9999) fit, as has_room says; of 1.3334 (4.0002) two."""
    model, new, items = _capacity_model(tmp_path, 3, cpu, 0.001)
    assert has_room({"cpu": 4.0 - (most - 1) * cpu}, {"cpu": cpu})
    assert not has_room({"cpu": 4.0 - most * cpu}, {"cpu": cpu})
    assert admits(model, [(new, 1), (items, most)])
    assert most == 3 or not admits(model, [(new, 1), (items, most + 1)])


def test_the_packers_exact_passes_count_as_the_model_does():
    """pack's exact passes (the re-pack of leftovers, the pattern rows patterns.py reads) count in the model's units
    (reconciler.units), so what the model holds on an instance they pack: jobs asking 2.007 and 13.993 vCPU fill a
    16-vCPU instance in both. (Their own ceil, with no tolerance, counted 2.007 as 2008: the pair did not fit there.)"""
    from dataclasses import replace

    from reconciler.pack import _needs, _room
    from tests.test_plan_tenant_spot import cpu_job

    dims, need, per = _needs([replace(cpu_job("a"), cpu=2.007), replace(cpu_job("b"), cpu=13.993)])
    assert per["cpu"] == scale("cpu", [2.007, 13.993]) == 1000
    assert [n["cpu"] for n in need] == [units(2.007, "cpu"), units(13.993, "cpu")] == [2007, 13993]
    assert sum(n["cpu"] for n in need) <= _room(16, "cpu", per) == room(16, "cpu")


def test_the_packers_patterns_fill_an_instance_exactly_with_requests_of_four_decimals():
    """256 items of 0.0625 GiB fill a 16 GiB instance in the pattern passes too (pack._patterns, and the pattern rows
    solve/patterns.py builds from them), as the model's capacity row admits them: counted as 0.063 they held 253."""
    from dataclasses import replace

    from reconciler.pack import _needs, _patterns, _room
    from tests.test_plan_tenant_spot import cpu_job

    dims, need, per = _needs([replace(cpu_job("a"), cpu=0.001, memory_gib=0.0625)])
    patterns = _patterns({k: _room({"cpu": 4, "memory_gib": 16}[k], k, per) for k in dims}, need, [300])
    assert max(p[0] for p in patterns) == 256


def test_a_row_counts_in_the_units_its_requests_need():
    """Thousandths where every request has at most three decimals (the rows such configs had), else the least finer
    unit that makes each request whole (0.0625 GiB: 2000ths; 100 MiB, 25/256 GiB: 32000ths), so long as the largest request's
    coefficient stays within 10**9: a request that would pass it counts up, as in thousandths (stricter, never more
    lenient)."""
    assert scale("cpu", [0.5, 1.25, 2.125]) == 1000 and scale("gpus", [0.0625]) == 1
    assert scale("memory_gib", [0.0625, 16]) == 2000 and scale("cpu", [0.333333]) == 10**6
    assert scale("memory_gib", [100 / 1024, 2.5]) == 32_000
    assert scale("memory_gib", [0.1234567, 500]) == 1000 and units(0.1234567, "memory_gib", 1000) == 124
    assert room(0.3 - 0.1, "cpu", 10**6) == 200_000 and units(1.1, "cpu") == 1100


def test_load_refuses_an_amount_no_row_holds_exactly_naming_file_line_and_field(tmp_path):
    """vCPU and GiB with at most six decimals, or whole MiB (100 MiB: 0.09765625 GiB), load; 0.1234567 vCPU or a quota of
    0.62500001 GiB, which the ledger's tolerance would read differently from a row, are refused where they are written."""
    from reconciler.errors import ConfigError
    from reconciler.load import load
    from tests.fleetkit import write_config

    ok = [topology(), tenant("t", memory_gib=0.625, cpu=1.000001), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], hi=3),
          job("a", cpu=0.333333, mem=100 / 1024)]
    load(write_config(tmp_path / "ok", ok))
    bad = [topology(), tenant("t", memory_gib=0.62500001), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], hi=3),
           job("a", cpu=0.1234567, mem=1)]
    with pytest.raises(ConfigError) as e:
        load(write_config(tmp_path / "bad", bad))
    errs = [str(d) for d in e.value.diagnostics]
    assert any(".yaml:" in s and "quota.memory_gib" in s and "more than 6 decimal places" in s for s in errs), errs
    assert any(".yaml:" in s and "resources.cpu" in s and "more than 6 decimal places" in s for s in errs), errs


def test_whole_mib_count_exactly():
    """memory_mib / 1024 (the openb trace's pods: 30,517 MiB is 29.8017578125 GiB, ten decimals) is read as written,
    not rounded to nine decimals: load admits it and a row counts it whole."""
    from reconciler.units import written_exactly

    assert written_exactly(30517 / 1024) and scale("memory_gib", [30517 / 1024]) == 128_000
    assert units(30517 / 1024, "memory_gib", 128_000) == 30517 * 125
