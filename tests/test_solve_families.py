"""Each constraint family of the CP-SAT model alone (reconciler/solve/model.py builds a model
with only the families asked for): a tiny fleet, some values fixed, and the family must admit
what the rules allow and refuse what they do not. A family's rows are checked by CP-SAT's
feasibility answer on the model with those values fixed, not by reading the rows back."""

from __future__ import annotations

from reconciler.cpsat import cp_model

from bench.trace import MIXES
from reconciler.load import load
from reconciler.problem import build_problem
from reconciler.solve.model import FAMILIES, Model
from reconciler.solve.variables import is_variable
from tests.fleetkit import catalog_observed, doc, instance, job, pool, tenant, topology, write_config

A100_1G = {"gpus": 1, "gpu_type": "A100", "cpu": 4, "mem": 16}


def model_of(tmp_path, docs, families, instances=(), placements=None) -> Model:
    desired = load(write_config(tmp_path, docs))
    return Model(build_problem(desired, catalog_observed(desired, list(instances), placements)), families=families)


def admits(model: Model, fixed: list[tuple[object, int]]) -> bool:
    """Whether the model has a solution with each variable at its value (the rest free)."""
    sub = model.m.clone()
    for v, n in fixed:
        assert is_variable(v), "fix variables only: a frozen value is not the model's to decide"
        dom = sub.proto.variables[v.index].domain
        assert len(dom) == 2 and dom[0] <= n <= dom[1], f"{v} = {n} is outside its domain {list(dom)}: the test would not test the family"
        dom[0], dom[1] = n, n
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.max_time_in_seconds = 20.0
    st = s.solve(sub)
    assert st in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE), s.status_name(st)
    return st != cp_model.INFEASIBLE


def demand(model: Model, job_name: str):
    return next(d for d in model.p.demands if job_name in d.jobs)


def new_items(model: Model, job_name: str, cap_key: str):
    gk = model.group_of[demand(model, job_name).key]
    return model.x[(gk, cap_key)]


def offer(model: Model, **attrs):
    return next(o for o in model.offers if all(getattr(o, k) == v for k, v in attrs.items()))


def test_families_are_the_models_whole_rule_set():
    assert FAMILIES == ("capacity", "patterns", "slots", "items", "gangs", "tenants", "licenses", "quotas", "fleet", "moves")


def test_capacity_counts_gpus_per_instance_and_its_cut_refuses_what_the_count_allows_but_cannot_pack(tmp_path):
    """Two 6-GPU jobs and a 4-GPU job on 8-GPU p4d instances: 16 GPUs of items fit the count of two
    instances, but no packing puts them on two (6+4 > 8); the Fekete-Schepers cut refuses it."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3)]
    docs += [job(f"six{i}", gpus=6, gpu_type="A100") for i in range(2)] + [job("four", gpus=4, gpu_type="A100")]
    model = model_of(tmp_path, docs, ("capacity",))
    p4d = offer(model, instance_type="p4d.24xlarge")
    new, six, four = model.use[p4d.key], new_items(model, "six0", p4d.key), new_items(model, "four", p4d.key)
    assert admits(model, [(new, 2), (six, 2), (four, 0)])
    assert admits(model, [(new, 3), (six, 2), (four, 1)])
    assert not admits(model, [(new, 2), (six, 2), (four, 1)])  # 6+6+4 = 16 GPUs, yet no packing onto two
    assert not admits(model, [(new, 1), (six, 2), (four, 0)])  # 12 GPUs on one 8-GPU instance
    # Without the family nothing bounds the items by the instances bought.
    assert admits(model_of(tmp_path / "none", docs, ()), [(new, 1), (six, 2), (four, 1)])


def whole_and_lean_docs(lo: int = 0) -> list[dict]:
    """Two p4d slots (8 GPUs, 96 vCPU each) for an 8-GPU, 80-vCPU job and eight 1-GPU, 14-vCPU jobs: 16 GPUs and
    192 vCPU, which the sums per dimension of two instances allow, but the big job takes one instance whole and the
    eight need 112 vCPU of the other's 96 (at most 6 of them fit beside nothing else)."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=lo, hi=2),
            job("big", gpus=8, gpu_type="A100", cpu=80, mem=300)]
    return docs + [job(f"f{k}", gpus=1, gpu_type="A100", cpu=14, mem=60) for k in range(8)]


def test_patterns_refuse_on_a_large_fixed_pool_what_its_sums_allow_but_no_packing_holds(tmp_path):
    """The same jobs on a fixed pool of 130 p4d (min = max, past the 128 modelled one by one, so summed): two instances
    allow the big job and eight lean ones per dimension in sum (16 GPUs, 192 vCPU), but no two instances hold them;
    the pattern rows (one pattern per instance: a count per shape within every dimension) refuse it, and allow the big
    job with six lean ones, or all on three."""
    docs = whole_and_lean_docs()
    docs[2] = pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=130, hi=130)
    model = model_of(tmp_path, docs, ("capacity", "patterns"))
    p4d = offer(model, instance_type="p4d.24xlarge")
    assert p4d.key not in model.slots_of and p4d.key in model.pattern_vars
    new, big, lean = model.use[p4d.key], new_items(model, "big", p4d.key), new_items(model, "f0", p4d.key)
    assert not admits(model, [(new, 2), (big, 1), (lean, 8)])
    assert admits(model, [(new, 2), (big, 1), (lean, 6)])
    assert admits(model, [(new, 3), (big, 1), (lean, 8)])
    # The summed rows alone allow it.
    assert admits(model_of(tmp_path / "sums", docs, ("capacity",)), [(new, 2), (big, 1), (lean, 8)])


def test_patterns_go_on_every_large_fixed_pool_of_a_gpu_type_or_on_none(tmp_path, monkeypatch):
    """Two fixed pools of 130 p4d: pool a holds the big and lean jobs (a few patterns), pool b those and jobs of two
    more shapes pinned to it (more patterns). With room for pool a's patterns but not pool b's, neither gets pattern
    rows: exact on one pool and summed on the other, the answer moved work to the summed one, where its counts did not
    pack (trace-mixed-5k: 60 jobs unpacked, and greedy's plan, 76 GPUs fewer, was emitted)."""
    from reconciler.solve import patterns

    docs = [topology(), tenant("t"), pool("a", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=130, hi=130),
            pool("b", "aws", "us-east-1", ["us-east-1b"], ["p4d.24xlarge"], lo=130, hi=130),
            job("big", gpus=8, gpu_type="A100", cpu=80, mem=300), job("lean", gpus=1, gpu_type="A100", cpu=14, mem=60)]
    docs += [job(f"odd{c}", gpus=1, gpu_type="A100", cpu=c, mem=20, pools=["b"]) for c in (5, 7)]
    model = model_of(tmp_path / "all", docs, ("capacity", "patterns"))
    counts = {o.pool: len(model.pattern_vars[o.key][0]) for o in model.offers if o.key in model.pattern_vars}
    assert set(counts) == {"a", "b"} and counts["a"] < counts["b"], counts
    monkeypatch.setattr(patterns, "PATTERNS_MOST", counts["a"])
    assert not model_of(tmp_path / "none", docs, ("capacity", "patterns")).pattern_vars


def test_slots_give_a_small_offers_instances_a_row_each_and_refuse_what_does_not_pack(tmp_path):
    docs = whole_and_lean_docs()
    model = model_of(tmp_path, docs, ("capacity", "slots"))
    p4d = offer(model, instance_type="p4d.24xlarge")
    assert [o.key for o in model.slot_offers] == [p4d.key] and p4d.max_new == 2
    new, big, lean = model.use[p4d.key], new_items(model, "big", p4d.key), new_items(model, "f0", p4d.key)
    assert admits(model, [(new, 2), (big, 1), (lean, 6)])
    assert admits(model, [(new, 1), (big, 0), (lean, 6)])  # 6 x 14 = 84 vCPU on one
    assert not admits(model, [(new, 2), (big, 1), (lean, 7)])  # 80 + 14 > 96 on one, or 7 x 14 = 98 on the other
    assert not admits(model, [(new, 2), (big, 1), (lean, 8)])
    assert not admits(model, [(new, 1), (big, 0), (lean, 7)])
    # The aggregate rows alone (and their cuts) allow it: 16 GPUs, 192 vCPU on two instances.
    assert admits(model_of(tmp_path / "aggregate", docs, ("capacity",)), [(new, 2), (big, 1), (lean, 8)])


def test_slots_stay_within_their_variable_budget(tmp_path, monkeypatch):
    """Two slots x two groups (big, the lean ones) is 4 slot variables: within a budget of 4, not of 3."""
    from reconciler.solve import slots

    docs = whole_and_lean_docs()
    monkeypatch.setattr(slots, "SLOT_VARS", 4)
    assert len(model_of(tmp_path / "4", docs, ("slots",)).slot_offers) == 1
    monkeypatch.setattr(slots, "SLOT_VARS", 3)
    model = model_of(tmp_path / "3", docs, ("slots",))
    assert model.slot_offers == [] and not model.z and not model.on


def test_an_offers_ballast_stands_idle_beyond_its_slots(tmp_path):
    """The p4d offer of whole_and_lean_docs (pool max 5) beside one spot A10G under a 50% on-demand buffer: its
    items need 3 instances one by one (the big job one, the eight lean ones two), and it may hold the buffer's idle
    GPU too (capacity.size_offers: a fourth instance, its ballast). The ballast gets no slot of its own, so the
    model is as small as without it, and is bought only once every slot is (any plan's empty instances can be its
    last ones)."""
    docs = whole_and_lean_docs()[:2] + [pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=5),
                                        pool("s", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"], market="spot", hi=4),
                                        doc("SpotPolicy", "sp", {"max_spot_fraction": 1.0, "on_demand_buffer_percent": 50}),
                                        job("sj", gpus=1, gpu_type="A10G", cpu=2, mem=8, spot="required")] + whole_and_lean_docs()[3:]
    model = model_of(tmp_path, docs, ("capacity", "slots"))
    p4d = offer(model, instance_type="p4d.24xlarge")
    assert (p4d.max_new, p4d.ballast, model.slots_of[p4d.key]) == (4, 1, 3)
    new, big, lean = model.use[p4d.key], new_items(model, "big", p4d.key), new_items(model, "f0", p4d.key)
    last = model.on[(p4d.key, 2)]
    assert admits(model, [(new, 4), (big, 1), (lean, 8)])  # the fourth stands idle
    assert admits(model, [(new, 3), (last, 1)])
    assert not admits(model, [(new, 3), (last, 0)])  # a ballast instance before the last slot
    assert not admits(model, [(new, 4), (last, 0)])


def test_slots_the_solver_places_only_what_packs_and_the_packer_follows_it(tmp_path):
    """Solved whole on a fixed pool of the two: the answer places the big job and six of the eight (98 work units
    against 56 for the eight alone), every instance as the model packed it: no repair, nothing unpacked."""
    from reconciler.solve import solve
    from tests.fleetkit import plan_for

    docs = whole_and_lean_docs(lo=2)
    model = model_of(tmp_path / "m", docs, ())
    sol = solve(model.p, time_limit=5, workers=1)
    lean = demand(model, "f0").key
    assert sol.placed[demand(model, "big").key] == 1 and sol.placed[lean] == 6
    (ok, insts), = sol.slots.items()
    assert len(insts) == 2 and sorted(sum(n for *_, n in cells) for cells in insts) == [1, 6]
    plan = plan_for(tmp_path / "p", docs, time_limit=5, workers=1)
    assert plan.solver.repairs == 0 and plan.solver.unpacked == 0
    assert sum(j.action != "pending" for j in plan.jobs) == 7, plan.jobs


def test_slots_hold_one_placement_group_each(tmp_path):
    """Two placement-group gangs of 2 x 4 GPUs on two p4d slots: each gang's pair shares one instance, never one of
    each gang per instance (an instance launches into one placement group)."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=2)]
    docs += [job(g, gpus=4, gpu_type="A100", cpu=40, mem=300, replicas=2, gang="placement-group") for g in ("ga", "gb")]
    model = model_of(tmp_path, docs, ("slots",))
    p4d = offer(model, instance_type="p4d.24xlarge")
    ga, gb = (model.group_of[demand(model, g).key] for g in ("ga", "gb"))
    z = {(g, i): model.z[(g, p4d.key, p4d.key, i)] for g in (ga, gb) for i in (0, 1)}
    assert admits(model, [(z[(ga, 0)], 2), (z[(gb, 1)], 2), (z[(ga, 1)], 0), (z[(gb, 0)], 0)])
    assert not admits(model, [(z[(ga, 0)], 1), (z[(gb, 0)], 1)])


def two_dimension_docs() -> list[dict]:
    """Eight 12-vCPU jobs, eight 40-GiB ones and four of 4 vCPU and 4 GiB on m6i.4xlarge (16 vCPU, 64 GiB), up to 40
    instances (more than SLOTS_MOST: summed per offer). Eight instances hold them in sum and in each dimension alone
    (12+4 vCPU on four, 12+2+2 on the others), but in two each takes one 12-vCPU job and one 40-GiB job at most
    (12+12 vCPU, 40+40 GiB do not fit), which leaves 2 vCPU: the 4-vCPU ones need a ninth."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=40)]
    docs += [job(f"a{i}", cpu=12, mem=8) for i in range(8)] + [job(f"c{i}", cpu=2, mem=40) for i in range(8)]
    return docs + [job(f"e{i}", cpu=4, mem=4) for i in range(4)]


def test_extended_slots_refuse_a_count_that_packs_per_dimension_but_not_in_two(tmp_path):
    from reconciler.solve import slots

    model = model_of(tmp_path, two_dimension_docs(), ("capacity", "slots"))
    m6i = offer(model, instance_type="m6i.4xlarge")
    assert m6i.max_new > slots.SLOTS_MOST and model.slot_offers == []

    def everything_on(n: int, e: int = 4) -> list:
        return [(model.use[m6i.key], n), (new_items(model, "a0", m6i.key), 8), (new_items(model, "c0", m6i.key), 8),
                (new_items(model, "e0", m6i.key), e)]

    assert admits(model, everything_on(8))  # the aggregate rows and their cuts allow it
    assert slots.extend_slots(model, {m6i.key: 9}) == [m6i] and len(model.on) == 9
    assert not admits(model, everything_on(8))
    assert admits(model, everything_on(9))
    assert not admits(model, everything_on(10, e=0))  # the slots bound the count: 9 of 40 here
    # Slots for only the x an answer put there (`held`): the others' items are 0 on that offer.
    other = model_of(tmp_path / "held", two_dimension_docs(), ("capacity", "slots"))
    held = {(other.group_of[demand(other, j).key], m6i.key) for j in ("a0", "c0")}
    assert slots.extend_slots(other, {m6i.key: 9}, held) == [m6i]
    assert admits(other, [(new_items(other, "a0", m6i.key), 8), (new_items(other, "e0", m6i.key), 0)])
    assert not admits(other, [(new_items(other, "e0", m6i.key), 1)])


def test_the_repair_stage_packs_what_the_counts_summed_per_offer_did_not(tmp_path, monkeypatch):
    """The solver buys the 8 instances the sums allow; the packer then needed a ninth (a repair). The repair stage
    models that offer instance by instance and packs its items there: the same 20 jobs placed at the same tiers, on
    9 instances with no repair, at no more than the repaired plan's $/h."""
    from reconciler.solve import strategy
    from tests.fleetkit import plan_for

    docs = two_dimension_docs()
    plan = plan_for(tmp_path / "p", docs, time_limit=5, workers=1)
    assert plan.solver.repairs == 0 and plan.solver.unpacked == 0 and len(plan.creates) == 9
    monkeypatch.setattr(strategy, "repair_stage", lambda search, sol, hint, lb, reports: (sol, hint))
    before = plan_for(tmp_path / "before", docs, time_limit=5, workers=1)
    assert before.solver.repairs == 1 and len(before.creates) == 9 and before.solver.status == "FEASIBLE"
    assert [t["value"] for t in plan.solver.tiers] == [t["value"] for t in before.solver.tiers]
    assert sum(j.action == "place" for j in plan.jobs) == 20 == sum(j.action == "place" for j in before.jobs)
    assert plan.cost_after <= before.cost_after
    assert plan.solver.status == "FEASIBLE" and plan.solver.gap > 0  # the LP's bound is 8 instances: not proven


def test_the_repair_stage_packs_within_the_count_where_the_packers_instances_break_a_rule(tmp_path, monkeypatch):
    """With a fleet budget for 8 instances the packer's ninth is refused: the repair stage finds its packing breaks
    the budget (no answer from `repack`). Before, it kept the solver's answer, whose 4 small jobs the packer then left
    unpacked (pending: the plan claimed work it did not place); now the answer is searched again on the 8 instances
    modelled one by one (`within_limits`), from the plan it gave, so what it places packs: 18 jobs, not 16, nothing
    unpacked, no tier claimed that the plan does not reach, nothing over the budget bought."""
    from reconciler.solve import strategy
    from tests.fleetkit import plan_for

    seen = []
    repack = strategy.repack
    monkeypatch.setattr(strategy, "repack", lambda *a: seen.append(repack(*a)) or seen[-1])
    docs = two_dimension_docs() + [doc("GuardrailPolicy", "g", {"max_hourly_budget": 6.2})]  # 8 x $0.768/h = $6.14/h
    plan = plan_for(tmp_path / "p", docs, time_limit=5, workers=1)
    assert seen == [None]
    assert len(plan.creates) == 8 and plan.solver.repairs == 0 and plan.solver.unpacked == 0
    placed = sum(j.action == "place" for j in plan.jobs)
    assert placed > 16 and plan.cost_after <= 6.2 and plan.solver.note == "" and plan.solver.status == "FEASIBLE"  # (18)


# Job mixes other than the trace's (bench/README.md, fifteenth session): (GPUs, vCPU, GiB) -> weight, drawn by
# bench.trace.jobs. 1-GPU jobs at 20-24 vCPU strand GPUs of 12-vCPU-a-GPU nodes; 10 and 16 vCPU a GPU do not tile.
# (bench/trace.py's job mixes: shape (gpus, vcpu, mem_gib) -> weight)
CPU_HEAVY, TEN_AND_SIXTEEN, MEMORY_HEAVY = (MIXES[k] for k in ("cpu-heavy", "10-and-16-vcpu", "memory-heavy"))


def _gpus_by_class(res) -> dict[int, int]:
    klass = {j: d.klass for d in res.problem.demands for j in d.jobs}
    out: dict[int, int] = {}
    for j in res.plan.jobs:
        if j.action in ("keep", "place", "move"):
            out[klass[j.job]] = out.get(klass[j.job], 0) + sum(len(g) for g in j.gpus)
    return out


def _mix(tmp_path, monkeypatch, trace: dict, mode: str, seed: int):
    import bench.trace

    monkeypatch.setattr(bench.trace, "TRACE", trace)
    return bench.trace.generate(tmp_path / "cfg", 1000, seed, mode)


def test_a_mixed_clusters_answer_searched_again_keeps_the_high_and_normal_work_an_exact_packing_places(tmp_path, monkeypatch):
    """1,000 CPU-heavy jobs on the trace cluster's fixed 8/4/2/1-GPU pools: the answer's counts on the 8-GPU pool do
    not pack, and the repair stage searches the answer again around their packing (`within_limits`). It left out the
    group's last demands' jobs, whatever their class (a group is one shape of every class), and a goal's search already
    at its best could hand over another answer that lost the goals after it: 736 normal GPUs, where an exact packing by
    class (computed outside the project) places 748. Now the lowest class's jobs are left out and the start is kept
    where a goal's search does no better: 352 high and 748 normal GPUs, every one."""
    from reconciler import api

    res = api.plan(_mix(tmp_path, monkeypatch, CPU_HEAVY, "mixed", 1), time_limit=20)
    assert _gpus_by_class(res) == {2: 352, 1: 748}, _gpus_by_class(res)


def test_a_fixed_pools_answer_searched_again_ranks_above_greedys_plan(tmp_path, monkeypatch):
    """1,000 jobs at 10 and 16 vCPU a GPU on one fixed pool of 215 8-GPU nodes (past the 128 modelled one by one): the
    repair stage's search around the answer's packing, from a start that kept all the high and normal work, returned
    an answer its first goal's search had handed over with less of the rest, below greedy's plan, which was emitted.
    Now the start stands where no goal does better: CP-SAT's plan, every high and normal GPU greedy's places and more
    low work."""
    from reconciler import api
    from reconciler.solve import patterns

    monkeypatch.setattr(patterns, "PATTERNS_MOST", 0)  # (the repair stage's case: the pool's rows summed, not by pattern)
    cfg = _mix(tmp_path, monkeypatch, TEN_AND_SIXTEEN, "fixed", 2)
    res = api.plan(cfg, time_limit=20)
    greedy = api.plan(cfg, time_limit=0)
    ours, theirs = _gpus_by_class(res), _gpus_by_class(greedy)
    assert res.plan.solver.status == "FEASIBLE" and not res.plan.solver.unpacked, res.plan.solver.note
    assert ours[2] == theirs[2] and ours[1] == theirs[1] and ours[0] > theirs[0], (ours, theirs)


def test_a_fixed_pools_count_holds_the_most_by_class_an_exact_packing_places(tmp_path, monkeypatch):
    """1,000 jobs at 120-150 GiB a GPU on one fixed pool of 274 a2-highgpu-8g (85 GiB a GPU; past the 128 nodes
    modelled one by one): the answer's counts, summed over the pool, do not pack, and the repair stage searched again
    from the packer's first 274 instances, which held 20 normal GPUs fewer than an exact packing by class (computed
    outside the project: 511 high, 1,269 normal, 72 low). Greedy's plan ranked higher and was emitted: 511 and 1,249,
    no low. Now the start is the most by class the 274 instances hold (`most_within`): the exact optimum's counts."""
    from reconciler import api
    from reconciler.solve import patterns

    monkeypatch.setattr(patterns, "PATTERNS_MOST", 0)  # (the repair stage's case: the pool's rows summed, not by pattern)
    res = api.plan(_mix(tmp_path, monkeypatch, MEMORY_HEAVY, "fixed", 1), time_limit=20)
    assert res.plan.solver.status == "FEASIBLE" and not res.plan.solver.unpacked, res.plan.solver.note
    assert _gpus_by_class(res) == {2: 511, 1: 1269, 0: 72}, _gpus_by_class(res)


def test_fixed_pools_past_the_slots_counted_by_pattern_reach_the_exact_optimum_and_prove_it(tmp_path, monkeypatch):
    """With the pattern rows, the model's counts on a large fixed pool are what packs: 1,000 memory-heavy jobs on 274
    a2-highgpu-8g, and 1,000 Philly-like jobs at 10 and 16 vCPU a GPU on the trace cluster's mixed node sizes (166
    8-GPU nodes summed), place what an exact packing by class places (computed outside the project), every tier
    proven, no repair, gap 0. Before them the repair stage's answers were FEASIBLE, the second 1,646 GPUs of 1,672."""
    from reconciler import api

    for trace, mode, exact in ((MEMORY_HEAVY, "fixed", {2: 511, 1: 1269, 0: 72}), (TEN_AND_SIXTEEN, "mixed", {2: 392, 1: 959, 0: 321})):
        res = api.plan(_mix(tmp_path / mode, monkeypatch, trace, mode, 1), time_limit=20)
        s = res.plan.solver
        assert (s.status, s.gap, s.unpacked, s.repairs, s.unproven) == ("OPTIMAL", 0.0, 0, 0, []), (s.status, s.gap, s.note)
        assert _gpus_by_class(res) == exact, _gpus_by_class(res)


# vCPU of 80 one-GPU jobs drawn from bench/trace.py's shapes (seed 36), in job-name order (the packer's order follows it).
TRACE_CPU = [12, 16, 12, 8, 15, 12, 12, 12, 12, 4, 10, 19, 10, 12, 4, 12, 4, 25, 4, 12, 19, 16, 19, 12, 16, 12, 25, 12, 12, 4,
             12, 12, 25, 4, 4, 12, 19, 9, 6, 4, 12, 12, 19, 12, 12, 15, 12, 12, 12, 12, 12, 12, 4, 4, 10, 12, 12, 12, 10, 12,
             12, 12, 12, 16, 12, 12, 12, 8, 19, 12, 8, 12, 12, 12, 12, 10, 8, 12, 19, 12]


def trace_shaped_docs(cpus: list[int] = TRACE_CPU) -> list[dict]:
    """80 one-GPU jobs of 4 to 25 vCPU (TRACE_CPU: 955 in all) on p4d.24xlarge (8 GPUs, 96 vCPU), up to 40 (summed per
    offer): 10 instances hold them, with no GPU and 5 vCPU to spare; the packer's first fit and filling take 11."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=40)]
    return docs + [job(f"j{i}", gpus=1, gpu_type="A100", cpu=c, mem=1) for i, c in enumerate(cpus)]


def replanned_after_the_packers_instances(tmp_path, monkeypatch, docs: list[dict]):
    """The cold plan without `fewer_instances` and the packer's exact re-pack of its leftovers (the packer's packing, on
    11 instances, as before both), applied on the sim, and the plan of the same config after it: (the cold PlanResult,
    the next Plan)."""
    from reconciler import api, pack
    from reconciler.solve import strategy

    cfg = write_config(tmp_path / "cfg", docs)
    with monkeypatch.context() as mp:
        mp.setattr(strategy, "fewer_instances", lambda *a: None)
        mp.setattr(pack, "_repack", lambda bins, items, left: left)
        first = api.plan(cfg, time_limit=5)
    assert len(first.plan.creates) == 11
    api.apply(cfg, saved_plan=first.plan, time_limit=5)
    return first, api.plan(cfg, time_limit=5).plan


def test_the_repair_stage_finds_a_packing_on_the_count_the_model_proved(tmp_path, monkeypatch):
    """Issue 20's trace-buy-1k in small: the model proves 10 instances (its bound), the packer's packing of the 10 takes
    11. The repair stage packed the items of the 11th and of the roomiest instances again (`fewer_instances`) and
    finds a packing on 10: the plan buys 10 and says OPTIMAL, gap 0. Without that search it bought 11 and said
    FEASIBLE with its gap to the 10 (true, but a plan of 10 existed: the next plan moved jobs to give one back). (The
    packer's exact re-pack of its leftovers, before it buys a repair, finds the 10 too: both are taken out for "before".)"""
    from reconciler import pack
    from reconciler.solve import strategy
    from tests.fleetkit import plan_for

    plan = plan_for(tmp_path / "p", trace_shaped_docs(), time_limit=5, workers=1)
    assert sum(j.action == "place" for j in plan.jobs) == 80
    assert len(plan.creates) == 10 and plan.solver.repairs == 0 and plan.solver.unpacked == 0
    assert plan.solver.status == "OPTIMAL" and plan.solver.gap == 0.0
    monkeypatch.setattr(strategy, "fewer_instances", lambda *a: None)
    alone = plan_for(tmp_path / "alone", trace_shaped_docs(), time_limit=5, workers=1)  # the packer's re-pack alone
    assert sum(j.action == "place" for j in alone.jobs) == 80 and len(alone.creates) == 10 and alone.solver.repairs == 0
    monkeypatch.setattr(pack, "_repack", lambda bins, items, left: left)
    before = plan_for(tmp_path / "before", trace_shaped_docs(), time_limit=5, workers=1)
    assert sum(j.action == "place" for j in before.jobs) == 80 and len(before.creates) == 11
    assert before.solver.status == "FEASIBLE" and before.solver.gap > 0.08  # 1 instance of 11 over the bound
    assert plan.cost_after < before.cost_after


def test_a_plan_right_after_applying_the_trace_shaped_plan_changes_nothing(tmp_path):
    """Issue 18: the plan of the same config right after its apply is a no-op. (When the cold plan bought 11 instances,
    it moved 8 jobs, removed no instance and said "consolidation: a cheaper packing" at $1.16/h more.)"""
    from reconciler import api

    cfg = write_config(tmp_path / "cfg", trace_shaped_docs())
    first = api.plan(cfg, time_limit=5)
    api.apply(cfg, saved_plan=first.plan, time_limit=5)
    again = api.plan(cfg, time_limit=5)
    counts = again.plan.counts()
    assert (counts["move"], counts["create"], counts["delete"], counts["evict"], counts["keep"]) == (0, 0, 0, 0, 80)
    assert not again.plan.has_changes


def test_the_integer_bound_is_below_the_plans_exact_price(tmp_path):
    """The benchmark's bounds price instances rounded down to the milli-dollar: 10 p4d.24xlarge at $21.957642/h cost
    $219.57642/h, and at the cost objective's nearest milli-dollar ($21.958) the bound said $219.58."""
    from reconciler import api

    res = api.plan(write_config(tmp_path / "cfg", trace_shaped_docs()), time_limit=5, lp_bound=True)
    assert len(res.plan.creates) == 10
    assert res.solution.lp_bound <= res.solution.int_bound <= res.plan.cost_after < res.solution.int_bound + 0.01


def test_items_every_placed_job_has_its_items_stay_or_land_somewhere(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=4)]
    docs += [job(f"j{i}", **A100_1G) for i in range(2)]
    model = model_of(tmp_path, docs, ("items",))
    a2 = offer(model, instance_type="a2-highgpu-1g")
    placed, x = model.placed[demand(model, "j0").key], new_items(model, "j0", a2.key)
    assert admits(model, [(placed, 2), (x, 2)])
    assert admits(model, [(placed, 0), (x, 0)])
    assert not admits(model, [(placed, 2), (x, 1)])  # a placed job with nowhere to run
    assert not admits(model, [(placed, 0), (x, 1)])  # an item placed for no job


def test_gangs_keep_a_gang_whole_in_one_zone(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=4),
            job("g", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2)]
    with_gangs = model_of(tmp_path / "gangs", docs, ("items", "gangs"))
    without = model_of(tmp_path / "items", docs, ("items",))
    for model, gangs_on in ((with_gangs, True), (without, False)):
        a, b = offer(model, zone="us-east-1a"), offer(model, zone="us-east-1b")
        placed, xa, xb = model.placed[demand(model, "g").key], new_items(model, "g", a.key), new_items(model, "g", b.key)
        assert admits(model, [(placed, 1), (xa, 2), (xb, 0)])
        assert admits(model, [(placed, 1), (xa, 1), (xb, 1)]) is not gangs_on  # spans two zones: only the gang family refuses


def test_tenants_cap_everything_a_tenant_places_and_its_guarantee_the_guaranteed_part(tmp_path):
    """quota: 2 GPUs guaranteed, burst 3: three 1-GPU jobs may run, two of them inside the guarantee."""
    docs = [topology(), tenant("t", gpus=2, burst={"gpus": 3}),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=8)]
    docs += [job(f"j{i}", **A100_1G) for i in range(5)]
    model = model_of(tmp_path, docs, ("tenants",))
    dk = demand(model, "j0").key
    placed, g, b = model.placed[dk], model.g[dk], model.b[dk]
    assert admits(model, [(placed, 3), (g, 2), (b, 1)])
    assert not admits(model, [(placed, 4)])  # over the burst cap
    assert not admits(model, [(placed, 3), (g, 3), (b, 0)])  # three GPUs counted inside a 2-GPU guarantee
    assert admits(model_of(tmp_path / "none", docs, ()), [(placed, 4), (g, 3), (b, 1)])


def test_licenses_cap_the_jobs_holding_one(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=8),
            doc("License", "matlab", {"count": 2})]
    docs += [job(f"j{i}", licenses={"matlab": 1}, **A100_1G) for i in range(3)]
    model = model_of(tmp_path, docs, ("licenses",))
    placed = model.placed[demand(model, "j0").key]
    assert admits(model, [(placed, 2)])
    assert not admits(model, [(placed, 3)])


def test_fleet_rules_hold_pool_minimums_and_the_spot_share(tmp_path):
    """max_spot_fraction 0.5 over 1-GPU instances, and an on-demand pool with min_instances 1."""
    docs = [topology(), tenant("t"), doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5}),
            pool("od", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], lo=1, hi=4),
            pool("spot", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="spot", hi=4)]
    docs += [job(f"j{i}", **A100_1G) for i in range(4)]
    model = model_of(tmp_path, docs, ("fleet",))
    od, spot = model.use[offer(model, market="on-demand").key], model.use[offer(model, market="spot").key]
    assert admits(model, [(od, 1), (spot, 1)])
    assert admits(model, [(od, 2), (spot, 2)])
    assert not admits(model, [(od, 1), (spot, 2)])  # 2 of 3 GPUs on spot: over half
    assert not admits(model, [(od, 0), (spot, 0)])  # the on-demand pool's minimum
    assert admits(model_of(tmp_path / "none", docs, ()), [(od, 0), (spot, 2)])


def test_moves_under_when_empty_keep_a_running_job_where_it_runs(tmp_path):
    """j runs on i0; i1 is idle beside it. Moving j to i1 is allowed, unless consolidation is WhenEmpty."""
    base = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=4), job("j", **A100_1G)]
    insts = [instance(f"i{k}", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g") for k in range(2)]
    for when_empty in (False, True):
        docs = base + ([doc("PlacementPolicy", "pp", {"consolidation": "WhenEmpty"})] if when_empty else [])
        model = model_of(tmp_path / str(when_empty), docs, ("items", "moves"), insts, placements={"j": ("i0",)})
        d = demand(model, "j")
        (stay_key, stay), = model.stay.variable_items()
        assert stay_key[1] == next(h.key for h in model.hosts if h.instance_id == "i0")
        moved_to_i1 = new_items(model, "j", next(h.key for h in model.hosts if h.instance_id == "i1"))
        assert admits(model, [(model.krj[d.key], 1), (stay, 1)])
        assert admits(model, [(model.krj[d.key], 1), (stay, 0), (moved_to_i1, 1)]) is not when_empty


def test_a_plan_after_applying_a_packing_on_one_instance_more_gives_that_instance_back(tmp_path, monkeypatch):
    """The fleet of the trace-shaped plan on 11 instances (the cold plan without `fewer_instances`, as before it),
    applied, then planned again: a consolidation that pays back (its moves cost less than the instance they free),
    so the plan moves jobs onto 10 instances, deletes the 11th and says what it saves; every move is that
    consolidation's and the fleet after it costs what the cold plan of 10 costs."""
    from tests.fleetkit import plan_for

    _, again = replanned_after_the_packers_instances(tmp_path, monkeypatch, trace_shaped_docs())
    counts = again.counts()
    assert (counts["create"], counts["delete"], counts["evict"], counts["pending"]) == (0, 1, 0, 0)
    assert all(j.reason.startswith("consolidation") for j in again.jobs if j.action == "move")
    c = again.consolidation
    assert c.instances_removed == tuple(d.instance_id for d in again.deletes) and c.saving_per_hour > 0
    assert abs(again.cost_after - plan_for(tmp_path / "ten", trace_shaped_docs(), time_limit=5, workers=1).cost_after) < 1e-6


# Another 80 of the trace's vCPU counts (drawn with seed 17): applied on the packer's 11 instances, the re-plan's answer
# gave 3 running hosts up for 2 new ones, whose packing took a third.
TRACE_CPU_17 = [12, 4, 6, 12, 9, 19, 12, 12, 4, 8, 12, 12, 4, 25, 12, 12, 12, 25, 8, 12, 25, 12, 12, 19, 12, 25, 19, 12, 12, 12,
                4, 4, 10, 12, 12, 8, 4, 4, 12, 12, 12, 12, 12, 12, 12, 15, 12, 12, 12, 12, 12, 12, 12, 4, 12, 12, 12, 8, 12, 12,
                4, 12, 12, 16, 12, 12, 19, 8, 4, 25, 4, 12, 12, 16, 19, 10, 12, 12, 4, 19]


def test_the_repair_stage_does_not_emit_moves_that_cost_more_than_staying_put(tmp_path, monkeypatch):
    """Issue 18 (a plan after apply moves nothing it need not): the re-plan's answer, on counts, moved 5 jobs to give
    3 hosts up for 2 new ones; their packing took a 3rd (the repair stage), so the emitted plan cost $1.41/h more than
    the fleet as it runs, moved 5 jobs, deleted nothing and called it "consolidation: a cheaper packing". The answer
    that moves only what must move is now weighed against the emitted one (`strategy.stay_if_cheaper`)."""
    _, again = replanned_after_the_packers_instances(tmp_path, monkeypatch, trace_shaped_docs(TRACE_CPU_17))
    moved = [(j.job, j.reason) for j in again.jobs if j.action == "move"]
    assert not moved and not again.has_changes and again.cost_after == again.cost_before, (moved, again.consolidation)


def test_the_repair_stage_finds_the_proven_count_on_each_offer_short(tmp_path):
    """trace_shaped_docs' 80 jobs twice, on p4d pools in two regions (each job pinned to one): each offer's count is
    10, each packer's packing takes 11; `fewer_instances` packs each offer's picked instances in a search of its own,
    and the plan buys 10 of each, OPTIMAL (one search of both offers must find both within the same work)."""
    from tests.fleetkit import plan_for

    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=40),
            pool("q", "aws", "us-west-2", ["us-west-2a"], ["p4d.24xlarge"], hi=40)]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=c, mem=1, pools=["p"]) for i, c in enumerate(TRACE_CPU)]
    docs += [job(f"k{i}", gpus=1, gpu_type="A100", cpu=c, mem=1, pools=["q"]) for i, c in enumerate(TRACE_CPU)]
    plan = plan_for(tmp_path / "p", docs, time_limit=5, workers=1)
    assert sum(j.action == "place" for j in plan.jobs) == 160
    assert sorted(c.pool for c in plan.creates) == ["p"] * 10 + ["q"] * 10
    assert plan.solver.repairs == 0 and plan.solver.status == "OPTIMAL" and plan.solver.gap == 0.0


def test_the_cost_stage_gets_more_work_on_a_model_past_its_size(tmp_path, monkeypatch):
    """The cost stage's work grows with the model past COST_WORK_VARS variables (twice as many: twice the budget), and
    the wall-clock safety cap moves by WALL_FACTOR seconds for each work-second added; a model within it keeps both."""
    from reconciler.solve import strategy

    model = model_of(tmp_path, two_dimension_docs(), FAMILIES)
    n = len(model.m.proto.variables)
    for vars_, budget, deadline in ((n, 6.0, 100.0), (n // 2, 6.0 * n / (n // 2), 100.0 + 10.0 * (6.0 * n / (n // 2) - 6.0) / 0.3)):
        monkeypatch.setattr(strategy, "COST_WORK_VARS", vars_)
        search = strategy.Search(model.p, 6.0, strategy.Work(100.0), 1, 0, 0.03)
        search.model = model
        strategy.grow_cost_work(search)
        assert abs(search.budget - budget) < 1e-9 and abs(search.clock.deadline - deadline) < 1e-6


def test_a_stop_made_while_all_of_its_tenants_new_work_waits_is_no_swap(tmp_path):
    """`old` runs on i0 and `new` (its tenant's, its class) waits. The swaps tier counts the less of `old`'s stop and
    `new`'s placement. An answer that stops `old` and places none of the tenant's new work names `old` as a stop that is
    no swap (objective.swap_exemptions), with `new`'s placement as the work a probe may try; one that places `new`, or
    keeps `old`, names nothing. With `old` exempt, the tenant has nothing to swap: no swaps tier."""
    from reconciler.solve.objective import swap_exemptions
    from reconciler.solve.variables import evaluate

    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=2),
            job("old", priority="low", **A100_1G), job("new", priority="low", **A100_1G)]
    insts = [instance("i0", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")]
    desired = load(write_config(tmp_path, docs))
    problem = build_problem(desired, catalog_observed(desired, insts, {"old": ("i0",)}))
    model = Model(problem)
    tiers = model.tiers()
    assert [t.name for t in tiers if t.swaps] == ["running low jobs stopped for their own tenant's work"]
    old, new = demand(model, "old"), demand(model, "new")

    def answer(kept_old: int, placed_new: int):
        values = [0] * len(model.m.proto.variables)
        values[model.krj[old.key].index] = kept_old
        values[model.placed[old.key].index] = kept_old
        values[model.placed[new.key].index] = placed_new
        return swap_exemptions(model, lambda e: evaluate(values, e))

    found, waiting = answer(0, 0)
    assert found == {old.key: 1} and len(waiting) == 1
    assert answer(0, 1) == ({}, [])  # its tenant places new work beside the stop: maybe a swap, the tier weighs it
    assert answer(1, 0) == ({}, [])  # nothing stops
    assert not [t for t in Model(problem, exempt={old.key: 1}).tiers() if t.swaps]

