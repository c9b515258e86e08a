"""The spot share and the on-demand buffer, one definition: the solver's rows, load's bound on what pool minimums cost
(load._least_cost) and the ledger's checks (greedy, apply's re-check, explain) accept the same fleets, exactly at
max_spot_fraction / on_demand_buffer_percent, and refuse one unit past (the rows had rounded the share to the per mille
and the buffer to 1/700 % in the solver, 1/1000 % in load)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from reconciler.errors import ConfigError
from reconciler.ledger import buffer_ok, buffer_row, share_row, spot_share_ok
from reconciler.load import load
from tests.fleetkit import doc, job, pool, tenant, topology, write_config
from tests.test_solve_families import admits, model_of, new_items, offer

A100_1G = {"gpus": 1, "gpu_type": "A100", "cpu": 4, "mem": 16}
SPOT_1G, OD_1G = 1.80385, 3.67339  # gcp a2-highgpu-1g in us-central1, $/h


@pytest.mark.parametrize("fraction", [0.5, 0.25, 0.0625, 0.3334, 0.123457, 0.999999, 0.001])
def test_the_share_row_accepts_exactly_what_spot_share_ok_accepts(fraction):
    scale, coef = share_row(fraction)
    assert Fraction(coef, scale) == Fraction(repr(fraction))
    for total in range(1, 80):
        for spot in range(total + 1):
            assert (scale * spot <= coef * total) == spot_share_ok(spot, total, fraction), (spot, total)


@pytest.mark.parametrize("percent", [10, 12.5, 3.125, 1.5625, 33.3333, 0.0001, 100])
def test_the_buffer_row_accepts_exactly_what_buffer_ok_accepts_counting_mig_slices(percent):
    """Idle capacity in MIG compute slices (sevenths of a GPU), as the solver counts what MIG items take of it."""
    scale, coef = buffer_row(percent)
    assert scale % 70000 == 0 and Fraction(coef, scale) == Fraction(repr(float(percent))) / 100
    for spot in range(1, 70):
        for slices in range(7 * 8):
            assert (scale // 7 * slices >= coef * spot) == buffer_ok(slices / 7, spot, percent), (slices, spot)


def test_the_rows_of_configs_with_three_decimals_are_the_ones_the_solver_had():
    """Digests: a share with at most 3 decimals and a buffer with at most 2 keep their x1000 and x70000 rows."""
    assert share_row(0.5) == (1000, 500) and share_row(0.15) == (1000, 150)
    assert buffer_row(10) == (70000, 7000) and buffer_row(12.34) == (70000, 8638)


def _share_docs(fraction: float) -> list[dict]:
    return [topology(), tenant("t"), doc("SpotPolicy", "sp", {"max_spot_fraction": fraction}),
            pool("od", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=16),
            pool("spot", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="spot", hi=16),
            *[job(f"j{i}", **A100_1G) for i in range(16)]]


def test_the_solver_holds_the_spot_share_exactly_at_a_fraction_with_four_decimals(tmp_path):
    """max_spot_fraction 0.0625: 1 spot GPU of 16 is exactly at it, of 15 past it. The row (x1000, 62 per mille) had
    refused the first, which spot_share_ok (greedy, apply's re-check) accepts."""
    model = model_of(tmp_path / "at", _share_docs(0.0625), ("fleet",))
    od, spot = model.use[offer(model, market="on-demand").key], model.use[offer(model, market="spot").key]
    assert spot_share_ok(1, 16, 0.0625) and admits(model, [(od, 15), (spot, 1)])
    assert not spot_share_ok(1, 15, 0.0625) and not admits(model, [(od, 14), (spot, 1)])
    model = model_of(tmp_path / "past", _share_docs(0.0624), ("fleet",))
    od, spot = model.use[offer(model, market="on-demand").key], model.use[offer(model, market="spot").key]
    assert not spot_share_ok(1, 16, 0.0624) and not admits(model, [(od, 15), (spot, 1)])


def _mig_buffer_docs(percent: float) -> list[dict]:
    """An on-demand MIG p4d (56 slices of 1g.5gb) beside four spot p4d (32 GPUs) under a buffer of `percent`."""
    mig = pool("od-mig", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1)
    mig["spec"]["mig"] = ["1g.5gb"] * 7
    sliced = [job(n, gpu_type="A100", replicas=r, pools=["od-mig"]) for n, r in (("a", 7), ("b", 1))]
    for j, count in zip(sliced, (7, 1)):
        j["spec"]["resources"]["mig"] = {"profile": "1g.5gb", "count": count}
    return [topology(), tenant("t"), doc("SpotPolicy", "sp", {"on_demand_buffer_percent": percent}), mig,
            pool("spot", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], market="spot", hi=4),
            job("w", gpus=8, gpu_type="A100", cpu=8, mem=64, replicas=4, pools=["spot"]), *sliced]


def test_the_solver_holds_the_buffer_exactly_counting_mig_slices(tmp_path):
    """on_demand_buffer_percent 3.125 of 32 spot GPUs asks 1 idle GPU: the on-demand p4d with 49 of its 56 slices used
    keeps it exactly, with 50 it does not. The row (x70000, 3.125% read as 2188/700) had refused the first."""
    model = model_of(tmp_path / "at", _mig_buffer_docs(3.125), ("fleet",))
    od, spot = offer(model, market="on-demand"), offer(model, market="spot")
    a, b = new_items(model, "a", od.key), new_items(model, "b", od.key)
    fixed = [(model.use[od.key], 1), (model.use[spot.key], 4), (a, 7)]
    assert buffer_ok(8 - 49 / 7, 32, 3.125) and admits(model, [*fixed, (b, 0)])
    assert not buffer_ok(8 - 50 / 7, 32, 3.125) and not admits(model, [*fixed, (b, 1)])
    model = model_of(tmp_path / "past", _mig_buffer_docs(3.1251), ("fleet",))
    od, spot = offer(model, market="on-demand"), offer(model, market="spot")
    fixed = [(model.use[od.key], 1), (model.use[spot.key], 4), (new_items(model, "a", od.key), 7)]
    assert not buffer_ok(1, 32, 3.1251) and not admits(model, [*fixed, (new_items(model, "b", od.key), 0)])


def _minimums_docs(spot_policy: dict, n: int, budget: float) -> list[dict]:
    """An `either` pool of n one-GPU instances at min_instances n, under a budget only spot among them keeps."""
    return [topology(), tenant("t"), doc("SpotPolicy", "sp", spot_policy),
            pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="either", lo=n, hi=n),
            doc("GuardrailPolicy", "g", {"max_hourly_budget": budget})]


def test_load_accepts_pool_minimums_exactly_at_the_spot_share_and_refuses_them_past_it(tmp_path):
    """16 minimums at a budget of 1 spot and 15 on-demand instances: max_spot_fraction 0.0625 holds them (load had
    refused them, its row the solver's per-mille one: 62/1000); 0.0624 does not, and 16 on-demand are over the budget."""
    budget = round(SPOT_1G + 15 * OD_1G, 6)
    load(write_config(tmp_path / "at", _minimums_docs({"max_spot_fraction": 0.0625}, 16, budget)))
    with pytest.raises(ConfigError, match=r"max_hourly_budget.*max_spot_fraction 0.0624.*at least \$58\.77/h"):
        load(write_config(tmp_path / "past", _minimums_docs({"max_spot_fraction": 0.0624}, 16, budget)))


def test_load_accepts_pool_minimums_exactly_at_the_buffer_and_refuses_them_past_it(tmp_path):
    """33 minimums at a budget of 32 spot and 1 on-demand instances: a 3.125% buffer holds them, 3.1251% does not."""
    budget = round(32 * SPOT_1G + OD_1G, 6)
    load(write_config(tmp_path / "at", _minimums_docs({"on_demand_buffer_percent": 3.125}, 33, budget)))
    with pytest.raises(ConfigError, match=r"max_hourly_budget.*on_demand_buffer_percent 3.1251.*at least \$63\.27/h"):
        load(write_config(tmp_path / "past", _minimums_docs({"on_demand_buffer_percent": 3.1251}, 33, budget)))


def test_a_spot_rule_with_more_decimals_than_its_row_holds_exactly_is_refused(tmp_path):
    docs = _minimums_docs({"max_spot_fraction": 0.1234567, "on_demand_buffer_percent": 3.12345,
                           "tenant_max_spot_fraction": {"t": 0.5}}, 1, 100)
    with pytest.raises(ConfigError) as e:
        load(write_config(tmp_path, docs))
    errs = [str(d) for d in e.value.diagnostics]
    assert any("fleet.yaml:" in s and "spec.max_spot_fraction" in s and "more than 6 decimal places" in s for s in errs), errs
    assert any("spec.on_demand_buffer_percent" in s and "more than 4 decimal places" in s for s in errs), errs
