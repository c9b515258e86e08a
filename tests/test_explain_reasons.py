"""Explain's and the pending reasons' words are true of the plan the user gets, job by job: which jobs of a group are
inside their tenant's guarantee, preemption: Never named where it keeps the tenant's lower jobs running, a gang too big
for every instance type, and the rule that evicts a job when no way of placing it is left."""

from __future__ import annotations

import pytest

from reconciler import api
from tests.fleetkit import doc, job, pool, tenant, topology, write_config

A10G = {"gpus": 1, "gpu_type": "A10G"}
AWS = {"aws": {"us-east-1": ["us-east-1a", "us-east-1b"]}}
FIXED = pool("fixed", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], lo=1, hi=1)  # 4 A10G, no more


def _borrowing(tmp_path):
    docs = [topology(clouds=AWS), FIXED, doc("Tenant", "a", {"quota": {"gpus": 2, "burst": {"gpus": 4}}})]
    return write_config(tmp_path / "cfg", docs + [job(f"a{i}", tenant="a", **A10G) for i in range(3)])


def _guarantee_line(e) -> str:
    return next(d for d in e.details if "guarantee" in d)


@pytest.mark.parametrize("limit", [5, 0])
def test_explain_says_per_job_which_of_identical_jobs_borrow(tmp_path, monkeypatch, limit):
    """Tenant a guaranteed 2 GPUs (burst 4), three identical 1-GPU jobs: each of a0, a1, a2 was said to be "on borrowed
    capacity", the group's guaranteed count (2) below its placed count (3) read as a yes/no for every job of it. New, the
    group says how many are inside; running, the guarantee protects a0 and a1 by name and a2 alone borrows. Greedy
    best-fit's plan (--time-limit 0) says the same: read from the solver's count, which greedy's answer has none of,
    explain said nothing of the guarantee there."""
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    cfg = _borrowing(tmp_path)
    for name in ("a0", "a1", "a2"):
        line = _guarantee_line(api.explain(cfg, name, time_limit=limit))
        assert "2 inside its tenant's guarantee, 1 on borrowed capacity" in line, line
        assert "placed 3 anew" not in line and "places 3 anew (a0, a1, a2)" in line, line
    api.apply(cfg, time_limit=limit)
    said = {name: _guarantee_line(api.explain(cfg, name, time_limit=limit)) for name in ("a0", "a1", "a2")}
    assert said["a0"] == said["a1"] == "inside its tenant's guarantee", said
    assert said["a2"].startswith("on borrowed capacity"), said


def test_explain_says_of_new_jobs_what_the_guarantee_holds_once_they_run(tmp_path, monkeypatch):
    """Tenant a guaranteed 2 GPUs (burst 4), four new 1-GPU jobs that no rule tells apart but their allowlists (four
    groups): the solver's count put a0's and a3's groups inside the guarantee, and explain said so, while the apply's
    next plan fills the guarantee by name among equals (a0, a1) and a3 borrows. Explain says, before the apply, what
    holds after it: a3 was "inside its tenant's guarantee" before and "on borrowed capacity" after."""
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    docs = [topology(clouds=AWS), FIXED, doc("Tenant", "a", {"quota": {"gpus": 2, "burst": {"gpus": 4}}})]
    rules = [{}, {"regions": ["us-east-1"]}, {"spot": "never"}, {"clouds": ["aws"]}]
    cfg = write_config(tmp_path / "cfg", docs + [job(f"a{i}", tenant="a", **A10G, **r) for i, r in enumerate(rules)])
    jobs = ("a0", "a1", "a2", "a3")
    before = {name: _guarantee_line(api.explain(cfg, name, time_limit=5)) for name in jobs}
    api.apply(cfg, time_limit=5)
    after = {name: _guarantee_line(api.explain(cfg, name, time_limit=5)) for name in jobs}
    assert before == after, (before, after)
    assert after["a0"] == after["a1"] == "inside its tenant's guarantee", after


def test_preemption_never_is_named_where_it_keeps_the_tenants_lower_jobs(tmp_path, monkeypatch):
    """Tenant t at its 4-GPU quota with four running low jobs on a full fixed pool, preemption: Never, and a new critical
    job: its reason said only "quota exhausted ...; pools at max_instances" and explain "No single change tried places
    it", where under LowerPriority it takes a low job's place. Both name preemption: Never now, and explain's re-plan
    shows LowerPriority placing it."""
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    docs = [topology(clouds=AWS), FIXED, tenant("t", gpus=4), doc("PlacementPolicy", "default", {"preemption": "Never"})]
    docs += [job(f"l{i}", priority="low", **A10G) for i in range(4)]
    cfg = write_config(tmp_path / "cfg", docs)
    api.apply(cfg, time_limit=5)
    write_config(cfg, docs + [job("crit", priority="critical", **A10G)])
    reason = next(j.reason for j in api.plan(cfg, time_limit=5).plan.jobs if j.job == "crit")
    assert reason.startswith("quota exhausted") and "preemption: Never keeps its tenant's lower-priority running jobs running" in reason, reason
    e = api.explain(cfg, "crit", time_limit=5)
    assert e.state == "pending"
    assert any(w.startswith("set PlacementPolicy preemption: LowerPriority") and ": it would run" in w for w in e.would_change), e.would_change


def test_preemption_never_is_not_named_for_a_quota_the_job_alone_exceeds(tmp_path, monkeypatch):
    """No stop of a lower job makes room for a job bigger than its tenant's quota: Never is not named, and LowerPriority,
    tried, is said not to be enough."""
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    docs = [topology(clouds=AWS), FIXED, tenant("t", gpus=2), doc("PlacementPolicy", "default", {"preemption": "Never"})]
    docs += [job("l0", priority="low", **A10G)]
    cfg = write_config(tmp_path / "cfg", docs)
    api.apply(cfg, time_limit=5)
    write_config(cfg, docs + [job("crit", priority="critical", gpus=3, gpu_type="A10G")])
    e = api.explain(cfg, "crit", time_limit=5)
    assert e.state == "pending" and "preemption" not in e.summary, e.summary
    assert not any("LowerPriority" in w for w in e.would_change), e.would_change
    assert any("LowerPriority" in w and "still pending (quota: the job needs 3 GPUs" in w for w in e.tried), e.tried


def test_explain_says_no_instance_type_holds_a_gang_rather_than_several_limits(tmp_path, monkeypatch):
    """A gang: instance job of 3x 2 T4 where the largest type holds 4 T4: its reason rightly said no instance type is large
    enough, and explain ended "No single change tried places it; several limits bind at once": one limit binds."""
    from reconciler.render import render_explanation

    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    docs = [topology(clouds=AWS), tenant("t", gpus=64),
            pool("g4", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["g4dn.xlarge", "g4dn.12xlarge"], hi=6),
            job("too-big-inst", replicas=3, gang="instance", gpus=2, gpu_type="T4", cpu=4, mem=16)]
    e = api.explain(write_config(tmp_path / "cfg", docs), "too-big-inst", time_limit=5)
    assert e.state == "pending" and not e.would_change
    assert "no instance type in an allowed pool is large enough" in e.summary, e.summary
    text = render_explanation(e)
    assert "several limits" not in text, text
    assert "No single change tried places it: no instance type in an allowed pool is large enough for one instance-gang" in text, text


def test_an_eviction_names_the_rule_that_refuses_keeping_its_instance(tmp_path, monkeypatch):
    """A spot job running in us-east-1a, then SpotPolicy min_zones: 2 with spot in both zones in cool-off: the plan deletes
    its (not full) instance for spot diversity, and its reason said "the instances that could hold it are full and no new
    one can be bought for it". Without the cool-offs the reason was rightly "spot diversity: ..."; now it is with them."""
    from reconciler.state import load_state, save_state

    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")

    def docs(min_zones: int) -> list[dict]:
        return [topology(clouds=AWS), tenant("a", gpus=16),
                pool("a10g", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["g5.xlarge"], market="either", hi=10),
                doc("SpotPolicy", "default", {"max_spot_fraction": 1.0, "min_zones": min_zones}),
                job("a1", tenant="a", spot="required", gpus=1, gpu_type="A10G", cpu=2, mem=8)]

    cfg = write_config(tmp_path / "cfg", docs(1))
    applied = api.apply(cfg, time_limit=5).plan
    (host,) = next(j.instances for j in api.plan(cfg, time_limit=5).plan.jobs if j.job == "a1")
    assert [c.site.market for c in applied.creates] == ["spot"]
    state = load_state(cfg)
    for zone in ("us-east-1a", "us-east-1b"):
        state.mark_short("aws", zone, "g5.xlarge", "spot")
    save_state(cfg, state)
    write_config(cfg, docs(2))
    plan = api.plan(cfg, time_limit=5).plan
    a1 = next(j for j in plan.jobs if j.job == "a1")
    assert a1.action == "evict" and [d.instance_id for d in plan.deletes] == [host]
    assert a1.reason.startswith("evicted: spot diversity: spot in the plan would span 1 instance type(s) and 1 zone(s)"), a1.reason
    assert "are full" not in a1.reason and f"keeping it on {host}, where it runs" in a1.reason, a1.reason


def test_explain_claims_a_cost_gap_only_where_the_plan_does(tmp_path, monkeypatch):
    """A scarce generated fleet at a short work limit (test_determinism's second): its tiers are not proven and
    backfill places pending work in room the packing left, so the plan's line says "no optimality gap is claimed".
    Explain of a job it places said "the plan is feasible (cost gap 100.0%)": the placeholder the plan keeps for a
    gap it does not claim, printed as a claim. It now says what the plan's line says: no gap, and why."""
    from reconciler.render import render
    from tests.test_determinism import scarce_fleet

    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")
    cfg = scarce_fleet(tmp_path / "f", 150, 3, 3)
    res = api.plan(cfg, time_limit=0.3)
    s = res.plan.solver
    assert s.unproven and s.backfilled and not s.optimal, s  # (the case this fleet was chosen for)
    line = next(ln for ln in render(res.plan, "human").splitlines() if "plan " + res.plan.id in ln)
    assert "no optimality gap is claimed" in line and "within" not in line, line
    placed = next(j.job for j in res.plan.jobs if j.action == "place")
    said = next(d for d in api.explain(cfg, placed, time_limit=0.3).details if d.startswith("the plan is"))
    assert "cost gap" not in said and "no optimality gap is claimed" in said, said
