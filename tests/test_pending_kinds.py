"""Every category of fleetops_pending_jobs (fleetview.REASON_KINDS) is one a real plan's reason reaches: "priority"
matched "preempted" or "outranked", words no reason says, so work waiting on higher-priority work was never counted
there; a running gang stopped under WhenEmpty was "other" beside a listed "gang"."""

from __future__ import annotations

import pytest

from reconciler import api
from reconciler.fleetview import REASON_KINDS, reason_kind
from tests.fleetkit import doc, instance, job, plan_for, pool, tenant, topology
from tests.test_truth import A100, _gpu_pool

GCP_A = ("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")


def _outranked_on_a_full_pool(tmp_path):
    """A high job runs on the one instance a full pool may have: the low job waits for it."""
    docs = [topology(), tenant("t"), _gpu_pool(), job("high", priority="high", **A100), job("low", priority="low", **A100)]
    return plan_for(tmp_path, docs, [instance("i0", "p", *GCP_A)], {"high": ("i0",)}), "low"


def _outranked_in_its_tenant(tmp_path):
    """Its tenant's quota goes to its new normal job first: the running low job is evicted (preemption: LowerPriority)."""
    from tests.test_greedy_preemption import FLEET, RUNNING, docs

    return plan_for(tmp_path, docs(), FLEET, RUNNING), "low-b"


def _quota(tmp_path):
    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 1}}), _gpu_pool(hi=4),
            job("a", priority="high", **A100), job("b", priority="high", **A100)]
    return plan_for(tmp_path, docs), "b"


def _over_its_quota_alone(tmp_path):
    """Asks 2 GPUs (two replicas) of a 1-GPU quota: its reason also names the higher job the full pool goes to (the other limits bind
    with it), but nothing placed otherwise would let it run: "quota", not "priority" (the report's too-big was)."""
    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 1}}), _gpu_pool(hi=1), job("high", priority="high", **A100),
            job("big", priority="low", replicas=2, **A100)]
    return plan_for(tmp_path, docs, [instance("i0", "p", *GCP_A)], {"high": ("i0",)}), "big"


def _pool_max(tmp_path):
    docs = [topology(), tenant("t"), _gpu_pool(hi=1), job("a", **A100), job("b", **A100)]
    return plan_for(tmp_path, docs), "b"


def _fleet_budget(tmp_path):
    docs = [topology(), tenant("t"), _gpu_pool(hi=4), doc("GuardrailPolicy", "g", {"max_hourly_budget": 1.0}), job("a", **A100)]
    return plan_for(tmp_path, docs), "a"


def _tenant_budget(tmp_path):
    docs = [topology(), tenant("t"), _gpu_pool(hi=4), doc("GuardrailPolicy", "g", {"tenant_hourly_budgets": {"t": 1.0}}),
            job("a", **A100)]
    return plan_for(tmp_path, docs), "a"


def _tenant_spot_share(tmp_path):
    docs = [topology(), tenant("t"),
            pool("od", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], lo=2, hi=2),
            pool("s", "gcp", "us-central1", ["us-central1-b"], ["a2-highgpu-1g"], market="spot", hi=2),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5, "tenant_max_spot_fraction": {"t": 0.0}}),
            job("j", spot="required", **A100)]
    return plan_for(tmp_path, docs), "j"


def _license(tmp_path):
    docs = [topology(), tenant("t"), _gpu_pool(hi=4), doc("License", "matlab", {"count": 1}),
            job("a", priority="high", licenses={"matlab": 1}, **A100), job("b", priority="high", licenses={"matlab": 1}, **A100)]
    return plan_for(tmp_path, docs), "b"


def _zone_out_of_capacity(tmp_path):
    docs = [topology(), tenant("t"), _gpu_pool(hi=4), job("a", **A100)]
    return plan_for(tmp_path, docs, short={("gcp", "us-central1-a", "a2-highgpu-1g", "on-demand")}), "a"


def _stuck_gang(tmp_path):
    from tests.test_open_findings import fleet
    from tests.test_truth import _plan_docs

    f = fleet("fleet13")
    return _plan_docs(f.docs, f)[1], "j4"


def _reclaimed(tmp_path):
    from tests.test_truth import _borrowed_fleet

    _, res = _borrowed_fleet(tmp_path, dict(gpus=8, burst={"gpus": 16}),
                             [job(f"a-{i:02d}", tenant="a", priority="low", **A100) for i in range(8)])
    return res.plan, next(j.job for j in res.plan.jobs if j.action == "evict")


def _reservation_full(tmp_path):
    """One reserved p4d holds one 8-GPU job; a $10/h budget keeps a second p4d from being bought: the reason leads with
    the full reservation (it was "other")."""
    from tests.test_rules import _p4d_fleet, reservation_doc

    docs = _p4d_fleet(2, reservation_doc(count=1), doc("GuardrailPolicy", "g", {"max_hourly_budget": 10.0}))
    plan = plan_for(tmp_path, docs)
    return plan, next(j.job for j in plan.jobs if j.action == "pending")


def _cloud_quota(tmp_path):
    from tests.test_cloud_quotas import _p4d_fleet

    cfg, _ = _p4d_fleet(tmp_path)
    plan = api.plan(cfg, time_limit=5).plan
    return plan, next(j.job for j in plan.jobs if j.action == "pending")


SCENARIOS = {
    "priority": [_outranked_on_a_full_pool, _outranked_in_its_tenant],
    "quota": [_quota, _over_its_quota_alone], "pool-max-instances": [_pool_max], "budget": [_fleet_budget], "tenant-budget": [_tenant_budget],
    "spot": [_tenant_spot_share], "license": [_license], "gang": [_stuck_gang], "guarantee": [_reclaimed],
    "cloud-quota": [_cloud_quota], "reservation": [_reservation_full], "other": [_zone_out_of_capacity],
}


def test_every_category_has_a_plan_that_reaches_it():
    """(awaiting-apply is the view's own, not a plan's reason: test_metrics counts it after a spot interruption.)"""
    assert set(SCENARIOS) | {"awaiting-apply"} == {kind for _, kind in REASON_KINDS} | {"other"}


@pytest.mark.parametrize("kind, scenario", [(k, s) for k, ss in SCENARIOS.items() for s in ss],
                         ids=[s.__name__.strip("_") for ss in SCENARIOS.values() for s in ss])
def test_a_real_plans_reason_is_counted_in_its_category(tmp_path, kind, scenario):
    plan, name = scenario(tmp_path)
    j = next(j for j in plan.jobs if j.job == name)
    assert j.action in ("pending", "evict") and reason_kind(j.reason) == kind, (j.action, j.reason)


def test_a_job_the_packer_left_pending_is_counted_by_the_rule_after_the_packers_words():
    """A job the solver placed and the packer could not reads UNPACKED, then the rule the ledger finds binding: it was
    "other" whatever that rule, as "evicted: " had been."""
    from reconciler.plan import UNPACKED

    reason = "quota exhausted: tenant t uses 8/8 GPUs in this plan, the job needs 1 more"
    assert reason_kind(f"{UNPACKED}; {reason}") == reason_kind(f"evicted: {UNPACKED}; {reason}") == "quota"


def test_a_full_reservation_that_leads_several_limits_is_counted_reservation():
    """diagnosis leads with the first rule in its order (a reservation before max_instances); the pools clause after it
    does not make it "pool-max-instances"."""
    from reconciler.ledger import RESERVATION_FULL

    reason = (f"reservation r1 {RESERVATION_FULL} (1/1 p4d.24xlarge in us-east-1a); several limits bind at once with it for "
              "1 new p4d.24xlarge on-demand (reserved: r1) in p (aws/us-east-1a): pools at max_instances (p 1/1)")
    assert reason_kind(reason) == reason_kind(f"evicted: {reason}") == "reservation"
