"""The new instances' packing the solver's repair stage makes is handed to the plan with its answer
(`Solution.packed`), and the plan rebuilds the bins of each part of it whose inputs are the answer's
instead of packing it again: the same bins, to the last free unit and GPU index, and the same plan byte
for byte; a part whose inputs differ (another answer, the repaired offers) or whose packing bought
instances the fleet's rules must allow is packed again."""

from __future__ import annotations

from dataclasses import replace

import bench.generate as gen
from reconciler import api
from reconciler.plan import make_plan
from reconciler.plan.packing import _parts, capacities_of, offer_packing, pack
from reconciler.plan.assign import assign_items
from reconciler.runtime.publish import demanding
from tests.fleetkit import job, pool, tenant, topology, write_config


def _bins(packing) -> list:
    """Every bin's whole state, in the packing's order, as plain data."""
    return [(key, b.cap.key, b.ref, dict(b.free), list(b.gpus_used), list(b.items), b.group, dict(b.gpu_of), b.touched,
             b.touched_before) for key, bins in packing.bins_of.items() for b in bins]


def _packed_both_ways(res):
    """pack() of the result's answer with its hand-off, and without it (packing again)."""
    problem, solution, observed = res.problem, res.solution, res.observed
    caps = capacities_of(problem, solution)
    hosts = {c.key: c for c in problem.hosts()}
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    out = []
    for sol in (solution, replace(solution, packed=None)):
        assigned = assign_items(problem, observed, sol, caps)
        out.append(pack(res.desired.fleet, problem, observed, sol, caps, hosts, demand_of, assigned))
    return out


def _plans_both_ways(res):
    demand = demanding(res.desired, res.observed)
    return [make_plan(demand, res.observed, res.problem, sol).to_json()
            for sol in (res.solution, replace(res.solution, packed=None))]


def _reused(res, solution=None) -> tuple[int, int]:
    """(parts the hand-off gives, parts) of the result's answer (or `solution`)."""
    sol = solution or res.solution
    caps = capacities_of(res.problem, sol)
    parts = _parts(sol, caps, assign_items(res.problem, res.observed, sol, caps).to_offer)
    return sum(1 for keys, inputs in parts.items() if sol.packed.same(keys, inputs)), len(parts)


def test_the_handed_packing_is_the_packing_made_again(tmp_path):
    cfg = gen.generate(tmp_path / "f", 200, 3)  # (no repair: the answer packed is the plan's)
    res = api.plan(cfg, time_limit=2)
    handed = res.solution.packed
    reused, parts = _reused(res)
    assert reused == parts > 20
    again = offer_packing(res.problem, res.solution)  # plain data: the same packing of the same answer
    assert (again.parts, again.instances) == (handed.parts, handed.instances)
    used, fresh = _packed_both_ways(res)
    assert sum(len(bins) for bins in used.bins_of.values()) > 80
    assert _bins(used) == _bins(fresh) and used.unpacked == fresh.unpacked == set()
    assert (used.gpu_of, used.where, used.repairs, used.pool_count) == (fresh.gpu_of, fresh.where, fresh.repairs, fresh.pool_count)
    # rebuilt afresh each time: a later phase's change to one plan's bins is not another's
    used.bins_of[next(iter(handed.instances))][0].free["cpu"] = -1.0
    assert _bins(_packed_both_ways(res)[0]) == _bins(fresh)
    with_it, without = _plans_both_ways(res)
    assert with_it == without == res.plan.to_json()


def test_a_repaired_answer_takes_the_parts_its_repair_left_alone(tmp_path):
    """The repair stage modelled the offers whose counts did not pack instance by instance: their parts are
    packed again (their packing bought instances, and their slots are new); the others are handed on."""
    res = api.plan(gen.generate(tmp_path / "f", 300, 2), time_limit=2)
    assert res.solution.slots  # (the repaired answer)
    reused, parts = _reused(res)
    assert 0 < reused < parts
    used, fresh = _packed_both_ways(res)
    assert _bins(used) == _bins(fresh) and used.unpacked == fresh.unpacked
    with_it, without = _plans_both_ways(res)
    assert with_it == without == res.plan.to_json()


def test_a_gangs_placement_group_is_named_for_the_fleet(tmp_path):
    p = pool("a100", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=6)
    docs = [topology("pg-fleet", clouds={"aws": {"us-east-1": ["us-east-1a", "us-east-1b"]}}), tenant("t"), p,
            job("pretrain", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=3, gang="placement-group"),
            job("small", gpus=1, gpu_type="A100", cpu=8, mem=64)]
    res = api.plan(write_config(tmp_path / "cfg", docs), time_limit=5)
    assert _reused(res)[0] == _reused(res)[1] > 0
    used, fresh = _packed_both_ways(res)
    groups = {b.group for bins in used.bins_of.values() for b in bins} - {None}
    assert len(groups) == 1 and next(iter(groups)).startswith("pg-fleet-pretrain-")
    assert _bins(used) == _bins(fresh)
    with_it, without = _plans_both_ways(res)
    assert with_it == without


def test_a_part_that_is_not_this_answers_is_packed_again(tmp_path):
    res = api.plan(gen.generate(tmp_path / "f", 120, 3), time_limit=2)
    reused, parts = _reused(res)
    assert reused == parts
    ok = next(k for k in res.solution.new if k not in res.solution.slots)
    other = replace(res.solution, new={**res.solution.new, ok: res.solution.new[ok] + 1})  # another answer, the same hand-off
    assert _reused(res, other) == (parts - 1, parts)
    caps = capacities_of(res.problem, other)
    hosts = {c.key: c for c in res.problem.hosts()}
    demand_of = {j: d for d in res.problem.demands for j in d.jobs}
    got = [_bins(pack(res.desired.fleet, res.problem, res.observed, s, caps, hosts, demand_of,
                      assign_items(res.problem, res.observed, s, caps))) for s in (other, replace(other, packed=None))]
    assert got[0] == got[1]
    assert len([b for b in got[0] if b[0] == ok]) == res.solution.new[ok] + 1
