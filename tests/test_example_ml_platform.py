"""examples/ml-platform end to end on the simulated cloud: every placement rule at once.

The example is what a platform team would write (H100 pretraining in a placement group,
NVLink tensor-parallel serving, MIG inference, EU residency, an instance-gang, aged sweeps,
spot diversification, budgets); these tests hold the plan to what each rule promises."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from providers.catalog import load_catalog
from providers.sim import SimCloud
from reconciler.plan import placement_group_name
from reconciler import api
from reconciler.cli import app
from reconciler.state import state_dir
from tests.fleetkit import ROOT
from tests.invariants import check_plan

EXAMPLE = ROOT / "examples" / "ml-platform"


@pytest.fixture()
def cfg(tmp_path: Path) -> Path:
    dst = tmp_path / "ml-platform"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns(".reconcile", "status"))
    return dst


def _jobs(plan):
    return {j.job: j for j in plan.jobs}


def _hosts(plan, observed):
    out = {c.ref: c for c in plan.creates}
    out.update({i.id: i for i in observed.instances})
    return out


def test_every_rule_of_the_example_holds_in_the_cold_plan(cfg):
    res = api.plan(cfg, time_limit=10)
    plan = res.plan
    check_plan(res.desired, res.observed, plan)
    jobs = _jobs(plan)
    hosts = _hosts(plan, res.observed)
    assert all(j.action == "place" for j in plan.jobs), [(j.job, j.reason) for j in plan.jobs if j.action != "place"]
    # Placement group: both replicas on new H100 instances of one zone, launched into the job's group.
    pre = jobs["llm-pretrain"]
    created = [hosts[r] for r in pre.instances]
    assert {c.instance_type for c in created} == {"p5.48xlarge"} and len({c.zone for c in created}) == 1
    assert {c.placement_group for c in created} == {placement_group_name("ml-platform", "llm-pretrain", created[0].zone)}  # one group per gang and zone
    # NVLink: every replica's 4 GPUs inside one NVLink domain of its instance.
    cat = load_catalog()
    for name in ("tp-serving", "eu-finetune"):
        j = jobs[name]
        for ref, gpus in zip(j.instances, j.gpus):
            dom = cat.shape(hosts[ref].cloud, hosts[ref].instance_type).nvlink_domain
            assert len(gpus) == 4 and len({g // dom for g in gpus}) == 1
    # MIG: the embedding replicas run on the MIG-partitioned A100-80GB pool.
    assert {hosts[r].pool for r in jobs["embed-mig"].instances} == {"gcp-mig"}
    # Residency: the EU fine-tune stays in europe-west4.
    assert {hosts[r].region for r in jobs["eu-finetune"].instances} == {"europe-west4"}
    # An instance-gang: both replicas share one instance, on different GPUs.
    rl = jobs["rl-rollouts"]
    assert len(set(rl.instances)) == 1 and not set(rl.gpus[0]) & set(rl.gpus[1])
    # spot: never / required.
    assert all(hosts[r].market == "on-demand" for r in jobs["tp-serving"].instances + jobs["llm-pretrain"].instances)
    assert all(hosts[r].market == "spot" for r in jobs["eval-l4"].instances)
    # Latency: tp-serving's data is in gcp/us-central1 with max_latency_ms 10: it runs there.
    assert {(hosts[r].cloud, hosts[r].region) for r in jobs["tp-serving"].instances} == {("gcp", "us-central1")}
    # Spot diversification: two types and two zones among spot instances.
    spot = [c for c in plan.creates if c.market == "spot"]
    assert len({c.instance_type for c in spot}) >= 2 and len({c.zone for c in spot}) >= 2
    # Budgets.
    assert plan.cost_after <= res.desired.guardrails.max_hourly_budget
    # The aged sweeps outrank nothing here but are placed; their priority says so in explain.
    assert res.problem.demand(next(d.key for d in res.problem.demands if "sweep-1" in d.jobs)).priority == 100


def test_apply_then_plan_is_quiet_and_a_lost_spot_instance_is_healed(cfg):
    first = api.apply(cfg, time_limit=10)
    assert first.report.ok
    again = api.plan(cfg, time_limit=10)
    assert not again.plan.has_changes, [(j.job, j.action, j.reason) for j in again.plan.changed_jobs]
    spot = next(i for i in again.observed.instances if i.market == "spot" and i.instance_type == "p4d.24xlarge")
    SimCloud(state_dir(cfg)).interrupt(spot.id)
    heal = api.plan(cfg, time_limit=10)
    check_plan(heal.desired, heal.observed, heal.plan)
    rl = _jobs(heal.plan)["rl-rollouts"]
    assert rl.action == "place" and "gone" in rl.reason and len(set(rl.instances)) == 1  # all it had is gone
    assert api.apply(cfg, time_limit=10).report.ok
    assert not api.plan(cfg, time_limit=10).plan.has_changes


def test_explain_tells_where_and_why_through_the_cli(cfg):
    out = CliRunner().invoke(app, ["explain", str(cfg), "eu-finetune", "--time-limit", "5"])
    assert out.exit_code == 0, out.output
    assert "placed on" in out.output and "europe-west4" in out.output and "regions europe-west4" in out.output
    bad = CliRunner().invoke(app, ["explain", str(cfg), "no-such-job"])
    assert bad.exit_code == 1 and "no job 'no-such-job'" in bad.output


def test_readmes_big_ablation_names_the_guaranteed_work_by_the_capacity_it_holds(cfg):
    """README's explain example: a low 4 x 8 A100 gang added for research. Its reason said that other tenants' guaranteed
    work "holds this capacity: tp-serving", after "4 new p4d.24xlarge spot in aws-a100", while tp-serving runs on a GCP
    a2-highgpu-8g: the holders are named by the kind of capacity they hold (A100 GPUs anywhere), and now say so."""
    (cfg / "jobs" / "big.yaml").write_text(
        "apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: big-ablation}\nspec:\n  tenant: research\n"
        "  priority: low\n  replicas: 4\n  resources: {gpus: 8, gpu_type: A100, cpu: 90, memory_gib: 1000}\n")
    res = api.plan(cfg, time_limit=10)
    jobs, hosts = _jobs(res.plan), _hosts(res.plan, res.observed)
    reason = jobs["big-ablation"].reason
    assert "which holds this capacity" not in reason, reason
    assert "borrowed room never displaces other tenants' work within their guarantees, which holds A100 GPUs: tp-serving)" in reason, reason
    assert {hosts[r].pool for r in jobs["tp-serving"].instances} == {"gcp-a100"}  # not the aws-a100 the reason is about
