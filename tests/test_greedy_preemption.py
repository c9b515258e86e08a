"""Greedy takes a lower class's place inside its own tenant's quota, as the model's tiers rank it (README: a higher
class may evict a lower one of its tenant, the same class never): where the quota alone refuses a job, the tenant's
running jobs of a lower class stop, lowest class first, then the least work and the least time left.

Found on an applied 5k-job fleet (bench.pr_plan): a PR added a normal 1-GPU job to a tenant at its GPU quota, greedy
left it pending, the guaranteed normal work tier's LP bound was one job more, and CP-SAT spent its whole work limit
without the eviction (10.7 s of CPU, the tier unproven, the job pending); with 120 s it found it. With greedy's warm
start at the bound, every tier is held: 5.6 s, the job placed, one low job of its tenant stopped."""

from __future__ import annotations

import pytest

from tests.fleetkit import doc, instance, job, plan_for, pool, topology
from tests.invariants import check_plan, check_stability

A100 = {"gpus": 1, "gpu_type": "A100", "cpu": 8, "mem": 60}


def docs(preemption: str = "LowerPriority", quota: int = 2) -> list[dict]:
    return [topology(), doc("Tenant", "t", {"quota": {"gpus": quota}}), doc("Tenant", "u", {}),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=4),
            doc("PlacementPolicy", "pp", {"preemption": preemption}),
            job("low-a", "t", priority="low", expected_hours=72, **A100),
            job("low-b", "t", priority="low", expected_hours=4, **A100),
            job("theirs", "u", priority="low", **A100),
            job("new", "t", priority="normal", **A100)]


FLEET = [instance(f"i{k}", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g") for k in range(3)]
RUNNING = {"low-a": ("i0",), "low-b": ("i1",), "theirs": ("i2",)}


def by_job(plan) -> dict:
    return {j.job: j for j in plan.jobs}


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_a_higher_class_takes_its_own_tenants_lower_job_when_the_quota_alone_refuses_it(tmp_path, time_limit):
    """t (2 GPUs) runs two low jobs; its new normal job fits only in their quota. Greedy (--time-limit 0) left it
    pending on the quota; now it stops the low job with the least time left (low-b: 4 h) and places it, and the
    other tenant's job is untouched. CP-SAT's warm start is then at every tier's bound: each is held."""
    plan = plan_for(tmp_path / "p", docs(), FLEET, RUNNING, time_limit=time_limit)
    jobs = by_job(plan)
    assert jobs["new"].action == "place" and jobs["low-b"].action == "evict", {k: v.action for k, v in jobs.items()}
    assert jobs["low-a"].action == "keep" and jobs["theirs"].action == "keep"
    assert jobs["low-b"].reason.endswith("quota exhausted: tenant t uses 2/2 GPUs in this plan, the job needs 1 more "
                                         "(its tenant's quota goes to its higher-priority work first: new)"), jobs["low-b"].reason
    if time_limit:
        assert all(t["status"] == "HELD" for t in plan.solver.tiers if "normal" in t["name"]), plan.solver.tiers
    from reconciler.load import load
    from tests.fleetkit import catalog_observed
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, FLEET, RUNNING)
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)


def test_greedy_stops_no_running_job_under_preemption_never(tmp_path):
    plan = plan_for(tmp_path / "p", docs("Never"), FLEET, RUNNING, time_limit=0)
    jobs = by_job(plan)
    assert jobs["new"].action == "pending" and "quota" in jobs["new"].reason
    assert {jobs[j].action for j in RUNNING} == {"keep"}


def test_greedy_stops_nothing_when_the_stopped_jobs_could_not_make_room(tmp_path):
    """A 2-GPU normal job needs 2 GPUs of quota; stopping both low jobs frees them, but the pool (max 3, all running)
    has no instance with 2 GPUs: nothing is stopped for a job that is not placed (the undo)."""
    two = [d for d in docs() if d["metadata"]["name"] != "new"]
    two.append(job("new", "t", priority="normal", gpus=2, gpu_type="A100", cpu=16, mem=120))
    plan = plan_for(tmp_path / "p", two, FLEET, RUNNING, time_limit=0)
    jobs = by_job(plan)
    assert jobs["new"].action == "pending"
    assert {jobs[j].action for j in RUNNING} == {"keep"}


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_a_gang_of_a_higher_class_takes_its_own_tenants_lower_jobs_quota(tmp_path, time_limit):
    """A normal 2-replica gang of t (quota 2 GPUs, both used by its low jobs): greedy stops both low jobs, not the other
    tenant's, and places the gang whole."""
    gang = [d for d in docs() if d["metadata"]["name"] != "new"]
    gang.append(job("new", "t", priority="normal", replicas=2, gang="zone", **A100))
    plan = plan_for(tmp_path / "p", gang, FLEET, RUNNING, time_limit=time_limit)
    jobs = by_job(plan)
    assert jobs["new"].action == "place" and len(jobs["new"].instances) == 2, {k: (v.action, v.reason) for k, v in jobs.items()}
    assert (jobs["low-a"].action, jobs["low-b"].action, jobs["theirs"].action) == ("evict", "evict", "keep")


# ---------------------------------------------------------------- no room left (capacity, not quota)


def full_pool_docs(preemption: str = "LowerPriority", new_priority: str = "normal") -> list[dict]:
    """t (4 GPUs guaranteed) runs two low jobs, u (1 GPU guaranteed) one; the pool's 3 instances are all it may have."""
    return [topology(), doc("Tenant", "t", {"quota": {"gpus": 4}}), doc("Tenant", "u", {"quota": {"gpus": 1}}),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=3),
            doc("PlacementPolicy", "pp", {"preemption": preemption}),
            job("low-a", "t", priority="low", expected_hours=72, **A100),
            job("low-b", "t", priority="low", expected_hours=4, **A100),
            job("theirs", "u", priority="low", **A100),
            job("new", "t", priority=new_priority, **A100)]


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_a_higher_class_takes_its_own_tenants_lower_jobs_room_when_no_capacity_is_left(tmp_path, time_limit):
    """The pool is at its max, t's quota has room: t's new normal job takes the room of its low job with the least time
    left (low-b, 4 h), on low-b's instance; u's guaranteed job is not touched. Greedy (--time-limit 0) stopped a lower
    job only for its tenant's quota and left the job pending on "pools at max_instances"."""
    plan = plan_for(tmp_path / "p", full_pool_docs(), FLEET, RUNNING, time_limit=time_limit)
    jobs = by_job(plan)
    assert jobs["new"].instances == ("i1",) and jobs["low-b"].action == "evict", {k: (v.action, v.reason) for k, v in jobs.items()}
    assert jobs["low-a"].action == jobs["theirs"].action == "keep"
    assert "higher-priority work first: new" in jobs["low-b"].reason
    from reconciler.load import load
    from tests.fleetkit import catalog_observed
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, FLEET, RUNNING)
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)


@pytest.mark.parametrize("preemption,new_priority", [("Never", "normal"), ("LowerPriority", "low")], ids=["never", "same-class"])
def test_greedy_takes_no_room_under_preemption_never_nor_for_its_own_class(tmp_path, preemption, new_priority):
    plan = plan_for(tmp_path / "p", full_pool_docs(preemption, new_priority), FLEET, RUNNING, time_limit=0)
    jobs = by_job(plan)
    assert jobs["new"].action == "pending" and "max_instances" in jobs["new"].reason
    assert {jobs[j].action for j in RUNNING} == {"keep"}


def test_greedy_takes_no_room_a_job_cannot_use(tmp_path):
    """t's new 2-GPU normal job: stopping a low job frees one a2-highgpu-1g, never enough: nothing is stopped."""
    two = [d for d in full_pool_docs() if d["metadata"]["name"] != "new"]
    two.append(job("new", "t", priority="normal", gpus=2, gpu_type="A100", cpu=16, mem=120))
    plan = plan_for(tmp_path / "p", two, FLEET, RUNNING, time_limit=0)
    jobs = by_job(plan)
    assert jobs["new"].action == "pending"
    assert {jobs[j].action for j in RUNNING} == {"keep"}


def test_greedy_takes_a_lower_jobs_room_for_its_tenants_budget_only_where_the_higher_job_lands(tmp_path):
    """t ($5/h) runs its high job on i0, a $3.67/h a2-highgpu-1g (pool at max 1); u's job keeps a p4d open with room,
    where t's new critical job would cost $2.75/h: $6.42/h with the high job, over t's budget. Greedy stopped the high
    job to make room on i0, placed the critical job on the p4d (first fit, the budget's room being the stop's), then
    kept the high job again, unasked, as the critical job took none of i0's room: t at $6.42/h, a plan `apply --plan`
    refuses (fleet89). Planned with the freed room first, the critical job takes i0, and the high job stops for it."""
    docs = [topology(), doc("Tenant", "t", {}), doc("Tenant", "u", {}),
            pool("aws", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1),
            pool("gcp", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=1),
            doc("GuardrailPolicy", "g", {"tenant_hourly_budgets": {"t": 5.0}}),
            job("old", "t", priority="high", **A100), job("theirs", "u", priority="low", **A100),
            job("new", "t", priority="critical", **A100)]
    fleet = [instance("i0", "gcp", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g"),
             instance("i1", "aws", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")]
    running = {"old": ("i0",), "theirs": ("i1",)}
    plan = plan_for(tmp_path / "p", docs, fleet, running, time_limit=0)  # (check_plan: every tenant within its budget)
    jobs = by_job(plan)
    assert jobs["new"].instances == ("i0",) and jobs["old"].action == "evict", {k: (v.action, v.instances) for k, v in jobs.items()}
    assert jobs["theirs"].action == "keep"


@pytest.mark.parametrize("time_limit", [0, 10], ids=["greedy", "cp-sat"])
def test_a_new_job_identical_to_running_ones_takes_its_tenants_lower_jobs_room(tmp_path, time_limit):
    """One a2-highgpu-8g (pool at max 1) runs t's five low and three high 1-GPU jobs; t's new high job is identical to
    the running high ones, so the solver groups them in one demand. Greedy took that demand's running jobs for the one
    being placed (a running job that must move stands in for no protected job) and left the new job pending, "pools at
    max_instances (p 1/1)", where a distinct new job (4.5 vCPU) took a low job's room; CP-SAT placed it. Found on the
    openb sharing pods' day-2 replan (bench.openb_share_check: 11 high jobs so pending beside low ones). A placed job
    of a demand is one of its running ones first (`_running_kept`): past them, the job is new work and stands in."""
    one = {"gpus": 1, "gpu_type": "A100", "cpu": 4, "mem": 10}
    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 16}}),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=1),
            *[job(f"low{k}", "t", priority="low", **one) for k in range(5)],
            *[job(f"high{k}", "t", priority="high", **one) for k in range(3)], job("new", "t", priority="high", **one)]
    fleet = [instance("i0", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-8g")]
    running = {n["metadata"]["name"]: ("i0",) for n in docs if n["kind"] == "Job" and n["metadata"]["name"] != "new"}
    plan = plan_for(tmp_path / "p", docs, fleet, running, time_limit=time_limit)
    jobs = by_job(plan)
    assert jobs["new"].action == "place", {k: (v.action, v.reason) for k, v in jobs.items()}
    assert [k for k, v in jobs.items() if v.action == "evict"] == ["low4"]
    assert "(capacity goes to higher-priority work first: " in jobs["low4"].reason
    from reconciler.load import load
    from tests.fleetkit import catalog_observed
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, fleet, running)
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)


def test_greedy_stops_a_lower_job_of_the_mig_profile_that_is_short_not_others_first(tmp_path):
    """One a2-highgpu-8g partitioned [4g.20gb, 3g.20gb] (pool at max 1): t runs seven high and one low 4g.20gb jobs and
    eight low 3g.20gb ones; its new high 4g.20gb job needs the one 4g device a low job holds. Greedy stopped the low
    jobs smallest first, the 3g ones, which free no 4g device, spent more protected units than the new job stands in
    for, undid it all and left the job pending; the stop now skips jobs holding nothing it is short of: the low 4g job
    goes (bench.openb_share's day-2 replan: 7 high 4g jobs so pending)."""
    four = {"gpu_type": "A100", "mig": {"profile": "4g.20gb", "count": 1}, "cpu": 4, "memory_gib": 10}
    three = {"gpu_type": "A100", "mig": {"profile": "3g.20gb", "count": 1}, "cpu": 1, "memory_gib": 2}
    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 16}}),
            {**pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=1)},
            *[doc("Job", f"high{k}", {"tenant": "t", "priority": "high", "resources": dict(four, cpu=5)}) for k in range(7)],
            doc("Job", "low4g", {"tenant": "t", "priority": "low", "resources": four}),
            *[doc("Job", f"low3g-{k}", {"tenant": "t", "priority": "low", "resources": three}) for k in range(8)],
            doc("Job", "new", {"tenant": "t", "priority": "high", "resources": dict(four, cpu=6)})]
    docs[2]["spec"]["mig"] = ["4g.20gb", "3g.20gb"]
    fleet = [instance("i0", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-8g")]
    running = {d["metadata"]["name"]: ("i0",) for d in docs if d["kind"] == "Job" and d["metadata"]["name"] != "new"}
    plan = plan_for(tmp_path / "p", docs, fleet, running, time_limit=0)
    jobs = by_job(plan)
    assert jobs["new"].action == "place", {k: (v.action, v.reason) for k, v in jobs.items() if v.action != "keep"}
    assert [k for k, v in jobs.items() if v.action == "evict"] == ["low4g"]
    from reconciler.load import load
    from tests.fleetkit import catalog_observed
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, fleet, running)
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)




A10G = {"gpus": 1, "gpu_type": "A10G", "cpu": 4, "mem": 16}


def held_docs(theirs: str | int = "normal") -> tuple[list[dict], list, dict]:
    """fleet141's shape at five jobs: t (4 GPUs guaranteed) runs its low A100 job `mine` on a spot a2-highgpu-1g, the
    one slot of pool a100 (max 1), and asks for a normal 4-GPU A10G job `big`, which its guarantee cannot hold beside
    `mine`; u (no quota) runs its low A10G `other` on a spot g5.xlarge, the one slot of pool a10g (max 1), and asks for
    a low A10G `extra` and a normal A100 `theirs`. The fleet is all spot, over max_spot_fraction 0.25, and no on-demand
    capacity can be bought beside it (both pools at their max), so greedy gives up both spot hosts; `other` and
    `extra` then share a g5.12xlarge (no room left for `big`), and `mine` needs the a100 slot again (on-demand), as
    1 spot GPU of 5 would do too (CP-SAT keeps it on its spot host)."""
    both = {"market": "either", "hi": 1}
    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 4}}), doc("Tenant", "u", {}),
            pool("a100", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], **both),
            pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], **both),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.25}),
            job("mine", "t", priority="low", spot="eligible", **A100),
            job("big", "t", priority="normal", gpus=4, gpu_type="A10G", cpu=40, mem=160),
            job("other", "u", priority="low", spot="eligible", **A10G), job("extra", "u", priority="low", spot="eligible", **A10G),
            job("theirs", "u", priority=theirs, spot="eligible", **A100)]
    fleet = [instance("i0", "a100", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", market="spot"),
             instance("i1", "a10g", "aws", "us-east-1", "us-east-1a", "g5.xlarge", market="spot")]
    return docs, fleet, {"mine": ("i0",), "other": ("i1",)}


@pytest.mark.parametrize("theirs", ["normal", 50], ids=["after", "before"])
def test_a_protected_job_held_for_its_tenants_higher_class_that_finds_no_room_keeps_its_place(tmp_path, theirs):
    """`held_docs`. Greedy (--time-limit 0) held `mine` for `big` (greedy._may_take_place: t's guarantee cannot hold
    both) until `mine`'s own turn, low; `big` found no room (a10g at its max), and u's normal `theirs`, ranked after
    `big` (priority 10 to big's 10, its dominant share less), took the a100 slot first: `mine` was evicted where no rule
    requires it, and apply's re-check refused the plan (fleet141). Held only until `big` was asked, `mine` still lost
    the slot to `theirs` at priority 50, ranked before `big`. Placed first, `mine` gives way only while `big` is asked
    (greedy._Protected): it moves into the slot and `theirs` waits."""
    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed

    docs, fleet, running = held_docs(theirs)
    plan = plan_for(tmp_path / "p", docs, fleet, running, time_limit=0)
    jobs = by_job(plan)
    assert (jobs["mine"].action, jobs["theirs"].action, jobs["big"].action) == ("move", "pending", "pending"), \
        {k: (v.action, v.reason) for k, v in jobs.items()}
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, fleet, running)
    assert not recheck(plan, desired, observed, build_problem(desired, observed))[1]
    check_stability(desired, observed, plan)


def test_a_protected_job_its_tenants_higher_class_stands_in_for_waits_for_its_own_turn(tmp_path):
    """t runs its low A100 job `mine` on a spot a2-highgpu-1g (pool a100, max 2) that must go (max_spot_fraction 0) and
    asks for a normal A100 job `n1`; u asks for a normal A100 job `theirs`. `mine`, placed first, gives way while `n1`
    is asked; `n1` takes its room (in the slot of its spot host), so it stands in for `mine` in the guarantees tier, and
    `mine` is low work in its turn: the second slot goes to `theirs`, normal, as in CP-SAT's plan (placed again at once,
    `mine` took it and `theirs` waited)."""
    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed

    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 4}}), doc("Tenant", "u", {}),
            pool("a100", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="either", hi=2),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.0}),
            job("mine", "t", priority="low", spot="eligible", **A100), job("n1", "t", priority="normal", spot="eligible", **A100),
            job("theirs", "u", priority="normal", spot="eligible", **A100)]
    fleet = [instance("i0", "a100", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", market="spot")]
    running = {"mine": ("i0",)}
    plan = plan_for(tmp_path / "p", docs, fleet, running, time_limit=0)
    assert {j.job: j.action for j in plan.jobs} == {"mine": "evict", "n1": "place", "theirs": "place"}, plan.jobs
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, fleet, running)
    assert not recheck(plan, desired, observed, build_problem(desired, observed))[1]
    check_stability(desired, observed, plan)


def test_room_a_lawful_stop_frees_goes_to_a_protected_job_waiting_for_room_before_new_work(tmp_path):
    """fleet142's shape at four jobs: pool a100 (on-demand, max 1) runs two instances, t's protected low `held` on i0
    and u's (no quota) protected low `kept` on i1, so one must go; greedy keeps i0 first (`held` is first by name), and
    `kept` finds no room when the protected jobs are placed (greedy._Protected). t's new high 4-GPU A10G `big` then
    stops `held` for t's 4-GPU quota (lawful: its tenant's higher class, `_place_preempting`), and the room `held` left
    on i0 went to v's new normal `theirs`: greedy evicted `kept` for no rule and apply's re-check refused the plan
    (CP-SAT keeps i1 with `kept`). A protected job that waits for room is asked again as soon as a stop frees some, before new work
    (`_Protected.retry`): `kept` moves to i0 and `theirs` waits."""
    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed

    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 4}}), doc("Tenant", "u", {}), doc("Tenant", "v", {}),
            pool("a100", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=1),
            pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], hi=1),
            job("held", "t", priority="low", **A100), job("kept", "u", priority="low", **A100),
            job("big", "t", priority="high", gpus=4, gpu_type="A10G", cpu=40, mem=160),
            job("theirs", "v", priority="normal", **A100)]
    fleet = [instance(f"i{k}", "a100", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g") for k in range(2)]
    running = {"held": ("i0",), "kept": ("i1",)}
    plan = plan_for(tmp_path / "p", docs, fleet, running, time_limit=0)
    jobs = by_job(plan)
    assert (jobs["held"].action, jobs["big"].action, jobs["theirs"].action) == ("evict", "place", "pending"), plan.jobs
    assert jobs["kept"].action in ("keep", "move"), plan.jobs
    desired = load(tmp_path / "p")
    observed = catalog_observed(desired, fleet, running)
    assert not recheck(plan, desired, observed, build_problem(desired, observed))[1]
    check_stability(desired, observed, plan)
