"""One scenario per placement rule a user relies on (README "How it decides"), on plain data.

Each test builds the smallest fleet where the rule decides the outcome, plans it against
the simulated cloud (every rule is checked again by tests/invariants.py) and asserts what a
platform team would look for in the plan: who runs, who is evicted, where, and what it costs.
Rules already covered elsewhere (quota and burst caps, spot never/required, max_spot_fraction,
max_price_fraction, min_instance_types, egress, running jobs staying, gang zones) are not
repeated here: see tests/test_solve.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timedelta, timezone

import pytest

from providers.catalog import load_catalog
from reconciler import api
from reconciler.render import render_human
from reconciler.load import load
from tests.fleetkit import catalog_observed, doc, instance, job, pinned_catalog, plan_for, pool, tenant, topology, write_config
from tests.invariants import check_plan

A100 = dict(gpus=1, gpu_type="A100", cpu=8, mem=60)  # one a2-highgpu-1g each


def by_job(plan):
    return {j.job: j for j in plan.jobs}


def one_gpu_pool(name="p", hi=1, market="on-demand", zones=("us-central1-a",)):
    """GCP a2-highgpu-1g instances: one A100 each, so max_instances counts GPUs."""
    return pool(name, "gcp", "us-central1", list(zones), ["a2-highgpu-1g"], market=market, hi=hi)


def gcp_1g(iid, market="on-demand", pool_name="p", zone="us-central1-a"):
    return instance(iid, pool_name, "gcp", "us-central1", zone, "a2-highgpu-1g", market)


def placement(**spec):
    return doc("PlacementPolicy", "pp", spec)


def markets(plan, observed_instances=()):
    """Instance ref -> market, for new and existing instances."""
    return {c.ref: c.market for c in plan.creates} | {i.id: i.market for i in observed_instances}


# ---------------------------------------------------------------- priorities and preemption


def test_a_higher_class_evicts_a_lower_running_job_of_its_tenant(tmp_path):
    """The one GPU goes to the critical job; the low job is evicted and told why."""
    docs = [topology(), tenant("t"), one_gpu_pool(), job("low", priority="low", **A100), job("crit", priority="critical", **A100)]
    plan = plan_for(tmp_path, docs, [gcp_1g("i0")], {"low": ("i0",)})
    jobs = by_job(plan)
    assert jobs["crit"].instances == ("i0",) and not plan.creates
    assert jobs["low"].action == "evict" and "higher-priority work first: crit" in jobs["low"].reason


FIXED = pool("fixed", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=1)  # one 16-vCPU instance, i0
BUY = pool("buy", "aws", "us-east-1", ["us-east-1a"], ["m6i.8xlarge"], hi=4)


def fixed_pool_plan(tmp_path, docs, crit: dict, instances=(), placements=None, time_limit=10):
    """t's normal n1 and n2 (6 vCPU each) run on the fixed pool's i0; t adds a critical CPU job (`crit`: its spec);
    `docs` the rest (the tenants among them). The plan `reconcile plan` emits (api._plan: the eviction rule asked of
    it), checked by tests/invariants.py; its jobs by name."""
    docs = [topology(), FIXED, *docs, job("n1", cpu=6, mem=8, pools=["fixed"]), job("n2", cpu=6, mem=8, pools=["fixed"]),
            job("crit", mem=8, priority="critical", **crit)]
    desired = load(write_config(tmp_path, docs))
    observed = catalog_observed(desired, [instance("i0", "fixed", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge"), *instances],
                                {"n1": ("i0",), "n2": ("i0",), **(placements or {})})
    plan = api._plan(desired, observed, "sim", time_limit, None).plan
    check_plan(desired, observed, plan)
    return plan, by_job(plan)


UHIGH = job("uhigh", tenant="u", cpu=6, mem=8, priority="high", pools=["fixed"])  # u's job that fits only on i0


@pytest.mark.parametrize("crit_cpu", [6, 12])
def test_a_tenants_higher_class_placed_elsewhere_gives_its_lower_jobs_room_to_no_other_tenant(tmp_path, crit_cpu):
    """t runs n1 and n2 on the one instance of a fixed pool, inside its guarantee; it adds a critical job that may go
    anywhere, and u a high job that fits only on the fixed pool. t's critical job takes a new instance, so nothing of
    t's needs n2's room: u's job waits (a guarantee is never taken by another tenant's work, whatever its class). The
    planner's model counted t's critical job in n2's place wherever it landed, and its plan evicted n2 for u's job."""
    plan, jobs = fixed_pool_plan(tmp_path, [tenant("t", cpu=64), tenant("u", cpu=64), BUY, UHIGH], dict(cpu=crit_cpu))
    assert jobs["n1"].action == jobs["n2"].action == "keep"
    assert jobs["uhigh"].action == "pending" and jobs["crit"].instances == ("+1",)
    # (its reason names what holds the fixed pool, not t's critical job elsewhere)
    assert "other tenants' work within their guarantees, which no other tenant's work displaces: n1, n2" in jobs["uhigh"].reason
    assert "crit" not in jobs["uhigh"].reason
    assert plan.solver.status == "OPTIMAL"  # (searched again counting t's critical work only in its lower jobs' room)


def test_a_tenant_over_its_gpu_guarantee_still_keeps_its_cpu_jobs_room_from_other_tenants(tmp_path):
    """As the fixed-pool case above, with t also running two 1-GPU jobs over its guarantee of 1 GPU (its burst 2): its
    guarantee is "full" in GPUs, not in vCPU, and its normal CPU job would borrow nothing. The excuse read any
    dimension, so t's critical job on a new instance elsewhere let u's high job take n2's room."""
    t = doc("Tenant", "t", {"quota": {"gpus": 1, "cpu": 64, "burst": {"gpus": 2, "cpu": 64}}})
    gpu = pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], lo=2, hi=2)
    _, jobs = fixed_pool_plan(tmp_path, [t, tenant("u", cpu=64), gpu, BUY, UHIGH, job("g1", pools=["gpu"], **A100),
                                         job("g2", pools=["gpu"], **A100)], dict(cpu=6, pools=["buy"]),
                              [gcp_1g("g0", pool_name="gpu"), gcp_1g("g9", pool_name="gpu")], {"g1": ("g0",), "g2": ("g9",)})
    assert jobs["n1"].action == jobs["n2"].action == "keep" and jobs["uhigh"].action == "pending"
    assert jobs["crit"].instances == ("+1",)


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_a_larger_higher_class_cpu_job_takes_the_room_of_two_smaller_jobs_of_its_tenant(tmp_path, time_limit):
    """A 12-vCPU critical job fits only on the one instance of a fixed pool, where its tenant's two 6-vCPU normal jobs
    run: it takes their place (a higher class of its own tenant may). A CPU replica counted one unit whatever its
    size, so the guarantees tier kept two units rather than one and the critical job waited for good; greedy
    (--time-limit 0, and the plan a solve falls back to) took a lower job's place only for quota, and left it
    waiting with "pools at max_instances"."""
    _, jobs = fixed_pool_plan(tmp_path, [tenant("t", cpu=64)], dict(cpu=12, pools=["fixed"]), time_limit=time_limit)
    assert jobs["crit"].instances == ("i0",) and jobs["n1"].action == jobs["n2"].action == "evict"
    assert "higher-priority work first: crit" in jobs["n1"].reason


def test_preemption_evicts_the_cheapest_victims(tmp_path):
    """Of three low jobs on a full p4d, a 2-GPU critical job evicts the one that loses least:
    not the 4-GPU job (more GPUs lost), not the 2-GPU job with 100 hours to go, but the one with
    5 hours left; the others are not moved."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1),
            job("big", gpus=4, gpu_type="A100", cpu=40, mem=400, priority="low", expected_hours=10),
            job("long", gpus=2, gpu_type="A100", cpu=20, mem=200, priority="low", expected_hours=100),
            job("short", gpus=2, gpu_type="A100", cpu=20, mem=200, priority="low", expected_hours=5),
            job("crit", gpus=2, gpu_type="A100", cpu=20, mem=200, priority="critical")]
    i0 = instance("i0", "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
    plan = plan_for(tmp_path, docs, [i0], {"big": ("i0",), "long": ("i0",), "short": ("i0",)})
    jobs = by_job(plan)
    assert {j.job for j in plan.jobs if j.action == "evict"} == {"short"}
    assert jobs["crit"].instances == ("i0",)
    assert jobs["big"].action == jobs["long"].action == "keep"


def test_preemption_never_keeps_lower_class_jobs_running(tmp_path):
    """With `preemption: Never` the critical job waits instead of evicting the low one."""
    docs = [topology(), tenant("t"), one_gpu_pool(), job("low", priority="low", **A100), job("crit", priority="critical", **A100),
            placement(preemption="Never")]
    jobs = by_job(plan_for(tmp_path, docs, [gcp_1g("i0")], {"low": ("i0",)}))
    assert jobs["low"].action == "keep" and jobs["crit"].action == "pending"


def test_guaranteed_work_is_never_preempted_by_another_tenant(tmp_path):
    """Tenant a runs a low job inside its guarantee; tenant b's critical job does not take it."""
    docs = [topology(), tenant("a", gpus=1), tenant("b"), one_gpu_pool(),
            job("a-low", tenant="a", priority="low", **A100), job("b-crit", tenant="b", priority="critical", **A100)]
    jobs = by_job(plan_for(tmp_path, docs, [gcp_1g("i0")], {"a-low": ("i0",)}))
    assert jobs["a-low"].action == "keep" and jobs["b-crit"].action == "pending"


def test_priority_aging_lets_an_old_low_job_beat_a_new_normal_one(tmp_path):
    """A low job waiting three days has climbed to high (one class per 24 h, up to high) and
    takes the only GPU from a normal job submitted now; an hour after submission it has not."""
    submitted = datetime(2026, 11, 1, tzinfo=timezone.utc)
    docs = [topology(), tenant("t"), one_gpu_pool(), placement(aging={"step_hours": 24, "max_priority": "high"}),
            job("old-low", priority="low", submitted=submitted, **A100)]
    now = submitted + timedelta(days=3)
    docs.append(job("new-normal", priority="normal", submitted=now, **A100))
    assert by_job(plan_for(tmp_path / "aged", docs, now=now))["old-low"].action == "place"
    young = by_job(plan_for(tmp_path / "young", docs, now=submitted + timedelta(hours=1)))
    assert young["old-low"].action == "pending" and young["new-normal"].action == "place"


def test_a_priority_zero_job_ages_too(tmp_path):
    """`priority: 0` (the lowest integer the schema takes) aged as 0 x 10 per step: it stayed 0 and starved behind every
    newer job, against "so nothing starves". It climbs from 1: after three days it is high and takes the GPU."""
    submitted = datetime(2026, 11, 1, tzinfo=timezone.utc)
    now = submitted + timedelta(days=3)
    docs = [topology(), tenant("t"), one_gpu_pool(), placement(aging={"step_hours": 24, "max_priority": "high"}),
            job("zero", priority=0, submitted=submitted, **A100), job("new-normal", priority="normal", submitted=now, **A100)]
    assert by_job(plan_for(tmp_path, docs, now=now))["zero"].action == "place"



def test_an_aged_job_once_placed_keeps_its_place_and_the_plan_after_its_apply_is_a_no_op(tmp_path, monkeypatch):
    """A low job waiting since 2020 has aged to high and takes the only GPU from a running normal job. Once it ran it
    dropped back to low (running jobs kept their own priority), and the normal job, now waiting, outranked it again:
    each apply evicted the other, without end (a controller would restart both every cycle). A running job now holds
    the aged priority it was placed with (state `aged`): the plan after the apply is a no-op, and the job is still
    evicted for work above what aging gave it (critical)."""
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    base = [topology(), tenant("t"), one_gpu_pool(), placement(aging={"step_hours": 24, "max_priority": "high"}),
            job("n0", priority="normal", **A100)]
    cfg = write_config(tmp_path / "c", base)
    api.apply(cfg, time_limit=5)
    write_config(cfg, base + [job("aged", priority="low", submitted=datetime(2020, 1, 1, tzinfo=timezone.utc), **A100)])
    jobs = by_job(api.plan(cfg, time_limit=5).plan)
    assert jobs["aged"].action == "place" and jobs["n0"].action == "evict"
    api.apply(cfg, time_limit=5)
    again = api.plan(cfg, time_limit=5).plan
    assert not again.has_changes, [(j.job, j.action, j.reason) for j in again.jobs if j.action != "keep"]
    assert by_job(again)["n0"].action == "pending" and "higher-priority work first: aged" in by_job(again)["n0"].reason
    write_config(cfg, base + [job("aged", priority="low", submitted=datetime(2020, 1, 1, tzinfo=timezone.utc), **A100),
                              job("crit", priority="critical", **A100)])
    jobs = by_job(api.plan(cfg, time_limit=5).plan)
    assert jobs["crit"].action == "place" and jobs["aged"].action == "evict"


# ---------------------------------------------------------------- guarantees, borrowing, fair share


def test_a_tenant_borrows_idle_capacity_beyond_its_guarantee(tmp_path):
    """Guarantee 1 GPU, burst 3: with nobody else asking, all three jobs run."""
    docs = [topology(), doc("Tenant", "a", {"quota": {"gpus": 1, "burst": {"gpus": 3}}}), tenant("b", gpus=2), one_gpu_pool(hi=3)]
    docs += [job(f"a{i}", tenant="a", **A100) for i in range(3)]
    plan = plan_for(tmp_path, docs)
    assert all(j.action == "place" for j in plan.jobs)


def test_borrowed_capacity_is_reclaimed_when_the_owner_needs_its_guarantee(tmp_path):
    """Tenant a borrows two of three GPUs; when tenant b asks for its guaranteed two, a's
    borrowed jobs are evicted, even though they outrank b's jobs."""
    docs = [topology(), doc("Tenant", "a", {"quota": {"gpus": 1, "burst": {"gpus": 3}}}), tenant("b", gpus=2), one_gpu_pool(hi=3)]
    docs += [job(f"a{i}", tenant="a", priority="high", **A100) for i in range(3)]
    docs += [job(f"b{i}", tenant="b", priority="low", **A100) for i in range(2)]
    insts = [gcp_1g(f"i{i}") for i in range(3)]
    plan = plan_for(tmp_path, docs, insts, {f"a{i}": (f"i{i}",) for i in range(3)})
    jobs = by_job(plan)
    assert jobs["b0"].instances and jobs["b1"].instances
    assert sorted(j.action for n, j in jobs.items() if n.startswith("a")) == ["evict", "evict", "keep"]


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_a_borrowing_tenants_gang_is_reclaimed_for_the_owners_guaranteed_job(tmp_path, time_limit):
    """A fixed pool of two p4d (8 GPUs each); tenant b (4 GPUs guaranteed, 16 at most) runs two 2 x 4-GPU gangs, one
    per host; tenant a (8 guaranteed) asks for an 8-GPU job. One of b's gangs stops, whole, and a's job takes its
    host, greedy (--time-limit 0, and the plan a solve falls back to) as CP-SAT: greedy reclaimed only 1-replica jobs
    and left a's job pending within its guarantee, "pools at max_instances (onprem 2/2)"."""
    docs = [topology(), pool("onprem", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=2, hi=2),
            tenant("a", gpus=8, burst={"gpus": 16}), tenant("b", gpus=4, burst={"gpus": 16}),
            *(job(g, "b", gpus=4, gpu_type="A100", cpu=8, mem=60, replicas=2, priority="low") for g in ("g1", "g2")),
            job("a-8", "a", gpus=8, gpu_type="A100", cpu=8, mem=60, priority="low")]
    fleet = [instance(f"h{k}", "onprem", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge") for k in range(2)]
    halves = ((0, 1, 2, 3), (4, 5, 6, 7))
    plan = plan_for(tmp_path, docs, fleet, {"g1": ("h0", "h0"), "g2": ("h1", "h1")}, time_limit=time_limit,
                    gpu_indices={"g1": halves, "g2": halves})
    jobs = by_job(plan)
    assert jobs["a-8"].action == "place", jobs["a-8"].reason
    assert sorted(jobs[g].action for g in ("g1", "g2")) == ["evict", "keep"]
    gone = next(jobs[g] for g in ("g1", "g2") if jobs[g].action == "evict")
    assert jobs["a-8"].instances == (gone.previous[0],) and "above its guaranteed 4" in gone.reason, gone.reason
    # b's 16 GPUs all guaranteed: it borrows nothing, so nothing of it is reclaimed and a's job waits
    docs[3] = tenant("b", gpus=16)
    plan = plan_for(tmp_path / "owned", docs, fleet, {"g1": ("h0", "h0"), "g2": ("h1", "h1")}, time_limit=time_limit,
                    gpu_indices={"g1": halves, "g2": halves})
    assert [j.action for j in sorted(plan.jobs, key=lambda j: j.job)] == ["pending", "keep", "keep"]


def test_weighted_fair_share_splits_borrowed_capacity_by_weight(tmp_path):
    """Two tenants with nothing guaranteed ask for all 8 GPUs each: weight 3 against weight 1
    gets 6 of them against 2."""
    burst = {"quota": {"gpus": 0, "burst": {"gpus": 8}}}
    docs = [topology(), doc("Tenant", "heavy", {**burst, "weight": 3}), doc("Tenant", "light", {**burst, "weight": 1}),
            one_gpu_pool(hi=8)]
    docs += [job(f"{t}{i}", tenant=t, **A100) for t in ("heavy", "light") for i in range(8)]
    placed = [j.tenant for j in plan_for(tmp_path, docs).jobs if j.instances]
    assert (placed.count("heavy"), placed.count("light")) == (6, 2)


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_borrowed_gpus_are_split_fairly_where_a_tenants_demand_weighs_most_on_vcpu(tmp_path, time_limit):
    """Two GPUs, all borrowed (guarantee 0, burst 2 each); a and b each ask two 1-GPU jobs and a 30-vCPU job no
    instance holds, so their demand weighs most on vCPU, which their quotas leave unlimited (nothing borrowed there).
    Each gets one GPU, greedy as CP-SAT: greedy measured a tenant's borrowed share as its use above its guarantee in
    that dimension, none, so a's jobs stayed first in line and took both GPUs while b borrowed none."""
    burst = {"quota": {"gpus": 0, "burst": {"gpus": 2}}}
    docs = [topology(), doc("Tenant", "a", burst), doc("Tenant", "b", burst), one_gpu_pool(hi=2)]
    docs += [job(f"{t}{i}", tenant=t, **A100) for t in "ab" for i in range(2)]
    docs += [job(f"{t}-cpu", tenant=t, cpu=30, mem=8) for t in "ab"]
    placed = [j.tenant for j in plan_for(tmp_path, docs, time_limit=time_limit).jobs if j.instances]
    assert sorted(placed) == ["a", "b"]


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
@pytest.mark.parametrize(("c_weight", "split"), [(1, [2, 2, 2]), (0.1, [3, 3, 0])], ids=["equal", "light-c"])
def test_small_borrowed_shares_are_split_by_weight(tmp_path, c_weight, split, time_limit):
    """104 GPUs (13 p4d); tenant o's guarantee holds 98 of them and its jobs fill it, so 6 are left to borrow for a, b
    and c (nothing guaranteed, four 1-GPU jobs each, a's high). Equal weights: each borrows 2; c at weight 0.1: a and b
    3 each, c none (its 1 GPU would be 10 of theirs). The fair-share tier's steps were 50 per mille of the fleet over
    the least weight (5.2 GPUs; 52 at weight 0.1), so every split of these 6 GPUs scored the same in it and a's high
    jobs took 4 of them (the tier below ranks borrowed work by class): 4/0/2 (bench/README s37-fair: 44/19 of 63 GPUs on
    the Philly replan). Greedy as CP-SAT: it lent borrowed room class by class, then by share within a class, and gave
    a's high jobs 4 (4/1/1; 4/2/0 at c's weight 0.1) where the README ranks the fair share above every class's borrowed
    work (`greedy._place_borrowed`)."""
    docs = [topology(), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=13), tenant("o", gpus=98),
            *(doc("Tenant", t, {"quota": {"gpus": 0, "burst": {"gpus": 8}}, "weight": c_weight if t == "c" else 1})
              for t in "abc")]
    docs += [job(f"o{i}", "o", gpus=8, gpu_type="A100", cpu=8, mem=60) for i in range(12)]
    docs += [job("o-2", "o", gpus=2, gpu_type="A100", cpu=8, mem=60)]
    docs += [job(f"{t}{i}", t, gpus=1, gpu_type="A100", cpu=4, mem=16, **({"priority": "high"} if t == "a" else {}))
             for t in "abc" for i in range(4)]
    placed = [j.tenant for j in plan_for(tmp_path, docs, time_limit=time_limit).jobs if j.instances]
    assert placed.count("o") == 13, placed
    assert [placed.count(t) for t in "abc"] == split, placed

# ---------------------------------------------------------------- spot policy


def test_spot_preferred_falls_back_to_on_demand_when_spot_is_short(tmp_path):
    """spot: preferred runs on spot while there is spot capacity, on on-demand when the zone
    has none (spot: required waits instead)."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=4, market="either"),
            job("pref", spot="preferred", **A100), job("req", spot="required", **A100)]
    plan = plan_for(tmp_path / "spot", docs)
    assert markets(plan)[by_job(plan)["pref"].instances[0]] == "spot"
    plan = plan_for(tmp_path / "short", docs, short={("gcp", "us-central1-a", "a2-highgpu-1g", "spot")})
    jobs = by_job(plan)
    assert markets(plan)[jobs["pref"].instances[0]] == "on-demand"
    assert jobs["req"].action == "pending"


def _spot_and_idle_gpus(plan):
    """GPUs of spot instances, and idle GPUs of on-demand ones (new a2-highgpu-1g instances)."""
    used = {i for j in plan.jobs for i in j.instances}
    spot = sum(c.market == "spot" for c in plan.creates)
    idle = sum(c.market == "on-demand" and c.ref not in used for c in plan.creates)
    return spot, idle


def test_on_demand_buffer_keeps_idle_on_demand_gpus_beside_spot(tmp_path):
    """A 50% buffer: for every two GPUs of spot work, one on-demand GPU stays idle as a landing
    zone. Without the buffer nothing idles."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=8, market="either")] + [job(f"j{i}", **A100) for i in range(4)]
    spot, idle = _spot_and_idle_gpus(plan_for(tmp_path / "none", docs))
    assert (spot, idle) == (4, 0)
    docs.append(doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 50}))
    spot, idle = _spot_and_idle_gpus(plan_for(tmp_path / "buffer", docs))
    assert spot > 0 and idle >= 0.5 * spot


def _buffered_spot_docs(budget: float) -> list[dict]:
    """A 50% on-demand buffer, a spot and an on-demand pool of m6i.4xlarge (16 vCPU), four spot-required 14-vCPU jobs."""
    return [topology(), tenant("t"), pool("sp", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], market="spot", hi=10),
            pool("od", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=10),
            doc("SpotPolicy", "s", {"max_spot_fraction": 1.0, "on_demand_buffer_percent": 50}),
            doc("GuardrailPolicy", "g", {"max_hourly_budget": budget}),
            *[job(f"j{i}", cpu=14, mem=16, spot="required") for i in range(4)]]


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_spot_required_work_runs_beside_the_idle_on_demand_capacity_the_buffer_asks_for(tmp_path, time_limit):
    """Four spot-required jobs, one m6i.4xlarge each, under a 50% buffer: all four run on spot, two on-demand instances
    stand idle beside them (the invariants check the buffer). Greedy best-fit (--time-limit 0, and the plan a solve
    falls back to) bought no spot where a buffer is asked for and left all four pending ("on-demand buffer: 0 idle
    on-demand vCPU in the plan"). Under a budget ($0.90/h) that cannot pay an on-demand instance ($0.77/h) beside a spot
    one ($0.29/h), none runs in either plan, and the reason says the budget binds (it named the buffer alone: QA 4b)."""
    plan = plan_for(tmp_path / "open", _buffered_spot_docs(100.0), time_limit=time_limit)
    assert all(j.action == "place" for j in plan.jobs), [(j.job, j.reason) for j in plan.jobs]
    assert sorted(c.market for c in plan.creates) == ["on-demand"] * 2 + ["spot"] * 4
    assert {markets(plan)[j.instances[0]] for j in plan.jobs} == {"spot"}
    plan = plan_for(tmp_path / "tight", _buffered_spot_docs(0.9), time_limit=time_limit)
    assert {j.action for j in plan.jobs} == {"pending"} and not plan.creates
    # (and its reason names the budget: the buffer alone read as if one idle on-demand instance would do)
    assert plan.jobs[0].reason == ("on-demand buffer: 0 idle on-demand vCPU in the plan, 50% of 16 spot vCPU is needed; the "
                                   "budget cannot pay for it: the cheapest cover, 1 on-demand m6i.4xlarge standing idle ($0.77/h) "
                                   "beside it, would take the fleet to $1.06/h, over max_hourly_budget $0.90/h"), plan.jobs[0].reason


def test_tenant_max_spot_fraction_caps_only_that_tenant(tmp_path):
    """Tenant capped at 50% spot runs half its jobs on-demand; the other tenant all on spot."""
    docs = [topology(), tenant("capped"), tenant("free"), one_gpu_pool(hi=8, market="either"),
            doc("SpotPolicy", "sp", {"tenant_max_spot_fraction": {"capped": 0.5}})]
    docs += [job(f"c{i}", tenant="capped", **A100) for i in range(4)] + [job(f"f{i}", tenant="free", **A100) for i in range(2)]
    plan = plan_for(tmp_path, docs)
    m = markets(plan)
    spot = {t: [m[j.instances[0]] for j in plan.jobs if j.tenant == t].count("spot") for t in ("capped", "free")}
    assert spot == {"capped": 2, "free": 2}


def test_tenant_spot_share_holds_when_the_packer_drops_its_on_demand_work(tmp_path, aggregate_only):
    """fleet12 (issue 18), reduced, with the offers' instances summed as a large offer's are (its 2 + 2 are modelled
    one by one now: solve/slots.py; the packer still drops work where counts are summed). The solver counts new
    instances per offer and a zone class over its zones: two 3 x 2-GPU gangs pinned to one new p4d each (us-east-1a, us-east-1b) leave 2 + 2
    GPUs, which it counts as room for t2's 4-GPU NVLink job; no instance has 4, the pool is at max,
    so the packer drops it. t2's CPU job on the running spot instance was within its 50% share
    only beside it (1 of 29 work units): alone it is 1 of 1, so the plan must not run it there."""
    from tests.fleetkit import reduced_fleet12

    docs, running = reduced_fleet12()
    plan = plan_for(tmp_path, docs, running, {"gang0": ("i0",) * 3}, time_limit=5, workers=1,
                    gpu_indices={"gang0": ((0, 1), (2, 3), (4, 5))})  # (the oracle checks every tenant's share)
    jobs, m = by_job(plan), markets(plan, running)
    small = jobs["small"]
    assert not any(m[i] == "spot" for i in small.instances)
    # (Which way the plan goes depends on the search: where the solver placed big and the packer dropped it, small
    # waits on the share; since the moves tier (solve/objective.moves_tier) the search leaves big pending on the pool
    # and small runs on on-demand. Either way small is never alone on spot.)
    if "could not be packed" in jobs["big"].reason:
        assert small.action == "pending" and small.reason.startswith("tenant spot share: t2's placed work would be 1 of 1")
    else:
        assert small.action == "place" and all(m[i] == "on-demand" for i in small.instances), small


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_min_zones_spreads_spot_over_zones(tmp_path, time_limit):
    """min_zones: 2 puts spot capacity in two zones even though one zone is cheaper. Greedy best-fit (--time-limit 0,
    and the plan a solve falls back to) bought no spot where diversity is asked for and left both jobs pending with
    "spot diversity: spot in the plan would span 1 instance type(s) and 1 zone(s)", which one job in each zone keeps."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=4, market="spot", zones=("us-central1-a", "us-central1-b")),
            doc("SpotPolicy", "sp", {"min_zones": 2})] + [job(f"j{i}", **A100) for i in range(2)]
    plan = plan_for(tmp_path, docs, time_limit=time_limit)
    assert {j.action for j in plan.jobs} == {"place"}, [(j.job, j.reason) for j in plan.jobs]
    assert {c.zone for c in plan.creates} == {"us-central1-a", "us-central1-b"} and len(plan.creates) == 2


def _spot_required_cpu(zones: tuple[str, ...], n: int) -> list[dict]:
    """n spot-required 4-vCPU jobs, a pool of m6i.xlarge (4 vCPU) of either market in these zones, min_zones: 2."""
    return [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", list(zones), ["m6i.xlarge"], market="either", hi=10),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 1.0, "min_zones": 2}),
            *[job(f"j{i}", cpu=4, mem=8, spot="required") for i in range(n)]]


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_one_spot_required_job_under_min_zones_runs_beside_an_idle_spot_instance_of_the_other_zone(tmp_path, time_limit):
    """One spot-required job and min_zones: 2: the plan buys a spot instance in each zone, the job on one, the other
    standing idle for the rule (the invariants check min_zones), greedy as CP-SAT. Where the budget cannot pay the
    second one, the job waits in both, nothing is bought, and the reason says the budget binds (it named the rule
    alone, as if a second zone were all it took)."""
    plan = plan_for(tmp_path / "open", _spot_required_cpu(("us-east-1a", "us-east-1b"), 1), time_limit=time_limit)
    assert by_job(plan)["j0"].action == "place", by_job(plan)["j0"].reason
    assert sorted((c.zone, c.market) for c in plan.creates) == [("us-east-1a", "spot"), ("us-east-1b", "spot")]
    tight = _spot_required_cpu(("us-east-1a", "us-east-1b"), 1) + [doc("GuardrailPolicy", "g", {"max_hourly_budget": 0.12})]
    plan = plan_for(tmp_path / "tight", tight, time_limit=time_limit)
    assert by_job(plan)["j0"].action == "pending" and not plan.creates
    assert by_job(plan)["j0"].reason == (
        "spot diversity: spot in the plan would span 1 instance type(s) and 1 zone(s); the SpotPolicy asks for 1 and 2; the "
        "budget cannot pay for it: that takes at least 1 more spot instance(s) of another type or zone, $0.09/h at the "
        "cheapest (m6i.xlarge in us-east-1b), which would take the fleet to at least $0.17/h, over max_hourly_budget $0.12/h")


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_spot_eligible_work_runs_on_spot_under_min_zones(tmp_path, time_limit):
    """Four spot-eligible 4-vCPU jobs under min_zones: 2 run on spot in two zones, four instances, no idle one, greedy
    as CP-SAT (greedy packs them where spot is cheapest, then moves one to the other zone at no cost rather than buy a
    fifth to stand idle there). Greedy's plan (--time-limit 0, the plan a solve falls back to, CP-SAT's warm start) ran
    all four on on-demand: $0.77/h against $0.34/h."""
    docs = [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["m6i.xlarge"], market="either", hi=10),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 1.0, "min_zones": 2}), *[job(f"j{i}", cpu=4, mem=8) for i in range(4)]]
    plan = plan_for(tmp_path, docs, time_limit=time_limit)
    assert {j.action for j in plan.jobs} == {"place"}
    assert {c.market for c in plan.creates} == {"spot"} and {c.zone for c in plan.creates} == {"us-east-1a", "us-east-1b"}
    assert len(plan.creates) == 4 and {i for j in plan.jobs for i in j.instances} == {c.ref for c in plan.creates}


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_spot_gangs_under_min_zones_go_one_to_each_zone_rather_than_beside_an_idle_instance(tmp_path, time_limit):
    """Two 2-replica zone gangs of 4-vCPU spot-eligible work under min_zones: 2: one gang in each zone, four spot
    instances, none idle, $0.34/h, greedy as CP-SAT. Greedy put both where spot is cheapest and bought a fifth spot
    instance to stand idle in the other zone ($0.43/h): its diversity move took no gang."""
    docs = [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["m6i.xlarge", "m6i.2xlarge"],
                                          market="either", hi=40),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 1.0, "min_zones": 2}),
            *[job(f"g{i}", cpu=4, mem=8, replicas=2, gang="zone") for i in range(2)]]
    plan = plan_for(tmp_path, docs, time_limit=time_limit)  # (plan_for checks every rule, the gangs' zones too)
    assert {j.action for j in plan.jobs} == {"place"}
    assert len(plan.creates) == 4 and {c.market for c in plan.creates} == {"spot"}
    assert {c.zone for c in plan.creates} == {"us-east-1a", "us-east-1b"}
    assert {i for j in plan.jobs for i in j.instances} == {c.ref for c in plan.creates}, "no instance stands idle"


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_spot_work_that_no_plan_can_spread_over_two_zones_waits_and_nothing_is_bought(tmp_path, time_limit):
    """min_zones: 2 where the pool has spot in one zone only: no plan keeps the rule with spot, so the spot-required
    jobs wait, saying so, and greedy buys nothing (its tentative spot purchases are undone, all or nothing)."""
    plan = plan_for(tmp_path, _spot_required_cpu(("us-east-1a",), 2), time_limit=time_limit)
    assert {j.action for j in plan.jobs} == {"pending"} and not plan.creates
    assert all(j.reason.startswith("spot diversity: ") for j in plan.jobs), [j.reason for j in plan.jobs]


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_spot_required_work_runs_under_both_an_on_demand_buffer_and_min_zones(tmp_path, time_limit):
    """Two spot-required jobs under min_zones: 2 and a 50% on-demand buffer: a spot instance in each zone and one
    on-demand instance standing idle beside them, greedy as CP-SAT. Greedy bought no spot at all where the SpotPolicy
    asks for both (its restraint, not a rule), so both jobs waited in its plan (--time-limit 0, the plan a solve falls
    back to) with a reason no rule gave: CP-SAT's plan keeps every rule."""
    docs = _spot_required_cpu(("us-east-1a", "us-east-1b"), 2)
    docs[3] = doc("SpotPolicy", "sp", {"max_spot_fraction": 1.0, "min_zones": 2, "on_demand_buffer_percent": 50})
    plan = plan_for(tmp_path, docs, time_limit=time_limit)  # (plan_for checks every rule of the plan)
    assert {j.action for j in plan.jobs} == {"place"}, [(j.job, j.reason) for j in plan.jobs]
    assert sorted((c.zone, c.market) for c in plan.creates if c.market == "spot") == [("us-east-1a", "spot"), ("us-east-1b", "spot")]
    on_demand = [c.ref for c in plan.creates if c.market == "on-demand"]
    assert len(on_demand) == 1 and not {i for j in plan.jobs for i in j.instances} & set(on_demand)


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
@pytest.mark.parametrize("min_zones", [1, 2])
def test_spot_eligible_work_runs_on_spot_beside_the_idle_on_demand_an_on_demand_buffer_keeps(tmp_path, time_limit, min_zones):
    """Eight spot-eligible 4-vCPU jobs under a 25% on-demand buffer (and min_zones 1 or 2): eight spot instances (in
    both zones where two are asked for) and 8 idle on-demand vCPU beside them, $1.06/h, greedy as CP-SAT. Greedy's
    plan (--time-limit 0, the plan a solve falls back to, CP-SAT's warm start) ran all eight on on-demand, $1.54/h: it
    bought spot only for work that waits otherwise where a buffer or diversity is asked."""
    docs = [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["m6i.xlarge", "m6i.2xlarge"],
                                          market="either", hi=20),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 1.0, "min_zones": min_zones, "on_demand_buffer_percent": 25}),
            *[job(f"j{i}", cpu=4, mem=8) for i in range(8)]]
    plan = plan_for(tmp_path, docs, time_limit=time_limit)  # (plan_for checks every rule of the plan)
    assert {j.action for j in plan.jobs} == {"place"}
    spot = [c for c in plan.creates if c.market == "spot"]
    assert len(spot) == 8 and len({c.zone for c in spot}) >= min_zones
    used = {i for j in plan.jobs for i in j.instances}
    assert used == {c.ref for c in spot}, "the on-demand instances stand idle for the buffer"
    assert round(plan.cost_after, 3) == 1.064, [(c.instance_type, c.market, c.zone) for c in plan.creates]


# ---------------------------------------------------------------- budgets


def _budget_config(tmp_path, guardrails: dict):
    """Three 1-GPU jobs at $3.67/h each (on-demand), in a pool of two zones."""
    docs = [topology(), tenant("a"), one_gpu_pool(hi=3, zones=("us-central1-a", "us-central1-b")),
            doc("GuardrailPolicy", "g", guardrails)]
    docs += [job(f"j{i}", tenant="a", priority=p, **A100) for i, p in enumerate(["high", "normal", "low"])]
    return write_config(tmp_path / "cfg", docs)


def test_tenant_budget_leaves_a_job_pending_and_explain_names_it(tmp_path):
    """A tenant budget of $8/h runs two of three jobs; the third is pending for the budget, and
    `explain` proves that raising the budget would run it. (Planning this crashed with a
    KeyError while the pending reason priced work placed on a zone class.)"""
    cfg = _budget_config(tmp_path, {"tenant_hourly_budgets": {"a": 8.0}})
    plan = api.plan(cfg, time_limit=10).plan
    jobs = by_job(plan)
    assert [jobs[j].action for j in ("j0", "j1", "j2")] == ["place", "place", "pending"]
    assert jobs["j2"].reason.startswith("tenant budget: a spends $7.35/h of its $8.00/h")
    ex = api.explain(cfg, "j2", time_limit=5)
    assert ex.summary.startswith("pending: tenant budget")
    # The amount searched from what is short ($7.35 + $3.67 - $8.00), not a blanket +50%.
    assert "raise tenant a's hourly budget by $3.03/h (to $11.03/h): it would run (+$3.67/h for the fleet)" in ex.would_change


def test_fleet_budget_leaves_a_job_pending_and_explain_names_it(tmp_path):
    cfg = _budget_config(tmp_path, {"max_hourly_budget": 8.0})
    plan = api.plan(cfg, time_limit=10).plan
    jobs = by_job(plan)
    assert [jobs[j].action for j in ("j0", "j1", "j2")] == ["place", "place", "pending"]
    ex = api.explain(cfg, "j2", time_limit=5)
    assert ex.summary.startswith("pending: budget: the fleet costs $7.35/h and max_hourly_budget is $8.00/h")
    assert "raise max_hourly_budget by $3.03/h (to $11.03/h): it would run (+$3.67/h for the fleet)" in ex.would_change


# ---------------------------------------------------------------- moves and consolidation


def _two_half_full_p4d(tmp_path, name, **policy):
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3),
            job("a", gpus=4, gpu_type="A100", cpu=40, mem=400), job("b", gpus=4, gpu_type="A100", cpu=40, mem=400)]
    if policy:
        docs.append(placement(**policy))
    insts = [instance(i, "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge") for i in ("i0", "i1", "idle")]
    return plan_for(tmp_path / name, docs, insts, {"a": ("i0",), "b": ("i1",)})


def test_consolidation_moves_work_off_a_half_empty_instance_and_shows_the_saving(tmp_path):
    """Two p4d half used: one job moves, one instance goes, and the plan says what it saves."""
    plan = _two_half_full_p4d(tmp_path, "under")
    assert sorted(j.action for j in plan.jobs) == ["keep", "move"]
    removed = {d.instance_id: d.price for d in plan.deletes}
    assert len(removed) == 2 and "idle" in removed  # the idle one and one of the half-used ones
    c = plan.consolidation
    assert c is not None and c.moved_replicas == 1
    assert abs(c.saving_per_hour - sum(p for i, p in removed.items() if i != "idle")) < 0.01
    assert f"saving ${c.saving_per_hour:,.2f}/h" in render_human(plan)


def test_when_empty_deletes_only_idle_instances_and_moves_nothing(tmp_path):
    plan = _two_half_full_p4d(tmp_path, "empty", consolidation="WhenEmpty")
    assert all(j.action == "keep" for j in plan.jobs)
    assert [d.instance_id for d in plan.deletes] == ["idle"] and plan.consolidation is None


def test_a_move_is_made_only_when_it_pays_back_within_payback_hours(tmp_path):
    """A job on on-demand could save ~$2.6/h on spot. Moving it costs $2 per GPU, paid back
    in under an hour: it moves. At $100 per GPU over 24 h ($4.17/h) it stays."""
    cat = load_catalog()
    o = cat.offering("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")
    saving = o.on_demand_price - o.spot_price
    docs = [topology(), tenant("t"), one_gpu_pool(hi=2, market="either"), job("j", **A100)]
    running = ([gcp_1g("i0")], {"j": ("i0",)})
    cheap = by_job(plan_for(tmp_path / "cheap", docs + [placement(move_cost_per_gpu=2.0, payback_hours=24)], *running))
    assert cheap["j"].action == "move"
    assert 100 / 24 > saving
    dear = by_job(plan_for(tmp_path / "dear", docs + [placement(move_cost_per_gpu=100.0, payback_hours=24)], *running))
    assert dear["j"].action == "keep"


# ---------------------------------------------------------------- locality and allowlists


def _east_west(latency_cost=0.0, **data):
    """Spot m6i.4xlarge in us-east-1b (cheaper) and us-west-2a (where the data is)."""
    return [topology(), tenant("t"),
            pool("east", "aws", "us-east-1", ["us-east-1b"], ["m6i.4xlarge"], market="spot"),
            pool("west", "aws", "us-west-2", ["us-west-2a"], ["m6i.4xlarge"], market="spot"),
            placement(latency_cost_per_ms=latency_cost),
            job("j", cpu=2, mem=8, data={"location": "aws/us-west-2", "size_gib": 0, **data})]


def test_latency_cost_pulls_work_next_to_its_data(tmp_path):
    cat = load_catalog()
    east = cat.offering("aws", "us-east-1", "us-east-1b", "m6i.4xlarge").spot_price
    west = cat.offering("aws", "us-west-2", "us-west-2a", "m6i.4xlarge").spot_price
    assert east < west  # without a latency price, the far zone wins
    assert plan_for(tmp_path / "free", _east_west()).creates[0].region == "us-east-1"
    assert plan_for(tmp_path / "priced", _east_west(latency_cost=0.01)).creates[0].region == "us-west-2"


def test_max_latency_ms_is_hard(tmp_path):
    """Within 5 ms of its data only us-west-2 qualifies, however cheap the east is; data with no
    zone that close leaves the job pending, saying so."""
    assert plan_for(tmp_path / "near", _east_west(max_latency_ms=5)).creates[0].region == "us-west-2"
    docs = _east_west(max_latency_ms=5)
    docs[-1]["spec"]["data"]["location"] = "gcp/us-central1"
    j = by_job(plan_for(tmp_path / "far", docs))["j"]
    assert j.action == "pending" and "within the data's max_latency_ms" in j.reason


def _cpu_pools():
    """CPU capacity in AWS (m6i.4xlarge, the cheaper) and GCP (n2-standard-16)."""
    return [pool("aws-cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
            pool("gcp-cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"])]


def test_job_allowlists_are_hard_even_when_elsewhere_is_cheaper(tmp_path):
    """Each job needs an instance of its own (12 of 16 vCPU): the one without an allowlist takes
    the cheaper AWS instance; each allowlist keeps its job in GCP."""
    docs = [topology(), tenant("t"), *_cpu_pools(), job("free", cpu=12, mem=16),
            job("by-cloud", cpu=12, mem=16, clouds=["gcp"]), job("by-region", cpu=12, mem=16, regions=["us-central1"]),
            job("by-pool", cpu=12, mem=16, pools=["gcp-cpu"])]
    plan = plan_for(tmp_path, docs)
    cloud = {c.ref: c.cloud for c in plan.creates}
    assert {n: cloud[j.instances[0]] for n, j in by_job(plan).items()} == {
        "free": "aws", "by-cloud": "gcp", "by-region": "gcp", "by-pool": "gcp"}


def test_guardrail_allowed_clouds_moves_work_out_of_a_disallowed_cloud(tmp_path):
    """AWS is cheaper, but the GuardrailPolicy allows only GCP: the AWS instance goes and its
    job moves; a new job starts in GCP."""
    docs = [topology(), tenant("t"), *_cpu_pools(), doc("GuardrailPolicy", "g", {"allowed_clouds": ["gcp"]}),
            job("running", cpu=4, mem=16), job("new", cpu=4, mem=16)]
    aws = instance("i-aws", "aws-cpu", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge")
    plan = plan_for(tmp_path, docs, [aws], {"running": ("i-aws",)})
    assert [(d.instance_id, "not allowed" in d.reason) for d in plan.deletes] == [("i-aws", True)]
    assert {c.cloud for c in plan.creates} == {"gcp"}
    assert by_job(plan)["running"].action == "move"


# ---------------------------------------------------------------- bugs the property tests found


def _mig_pool(name: str, layout: list[str], hi: int = 1, market: str = "on-demand") -> dict:
    """Azure NC24ads A100 v4 (one A100-80GB) partitioned with a MIG layout."""
    p = pool(name, "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"], market=market, hi=hi)
    p["spec"]["mig"] = layout
    return p


def _mig_job(name: str, profile: str, **spec) -> dict:
    j = job(name, **spec)
    j["spec"]["resources"] = {"gpu_type": "A100-80GB", "mig": {"profile": profile, "count": 1}, "cpu": 2, "memory_gib": 8}
    return j


def test_two_placement_group_gangs_never_share_an_instance(tmp_path):
    """An instance launches into one placement group. The model let two 2x2-GPU gangs share one
    8-GPU instance; the packer could not, so one gang went pending ('could not be packed') and
    the four 1-GPU jobs that fit beside the other gang waited for nothing."""
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=1)]
    docs += [job(f"pg-{x}", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=2, gang="placement-group") for x in "ab"]
    docs += [job(f"small{i}", priority="low", **A100) for i in range(4)]
    plan = plan_for(tmp_path, docs)
    jobs = by_job(plan)
    assert sorted(jobs[g].action for g in ("pg-a", "pg-b")) == ["pending", "place"]
    assert all(jobs[f"small{i}"].action == "place" for i in range(4))
    assert not any("could not be packed" in j.reason for j in plan.jobs)


def test_each_placement_group_gang_fills_its_own_instance(tmp_path):
    """Two 2x2-GPU gangs, two 4-GPU instances: the packer spread the first gang over both (a
    placement group each) and the second found none left."""
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-4g"], hi=2)]
    docs += [job(f"pg-{x}", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=2, gang="placement-group") for x in "ab"]
    for limit in (0, 10):  # greedy's plan (the fallback) and CP-SAT's
        plan = plan_for(tmp_path / str(limit), docs, time_limit=limit)
        assert all(j.action == "place" and len(set(j.instances)) == 1 for j in plan.jobs), [(j.job, j.instances) for j in plan.jobs]


def test_an_instance_gang_spread_over_instances_is_placed_again_whole(tmp_path):
    """A running gang changed to `gang: instance` has a replica on each of two instances. Each
    instance counted the whole gang as staying, and one replica got no GPUs; it moves onto one
    instance, every replica with GPUs of its own."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3),
            job("tp", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=2, gang="instance"),
            job("other", gpus=4, gpu_type="A100", cpu=40, mem=300)]
    insts = [instance(i, "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge") for i in ("i0", "i1")]
    tp = by_job(plan_for(tmp_path, docs, insts, {"tp": ("i0", "i1"), "other": ("i0",)}))["tp"]
    assert tp.action == "move" and len(set(tp.instances)) == 1 and [len(g) for g in tp.gpus] == [2, 2]


def test_the_greedy_fallback_counts_a_running_instance_gang_once(tmp_path):
    """Greedy kept a running 2x2-GPU instance-gang twice over and bought a second p4d for a
    4-GPU job that fits beside it."""
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3),
            job("tp", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=2, gang="instance"),
            job("four", gpus=4, gpu_type="A100", cpu=16, mem=120)]
    i0 = instance("i0", "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
    plan = plan_for(tmp_path, docs, [i0], {"tp": ("i0", "i0")}, time_limit=0)
    assert not plan.creates and by_job(plan)["four"].instances == ("i0",)


def test_the_greedy_fallback_opens_no_idle_spot_host_against_spot_diversity(tmp_path):
    """min_zones: 2 and an idle spot host: greedy best-fit (the plan when CP-SAT has no answer)
    put the job on it, leaving all spot in one zone (plan_for checks min_zones)."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=3, market="either"), doc("SpotPolicy", "sp", {"min_zones": 2}), job("j", **A100)]
    plan = plan_for(tmp_path, docs, [gcp_1g("i-spot", market="spot")], time_limit=0)
    assert by_job(plan)["j"].action == "place"


def test_a_mig_instance_with_one_profile_taken_has_room_for_another(tmp_path):
    """Layout [3g, 2g, 2g] on one GPU: once the 3g device was taken the packer saw the instance
    as full, and the 2g job went pending ('could not be packed')."""
    docs = [topology(), tenant("t"), _mig_pool("mig", ["3g.40gb", "2g.20gb", "2g.20gb"]),
            _mig_job("small", "2g.20gb"), _mig_job("large", "3g.40gb")]
    plan = plan_for(tmp_path, docs)
    assert len(plan.creates) == 1 and all(j.instances == ("+1",) for j in plan.jobs)


def test_mig_work_is_not_counted_as_idle_on_demand_buffer(tmp_path):
    """A 100% buffer: an on-demand GPU partitioned for inference is not idle. The model counted
    it idle, so the training job went to spot with no landing zone beside it."""
    docs = [topology(), tenant("t"), _mig_pool("mig", ["1g.10gb"] * 7), one_gpu_pool(hi=2, market="either"),
            doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 100}),
            _mig_job("inference", "1g.10gb", spot="never"), job("train", **A100)]
    plan = plan_for(tmp_path, docs)  # checks the buffer: idle on-demand GPUs >= GPUs on spot
    assert markets(plan)[by_job(plan)["train"].instances[0]] == "on-demand"


def test_seven_1g_slices_fill_one_on_demand_mig_gpu_under_an_on_demand_buffer(tmp_path):
    """With an on-demand buffer, the model counted each 1g slice as 1429/10000 of a GPU, so a
    GPU's seven slices used 1.0003 GPUs: a full MIG GPU broke the buffer's row by rounding, one
    job was left out or a second instance bought (found by the random property tier: greedy's
    warm start, a full GPU, was not a solution of the model)."""
    docs = [topology(), tenant("t"), tenant("no-gpus", gpus=0), _mig_pool("mig", ["1g.10gb"] * 7, hi=2),
            one_gpu_pool(hi=2, market="spot"), doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 25}),
            job("wish", tenant="no-gpus", **A100)]  # could use spot, but its tenant has no GPUs: the buffer needs nothing
    docs += [_mig_job(f"slice{i}", "1g.10gb", spot="never") for i in range(7)]
    plan = plan_for(tmp_path, docs)
    jobs = by_job(plan)
    assert jobs.pop("wish").action == "pending"
    assert len(plan.creates) == 1 and all(j.action == "place" and j.instances == ("+1",) for j in jobs.values()), plan.jobs


def test_work_pinned_to_a_zone_does_not_strand_room_a_zone_free_gang_needs(tmp_path):
    """Two MIG instances with two 2g devices each: a zone gang (one 2g device per replica,
    pinned to its zone) was packed first and spread one replica per instance, so the
    instance-gang needing two devices on one instance was dropped ('could not be packed')."""
    docs = [topology(), tenant("t"), _mig_pool("mig", ["3g.40gb", "2g.20gb", "2g.20gb"], hi=2),
            _mig_job("zone-gang", "2g.20gb", replicas=2, gang="zone"), _mig_job("instance-gang", "2g.20gb", replicas=2, gang="instance")]
    docs[2]["spec"]["zones"] = ["eastus-1", "eastus-2"]
    plan = plan_for(tmp_path, docs)
    assert all(j.action == "place" for j in plan.jobs) and len(plan.creates) == 2


def test_zone_free_work_leaves_a_pinned_gang_the_room_the_solver_counted(tmp_path):
    """16 of 17 GPUs fit on the pool's two 8-GPU instances, one per zone. The 4-GPU job (placed
    on the zone class) was packed onto the instance in the gang's zone, leaving the 3x2-GPU
    gang 4 GPUs there: the gang was dropped ('could not be packed') and 6 GPUs sat idle."""
    docs = [topology(), tenant("t"),
            pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"], hi=2)]
    near = {"location": "aws/us-east-1", "size_gib": 0}
    nvlink = [job(n, gpus=g, gpu_type="A100", cpu=cpu, mem=mem, priority="low", **extra)
              for n, g, cpu, mem, extra in [("a", 2, 16, 120, {"data": near}), ("b", 2, 16, 120, {}), ("c", 2, 16, 120, {"data": near}),
                                            ("four", 4, 40, 300, {})]]
    for j in nvlink:
        j["spec"]["resources"]["nvlink"] = True
    docs += nvlink + [job("one", priority="low", **A100), job("gang", gpus=2, gpu_type="A100", cpu=16, mem=120, priority="low", replicas=3)]
    plan = plan_for(tmp_path, docs, workers=1)  # one worker: the solver's choice of zones is the one that showed it
    assert [j.job for j in plan.jobs if not j.instances] == ["one"]  # 17 GPUs asked, 16 to be had
    assert not any("could not be packed" in j.reason for j in plan.jobs)


def test_an_instance_gang_is_packed_by_its_whole_size(tmp_path):
    """A 3x2-GPU instance-gang needs 6 GPUs of one instance. The packer sorted it by one
    replica's 2 GPUs, so two 4-GPU jobs went first, one on each 8-GPU instance, and the gang
    the solver had placed was dropped ('could not be packed')."""
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=2),
            job("gang", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=3, gang="instance"),
            job("four-a", gpus=4, gpu_type="A100", cpu=40, mem=300), job("four-b", gpus=4, gpu_type="A100", cpu=40, mem=300)]
    docs += [job(f"one{i}", **A100) for i in range(2)]
    plan = plan_for(tmp_path, docs)
    assert all(j.action == "place" for j in plan.jobs) and len(plan.creates) == 2


def test_the_greedy_fallback_keeps_a_running_gang_only_within_its_tenant_budget(tmp_path):
    """Greedy checked the tenant budget replica by replica when keeping a running gang (each
    of three replicas' $2.14/h fit under $5/h), so the fallback plan kept all three ($6.42/h)."""
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], market="either", hi=1),
            doc("GuardrailPolicy", "g", {"tenant_hourly_budgets": {"t": 5.0}}),
            job("gang", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=3)]
    i0 = instance("i0", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-8g", "spot")
    plan = plan_for(tmp_path, docs, [i0], {"gang": ("i0", "i0", "i0")}, time_limit=0)  # checks the budget
    assert by_job(plan)["gang"].action == "evict" and "tenant budget" in by_job(plan)["gang"].reason


def test_room_left_by_a_tenant_over_its_lowered_quota_is_used_without_extra_moves(tmp_path):
    """A tenant's quota drops to 0: its job on i0 must go. A gang with a replica on i0 and one
    on a spot instance (which the spot share no longer allows) can gather on i0, moving one
    replica. The model only let new work onto a host where the residents left room, so it
    moved both replicas to a new instance instead (two restarts, where greedy needed one)."""
    docs = [topology(), tenant("t"), tenant("shrunk", gpus=0),
            pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-4g"], market="either", hi=1),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.25}),
            job("gang", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=2), job("old", tenant="shrunk", **A100)]
    insts = [instance("i0", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-4g"),
             instance("i1", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-4g", "spot")]
    plan = plan_for(tmp_path, docs, insts, {"gang": ("i0", "i1"), "old": ("i0",)})
    jobs = by_job(plan)
    assert jobs["old"].action == "evict" and jobs["gang"].instances == ("i0", "i0") and not plan.creates


def test_an_item_over_half_an_instance_is_counted_in_its_zone(tmp_path):
    """Two 8-GPU instances hold a 3x2-GPU instance-gang (6 GPUs on one instance) and two zone
    gangs (3x2 and 2x2 GPUs) only if both are in one zone. The model counted the instance-gang
    on the pool's zone class and bought one instance per zone: the class had room in
    aggregate, no single instance did, and the instance-gang was dropped ('could not be
    packed'). (The job names and the pending job keep the solver's order that showed it.)"""
    two = dict(tenant="t2", gpus=2, gpu_type="A100", cpu=16, mem=120, priority="low")
    docs = [topology(), tenant("t1", gpus=0), tenant("t2"),
            pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"],
                 market="either", hi=2),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.25, "max_price_fraction": 0.3}),
            job("j1", replicas=3, gang="zone", **two), job("j5", tenant="t1", priority="low", **A100),
            job("j6", replicas=3, gang="instance", **two),
            job("j7", replicas=2, spot="never", data={"location": "aws/us-east-1", "size_gib": 0}, **two)]
    plan = plan_for(tmp_path, docs, workers=1)
    assert [j.job for j in plan.jobs if not j.instances] == ["j5"]  # over its tenant's quota of 0


def test_the_solver_places_only_what_packs_when_the_pool_is_full(tmp_path):
    """Two 3x2-GPU instance-gangs and a 4-GPU job on at most two 8-GPU instances: only two of
    the three fit. The aggregate count (16 GPUs) accepted all three and the packer dropped one
    every run ('could not be packed ... the next run retries'); the big-item cut makes the
    solver leave one pending, with a reason, and place what packs."""
    two = dict(gpus=2, gpu_type="A100", cpu=16, mem=120)
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=2),
            job("gang-a", replicas=3, gang="instance", **two), job("gang-b", replicas=3, gang="instance", **two),
            job("four", gpus=4, gpu_type="A100", cpu=40, mem=300)]
    plan = plan_for(tmp_path, docs)
    assert not any("could not be packed" in j.reason for j in plan.jobs)
    placed = [j for j in plan.jobs if j.instances]
    pending = [j for j in plan.jobs if not j.instances]
    assert len(placed) == 2 and len({i for j in placed for i in j.instances}) == 2
    assert len(pending) == 1 and pending[0].reason


def test_a_replica_placed_again_on_its_own_instance_keeps_its_gpus(tmp_path):
    """Greedy gives up a spot host whose tenant may no longer use spot, then places the other
    tenant's job back on it. The plan called that job kept but gave it GPU 0 instead of the
    GPU 1 it runs on, and apply would have recorded GPU 0 for a process still on GPU 1."""
    docs = [topology(), tenant("t1"), tenant("t2"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], market="either", hi=1),
            doc("SpotPolicy", "sp", {"tenant_max_spot_fraction": {"t1": 0.0}}),
            job("spot-banned", tenant="t1", priority="low", **A100), job("other", tenant="t2", **A100)]
    i0 = instance("i0", "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "spot")
    running = {"spot-banned": ("i0",), "other": ("i0",)}
    plan = plan_for(tmp_path, docs, [i0], running, time_limit=0, gpu_indices={"spot-banned": ((0,),), "other": ((1,),)})
    other = by_job(plan)["other"]
    assert (other.action, other.instances, other.gpus) == ("keep", ("i0",), ((1,),))


# ---------------------------------------------------------------- warm pools (idle instances)


def _warm_pool_docs(idle: int, jobs: list[dict]) -> tuple[list[dict], list]:
    """A pool of a2-highgpu-8g kept warm by min_instances: `idle` running, empty instances."""
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], lo=idle, hi=idle + 4), *jobs]
    insts = [instance(f"i{k:02d}", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-8g") for k in range(idle)]
    return docs, insts


def test_new_jobs_fill_a_warm_pools_idle_instances_before_buying(tmp_path):
    """Idle instances of one shape are solved as a class (one variable per job group, not per
    instance); the plan still names real instances, packs them without overcommit (every
    rule is re-checked on the plan) and buys nothing while warm capacity is free."""
    jobs = [job(f"big{k}", gpus=4, gpu_type="A100", cpu=40, mem=300) for k in range(3)] + \
           [job(f"small{k}", gpus=2, gpu_type="A100", cpu=8, mem=60) for k in range(5)]
    docs, insts = _warm_pool_docs(6, jobs)
    plan = plan_for(tmp_path, docs, insts)
    assert not plan.creates and not plan.deletes
    placed = by_job(plan)
    assert all(placed[j["metadata"]["name"]].action == "place" for j in jobs)
    gpus_on: dict[str, int] = {}
    for j in plan.jobs:
        for iid in j.instances:
            gpus_on[iid] = gpus_on.get(iid, 0) + (4 if j.job.startswith("big") else 2)
    assert set(gpus_on) <= {i.id for i in insts} and max(gpus_on.values()) <= 8
    assert sum(gpus_on.values()) == 22  # 3 x 4 + 5 x 2, on ceil(22 / 8) = 3 or more instances


def test_a_warm_pools_model_does_not_grow_with_its_idle_instances(tmp_path):
    """The CP-SAT model's placement variables are the same for 5 and 50 idle instances."""
    from reconciler.load import load
    from reconciler.problem import build_problem
    from reconciler.solve.model import Model
    from tests.fleetkit import catalog_observed

    sizes = []
    for idle in (5, 50):
        docs, insts = _warm_pool_docs(idle, [job(f"j{k}", gpus=k % 3 + 1, gpu_type="A100", cpu=4, mem=20) for k in range(6)])
        desired = load(write_config(tmp_path / str(idle), docs))
        sizes.append(len(Model(build_problem(desired, catalog_observed(desired, insts))).x))
    assert sizes[0] == sizes[1] > 0


def test_spot_cpu_instances_do_not_count_against_a_gpu_fleets_spot_share_when_freezing(tmp_path):
    """The spot share is GPUs in a GPU fleet, for the freezer as for the solver: idle spot CPU
    instances (many vCPUs, no GPU) once made the share look over max_spot_fraction, so on a
    10k-instance fleet nothing was frozen and a warm plan solved every host."""
    from reconciler.load import load
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed

    docs = [topology(), tenant("t"), one_gpu_pool(hi=2),
            pool("cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="spot", lo=3, hi=3),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5}), job("train", **A100)]
    insts = [gcp_1g("g0")] + [instance(f"c{k}", "cpu", "gcp", "us-central1", "us-central1-a", "n2-standard-16", "spot") for k in range(3)]
    desired = load(write_config(tmp_path, docs))
    problem = build_problem(desired, catalog_observed(desired, insts, {"train": ("g0",)}), freeze=True)
    assert {c.instance_id for c in problem.capacities if c.frozen} == {"g0"}


def test_greedy_keeps_an_idle_on_demand_host_that_holds_the_spot_share(tmp_path):
    """The warm start (and fallback) keeps what runs, then settles the spot rules: an idle
    on-demand instance the fleet kept for the share is kept again, instead of giving up the
    spot instance and moving its job (churn at every run of a warm fleet)."""
    docs = [topology(), tenant("t"), one_gpu_pool("od", hi=2), one_gpu_pool("sp", hi=2, market="spot"),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5}), job("train", spot="preferred", **A100)]
    insts = [gcp_1g("s0", "spot", "sp"), gcp_1g("o0", "on-demand", "od")]
    plan = plan_for(tmp_path, docs, insts, {"train": ("s0",)}, time_limit=0)
    assert by_job(plan)["train"].action == "keep"
    assert not plan.creates and not plan.deletes


def test_the_fleet_as_it_is_warm_start_meets_pool_minimums_before_keeping_idle_instances(tmp_path):
    """The warm start that keeps the fleet as it is kept an idle 4-GPU instance first, and the
    $15/h budget then had no room for the CPU pool's minimum instance: the warm start was no
    solution of the model, so CP-SAT searched every tier from nothing (found by the random
    property tier)."""
    from reconciler.greedy import greedy
    from reconciler.load import load
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed

    docs = [topology(), tenant("t"), pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g", "a2-highgpu-4g"], hi=1),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=1),
            doc("GuardrailPolicy", "g", {"max_hourly_budget": 15.0}), job("j0", **A100), job("j1", **A100)]
    idle = instance("i0", "gpu", "gcp", "us-central1", "us-central1-a", "a2-highgpu-4g")
    desired = load(write_config(tmp_path, docs))
    problem = build_problem(desired, catalog_observed(desired, [idle]))
    caps = {c.key: c for c in problem.capacities}
    for a in (greedy(problem), greedy(problem, keep_fleet=True)):
        kept = [caps[k] for k, n in a.use.items() for _ in range(n)]
        assert sum(c.pool == "cpu" for c in kept) == 1
        assert sum(c.price for c in kept) <= 15.0


def test_greedy_leaves_the_budget_room_for_unmet_pool_minimums(tmp_path):
    """A $15/h budget, a running 1-GPU job on a $14.69/h 4-GPU instance, a CPU pool with a
    minimum of one: greedy best-fit (the fallback) kept the running instance first and then
    could not buy the pool's minimum, a plan breaking a hard rule (found by the random
    property tier). It now counts unmet minimums against the budget, so the job moves."""
    docs = [topology(), tenant("t"), pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g", "a2-highgpu-4g"], hi=1),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=1),
            doc("GuardrailPolicy", "g", {"max_hourly_budget": 15.0}), job("j", **A100)]
    running = instance("i0", "gpu", "gcp", "us-central1", "us-central1-a", "a2-highgpu-4g")
    for limit in (0, 10):  # greedy's plan and CP-SAT's (plan_for checks the minimum and the budget)
        plan = plan_for(tmp_path / str(limit), docs, [running], {"j": ("i0",)}, time_limit=limit)
        assert by_job(plan)["j"].action == "move"
        assert sorted(c.pool for c in plan.creates) == ["cpu", "gpu"]


def test_a_tenant_budget_is_charged_at_the_zone_its_work_lands_in(tmp_path):
    """Spot a2-highgpu-4g costs more in us-central1-b than in -a. Work that may go to either
    zone was one variable for the pool's zones, charged to the tenant's $5/h budget at the
    dearer zone's price, so the 1-GPU job that fits the budget in -a stayed pending although
    greedy placed it (found by the random property tier). Per-zone spot prices are what a live
    source (EC2 spot history) gives; the shipped catalog prices GCP spot per region, so this pins a
    catalog with the zone prices the property tier found it with."""
    zone_spot = {"a2-highgpu-1g": (1.067, 1.023), "a2-highgpu-4g": (4.0572, 4.4541), "a2-highgpu-8g": (8.5554, 8.4672)}

    a10g_spot = {"g5.12xlarge": 1.8718, "g5.xlarge": 0.3744}  # the rest of the tenant's spending, as it was then

    def per_zone(raw):
        for t, (a, b) in zone_spot.items():
            raw["clouds"]["gcp"]["instance_types"][t]["prices"]["us-central1"]["spot"] = {"us-central1-a": a, "us-central1-b": b}
        for t, price in a10g_spot.items():
            raw["clouds"]["aws"]["instance_types"][t]["prices"]["us-east-1"]["spot"] = price

    with pinned_catalog(tmp_path / "pinned" / "catalog.json", per_zone):
        _budget_at_zone(tmp_path)


def _budget_at_zone(tmp_path):
    docs = [topology(), tenant("t"), pool("a100", "gcp", "us-central1", ["us-central1-a", "us-central1-b"],
                                          ["a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"], market="either", hi=1),
            pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], market="spot", hi=1),
            doc("GuardrailPolicy", "g", {"tenant_hourly_budgets": {"t": 5.0}}),
            job("four-a10g", gpus=4, gpu_type="A10G", cpu=40, mem=160),
            job("two-a100", gpus=2, gpu_type="A100", cpu=16, mem=120),
            job("one-a100", priority="low", **A100)]
    docs[-2]["spec"]["resources"]["nvlink"] = True
    plan = plan_for(tmp_path, docs)
    assert all(j.action == "place" for j in plan.jobs), [(j.job, j.action, j.reason) for j in plan.jobs]


# ---------------------------------------------------------------- floating licenses (issue 17)


def load_errors(path, docs) -> str:
    """What `load` refuses the config with (it must refuse it)."""
    from reconciler.errors import ConfigError
    from reconciler.load import load

    with pytest.raises(ConfigError) as e:
        load(write_config(path, docs))
    return str(e.value)


def license_doc(name="matlab", count=2, **spec):
    return doc("License", name, {"count": count, **spec})


def test_a_license_count_caps_the_replicas_holding_it_and_the_rest_wait_saying_so(tmp_path):
    """Five 1-GPU jobs each hold one of 2 matlab licenses: with GPUs for all, two run, the rest are
    pending on the license, naming its holders; greedy best-fit (the fallback) agrees."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=8), license_doc(count=2)]
    docs += [job(f"j{i}", licenses={"matlab": 1}, **A100) for i in range(5)]
    for limit in (10, 0):
        jobs = by_job(plan_for(tmp_path / str(limit), docs, time_limit=limit))
        running = sorted(n for n, j in jobs.items() if j.instances)
        assert len(running) == 2, (limit, running)
        waiting = [j for j in jobs.values() if not j.instances]
        assert all(j.reason.startswith(f"license matlab: 2/2 held, by {running[0]}, {running[1]}; the job needs 1") for j in waiting), \
            [j.reason for j in waiting]


def test_a_gang_holds_a_license_per_replica_and_never_runs_over_the_count(tmp_path):
    """A 3-replica gang needs 3 of 2 licenses: it never runs, and the reason says the count is too small."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=8), license_doc(count=2), job("gang", replicas=3, licenses={"matlab": 1}, **A100),
            job("solo", licenses={"matlab": 2}, **A100)]
    jobs = by_job(plan_for(tmp_path, docs))
    assert jobs["gang"].action == "pending" and jobs["solo"].action == "place"
    assert jobs["gang"].reason.startswith("license matlab: the job needs 3 but its count is 2")


def test_license_tenant_quotas_are_exact(tmp_path):
    """Count 3, research may hold 1: research runs one job, product two, though research's jobs rank higher."""
    docs = [topology(), tenant("research"), tenant("product"), one_gpu_pool(hi=8), license_doc(count=3, tenant_quotas={"research": 1})]
    docs += [job(f"r{i}", tenant="research", priority="high", licenses={"matlab": 1}, **A100) for i in range(3)]
    docs += [job(f"p{i}", tenant="product", priority="low", licenses={"matlab": 1}, **A100) for i in range(3)]
    for limit in (10, 0):
        plan = plan_for(tmp_path / str(limit), docs, time_limit=limit)
        running = [j.tenant for j in plan.jobs if j.instances]
        assert (running.count("research"), running.count("product")) == (1, 2), limit
        r = next(j for j in plan.jobs if j.tenant == "research" and not j.instances)
        assert r.reason.startswith("license matlab: tenant research holds 1/1 of its quota, by r"), r.reason


def test_a_higher_class_takes_the_license_of_the_lowest_priority_holder_when_preemption_allows(tmp_path):
    """One license, held by a low and a normal job on two GPUs (count 2); a critical job arrives
    with GPUs to spare: the low holder is evicted (not the normal one) and told why. Under
    `preemption: Never` both holders keep it and the critical job waits, naming them."""
    docs = [topology(), tenant("t"), one_gpu_pool(hi=3), license_doc(count=2),
            job("low", priority="low", licenses={"matlab": 1}, **A100), job("normal", licenses={"matlab": 1}, **A100),
            job("crit", priority="critical", licenses={"matlab": 1}, **A100)]
    insts, running = [gcp_1g("i0"), gcp_1g("i1")], {"low": ("i0",), "normal": ("i1",)}
    jobs = by_job(plan_for(tmp_path / "pre", docs, insts, running))
    assert jobs["crit"].instances and jobs["normal"].action == "keep"
    assert jobs["low"].action == "evict" and jobs["low"].reason.startswith("evicted: license matlab: 2/2 held, by normal, crit")
    jobs = by_job(plan_for(tmp_path / "never", docs + [placement(preemption="Never")], insts, running))
    assert jobs["low"].action == jobs["normal"].action == "keep"
    assert jobs["crit"].action == "pending" and jobs["crit"].reason.startswith("license matlab: 2/2 held, by low, normal")



def test_a_license_count_lowered_to_zero_stops_its_holders_and_every_plan_is_emitted(tmp_path):
    """License sim lowered to 0 under two holders on one g5.12xlarge (a pool at max 1): t3's j1 (2 of it) and t1's
    guaranteed low j3 (1), while t3 asks for a critical 4-GPU j6 there. Neither holder can run anywhere, so both stop
    and j6 takes the instance. Apply's re-check weighed j3's stop with j1 put back in its room (guaranteed work of
    t3's that t3's higher class took): the license broken with j1 there, keeping j3 broke "no rule the plan keeps", and
    every plan was refused ("internal error: the plan would stop running work that no rule requires stopping"; the h7
    hunt, reduced from a random fleet). A job that alone holds more of a License than its count, or its tenant's quota
    of it, cannot stay anywhere now (ledger.jobs_that_must_leave)."""
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem

    docs = [topology(), tenant("t1", gpus=2), tenant("t3", gpus=5),
            pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], hi=1), doc("License", "sim", {"count": 0}),
            job("j1", tenant="t3", gpus=1, gpu_type="A10G", cpu=4, mem=16, licenses={"sim": 2}),
            job("j3", tenant="t1", gpus=1, gpu_type="A10G", cpu=4, mem=16, priority="low", licenses={"sim": 1}),
            job("j6", tenant="t3", gpus=4, gpu_type="A10G", cpu=40, mem=160, priority="critical")]
    insts, running = [instance("i0", "a10g", "aws", "us-east-1", "us-east-1a", "g5.12xlarge")], {"j1": ("i0",), "j3": ("i0",)}
    desired = load(write_config(tmp_path / "cfg", docs))
    observed = replace(catalog_observed(desired, insts, running), gpu_indices={"j1": ((0,),), "j3": ((1,),)})
    problem = build_problem(desired, observed)
    for limit in (5, 0):
        plan, _ = api.emitted(desired, observed, problem, limit)
        assert {j.job: j.action for j in plan.jobs} == {"j1": "evict", "j3": "evict", "j6": "place"}, (limit, plan.jobs)
        assert recheck(plan, desired, observed, build_problem(desired, observed))[1] == [], limit


@pytest.mark.parametrize("lowered", ["license", "pool"])
def test_a_rule_lowered_below_what_runs_stops_one_guaranteed_job_and_the_recheck_takes_that_stop_not_two(tmp_path, lowered):
    """Tenants t and u each run one guaranteed 1-GPU job on its own a2-highgpu-1g; then a license count (or the pool's
    max_instances) is lowered from 2 to 1. Something must give: both planners stop one of them, and apply's re-check
    takes it, because keeping it breaks the rule the plan keeps. An edited plan stopping both is refused: keeping
    either breaks no rule (while a fleet-wide rule was broken, the re-check took any stop)."""
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed

    docs = [topology(), tenant("t", gpus=1), tenant("u", gpus=1), one_gpu_pool(hi=1 if lowered == "pool" else 2),
            license_doc(count=1 if lowered == "license" else 2),
            job("a", tenant="t", licenses={"matlab": 1}, **A100), job("b", tenant="u", licenses={"matlab": 1}, **A100)]
    insts, running = [gcp_1g("i0"), gcp_1g("i1")], {"a": ("i0",), "b": ("i1",)}
    for limit in (5, 0):
        plan = plan_for(tmp_path / str(limit), docs, insts, running, time_limit=limit)
        assert sorted(j.action for j in plan.jobs) == ["evict", "keep"], (limit, plan.jobs)
        desired = load(tmp_path / str(limit))
        observed = catalog_observed(desired, insts, running)
        problem = build_problem(desired, observed)
        assert recheck(plan, desired, observed, problem)[1] == [], limit
        both = replace(plan, jobs=tuple(replace(j, action="evict", instances=(), gpus=()) for j in plan.jobs))
        if lowered == "pool":  # (the instance the stop frees goes too, as the planner's plan deletes it)
            assert len(plan.deletes) == 1
        errors = recheck(both, desired, observed, problem)[1]
        kept = next(j.job for j in plan.jobs if j.action == "keep")
        assert any(e.startswith(f"job {kept}: evicted, but it runs inside tenant") and "the plan with it kept where it runs" in e
                   for e in errors), errors


def test_license_hours_are_charged_to_the_tenant_in_plan_status_and_explain(tmp_path):
    """$1.20 per license-hour: the plan, status/ and `reconcile status` say who holds how many at
    what cost; `explain` of the waiting job proves that one more license would run it."""
    from reconciler.render import render_status

    cfg = write_config(tmp_path / "cfg", [topology(), tenant("t"), tenant("u"), one_gpu_pool(hi=4),
                                          license_doc(count=2, cost_per_hour=1.2),
                                          job("a", licenses={"matlab": 1}, **A100), job("b", tenant="u", licenses={"matlab": 1}, **A100),
                                          job("c", priority="low", licenses={"matlab": 1}, **A100)])
    plan = api.plan(cfg, time_limit=5).plan
    assert plan.rules["licenses"]["matlab"] == {"count": 2, "held": 2, "tenants": {"t": 1, "u": 1}, "cost_per_hour": 2.4}
    assert "License matlab: 2/2 held (t 1, u 1), $2.40/h charged to their tenants" in render_human(plan, width=400)
    ex = api.explain(cfg, "c", time_limit=5)
    assert ex.summary.startswith("pending: license matlab: 2/2 held, by a, b; the job needs 1")
    assert any(w.startswith("raise License matlab count by 1 (to 3): it would run") for w in ex.would_change), ex.would_change
    api.apply(cfg, time_limit=5)
    st = api.read_status(cfg)
    fleet = st["fleet"]["status"]
    assert fleet["tenants"]["t"]["licenseCostPerHour"] == 1.2 and fleet["tenants"]["u"]["licenseCostPerHour"] == 1.2
    assert fleet["licenses"]["matlab"] == {"count": 2, "held": 2, "tenants": {"t": 1, "u": 1}}
    assert st["jobs"]["a"]["status"]["licenseCostPerHour"] == 1.2
    text = render_status(st)
    assert "tenant t: $3.67/h + $1.20/h of licenses" in text and "license matlab: 2/2 held (t 1, u 1)" in text
    prom = (cfg / "status" / "metrics.prom").read_text()  # chargeback: the same figure for Prometheus
    assert 'fleetops_tenant_license_cost_dollars_per_hour{fleet="test",tenant="t"} 1.2' in prom


def test_license_references_are_validated_with_file_and_line(tmp_path):
    docs = [topology(), tenant("t"), one_gpu_pool(), license_doc(count=1, tenant_quotas={"nobody": 1}),
            job("j", licenses={"matlb": 1}, **A100)]
    text = load_errors(tmp_path, docs)
    assert "fleet.yaml:" in text
    assert "License/matlab: spec.tenant_quotas.nobody: unknown tenant 'nobody'" in text
    assert "Job/j: spec.licenses.matlb: unknown License 'matlb' (did you mean 'matlab'?)" in text


# ---------------------------------------------------------------- reserved capacity (issue 17)


def reservation_doc(name="r1", count=2, zone="us-east-1a", itype="p4d.24xlarge", hourly_cost=19.2, **spec):
    return doc("Reservation", name, {"cloud": "aws", "region": "us-east-1", "zone": zone, "instance_type": itype, "count": count,
                                     "hourly_cost": hourly_cost, **spec})


def _p4d_fleet(n_jobs: int, *extra):
    """8-GPU A100 jobs; a p4d pool (spot or on-demand) in two zones; spot there is far cheaper than on-demand."""
    return [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], market="either", hi=6),
            *extra] + [job(f"j{i}", gpus=8, gpu_type="A100", cpu=90, mem=1000) for i in range(n_jobs)]


def test_reserved_capacity_is_filled_first_at_no_marginal_cost(tmp_path):
    """Three 8-GPU jobs, a reservation of two p4d in us-east-1a: two jobs land on reserved instances
    (even though spot is cheaper, a reserved hour is already paid), the third on the cheapest offer;
    the reserved instances cost $0.00/h more and the plan says the reservation is fully used. Greedy agrees."""
    cat = load_catalog()
    spot = cat.offering("aws", "us-east-1", "us-east-1b", "p4d.24xlarge").spot_price
    for limit in (10, 0):
        plan = plan_for(tmp_path / str(limit), _p4d_fleet(3, reservation_doc()), time_limit=limit)
        reserved = [c for c in plan.creates if c.reservation == "r1"]
        assert len(reserved) == 2 and all((c.zone, c.market, c.price) == ("us-east-1a", "on-demand", 0.0) for c in reserved), limit
        assert len(plan.creates) == 3 and all(j.instances for j in plan.jobs)
        assert abs(plan.cost_after - min(c.price for c in plan.creates if not c.reservation)) < 1e-6 and plan.cost_after <= spot + 1e-6
        assert plan.rules["reservations"]["r1"] == {"pool": "p", "zone": "us-east-1a", "instance_type": "p4d.24xlarge", "count": 2,
                                                    "used": 2, "utilisation": 1.0, "committed_per_hour": 38.4, "wasted_per_hour": 0.0,
                                                    "until": None}


def test_unused_reserved_hours_are_shown_as_waste(tmp_path):
    """One job, a reservation of two: one reserved instance runs it, the other is idle (no instance is
    bought to stand idle), and the plan prices the idle reserved hour as waste."""
    plan = plan_for(tmp_path, _p4d_fleet(1, reservation_doc()))
    assert [c.reservation for c in plan.creates] == ["r1"]
    r = plan.rules["reservations"]["r1"]
    assert (r["used"], r["wasted_per_hour"]) == (1, 19.2)
    text = render_human(plan, width=400)
    assert "Reservation r1: 1/2 p4d.24xlarge in us-east-1a used (50%), $38.40/h committed (not in the $/h above); 1 unused waste $19.20/h" in text
    assert "on-demand (reserved: r1)" in text


def test_a_reservation_its_kept_instance_fills_takes_no_new_one(tmp_path):
    """A reservation of one p4d, held by the running instance j0 runs on: j1 (8 GPUs) gets an instance of its own,
    not a second one in the reservation. The reservation's offer is sized to its whole count now (a plan may delete
    a holder and launch into it: fleet66), so the count of kept and new instances is a rule of the model's
    (fleet_rules.add_reservations), of greedy's ledger (Ledger.open_rules) and of the packer's; each of them alone
    put j1 in the full reservation at $0."""
    held = instance("i-r", "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
    held = replace(held, tags={**held.tags, "fleetops.io/reservation": "r1"})
    for limit in (10, 0):  # CP-SAT's plan, and greedy's
        plan = plan_for(tmp_path / str(limit), _p4d_fleet(2, reservation_doc(count=1)), [held], {"j0": ("i-r",)}, time_limit=limit)
        jobs = by_job(plan)
        assert jobs["j0"].instances == ("i-r",) and not plan.deletes, limit
        assert [c.reservation for c in plan.creates] == [None] and jobs["j1"].instances == (plan.creates[0].ref,), limit
        assert plan.rules["reservations"]["r1"]["used"] == 1, limit


def test_an_expired_reservation_is_not_planned_on(tmp_path):
    now = datetime(2027, 2, 1, tzinfo=timezone.utc)
    plan = plan_for(tmp_path, _p4d_fleet(1, reservation_doc(until=date(2027, 1, 1))), now=now)
    assert [c.reservation for c in plan.creates] == [None] and "reservations" not in plan.rules


def test_reserved_instances_stay_reserved_across_applies_and_status_shows_use(tmp_path):
    """Applied on the simulated cloud, the reserved instance carries the reservation's tag; the next
    plan prices it at $0 and changes nothing; status/ reports utilisation and the waste."""
    cfg = write_config(tmp_path / "cfg", _p4d_fleet(1, reservation_doc()))
    res = api.apply(cfg, time_limit=5)
    assert res.report.ok and [c.reservation for c in res.plan.creates] == ["r1"]
    again = api.plan(cfg, time_limit=5).plan
    assert not again.has_changes and again.cost_after == 0.0 and again.rules["reservations"]["r1"]["used"] == 1
    fleet = api.read_status(cfg)["fleet"]["status"]
    assert fleet["reservations"]["r1"] == {"count": 2, "used": 1, "utilisation": 0.5, "committedPerHour": 38.4, "wastedPerHour": 19.2}
    from reconciler.render import render_status
    assert "reservation r1: 1/2 used, $38.40/h committed, $19.20/h wasted on unused reserved instances" in render_status(api.read_status(cfg))


def test_a_reservation_must_name_capacity_a_pool_can_hold(tmp_path):
    two = pool("q", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1)
    docs = _p4d_fleet(0, two, reservation_doc("ambiguous"), reservation_doc("nowhere", zone="us-east-1b", itype="g5.xlarge"),
                      reservation_doc("bad-id", pool="q", target={"reservation_id": "r-123"}))
    text = load_errors(tmp_path, docs)
    assert "Reservation/ambiguous: spec.pool: pools p, q all match (aws/us-east-1a p4d.24xlarge, on-demand): set spec.pool" in text
    assert "Reservation/nowhere: spec.zone: no pool matches" in text
    assert "Reservation/bad-id: spec.target.reservation_id: an AWS capacity reservation id starts with 'cr-'" in text



def test_a_gcp_or_azure_reservation_target_the_cloud_cannot_take_is_refused_at_load(tmp_path):
    """Only an AWS target's form was checked: a GCE reservation value GCE refuses (uppercase, '_', a path other than
    projects/P/reservations/NAME) or an Azure target that is no capacity reservation group planned the instances at
    $0 reserved and failed at apply, in the cloud. Each is refused where it is written."""
    gcp = pool("g", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=2)
    az = pool("z", "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"], hi=2)

    def res(name, cloud, region, zone, itype, rid):
        return doc("Reservation", name, {"cloud": cloud, "region": region, "zone": zone, "instance_type": itype, "count": 1,
                                         "hourly_cost": 1.0, "target": {"reservation_id": rid}})

    g = ("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")
    a = ("azure", "eastus", "eastus-1", "Standard_NC24ads_A100_v4")
    bad = {"g-upper": (*g, "My-Reservation"), "g-underscore": (*g, "my_reservation"),
           "g-path": (*g, "projects/p1/zones/us-central1-a/reservations/r1"),
           "a-other": (*a, "subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/hostGroups/h1"),
           "a-colon": (*a, "group:1")}
    good = {"g-name": (*g, "r1"), "g-shared": (*g, "projects/other-project/reservations/r1"),
            "a-name": (*a, "crg-1"), "a-id": (*a, "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/capacityReservationGroups/crg-1")}
    docs = [topology(), tenant("t"), gcp, az] + [res(n, *v) for n, v in {**bad, **good}.items()]
    text = load_errors(tmp_path, docs)
    for name in bad:
        assert f"Reservation/{name}: spec.target.reservation_id:" in text, (name, text)
    for name in good:
        assert f"Reservation/{name}:" not in text, (name, text)


# ---------------------------------------------------------------- deadlines (issue 17)

NOW = datetime(2026, 11, 20, tzinfo=timezone.utc)


def due(hours_from_now: float, expected: float = 10.0) -> dict:
    return {"deadline": NOW + timedelta(hours=hours_from_now), "expected_hours": expected}


def test_deadline_work_ranks_above_its_class_and_the_closest_deadline_first(tmp_path):
    """One GPU: of three normal jobs the one due soonest runs; with two GPUs both deadline jobs run and the
    one without waits. A critical job without a deadline still outranks them all. Greedy agrees."""
    base = [topology(), tenant("t"), job("plain", **A100), job("later", **A100, **due(300)), job("soon", **A100, **due(40))]
    for limit in (10, 0):
        one = by_job(plan_for(tmp_path / f"one{limit}", base + [one_gpu_pool(hi=1)], now=NOW, time_limit=limit))
        assert [n for n, j in one.items() if j.instances] == ["soon"], limit
        two = by_job(plan_for(tmp_path / f"two{limit}", base + [one_gpu_pool(hi=2)], now=NOW, time_limit=limit))
        assert sorted(n for n, j in two.items() if j.instances) == ["later", "soon"], limit
        crit = by_job(plan_for(tmp_path / f"crit{limit}", base + [one_gpu_pool(hi=1), job("crit", priority="critical", **A100)],
                               now=NOW, time_limit=limit))
        assert [n for n, j in crit.items() if j.instances] == ["crit"], limit


def test_deadline_conditions_are_flagged_in_the_plan_and_the_pr_comment(tmp_path):
    """A job that can no longer finish is DeadlineMissed (and ranks as its class); one this plan cannot run but
    that could still finish is DeadlineAtRisk; one that runs is on track."""
    from reconciler.render import render_markdown

    docs = [topology(), tenant("t"), one_gpu_pool(hi=1), job("late", priority="high", **A100, **due(5)),
            job("waits", **A100, **due(100)), job("runs", **A100, **due(50))]
    plan = plan_for(tmp_path, docs, now=NOW)
    jobs = by_job(plan)
    dl = plan.rules["deadlines"]
    assert dl["late"]["condition"] == "DeadlineMissed" and dl["late"]["message"].startswith("cannot finish by 2026-11-20T05:00:00+00:00")
    placed = [n for n, j in jobs.items() if j.instances]
    assert placed == ["late"]  # high beats normal, deadline or not
    assert dl["waits"]["condition"] == dl["runs"]["condition"] == "DeadlineAtRisk"
    assert dl["runs"]["start_by"] == "2026-11-21T16:00:00+00:00"
    md = render_markdown(plan)
    assert "- DeadlineMissed: job late cannot finish by 2026-11-20T05:00:00+00:00" in md
    assert "- DeadlineAtRisk: job runs not running in this plan; it must start by 2026-11-21T16:00:00+00:00" in md
    assert "DeadlineAtRisk: job waits" in render_human(plan, width=400)


def test_deadline_critical_work_may_use_the_on_demand_buffer(tmp_path):
    """A 100% on-demand buffer keeps the idle on-demand GPU beside the spot one: a new on-demand-only job waits
    for it; due within its expected hours, it takes that GPU."""
    docs = [topology(), tenant("t"), one_gpu_pool("od", hi=1), one_gpu_pool("sp", hi=1, market="spot"),
            doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 100}), job("train", spot="required", **A100)]
    insts = [gcp_1g("s0", "spot", "sp"), gcp_1g("o0", "on-demand", "od")]
    running = {"train": ("s0",)}
    plain = by_job(plan_for(tmp_path / "plain", docs + [job("new", spot="never", **A100)], insts, running, now=NOW))
    assert plain["new"].action == "pending" and "on-demand buffer" in plain["new"].reason
    for limit in (10, 0):
        urgent = by_job(plan_for(tmp_path / f"urgent{limit}", docs + [job("new", spot="never", **A100, **due(15))], insts, running,
                                 now=NOW, time_limit=limit))
        assert urgent["new"].instances == ("o0",), limit
        assert urgent["train"].action == "keep", limit  # greedy keeps it too
    relaxed = by_job(plan_for(tmp_path / "relaxed", docs + [job("new", spot="never", **A100, **due(500))], insts, running, now=NOW))
    assert relaxed["new"].action == "pending"  # a deadline far off is no reason to give up the buffer


def test_deadline_conditions_reach_status_and_explain(tmp_path):
    """After an apply, status/ carries DeadlineAtRisk for the job the plan could not run; explain says when it must start."""
    far = datetime.now(timezone.utc) + timedelta(days=60)
    cfg = write_config(tmp_path / "cfg", [topology(), tenant("t"), one_gpu_pool(hi=1),
                                          job("a", **A100, deadline=far, expected_hours=10), job("b", **A100, deadline=far + timedelta(days=1))])
    api.apply(cfg, time_limit=5)
    st = api.read_status(cfg)["jobs"]
    conds = {c["type"]: c for c in st["b"]["status"]["conditions"]}
    assert conds["DeadlineAtRisk"]["status"] == "True" and conds["DeadlineMissed"]["status"] == "False"
    assert {c["type"]: c["status"] for c in st["a"]["status"]["conditions"]}["DeadlineAtRisk"] == "False"
    ex = api.explain(cfg, "b", time_limit=5)
    assert any(x.startswith("deadline ") and "DeadlineAtRisk: not running in this plan" in x for x in ex.details), ex.details


def test_the_benchmark_config_with_rules_plans_every_rule(tmp_path):
    """bench.generate --rules (licenses, reservations, deadlines on a generated fleet) plans, and the plan keeps every
    rule (the oracle), holds licenses, fills its reservations and flags deadlines. 20 jobs have all three (50 did too, at
    5.2 s of CPU to 20's 1.1 s)."""
    from dataclasses import replace as dc_replace

    from bench.generate import generate
    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed
    from tests.invariants import check_plan

    now = datetime(2026, 11, 25, tzinfo=timezone.utc)
    desired = load(generate(tmp_path / "b", 20, seed=3, rules=True))
    assert desired.licenses and desired.reservations and any(j.spec.deadline for j in desired.jobs.values())
    observed = dc_replace(catalog_observed(desired), gpu_indices={})
    problem = build_problem(desired, observed, now=now)
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=3))
    check_plan(desired, observed, plan, now=now)
    rules = plan.rules
    assert sum(lic["held"] for lic in rules["licenses"].values()) > 0
    assert sum(r["used"] for r in rules["reservations"].values()) > 0
    assert rules["deadlines"]


def test_a_job_waiting_while_the_reservation_is_full_is_told_so(tmp_path):
    """A reservation of one p4d runs one 8-GPU job; a $10/h budget keeps a second p4d from being bought. The second
    job's reason names the full reservation and the budget (it claimed that another reserved instance, at $0, would
    hold it under every rule)."""
    docs = _p4d_fleet(2, reservation_doc(count=1), doc("GuardrailPolicy", "g", {"max_hourly_budget": 10.0}))
    jobs = by_job(plan_for(tmp_path, docs))
    waiting = [j for j in jobs.values() if not j.instances]
    assert len(waiting) == 1
    assert waiting[0].reason.startswith("reservation r1 is fully used in this plan (1/1 p4d.24xlarge in us-east-1a); "
                                        "other capacity is blocked by max_hourly_budget"), waiting[0].reason


def test_the_greedy_fallback_counts_an_on_demand_mig_gpu_as_the_buffer_does(tmp_path):
    """A 50% on-demand buffer beside one spot GPU: the on-demand MIG instance, one slice of seven in use, has 6/7
    of a GPU idle, as the model and the ledger count it (ledger.buffer_use). Greedy (the fallback, time_limit=0)
    counted a MIG instance's idle GPUs as 0 (its free 'gpus', which MIG capacity never has), saw the buffer
    broken and gave up the spot host: the running training job was stopped for a rule the fleet keeps."""
    docs = [topology(), tenant("t"), _mig_pool("mig", ["1g.10gb"] * 7), one_gpu_pool(hi=1, market="spot"),
            doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 50}),
            _mig_job("inference", "1g.10gb", spot="never"), job("train", **A100)]
    fleet = [instance("i-mig", "mig", "azure", "eastus", "eastus-1", "Standard_NC24ads_A100_v4"), gcp_1g("i-spot", market="spot")]
    running = {"inference": ("i-mig",), "train": ("i-spot",)}
    for limit in (0, 10):  # greedy's plan, and CP-SAT's
        jobs = by_job(plan_for(tmp_path / str(limit), docs, fleet, running, time_limit=limit))
        assert jobs["train"].instances == ("i-spot",) and jobs["train"].action != "evict", (limit, jobs["train"])
        assert jobs["inference"].instances == ("i-mig",)


def test_the_greedy_fallback_leaves_running_deadline_critical_work_out_of_the_buffer(tmp_path):
    """A 100% buffer beside one spot GPU, and deadline-critical work running on the one on-demand GPU: the model and
    the ledger count that GPU as the buffer's (deadline-critical work may use it, ledger.buffer_use). Greedy counted
    it taken, saw the buffer broken and gave up the spot host, stopping the training job running there."""
    docs = [topology(), tenant("t"), one_gpu_pool("od", hi=1), one_gpu_pool("sp", hi=1, market="spot"),
            doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 100}), job("train", spot="required", **A100),
            job("urgent", spot="never", **A100, **due(15))]
    insts = [gcp_1g("s0", "spot", "sp"), gcp_1g("o0", "on-demand", "od")]
    for limit in (0, 10):
        jobs = by_job(plan_for(tmp_path / str(limit), docs, insts, {"train": ("s0",), "urgent": ("o0",)}, now=NOW, time_limit=limit))
        assert jobs["train"].instances == ("s0",) and jobs["urgent"].instances == ("o0",), (limit, jobs)


def test_an_instance_gang_running_split_that_cannot_regroup_is_evicted_and_apply_accepts_it(tmp_path):
    """The 2 x 4-GPU `gang: instance` tp runs split over i0 and i1, each full with 1-GPU jobs of tp's own class beside
    it, the pool at max 2, and the eight 14-vCPU jobs do not fit on one p4d: tp cannot regroup, and greedy's plan
    stops it. Its tenant has no quota, so all it runs was counted inside its guarantee, tp too (a same-instance gang
    is one item, `d.gang` false, so the split was not seen), and apply's re-check refused the plan: 'evicted, but it
    runs inside tenant t's guarantee'. A gang that must move whole is new work, and the re-check knows it cannot
    stay (gang_split, one test for both). CP-SAT's answer: the next test."""
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed

    desired = load(write_config(tmp_path, split_instance_gang_docs()))
    observed = replace(catalog_observed(desired, *SPLIT_INSTANCE_GANG[:2]), gpu_indices=SPLIT_INSTANCE_GANG[2])
    problem = build_problem(desired, observed)
    assert problem.tenants["t"].protected_jobs == tuple(f"f{k}" for k in range(8))
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=0))
    assert by_job(plan)["tp"].action == "evict" and not plan.creates
    assert recheck(plan, desired, observed, problem)[1] == []


def test_a_whole_instance_item_leaves_none_of_its_instance_to_others(tmp_path):
    """The same fleet, CP-SAT: it replaced both p4d by two new ones for tp (8 GPUs, 80 vCPU) and the eight 1-GPU jobs
    (8 GPUs, 112 vCPU), 16 GPUs and 192 vCPU in all, which the rows per dimension allow, but tp takes a whole p4d and
    the eight need 112 vCPU of the other's 96. The packer dropped f6 and f7, inside t's guarantee, and apply's
    re-check refused the plan (a way a plan takes a guarantee: 'job f6: evicted, but it runs inside tenant t's
    guarantee'). The offer's two new instances now have rows each (solve/slots.py: at most SLOTS_MOST of them), so the
    model sees that tp and the eight do not pack: tp stops and f0-f7 stay."""
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed
    from tests.invariants import check_stability

    plan = plan_for(tmp_path, split_instance_gang_docs(), *SPLIT_INSTANCE_GANG[:2], time_limit=5, workers=1,
                    gpu_indices=SPLIT_INSTANCE_GANG[2])  # (checks every rule: check_plan)
    jobs = by_job(plan)
    assert jobs["tp"].action == "evict" and all(jobs[f"f{k}"].action == "keep" for k in range(8)), plan.jobs
    desired = load(tmp_path)
    observed = replace(catalog_observed(desired, *SPLIT_INSTANCE_GANG[:2]), gpu_indices=SPLIT_INSTANCE_GANG[2])
    check_stability(desired, observed, plan)
    assert recheck(plan, desired, observed, build_problem(desired, observed))[1] == []


def split_instance_gang_docs() -> list[dict]:
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=2),
            job("tp", gpus=4, gpu_type="A100", cpu=40, mem=300, replicas=2, gang="instance")]
    return docs + [job(f"f{k}", gpus=1, gpu_type="A100", cpu=14, mem=60) for k in range(8)]  # (8 x 14 vCPU: more than one p4d)


SPLIT_INSTANCE_GANG = ([instance(i, "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge") for i in ("i0", "i1")],
                       {"tp": ("i0", "i1")} | {f"f{k}": ("i0" if k < 4 else "i1",) for k in range(8)},
                       {"tp": ((0, 1, 2, 3), (0, 1, 2, 3))} | {f"f{k}": ((4 + k % 4,),) for k in range(8)})


def test_a_full_reservation_says_how_many_more_of_it_a_gang_needs(tmp_path):
    """Found by the random hunt: "reservation r1 is fully used in this plan (1/1 ...)", the job a 2-replica gang whose
    only way (a $10/h budget leaves no other p4d) is 2 new reserved instances: raised by one, it stayed pending. The
    reason says how many more of the reservation the way needs, and raised by that, the job runs."""
    import re

    gang = job("g", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2, gang="zone")

    def waiting(count: int) -> list:
        docs = _p4d_fleet(1, reservation_doc(count=count), doc("GuardrailPolicy", "g", {"max_hourly_budget": 10.0}), gang)
        return [j for j in by_job(plan_for(tmp_path / str(count), docs)).values() if not j.instances]

    before = waiting(1)
    assert [j.job for j in before] == ["g"], before
    m = re.match(r"reservation r1 is fully used in this plan \(1/1 p4d.24xlarge in us-east-1a\); the job needs (\d+) more of it",
                 before[0].reason)
    assert m, before[0].reason
    assert waiting(1 + int(m.group(1))) == []
