"""A saved plan is input, not an order (issue 15, item 4).

`apply --plan` checks every action of the file against the desired state, the offerings and the
fleet, recomputes its cost from prices, and refuses an edited body. Each attack here is an edit
that keeps the desired and observed digests (and, but for the last, recomputes the body digest
as anyone can): on the code before, each was carried out or crashed."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from providers.sim import SimCloud
from reconciler import api
from reconciler.cli import app
from reconciler.plan import body_digest
from reconciler.state import state_dir
from tests.fleetkit import copy_quickstart, launched_later

runner = CliRunner()
QUICK = "5"


def _live(cfg: Path) -> dict[str, dict]:
    return {i["id"]: i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"}


@pytest.fixture(scope="module")
def applied_once(tmp_path_factory):
    """The quickstart applied, and a no-change plan of it saved, once for the module: tests copy it (`applied`), never
    change it."""
    tmp = tmp_path_factory.mktemp("applied")
    cfg = copy_quickstart(tmp)
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    out = tmp / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    return cfg, out


@pytest.fixture
def applied(applied_once, tmp_path):
    """A private copy of the applied quickstart and its saved no-change plan: the raw material an attacker edits (an
    apply and a plan per test took ~0.5 s of CPU, forty times a run; the plan names no path, so it applies to the copy)."""
    cfg, out = applied_once
    shutil.copytree(cfg, tmp_path / "quickstart")
    shutil.copy(out, tmp_path / "plan.json")
    return tmp_path / "quickstart", tmp_path / "plan.json"


def _edit(path: Path, change, *, redigest: bool = True) -> None:
    raw = json.loads(path.read_text())
    old = raw.pop("body_digest")
    change(raw)
    raw["body_digest"] = body_digest(raw) if redigest else old
    path.write_text(json.dumps(raw))


def _create(raw: dict, n: int, pool: str, zone: str, itype: str, cloud: str = "aws", region: str = "us-east-1",
            market: str = "on-demand", **extra) -> dict:
    return {"ref": f"+{n}", "key": f"{raw['id']}-{n:04d}", "pool": pool, "provider": "sim", "cloud": cloud, "region": region,
            "zone": zone, "instance_type": itype, "market": market, "price": 0.01, "max_price": None,
            "placement_group": None, **extra}


def _delete_of(iid: str, inst: dict, price: float) -> dict:
    """A saved plan's delete of live instance `iid` (as `_live` lists it), as a hand edit would add it."""
    return {"instance_id": iid, "pool": inst["tags"]["fleetops.io/pool"], "provider": "sim", "cloud": inst["cloud"],
            "region": inst["region"], "zone": inst["zone"], "instance_type": inst["instance_type"],
            "market": inst["market"], "price": price, "reason": "no longer needed"}


def _apply(cfg: Path, plan: Path):
    return runner.invoke(app, ["apply", str(cfg), "--plan", str(plan)])


def _refused(res, *needles: str) -> None:
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    for n in needles:
        assert n in res.output, res.output


def test_an_honest_saved_plan_applies(tmp_path):
    cfg = copy_quickstart(tmp_path)
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output
    assert len(_live(cfg)) == len(json.loads(out.read_text())["creates"])


def test_delete_of_an_instance_running_a_job_is_refused(applied):
    cfg, out = applied
    host = api.read_status(cfg)["jobs"]["finetune-a"]["status"]["instances"][0]
    inst = _live(cfg)[host]

    def add_delete(raw):
        raw["deletes"].append(_delete_of(host, inst, 0.0))

    _edit(out, add_delete)
    _refused(_apply(cfg, out), f"delete {host}: job finetune-a runs on it and the plan keeps it there")
    assert host in _live(cfg)


def test_extra_creates_past_max_instances_and_the_budget_are_refused(applied):
    """20 p4d.24xlarge ($655/h against a $150/h budget, max_instances 3), priced at a cent in the plan."""
    cfg, out = applied
    before = set(_live(cfg))
    _edit(out, lambda raw: raw["creates"].extend(_create(raw, n, "aws-a100", "us-east-1a", "p4d.24xlarge")
                                                 for n in range(1, 21)))
    _refused(_apply(cfg, out), "pool aws-a100: the plan would run", "over its max_instances 3")
    assert set(_live(cfg)) == before


def test_budget_is_recomputed_from_prices_not_read_from_the_plan(applied):
    cfg, out = applied
    pools = cfg / "pools.yaml"
    pools.write_text(pools.read_text().replace("max_instances: 3", "max_instances: 30"))
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    before = set(_live(cfg))
    _edit(out, lambda raw: raw["creates"].extend(_create(raw, n, "aws-a100", "us-east-1a", "p4d.24xlarge")
                                                 for n in range(1, 6)))
    _refused(_apply(cfg, out), "max_hourly_budget")
    assert set(_live(cfg)) == before


def test_a_type_and_zone_the_pool_does_not_allow_are_refused(applied):
    cfg, out = applied
    _edit(out, lambda raw: raw["creates"].append(_create(raw, 1, "aws-cpu", "us-east-1b", "p5.48xlarge")))
    _refused(_apply(cfg, out), "create +1 (on-demand p5.48xlarge in us-east-1b, pool 'aws-cpu'): the pool does not allow it")
    _edit(out, lambda raw: raw["creates"].__setitem__(0, _create(raw, 1, "aws-cpu", "us-east-1a", "p5.48xlarge")))
    _refused(_apply(cfg, out), "the pool does not allow it")
    _edit(out, lambda raw: raw["creates"].__setitem__(0, _create(raw, 1, "gcp-l4-spot", "us-central1-a", "g2-standard-4",
                                                                  cloud="gcp", region="us-central1")))  # on-demand in a spot pool
    _refused(_apply(cfg, out), "the pool does not allow it")
    assert not runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode"]).exit_code


def test_an_unknown_pool_is_a_clear_error(applied):
    cfg, out = applied
    _edit(out, lambda raw: raw["creates"].append(_create(raw, 1, "ghost", "us-east-1a", "m6i.4xlarge")))
    _refused(_apply(cfg, out), "create +1 (on-demand m6i.4xlarge in us-east-1a, pool 'ghost'): there is no pool 'ghost'")


def test_delete_of_a_foreign_instance_is_refused_and_never_reported_deleted(applied):
    cfg, out = applied
    theirs = SimCloud(state_dir(cfg)).plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", tags={"owner": "them"})

    def add_delete(raw):
        raw["deletes"].append({"instance_id": theirs, "pool": "aws-cpu", "provider": "sim", "cloud": "aws",
                               "region": "us-east-1", "zone": "us-east-1a", "instance_type": "m6i.4xlarge",
                               "market": "on-demand", "price": 0.768, "reason": "no longer needed"})

    _edit(out, add_delete)
    res = _apply(cfg, out)
    _refused(res, f"delete {theirs}: not an instance of fleet 'quickstart'")
    assert "1 deleted" not in res.output and theirs in _live(cfg)


def test_delete_of_a_copy_of_the_fleets_instance_is_refused(applied, tmp_path):
    """A copy of one of the fleet's instances with all its tags (its create key too: cloned in a console) is someone
    else's (tests/test_ownership.py); a saved plan edited to delete it is refused like any instance not the fleet's."""
    cfg, _ = applied
    original = next(i for i in _live(cfg).values() if i["tags"].get("fleetops.io/create-key"))
    sim = SimCloud(state_dir(cfg))
    copy = sim.plant(original["cloud"], original["region"], original["zone"], original["instance_type"], tags=dict(original["tags"]))
    launched_later(sim, copy, original)
    out = tmp_path / "after.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    assert copy not in {d["instance_id"] for d in json.loads(out.read_text())["deletes"]}

    def add_delete(raw):
        raw["deletes"].append(_delete_of(copy, original, 0.768))

    _edit(out, add_delete)
    _refused(_apply(cfg, out), f"delete {copy}: not an instance of fleet 'quickstart'")
    assert copy in _live(cfg)


def test_apply_plan_reports_a_refused_delete_as_a_failure(applied):
    """Below the check, too: apply_plan never counts a delete of an instance observe did not find as done."""
    from dataclasses import replace

    from reconciler.apply import apply_plan
    from reconciler.observe import Fleet
    from reconciler.plan import DeleteAction
    from reconciler.site import Site
    from reconciler.state import State

    cfg, _ = applied
    theirs = SimCloud(state_dir(cfg)).plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", tags={"owner": "them"})
    res = api.plan(cfg, time_limit=float(QUICK))
    plan = replace(res.plan, deletes=(DeleteAction(theirs, Site("aws-cpu", "sim", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge",
                                                        "on-demand"), 0.768, "forged"),))
    report = apply_plan(res.desired, res.observed, plan, Fleet(res.desired, state_dir(cfg)), State())
    assert not report.ok and theirs not in report.deleted and theirs in _live(cfg)


def test_an_edited_body_with_the_old_digests_is_refused(applied):
    cfg, out = applied
    _edit(out, lambda raw: raw["creates"].append(_create(raw, 1, "aws-cpu", "us-east-1a", "m6i.4xlarge")), redigest=False)
    _refused(_apply(cfg, out), "it was edited after `reconcile plan` wrote it")


# -- what the instances will host (issue 15 item 4, the rest): each edit below keeps every pool, zone, type, market,
# max_instances and the budget within bounds, so only the placements are wrong. Each was applied before.


def _job(raw: dict, name: str) -> dict:
    return next(j for j in raw["jobs"] if j["job"] == name)


def _move(raw: dict, name: str, instances: list[str], gpus: list[list[int]]) -> None:
    _job(raw, name).update(action="move", instances=instances, gpus=gpus)


def _host(cfg: Path, job: str, replica: int = 0) -> str:
    return api.read_status(cfg)["jobs"][job]["status"]["instances"][replica]


def _fresh(out: Path, pristine: str, change) -> None:
    """The saved plan as `reconcile plan` wrote it, then one attacker's edit (digest recomputed)."""
    out.write_text(pristine)
    _edit(out, change)


def test_two_replicas_on_one_gpu_are_refused_and_distinct_gpus_apply(applied):
    cfg, out = applied
    pristine, before = out.read_text(), set(_live(cfg))

    def both_on(gpus_a, gpus_b):
        def change(raw):
            raw["creates"].append(_create(raw, 1, "gcp-a100", "us-central1-a", "a2-highgpu-8g", cloud="gcp", region="us-central1"))
            _move(raw, "finetune-a", ["+1"], [gpus_a])
            _move(raw, "finetune-b", ["+1"], [gpus_b])
        return change

    _fresh(out, pristine, both_on([0], [0]))
    _refused(_apply(cfg, out), "job finetune-b replica 0 on +1 (on-demand a2-highgpu-8g in us-central1-a): GPU 0 is also "
                               "given to job finetune-a replica 0 (GPU overcommit)")
    assert set(_live(cfg)) == before
    _fresh(out, pristine, both_on([3], [2, 3]))  # one replica given two GPUs: one of them another's
    _refused(_apply(cfg, out), "GPU indices [2, 3] are not 1 distinct GPU of the 8 GPUs it has")
    assert set(_live(cfg)) == before
    # The same edit with a GPU each is a plan the planner could have made: it is carried out (the check is no blanket refusal).
    _fresh(out, pristine, both_on([0], [1]))
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output
    new = _host(cfg, "finetune-a")
    assert new not in before and _host(cfg, "finetune-b") == new


def test_nine_gpus_on_an_eight_gpu_instance_are_refused(applied):
    cfg, out = applied
    pristine, before = out.read_text(), set(_live(cfg))
    p4d = _host(cfg, "llm-pretrain")
    where = f"{p4d} (on-demand p4d.24xlarge in "
    _fresh(out, pristine, lambda raw: _move(raw, "finetune-a", [p4d], [[7]]))
    _refused(_apply(cfg, out), where, "the plan puts 9 GPUs on it, it has 8 GPUs (finetune-a, llm-pretrain)",
             "GPU 7 is also given to job finetune-a replica 0 (GPU overcommit)")
    _fresh(out, pristine, lambda raw: _move(raw, "finetune-a", [p4d], [[8]]))  # a GPU the instance does not have
    _refused(_apply(cfg, out), "job finetune-a replica 0 on " + where, "GPU indices [8] are not 1 distinct GPU of the 8 GPUs it has (0..7)")
    _fresh(out, pristine, lambda raw: _job(raw, "llm-pretrain")["gpus"].__setitem__(0, list(range(9))))  # kept, 9 indices
    _refused(_apply(cfg, out), "job llm-pretrain replica 0 on " + where, "GPU indices [0, 1, 2, 3, 4, 5, 6, 7, 8] are not 8")
    assert set(_live(cfg)) == before


def test_memory_and_placement_rules_of_an_instance_are_rechecked(applied):
    cfg, out = applied
    pristine, before = out.read_text(), set(_live(cfg))
    first = _host(cfg, "llm-pretrain")

    def half_gang_on_a2(raw):  # 8 GPUs fit an a2-highgpu-8g; the replica's 1000 GiB do not (680)
        raw["creates"].append(_create(raw, 1, "gcp-a100", "us-central1-a", "a2-highgpu-8g", cloud="gcp", region="us-central1"))
        _move(raw, "llm-pretrain", [first, "+1"], [list(range(8)), list(range(8))])

    _fresh(out, pristine, half_gang_on_a2)
    _refused(_apply(cfg, out), "+1 (on-demand a2-highgpu-8g in us-central1-a): the plan puts 1000 GiB of memory on it, it has 680 GiB of memory")
    gpu_box = _host(cfg, "eval-nightly")  # a g5.xlarge: CPU work is kept off GPU instances
    _fresh(out, pristine, lambda raw: _move(raw, "label-sync", [gpu_box], [[]]))
    _refused(_apply(cfg, out), f"job label-sync onto {gpu_box} (spot g5.xlarge in us-east-1", "CPU work does not run on GPU instances")
    assert set(_live(cfg)) == before


def test_mig_slices_past_the_instance_are_refused(tmp_path):
    """16 3g.40gb slices per a2-ultragpu-8g (two per GPU); mig-a holds 10, mig-b's 7 wait for the pool's one instance."""
    cfg = copy_quickstart(tmp_path)
    with open(cfg / "pools.yaml", "a") as f:
        f.write("---\napiVersion: fleetops.io/v1alpha1\nkind: Pool\nmetadata: {name: gcp-mig}\nspec:\n  cloud: gcp\n"
                "  region: us-central1\n  zones: [us-central1-a]\n  instance_types: [a2-ultragpu-8g]\n  market: on-demand\n"
                "  max_instances: 1\n  mig: [3g.40gb, 3g.40gb]\n")
    for name, count in (("mig-a", 10), ("mig-b", 7)):
        (cfg / "jobs" / f"{name}.yaml").write_text(
            f"apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  tenant: research\n"
            f"  resources: {{gpu_type: A100-80GB, mig: {{profile: 3g.40gb, count: {count}}}, cpu: 4, memory_gib: 32}}\n")
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    raw = json.loads(out.read_text())
    assert _job(raw, "mig-a")["action"] == "keep" and _job(raw, "mig-b")["action"] == "pending"
    box, before = _host(cfg, "mig-a"), set(_live(cfg))
    _edit(out, lambda raw: _job(raw, "mig-b").update(action="place", instances=[box], gpus=[]))
    _refused(_apply(cfg, out), f"{box} (on-demand a2-ultragpu-8g in us-central1-a): the plan puts 17 MIG 3g.40gb slices on it, "
                               "it has 16 MIG 3g.40gb slices (mig-a, mig-b)")
    assert set(_live(cfg)) == before


def test_stopping_running_work_is_only_an_evict_of_what_the_snapshot_runs(applied):
    cfg, out = applied
    pristine, before = out.read_text(), set(_live(cfg))
    host = _host(cfg, "finetune-a")
    _fresh(out, pristine, lambda raw: _job(raw, "finetune-a").update(action="pending", instances=[], gpus=[]))
    _refused(_apply(cfg, out), f"job finetune-a: pending, but it runs on {host}: stopping running work is an evict")

    def twice(raw):  # kept by one entry, moved by another: apply would act on both
        raw["jobs"].append({**_job(raw, "finetune-a"), "action": "evict", "instances": [], "gpus": []})

    _fresh(out, pristine, twice)
    _refused(_apply(cfg, out), "job finetune-a: listed more than once")
    _fresh(out, pristine, lambda raw: _job(raw, "llm-pretrain").update(instances=_job(raw, "llm-pretrain")["instances"][:1],
                                                                        gpus=[list(range(8))]))
    _refused(_apply(cfg, out), "job llm-pretrain: keep of 1 replica; the job has 2 replicas")
    _fresh(out, pristine, lambda raw: _job(raw, "finetune-a").update(action="keep", instances=[_host(cfg, "finetune-b")]))
    _refused(_apply(cfg, out), "job finetune-a: keep, but on")
    assert set(_live(cfg)) == before
    assert api.read_status(cfg)["jobs"]["finetune-a"]["status"]["instances"] == [host]


def test_a_saved_plan_with_a_finished_job_is_rechecked_as_it_was_made(applied):
    """A job whose agent reported Succeeded demands nothing: `plan` leaves it out, and the re-check must see the
    desired state the same way (it refused every such honest plan: 'missing from the plan')."""
    from reconciler.backend import backend_for
    from reconciler.load import load
    from reconciler.runtime.assign import spec_hash
    from reconciler.runtime.bus import Bus

    cfg, out = applied
    host = _host(cfg, "finetune-a")
    job = load(cfg).jobs["finetune-a"]
    Bus(backend_for(cfg, None)).put_run("finetune-a", 0, {
        "job": "finetune-a", "replica": 0, "instance": host, "spec_hash": spec_hash(job), "epoch": 1, "attempt": 0,
        "restarts": 0, "phase": "Succeeded", "reason": "Completed", "terminal": True})
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code in (0, 2)
    assert "finetune-a" not in {j["job"] for j in json.loads(out.read_text())["jobs"]}
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output
    assert "finetune-a" not in api.read_status(cfg)["jobs"] or not api.read_status(cfg)["jobs"]["finetune-a"]["status"].get("instances")


def test_a_job_its_quota_keeps_pending_cannot_be_placed_by_an_edit(tmp_path):
    """platform's quota is 48 vCPUs; `backfill` (40) would take it to 56, so the planner leaves it pending. An edit
    that buys it a c6i.8xlarge (within the pool, max_instances and the fleet budget) and places it there was
    applied: the tenant ran past its quota (and, in the next test, past its budget)."""
    cfg = copy_quickstart(tmp_path)
    (cfg / "jobs" / "backfill.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: backfill}\n"
                                                "spec:\n  tenant: platform\n  resources: {cpu: 40, memory_gib: 8}\n")
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    assert _job(json.loads(out.read_text()), "backfill")["action"] == "pending"
    before = set(_live(cfg))

    def place(raw):
        raw["creates"].append(_create(raw, 1, "aws-cpu", "us-east-1a", "c6i.8xlarge"))
        _job(raw, "backfill").update(action="place", instances=["+1"], gpus=[])

    _edit(out, place)
    _refused(_apply(cfg, out), "tenant platform: the plan gives it 56 vCPUs, over its ceiling of 48 vCPUs")
    assert set(_live(cfg)) == before


def test_a_job_its_tenant_budget_keeps_pending_cannot_be_placed_by_an_edit(tmp_path):
    cfg = copy_quickstart(tmp_path)
    pol = cfg / "policies.yaml"
    pol.write_text(pol.read_text().replace("max_destroy_per_apply: 6", "max_destroy_per_apply: 6\n  tenant_hourly_budgets: {product: 1.5}"))
    (cfg / "jobs" / "probe.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: probe}\nspec:\n"
                                             "  tenant: product\n  resources: {gpus: 1, gpu_type: A10G, cpu: 4, memory_gib: 16}\n"
                                             "  spot: never\n")
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    assert _job(json.loads(out.read_text()), "probe")["action"] == "pending"
    before = set(_live(cfg))

    def place(raw):
        raw["creates"].append(_create(raw, 1, "aws-a10g", "us-east-1a", "g5.xlarge"))
        _job(raw, "probe").update(action="place", instances=["+1"], gpus=[[0]])

    _edit(out, place)
    _refused(_apply(cfg, out), "tenant product: the plan charges it $", "/h, over its budget of $1.50/h")
    assert set(_live(cfg)) == before


def test_an_evict_of_guaranteed_work_no_rule_requires_is_refused(applied):
    """An edited `keep` -> `evict` stopped another team's work inside its guarantee, and apply carried it out
    (issue 15; the planner's own evictions name a rule: issue 18). Borrowed work may still be reclaimed."""
    cfg, out = applied
    pristine, before = out.read_text(), set(_live(cfg))
    host = _host(cfg, "serving-canary")
    _fresh(out, pristine, lambda raw: _job(raw, "serving-canary").update(action="evict", instances=[], gpus=[]))
    _refused(_apply(cfg, out), "job serving-canary: evicted, but it runs inside tenant product's guarantee")
    assert set(_live(cfg)) == before
    assert api.read_status(cfg)["jobs"]["serving-canary"]["status"]["instances"] == [host]

    # With its guarantee lowered to 20 GPUs, research (22 GPUs running, a 32-GPU burst) borrows: its
    # lowest-priority running work is borrowed and may be reclaimed.
    tenants = cfg / "tenants.yaml"
    tenants.write_text(tenants.read_text().replace("quota: {gpus: 24,", "quota: {gpus: 20,"))
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    problem = api.plan(cfg, time_limit=0).problem
    research = problem.tenants["research"]
    borrowed = sorted(j for d in problem.demands if d.tenant == "research" for j, _ in d.running if j not in research.protected_jobs)
    assert research.protected_jobs and borrowed, (research.protected_jobs, borrowed)
    _edit(out, lambda raw: _job(raw, borrowed[0]).update(action="evict", instances=[], gpus=[]))
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output
    assert not api.read_status(cfg)["jobs"][borrowed[0]]["status"].get("instances")



def test_a_pool_under_its_minimum_licenses_no_stop_of_guaranteed_work_on_an_instance_that_stays(applied):
    """aws-cpu (min_instances 1) lost its only instance (interrupted): the fleet breaks a fleet-wide rule now, and the
    re-check took any eviction as lawful then ("something must give"). An edited plan stopped research's guaranteed
    llm-pretrain gang and product's critical serving-canary, and another one gave serving-canary's T4 to research's
    new job: both applied. A minimum is met by buying (what the plan does), and no rule but a license or the on-demand
    buffer is mended by stopping work on an instance that stays with room for it beside the running work there: a stop
    is lawful where the plan with the job kept instead (and what took its room back where it ran, or waiting) breaks a
    rule the plan keeps."""
    cfg, out = applied
    SimCloud(state_dir(cfg)).interrupt(_host(cfg, "feature-etl"), notice_seconds=0)
    (cfg / "jobs" / "t4.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: t4-probe}\nspec:\n"
                                          "  tenant: research\n  priority: critical\n  regions: [eastus]\n"
                                          "  resources: {gpus: 1, gpu_type: T4, cpu: 4, memory_gib: 16}\n")
    pools = cfg / "pools.yaml"  # no second T4: the probe waits (research borrows no T4 room of product's guarantee)
    pools.write_text(pools.read_text().replace("market: on-demand\n  max_instances: 4", "market: on-demand\n  max_instances: 1"))
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    pristine = out.read_text()
    raw = json.loads(pristine)
    assert _job(raw, "t4-probe")["action"] == "pending" and _job(raw, "feature-etl")["action"] == "place"
    before = set(_live(cfg))
    canary = _host(cfg, "serving-canary")

    def stop_both(raw):
        for name in ("llm-pretrain", "serving-canary"):
            _job(raw, name).update(action="evict", instances=[], gpus=[])

    def take_the_t4(raw):
        _job(raw, "serving-canary").update(action="evict", instances=[], gpus=[])
        _job(raw, "t4-probe").update(action="place", instances=[canary], gpus=[[0]])

    _fresh(out, pristine, stop_both)
    _refused(_apply(cfg, out), "job llm-pretrain: evicted, but it runs inside tenant research's guarantee",
             "job serving-canary: evicted, but it runs inside tenant product's guarantee", "pool-min:aws-cpu")
    def swap_the_t4(raw):  # its instance deleted too, for an identical one that the new job gets
        _job(raw, "serving-canary").update(action="evict", instances=[], gpus=[])
        raw["creates"].append(_create(raw, 2, "azure-t4", "eastus-1", "Standard_NC4as_T4_v3", cloud="azure", region="eastus"))
        raw["deletes"].append({"instance_id": canary, "pool": "azure-t4", "provider": "sim", "cloud": "azure", "region": "eastus",
                               "zone": "eastus-1", "instance_type": "Standard_NC4as_T4_v3", "market": "on-demand",
                               "price": 0.526, "reason": "edited"})
        _job(raw, "t4-probe").update(action="place", instances=["+2"], gpus=[[0]])

    for attack in (take_the_t4, swap_the_t4):
        _fresh(out, pristine, attack)
        _refused(_apply(cfg, out), "job serving-canary: evicted, but it runs inside tenant product's guarantee")

    p4d = _host(cfg, "llm-pretrain")

    def move_into_its_room(raw):  # running work moved, for no rule, from an instance that stays into the gang's room
        _job(raw, "llm-pretrain").update(action="evict", instances=[], gpus=[])
        _move(raw, "finetune-a", [p4d], [[0]])

    _fresh(out, pristine, move_into_its_room)
    _refused(_apply(cfg, out), "job llm-pretrain: evicted, but it runs inside tenant research's guarantee",
             "the plan with it kept where it runs, and whatever took its room where it was, breaks no rule")

    def fill_the_budget(raw):  # the gang stopped, its two p4d deleted ($43.92/h), and $110/h of idle instances bought:
        _job(raw, "llm-pretrain").update(action="evict", instances=[], gpus=[])  # kept, it "broke" the $150/h budget
        for iid in {_host(cfg, "llm-pretrain", 0), _host(cfg, "llm-pretrain", 1)}:
            i = _live(cfg)[iid]
            raw["deletes"].append({"instance_id": iid, "pool": "aws-a100", "provider": "sim", "cloud": "aws", "region": "us-east-1",
                                   "zone": i["zone"], "instance_type": "p4d.24xlarge", "market": "on-demand", "price": 21.96,
                                   "reason": "edited"})
        raw["creates"].append(_create(raw, 2, "aws-a100", "us-east-1a", "p4d.24xlarge"))
        for n in (3, 4, 5):
            raw["creates"].append(_create(raw, n, "gcp-a100", "us-central1-a", "a2-highgpu-8g", cloud="gcp", region="us-central1"))

    def move_off_a_deleted_instance(raw):  # finetune-a's instance deleted for no rule, and finetune-a into the gang's room
        _job(raw, "llm-pretrain").update(action="evict", instances=[], gpus=[])
        _move(raw, "finetune-a", [p4d], [[0]])
        i = _live(cfg)[_host(cfg, "finetune-a")]
        raw["deletes"].append({"instance_id": i["id"], "pool": "gcp-a100", "provider": "sim", "cloud": "gcp", "region": "us-central1",
                               "zone": i["zone"], "instance_type": i["instance_type"], "market": i["market"], "price": 1.8,
                               "reason": "edited"})

    _fresh(out, pristine, move_off_a_deleted_instance)
    _refused(_apply(cfg, out), "job llm-pretrain: evicted, but it runs inside tenant research's guarantee")

    _fresh(out, pristine, fill_the_budget)
    _refused(_apply(cfg, out), "job llm-pretrain: evicted, but it runs inside tenant research's guarantee")
    assert set(_live(cfg)) == before
    assert api.read_status(cfg)["jobs"]["serving-canary"]["status"]["instances"] == [canary]
    out.write_text(pristine)  # the plan as made (it buys the minimum) applies
    assert _apply(cfg, out).exit_code == 0


def test_new_work_bought_up_to_the_budget_licenses_no_stop_of_guaranteed_work_while_a_pool_is_under_its_minimum(applied):
    """The fleet breaks aws-cpu's minimum (its one instance interrupted), under a $100/h budget. An edited plan stops
    research's guaranteed llm-pretrain gang, deletes its two p4d ($43.92/h) and places a new 3 x 8-GPU gang of another
    tenant on three new a2-highgpu-8g ($88.16/h): kept, llm-pretrain would take the fleet past the budget, and the re-check took
    that as the rule the stop mends. New work of another tenant ranks below running work inside its tenant's guarantee:
    weighed with it waiting (its instances not bought), keeping the gang breaks nothing, and the stop is refused."""
    cfg, out = applied
    SimCloud(state_dir(cfg)).interrupt(_host(cfg, "feature-etl"), notice_seconds=0)
    policies = cfg / "policies.yaml"
    policies.write_text(policies.read_text().replace("max_hourly_budget: 150", "max_hourly_budget: 100"))
    (cfg / "lab.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Tenant\nmetadata: {name: lab}\nspec: {}\n---\n"
                                  "apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: sweep-big}\nspec:\n"
                                  "  tenant: lab\n  replicas: 3\n  spot: never\n"
                                  "  resources: {gpus: 8, gpu_type: A100, cpu: 90, memory_gib: 600}\n")
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    pristine = out.read_text()
    assert _job(json.loads(pristine), "sweep-big")["action"] == "pending"  # (the budget)
    before = set(_live(cfg))

    def fund_it(raw):
        _job(raw, "llm-pretrain").update(action="evict", instances=[], gpus=[])
        for iid in {_host(cfg, "llm-pretrain", 0), _host(cfg, "llm-pretrain", 1)}:
            i = _live(cfg)[iid]
            raw["deletes"].append({"instance_id": iid, "pool": "aws-a100", "provider": "sim", "cloud": "aws", "region": "us-east-1",
                                   "zone": i["zone"], "instance_type": "p4d.24xlarge", "market": "on-demand", "price": 21.96,
                                   "reason": "edited"})
        raw["creates"] += [_create(raw, n, "gcp-a100", "us-central1-a", "a2-highgpu-8g", cloud="gcp", region="us-central1")
                           for n in (2, 3, 4)]
        _job(raw, "sweep-big").update(action="place", instances=["+2", "+3", "+4"], gpus=[list(range(8))] * 3)

    _fresh(out, pristine, fund_it)
    _refused(_apply(cfg, out), "job llm-pretrain: evicted, but it runs inside tenant research's guarantee")
    assert set(_live(cfg)) == before


def test_a_gang_split_across_zones_and_a_spot_share_past_its_cap_are_refused(applied):
    """Gang topology and the fleet's spot rules were not re-checked: a saved plan could split a gang over two
    zones, or buy spot past max_spot_fraction (issue 15)."""
    cfg, out = applied
    pristine, before = out.read_text(), set(_live(cfg))

    p4d = _host(cfg, "llm-pretrain", 0)
    zone = _live(cfg)[p4d]["zone"]
    other = "us-east-1b" if zone == "us-east-1a" else "us-east-1a"

    def split(to):  # llm-pretrain's second replica onto a new p4d.24xlarge in `to` (the pool allows a third)
        def change(raw):
            raw["creates"].append(_create(raw, 1, "aws-a100", to, "p4d.24xlarge"))
            _move(raw, "llm-pretrain", [p4d, "+1"], [list(range(8)), list(range(8))])
        return change

    _fresh(out, pristine, split(other))
    _refused(_apply(cfg, out), f"job llm-pretrain: its replicas span zones {sorted([zone, other])}; a gang runs in one zone")
    assert set(_live(cfg)) == before

    def more_spot(raw):  # the fleet runs 9 of its 26 GPUs on spot: two idle 8-GPU spot instances make it 25 of 42
        for n in (1, 2):
            raw["creates"].append(_create(raw, n, "gcp-a100", "us-central1-a", "a2-highgpu-8g", cloud="gcp",
                                          region="us-central1", market="spot"))

    _fresh(out, pristine, more_spot)
    _refused(_apply(cfg, out), "the plan breaks a rule the fleet keeps now: the fleet is 59.5% spot, over max_spot_fraction 0.5")
    assert set(_live(cfg)) == before
    _fresh(out, pristine, split(zone))  # the gang in one zone is a plan the planner could make: carried out
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output


def test_an_evict_for_spot_diversity_the_fleet_breaks_now_is_accepted(tmp_path):
    """The fleet's only spot instance is a CPU one in one zone, under min_zones 2: the fleet breaks spot diversity
    as it runs, so the planner stops the job on it. The re-check counted diversity only where spot GPUs ran and
    refused that honest plan (found by the property tier)."""
    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed, doc, instance, job, plan_for, pool, topology

    docs = [topology(), doc("SpotPolicy", "sp", {"max_spot_fraction": 0.25, "min_zones": 2}), doc("Tenant", "t1", {}),
            pool("gcp-cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="spot", hi=1),
            pool("aws-a100", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1),
            job("etl", "t1", cpu=4, mem=16), job("ft", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60)]
    fleet = [instance("i0", "gcp-cpu", "gcp", "us-central1", "us-central1-a", "n2-standard-16", market="spot"),
             instance("i1", "aws-a100", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")]
    placements = {"etl": ("i0",)}
    for time_limit in (10, 0):
        plan = plan_for(tmp_path / str(time_limit), docs, fleet, placements, time_limit=time_limit)
        assert next(j for j in plan.jobs if j.job == "etl").action == "evict"
        desired = load(tmp_path / str(time_limit))
        observed = catalog_observed(desired, fleet, placements)
        assert recheck(plan, desired, observed, build_problem(desired, observed))[1] == []


def test_extra_creates_past_a_cloud_quota_are_refused_before_anything_launches(tmp_path):
    """The account's P-instance vCPU quota has room for one more p4d.24xlarge; an edited plan asks for two (within
    the pool's max_instances and the budget). Before, the first launched and the second failed at the cloud: a
    half-applied plan. The quota is in the plan's observed snapshot, so the check needs no new read."""
    cfg = copy_quickstart(tmp_path)
    pools = cfg / "pools.yaml"
    pools.write_text(pools.read_text().replace("max_instances: 3", "max_instances: 6"))
    sim = SimCloud(state_dir(cfg))
    quota = "Running On-Demand P instances (L-417A185B)"
    sim.set_quota(quota, "aws", "us-east-1", "vCPUs", 96 * 3, market="on-demand", instance_types=["p4d.24xlarge"])
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    used = sum(1 for i in _live(cfg).values() if i["instance_type"] == "p4d.24xlarge" and i["market"] == "on-demand")
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    before = set(_live(cfg))
    room = 3 - used
    _edit(out, lambda raw: raw["creates"].extend([_create(raw, len(raw["creates"]) + n, "aws-a100", "us-east-1a",
                                                          "p4d.24xlarge") for n in range(1, room + 2)]))
    _refused(_apply(cfg, out), f"cloud quota: aws {quota} in us-east-1")
    assert set(_live(cfg)) == before



def _reshaped_at_quota(tmp_path: Path):
    """t (3 GPUs) runs normal ja and jc and low jl on one p4d, u (1 GPU) its normal jb beside them; a PR raises ja
    from 1 to 2 A100s. Returns (desired, observed, problem)."""
    from reconciler.load import load
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed, instance, job, pool, tenant, topology, write_config

    one = dict(gpu_type="A100", cpu=8, mem=60)
    docs = [topology(), tenant("t", gpus=3), tenant("u", gpus=1), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=2),
            job("ja", "t", gpus=2, priority="normal", **one), job("jc", "t", gpus=1, priority="normal", **one),
            job("jl", "t", gpus=1, priority="low", **one), job("jb", "u", gpus=1, priority="normal", **one)]
    fleet = [instance("i0", "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")]
    placements = {j: ("i0",) for j in ("ja", "jc", "jl", "jb")}
    shapes = {j: {"gpus": 1, "gpu_type": "A100", "mig": None, "nvlink": False, "cpu": 8.0, "memory_gib": 60.0} for j in placements}
    desired = load(write_config(tmp_path, docs))
    observed = replace(catalog_observed(desired, fleet, placements), shapes=shapes)
    return desired, observed, build_problem(desired, observed)


@pytest.mark.parametrize("time_limit", [10, 0], ids=["cp-sat", "greedy"])
def test_a_job_raised_past_its_tenants_quota_licenses_no_other_eviction(tmp_path, time_limit):
    """A PR raising a running job's GPUs puts its tenant over its quota only at the new size, which does not run
    yet. The fleet as it runs was read with the job at its new size (t at 4 of 3 GPUs: 'a rule the fleet breaks
    now, something must give'), so the re-check let any eviction through: an edited plan stopping u's guaranteed
    job jb was accepted. The honest plan (ja restarts at 2 GPUs, t's low jl stops for it) still is."""
    from reconciler.plancheck import recheck
    from reconciler.plan import make_plan
    from reconciler.solve import solve
    from tests.invariants import check_plan, check_stability

    desired, observed, problem = _reshaped_at_quota(tmp_path)
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=time_limit))
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)
    jobs = {j.job: j for j in plan.jobs}
    assert jobs["ja"].action == "move" and jobs["jl"].action == "evict" and jobs["jb"].action == jobs["jc"].action == "keep", jobs
    assert recheck(plan, desired, observed, problem)[1] == []
    edited = replace(plan, jobs=tuple(replace(j, action="evict", instances=(), gpus=()) if j.job == "jb" else j for j in plan.jobs))
    errors = recheck(edited, desired, observed, problem)[1]
    assert any("job jb: evicted, but it runs inside tenant u's guarantee" in e for e in errors), errors


def test_on_the_sim_a_raised_job_stops_its_own_tenants_low_job_and_apply_refuses_stopping_anothers(tmp_path):
    """The same PR end to end on the simulated cloud: applied, then ja raised from 1 to 2 A100s with its tenant t at its
    quota (3 GPUs). The plan restarts ja and stops t's low jl (apply records the shape each job runs with, so the
    plan knows ja runs at 1 GPU); the saved plan edited to stop u's guaranteed jb too is refused by `apply --plan`,
    which carries out the plan as made."""
    import yaml

    from tests.fleetkit import job, pool, tenant, topology, write_config

    def docs(ja_gpus: int) -> list[dict]:
        one = dict(gpu_type="A100", cpu=8, mem=60)
        return [topology(), tenant("t", gpus=3), tenant("u", gpus=1), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1),
                job("ja", "t", gpus=ja_gpus, priority="normal", **one), job("jc", "t", gpus=1, priority="normal", **one),
                job("jl", "t", gpus=1, priority="low", **one), job("jb", "u", gpus=1, priority="normal", **one)]

    cfg = write_config(tmp_path / "cfg", docs(1))
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    (cfg / "fleet.yaml").write_text(yaml.safe_dump_all(docs(2), sort_keys=False))
    out = tmp_path / "plan.json"
    res = runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK, "--detailed-exitcode"])
    assert res.exit_code == 2, res.output
    acts = {j["job"]: j["action"] for j in json.loads(out.read_text())["jobs"]}
    assert acts == {"ja": "move", "jc": "keep", "jl": "evict", "jb": "keep"}, acts
    pristine, before = out.read_text(), set(_live(cfg))
    _fresh(out, pristine, lambda raw: _job(raw, "jb").update(action="evict", instances=[], gpus=[]))
    _refused(_apply(cfg, out), "job jb: evicted, but it runs inside tenant u's guarantee")
    assert set(_live(cfg)) == before
    out.write_text(pristine)
    assert _apply(cfg, out).exit_code == 0
    assert runner.invoke(app, ["plan", str(cfg), "--time-limit", QUICK, "--detailed-exitcode"]).exit_code == 0


def test_a_plan_given_an_earlier_plans_id_and_keys_is_refused_before_anything_launches(applied):
    """Audit: a saved plan whose id (and so its create keys) was set to the first apply's. The cloud answers a key it has
    seen with that key's instance: apply took three busy instances (one an A10G box, for an A100 job) as new ones, put
    the plan's jobs beside their residents on the same GPUs, and reported "3 created"."""
    cfg, out = applied
    sim = SimCloud(state_dir(cfg))
    gcp = sorted(i for i, d in _live(cfg).items() if d["cloud"] == "gcp")
    for iid in gcp[:3]:
        sim.interrupt(iid)
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    first = min(d["tags"]["fleetops.io/create-key"] for d in _live(cfg).values()).split("-")[0]
    before = _live(cfg)

    def earlier(raw):
        assert raw["creates"], "the interrupts need replacements"
        raw["id"] = first
        for n, c in enumerate(raw["creates"], 1):
            c["key"] = f"{first}-{n:04d}"

    _edit(out, earlier)
    _refused(_apply(cfg, out), f"create +1: its key '{first}-0001' is the one")
    assert _live(cfg) == before


def test_a_create_the_cloud_answers_with_another_launchs_instance_places_nothing_on_it(tmp_path):
    """Defense in depth below the re-check: where the cloud answers a create with an instance of another site or fleet
    (a key some other launch used), the create fails and no replica is put on that instance."""
    from providers.base import Instance
    from reconciler.apply import _check_launched
    from reconciler.errors import ProviderError
    from reconciler.plan import CreateAction
    from reconciler.site import Site

    site = Site("aws-a100", "sim", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "on-demand")
    c = CreateAction(ref="+1", key="abc-0001", site=site, price=21.96, max_price=None)
    new = Instance("i-9", "sim", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "on-demand", "running", "aws-a100",
                   tags={"fleetops.io/fleet": "f"})
    _check_launched(c, c.key, new, frozenset({"i-1"}), "f")  # a new instance of the site asked for
    with pytest.raises(ProviderError, match="an instance the fleet already runs"):
        _check_launched(c, c.key, new, frozenset({"i-9"}), "f")
    with pytest.raises(ProviderError, match="a on-demand g5.12xlarge"):
        _check_launched(c, c.key, replace(new, instance_type="g5.12xlarge"), frozenset(), "f")
    with pytest.raises(ProviderError, match="an instance of fleet 'other'"):
        _check_launched(c, c.key, replace(new, tags={"fleetops.io/fleet": "other"}), frozenset(), "f")
    # Another repo's fleet of the same name (its own uid) is not this fleet either.
    theirs = replace(new, tags={"fleetops.io/fleet": "f", "fleetops.io/fleet-uid": "u-2"})
    with pytest.raises(ProviderError, match="an instance of fleet 'f' .uid u-2."):
        _check_launched(c, c.key, theirs, frozenset(), "f", "u-1")
    _check_launched(c, c.key, replace(theirs, tags={**theirs.tags, "fleetops.io/fleet-uid": "u-1"}), frozenset(), "f", "u-1")


def test_the_sim_answers_a_key_reused_for_another_launch_as_ec2_does(tmp_path):
    """EC2 answers a ClientToken reused with other parameters with IdempotentParameterMismatch, never with the other
    launch's instance; the sim did (it returned an A10G box for a p4d create). The key is spent: apply tries the next."""
    from providers.base import CreateRequest, PoolTarget, ProviderContext
    from providers.errors import KeySpentError
    from providers.sim import SimProvider

    prov = SimProvider(ProviderContext("f", tmp_path))
    pool = PoolTarget("p", "aws", "us-east-1", ("us-east-1a",), ("g5.xlarge", "m6i.4xlarge"))
    first = prov.create(CreateRequest("k-0001", pool, "us-east-1a", "g5.xlarge", "on-demand"))
    assert prov.create(CreateRequest("k-0001", pool, "us-east-1a", "g5.xlarge", "on-demand")).id == first.id  # a retry
    with pytest.raises(KeySpentError, match="IdempotentParameterMismatch"):
        prov.create(CreateRequest("k-0001", pool, "us-east-1a", "m6i.4xlarge", "on-demand"))


def _one_p4d(tmp_path: Path, *jobs: str) -> Path:
    from tests.fleetkit import job, pool, tenant, topology, write_config

    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=1, hi=1)]
    docs += [job(name, gpus=gpus, gpu_type="A100", cpu=4, mem=16) for name, gpus in (j.split(":") for j in jobs) for gpus in [int(gpus)]]
    return write_config(tmp_path / "cfg", docs)


def test_a_keep_given_other_gpus_than_it_runs_on_is_refused(tmp_path):
    """Audit: a kept job's GPUs relabelled (1 -> 7) in the saved plan and a new job given GPU 1: accepted, and both ran
    with CUDA_VISIBLE_DEVICES=1. A keep restarts nothing, so it must name the GPUs its replicas hold."""
    cfg = _one_p4d(tmp_path, "a:1", "b:1")
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    (cfg / "fleet.yaml").write_text((cfg / "fleet.yaml").read_text() + yaml_job("n", 1))
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    raw = json.loads(out.read_text())
    assert _job(raw, "b")["action"] == "keep" and _job(raw, "n")["action"] == "place"
    held = _job(raw, "b")["gpus"]  # as it runs
    taken = {g for name in ("a", "b", "n") for g in _job(raw, name)["gpus"][0]}
    free = min(set(range(8)) - taken)

    def relabel(raw):
        _job(raw, "b")["gpus"] = [[free]]
        _job(raw, "n")["gpus"] = held  # the GPU b goes on holding
    _edit(out, relabel)
    _refused(_apply(cfg, out), f"job b: keep, but on GPUs [[{free}]], not the GPUs it runs on ({held})")


def test_a_plan_saved_before_a_job_was_resized_in_place_is_stale(tmp_path):
    """Audit: a plan saved, then the fleet changed by an apply that resized a job in place (its GPUs, its shape), then
    the config put back and the old plan applied: both digests matched, and it restarted the job on fewer GPUs while a
    new job took a GPU the old one still held. The GPUs each replica holds and its shape are part of what a plan was
    made against."""
    cfg = _one_p4d(tmp_path, "a:1", "b:1")
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    text = (cfg / "fleet.yaml").read_text()
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    (cfg / "fleet.yaml").write_text(text.replace("gpus: 1", "gpus: 2", 1))  # a: 1 -> 2 GPUs, restarted in place
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    (cfg / "fleet.yaml").write_text(text)
    _refused(_apply(cfg, out), "stale plan: the fleet changed since the plan was made")


def yaml_job(name: str, gpus: int) -> str:
    import yaml

    from tests.fleetkit import job
    return "---\n" + yaml.safe_dump(job(name, gpus=gpus, gpu_type="A100", cpu=4, mem=16), sort_keys=False)


@pytest.mark.parametrize("field,value,needle", [("gpus", [[0.0]], "jobs[{n}].gpus[0][0]: expected an integer, got 0.0"),
                                                ("gpus", [["0"]], 'jobs[{n}].gpus[0][0]: expected an integer, got "0"'),
                                                ("instances", [1], "jobs[{n}].instances[0]: expected a string, got 1"),
                                                ("action", "restart", "jobs[{n}].action: 'restart' is not one of")])
def test_a_field_of_the_wrong_type_is_refused_before_anything_launches(applied, field, value, needle):
    """Audit: a saved plan's GPU indices written as floats passed the re-check; apply launched the replacement
    instance, then stopped with "unexpected PlacementTagError" and recorded nothing (the instance ran on, unknown
    to the state). Strings gave "unexpected TypeError". Every field is read as `reconcile plan` writes it, first."""
    cfg, out = applied
    SimCloud(state_dir(cfg)).interrupt(_host(cfg, "sweep-lr"))
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    assert json.loads(out.read_text())["creates"]
    before = _live(cfg)
    n = [j["job"] for j in json.loads(out.read_text())["jobs"]].index("sweep-lr")
    _edit(out, lambda raw: _job(raw, "sweep-lr").update({field: value}))
    _refused(_apply(cfg, out), f"cannot read plan {out}: " + needle.format(n=n))
    assert _live(cfg) == before


def _text(text: str):
    return lambda path: path.write_text(text)


def _redigested(change):
    return lambda path: _edit(path, change)


@pytest.mark.parametrize("corrupt,needle", [
    (_text("[]"), "not a plan: a JSON array, not an object"),
    (_text('"x"'), "not a plan: a JSON string, not an object"),
    (_text("[" * 100_000), "not a plan: nested too deep to be read"),
    (_text('{"format": 2, "id": ' + "[" * 100_000), "not a plan: nested too deep to be read"),
    # A key twice: JSON's last one won, so a `"fleet"` added before the real one passed the digest (which covers the
    # parsed body) while the file showed a reader another fleet; likewise inside an action (s35).
    (lambda path: path.write_text('{"fleet": "someone-else", ' + path.read_text().lstrip()[1:]),
     'not a plan: the key "fleet" appears twice in one object'),
    (lambda path: path.write_text(path.read_text().replace('"key": ', '"pool": "x", "key": ', 1)),
     'not a plan: the key "pool" appears twice'),
    (_redigested(lambda raw: raw["solver"].update(tiers="x")), "solver.tiers: expected a list, got str"),
    (_redigested(lambda raw: raw.update(solver={})), "solver: status is missing"),
    (_redigested(lambda raw: raw["solver"]["tiers"][0].update(proven="yes")), 'solver.tiers[0].proven: expected true or false, got "yes"'),
    (_redigested(lambda raw: raw["solver"].update(scope=[1])), "solver.scope: expected [solved, frozen]"),
    (_redigested(lambda raw: raw["solver"].update(seconds=1.0)), "solver: unknown field 'seconds'"),
    (_redigested(lambda raw: raw.update(consolidation={"moved_replicas": 1})), "consolidation: instances_removed is missing"),
    (_redigested(lambda raw: raw.update(notes="x")), "notes: expected a list, got str"),
    # The id keys every create (`<id>-0001`, an AWS ClientToken of at most 64 characters) and goes into tags and status/.
    (_redigested(lambda raw: raw.update(id="my plan")), 'id: "my plan" is not a plan id (12 hex digits'),
    (_redigested(lambda raw: raw.update(id='a"b\ncd')), 'id: "a\\"b\\ncd" is not a plan id'),
    (_redigested(lambda raw: raw.update(id="a" * 5000)), "is not a plan id (12 hex digits"),
    (_redigested(lambda raw: raw.update(id=raw["id"].upper())), "is not a plan id (12 hex digits"),
    # A field no version writes was read past, while one inside an action was refused (attacks s34).
    (_redigested(lambda raw: raw.update(evict_all=True)), "unknown field 'evict_all' (no fleetops writes it"),
], ids=["list", "string", "deep list", "deep in an object", "a key twice", "a key twice in a create", "tiers a string", "solver empty", "tier proven a string", "scope short",
        "solver unknown field", "consolidation short", "notes a string", "id with a space", "id with a quote and newline",
        "id 5000 chars", "id upper case", "unknown top-level field"])
def test_a_malformed_plan_file_is_one_clear_error_and_changes_nothing(applied, corrupt, needle):
    """Audit: `[]` or `"x"` gave "unexpected AttributeError", 100,000 `[` "unexpected RecursionError"; with the body digest
    recomputed (anyone can), `solver.tiers: "x"` an AttributeError and `solver: {}` SolverReport's missing arguments; and
    an id with spaces, quotes, a newline or 5,000 characters was applied, into create keys, tags and status/."""
    cfg, out = applied
    SimCloud(state_dir(cfg)).interrupt(_host(cfg, "sweep-lr"))  # a plan with a create, so a slip would launch it
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    assert json.loads(out.read_text())["creates"]
    before = _live(cfg)
    corrupt(out)
    _refused(_apply(cfg, out), f"cannot read plan {out}: ", needle)
    assert _live(cfg) == before


def test_a_plan_files_fields_are_the_plans():
    """The fields read_body takes are the ones `reconcile plan` writes: one added to Plan is not refused as unknown."""
    from dataclasses import fields

    from reconciler.plan import Plan
    from reconciler.plan.file import PLAN_FIELDS

    assert sorted(PLAN_FIELDS) == sorted(f.name for f in fields(Plan))


def test_a_plan_handed_to_the_api_with_an_id_plan_does_not_make_is_refused(applied):
    """The same rule for a Plan object given to api.apply (not read from a file): the re-check refuses its id."""
    from reconciler.errors import StalePlanError

    cfg, out = applied
    SimCloud(state_dir(cfg)).interrupt(_host(cfg, "sweep-lr"))
    plan = api.plan(cfg, time_limit=float(QUICK)).plan
    assert plan.creates
    bad = "x" * 70
    plan = replace(plan, id=bad, creates=tuple(replace(c, key=f"{bad}-{n:04d}") for n, c in enumerate(plan.creates, 1)))
    before = _live(cfg)
    with pytest.raises(StalePlanError, match="plan id 'xxxxxxxx.*' is not one `reconcile plan` makes"):
        api.apply(cfg, saved_plan=plan, time_limit=float(QUICK))
    assert _live(cfg) == before


# While the fleet breaks a fleet-wide rule now (audit of plancheck.KeptInstead): a stop whose "need" the plan's other parts
# made. Each fleet is planned by CP-SAT and by greedy alone, both plans re-checked (they must apply), then edited.


def _weighed(tmp_path: Path, docs: list[dict], fleet: list, placements: dict, gpu_indices: dict):
    """The planners' plans of this fleet (CP-SAT's, greedy's; each accepted by the re-check), and the re-check of an edit."""
    from reconciler.load import load
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed, plan_for, write_config

    desired = load(write_config(tmp_path / "cfg", docs))
    observed = replace(catalog_observed(desired, fleet, placements), gpu_indices=gpu_indices)

    def check(plan) -> list[str]:
        return recheck(plan, desired, observed, build_problem(desired, observed))[1]

    plans = [plan_for(tmp_path / f"t{tl}", docs, fleet, placements, time_limit=tl, gpu_indices=gpu_indices) for tl in (10, 0)]
    for plan in plans:
        assert check(plan) == [], plan
    return plans, check


def _set(plan, name: str, action: str, instances=(), gpus=()):
    return replace(plan, jobs=tuple(replace(j, action=action, instances=tuple(instances), gpus=tuple(gpus)) if j.job == name else j
                                    for j in plan.jobs))


def _deleting(plan, *instances):
    from reconciler.plan import DeleteAction
    from reconciler.site import Site

    return replace(plan, deletes=tuple(DeleteAction(i.id, Site.of(i), 0.0, "edited") for i in instances))


def _buying(plan, pool: str, cloud: str, region: str, zone: str, itype: str):
    from reconciler.plan import CreateAction
    from reconciler.site import Site

    n = len(plan.creates) + 1
    site = Site(pool=pool, provider="sim", cloud=cloud, region=region, zone=zone, instance_type=itype, market="on-demand")
    return replace(plan, creates=plan.creates + (CreateAction(f"+{n}", f"{plan.id}-{n:04d}", site, 0.0, None),)), f"+{n}"


def _a100_fleet(*, hi: int = 4, lo_cpu: int = 1, extra=(), market: str = "on-demand"):
    """t1's job e and t2's job x, each 1 A100, inside their tenants' guarantees; an empty CPU pool under its minimum (the
    fleet breaks a fleet-wide rule now, whatever a plan does)."""
    from tests.fleetkit import job, pool, tenant, topology

    return [topology(), tenant("t1", gpus=8), tenant("t2", gpus=8),
            pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market=market, hi=hi),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=lo_cpu, hi=2),
            job("e", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60), *extra] + \
        ([] if any(d["metadata"]["name"] == "x" for d in extra) else [job("x", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60)])


def _gcp(n: int, itype: str = "a2-highgpu-1g", pool: str = "gpu", market: str = "on-demand"):
    from tests.fleetkit import instance

    return instance(f"i{n}", pool, "gcp", "us-central1", "us-central1-a", itype, market=market)


def test_a_pool_under_its_minimum_licenses_no_stop_of_guaranteed_work_whose_room_another_tenants_work_takes_by_an_edit(tmp_path):
    """aws-cpu under its minimum (something must give). Edited plans stopped t1's guaranteed e for t2's x, and apply
    carried them out: x moved in place on their shared a2-highgpu-2g onto e's GPU index, or kept there with e's GPU written
    as its where its own were never recorded (e then "did not fit" where it ran); x,
    which must leave its spot host (spot: never), moved into e's room (work a rule moves "outranked" e); t2's gang g,
    one replica lost, re-formed in e's room (a gang re-forming "outranked" it). Work a rule moves and gangs re-forming
    are new work, as the planner counts them: another tenant's waits for a job inside its guarantee."""
    from tests.fleetkit import job, pool

    docs = _a100_fleet()
    docs[3] = pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-2g"], hi=2)
    plans, check = _weighed(tmp_path / "gpu-index", docs, [_gcp(1, "a2-highgpu-2g")], {"e": ("i1",), "x": ("i1",)},
                            {"e": [[0]], "x": [[1]]})
    for plan in plans:
        assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e
                   for e in check(_set(_set(plan, "e", "evict"), "x", "move", ["i1"], [(0,)])))
    plans, check = _weighed(tmp_path / "unrecorded", docs, [_gcp(1, "a2-highgpu-2g")], {"e": ("i1",), "x": ("i1",)}, {"e": [[0]]})
    for plan in plans:  # x's GPUs never recorded: kept, the plan wrote e's GPU as x's
        for action in ("keep", "move"):
            assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e
                       for e in check(_set(_set(plan, "e", "evict"), "x", action, ["i1"], [(0,)])))

    spot = [_gcp(1), _gcp(2, market="spot")]
    never = job("x", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60, spot="never")
    plans, check = _weighed(tmp_path / "must-leave", _a100_fleet(extra=[never], market="either"), spot, {"e": ("i1",), "x": ("i2",)},
                            {"e": [[0]], "x": [[0]]})
    for plan in plans:
        assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e
                   for e in check(_set(_set(plan, "e", "evict"), "x", "move", ["i1"], [(0,)])))

    gang = job("g", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60, replicas=2, gang="zone")
    plans, check = _weighed(tmp_path / "gang", _a100_fleet(extra=[gang]), [_gcp(1), _gcp(2)],
                            {"e": ("i1",), "g": ("i2",)}, {"e": [[0]], "g": [[0]]})
    for plan in plans:
        assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e
                   for e in check(_set(_set(plan, "e", "evict"), "g", "move", ["i2", "i1"], [(0,), (0,)])))


def test_a_stop_is_not_made_needed_by_a_dearer_move_an_idle_instance_kept_or_another_tenants_borrowed_work(tmp_path):
    """Edited plans stopped t1's guaranteed e, each for a rule the plan's other parts made it "need", and apply carried
    them out: with aws-cpu under its minimum and a $32/h budget, t2's x moved to a new $29/h a2-highgpu-8g (kept, e
    "broke" the budget); with gpu's max_instances lowered to 2 of the 3 running, the idle third kept and e's deleted (kept,
    e "broke" the maximum); with a license lowered to 1 of the 2 held, t2's borrowed x kept it. Running work moved for
    no rule goes back where it ran, idle instances no rule asks for are not kept, and borrowed work goes first."""
    from tests.fleetkit import doc, job, pool, tenant, topology

    docs = _a100_fleet(extra=[doc("GuardrailPolicy", "g", {"max_hourly_budget": 32}),
                              pool("big", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=1)])
    fleet = [_gcp(1), _gcp(2)]
    plans, check = _weighed(tmp_path / "budget", docs, fleet, {"e": ("i1",), "x": ("i2",)}, {"e": [[0]], "x": [[0]]})
    for plan in plans:
        dearer, ref = _buying(_deleting(_set(plan, "e", "evict"), *fleet), "big", "gcp", "us-central1", "us-central1-a", "a2-highgpu-8g")
        assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e for e in check(_set(dearer, "x", "move", [ref], [(0,)])))

    fleet = [_gcp(1), _gcp(2), _gcp(3)]
    plans, check = _weighed(tmp_path / "max", _a100_fleet(hi=2, lo_cpu=0), fleet, {"e": ("i1",), "x": ("i2",)},
                            {"e": [[0]], "x": [[0]]})
    for plan in plans:
        assert [d.instance_id for d in plan.deletes] == ["i3"]
        for edit in (_deleting(_set(plan, "e", "evict"), fleet[0]),  # the idle i3 kept
                     _deleting(_set(_set(plan, "e", "evict"), "x", "move", ["i1"], [(0,)]), fleet[1])):  # x into e's room
            assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e for e in check(edit))

    lic = [topology(), tenant("t1", gpus=8), tenant("t2", gpus=0, burst={"gpus": 8}), doc("License", "lic", {"count": 1}),
           pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=4),
           job("e", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60, licenses={"lic": 1}),
           job("x", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60, licenses={"lic": 1})]
    fleet = [_gcp(1), _gcp(2)]
    plans, check = _weighed(tmp_path / "license", lic, fleet, {"e": ("i1",), "x": ("i2",)}, {"e": [[0]], "x": [[0]]})
    for plan in plans:
        assert [j.job for j in plan.jobs if j.action == "evict"] == ["x"]
        edit = _deleting(_set(_set(plan, "x", "keep", ["i2"], [(0,)]), "e", "evict"), fleet[0])
        assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e for e in check(edit))


def test_spot_ballast_the_plan_keeps_or_buys_licenses_no_stop_of_guaranteed_spot_work(tmp_path):
    """The fleet runs t1's e on spot beside t2's x on demand, over max_spot_fraction 0.4 (or, with an idle on-demand
    instance, under it while aws-cpu is under its minimum). An edited plan stopped e and bought (or kept) an idle on-demand
    instance: weighed with that instance taken as padding, e kept "broke" the spot share, and apply carried it out. Kept,
    e is what the idle instance is ballast for: the padding is offered again with the job kept."""
    from tests.fleetkit import doc, instance, job, pool, tenant, topology

    docs = [topology(), tenant("t1", gpus=8), tenant("t2", gpus=8), doc("SpotPolicy", "sp", {"max_spot_fraction": 0.4}),
            pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="either", hi=6),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=2),
            job("e", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60), job("x", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60)]
    spot = instance("i1", "gpu", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", market="spot")
    for fleet in ([spot, _gcp(2)], [spot, _gcp(2), _gcp(3)]):
        plans, check = _weighed(tmp_path / str(len(fleet)), docs, fleet, {"e": ("i1",), "x": ("i2",)}, {"e": [[0]], "x": [[0]]})
        for plan in plans:
            edit = _deleting(_set(_set(plan, "e", "evict"), "x", "keep", ["i2"], [(0,)]), spot)
            if len(fleet) == 2:
                edit = _buying(replace(edit, creates=tuple(c for c in edit.creates if c.site.pool == "cpu")), "gpu", "gcp",
                               "us-central1", "us-central1-a", "a2-highgpu-1g")[0]
            assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e for e in check(edit)), check(edit)


def test_a_tenant_over_its_own_spot_share_licenses_no_stop_of_its_on_demand_work(tmp_path):
    """t1 runs e on demand and s on spot, over its own max_spot_fraction 0.3 (lowered): its own rule broken now let any
    of its jobs go, and an edited plan that stopped e (keeping s on spot: t1 then all spot, worse) was applied. Its spot
    share licenses the stop of its spot work only."""
    from tests.fleetkit import doc, instance, job, pool, tenant, topology

    docs = [topology(), tenant("t1", gpus=8), tenant("t2", gpus=8),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.9, "tenant_max_spot_fraction": {"t1": 0.3}}),
            pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="either", hi=6),
            job("e", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60), job("s", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60),
            job("x", "t2", gpus=1, gpu_type="A100", cpu=8, mem=60)]
    fleet = [_gcp(1), instance("i2", "gpu", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", market="spot"), _gcp(3)]
    plans, check = _weighed(tmp_path, docs, fleet, {"e": ("i1",), "s": ("i2",), "x": ("i3",)}, {j: [[0]] for j in "esx"})
    for plan in plans:
        edit = replace(_set(plan, "e", "evict"), creates=())
        edit = _deleting(_set(_set(edit, "s", "keep", ["i2"], [(0,)]), "x", "keep", ["i3"], [(0,)]), fleet[0])
        assert any("job e: evicted, but it runs inside tenant t1's guarantee" in e for e in check(edit)), check(edit)
        edit = _deleting(_set(_set(replace(_set(plan, "s", "evict"), creates=()), "e", "keep", ["i1"], [(0,)]), "x", "keep",
                              ["i3"], [(0,)]), fleet[1])
        assert check(edit) == []  # (its spot job's stop mends it: accepted)


def test_a_tenant_over_its_gpu_ceiling_licenses_no_stop_of_its_cpu_work(tmp_path):
    """t1 (quota 1 GPU, lowered) runs two 1-GPU jobs and the CPU job c: over its GPU ceiling, its own rule let any of
    its jobs go, and an edited plan that stopped c and kept both GPU jobs (t1 still over its ceiling) was applied. Its
    ceiling licenses the stop of its work in a dimension it is over only."""
    from tests.fleetkit import instance, job, pool, tenant, topology

    docs = [topology(), tenant("t1", gpus=1, cpu=64), tenant("t2", gpus=8),
            pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=6),
            pool("cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], hi=3),
            job("g1", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60, priority="high"),
            job("g2", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60, priority="low"), job("c", "t1", cpu=4, mem=8, priority="high")]
    fleet = [_gcp(1), _gcp(2), instance("i3", "cpu", "gcp", "us-central1", "us-central1-a", "n2-standard-16")]
    plans, check = _weighed(tmp_path, docs, fleet, {"g1": ("i1",), "g2": ("i2",), "c": ("i3",)}, {"g1": [[0]], "g2": [[0]]})
    for plan in plans:
        assert [j.job for j in plan.jobs if j.action == "evict"] == ["g2"]
        edit = _deleting(_set(_set(_set(plan, "c", "evict"), "g1", "keep", ["i1"], [(0,)]), "g2", "keep", ["i2"], [(0,)]), fleet[2])
        assert any("job c: evicted, but it runs inside tenant t1's guarantee" in e for e in check(edit)), check(edit)


def test_a_pool_under_its_minimum_is_left_under_it_only_where_the_planner_cannot_buy_for_it(tmp_path):
    """Pool cpu (min_instances 3) runs one m6i.xlarge, i0: under its minimum now. `pool-min` broken now licensed any
    plan for it: an edit that bought nothing for it, or deleted i0 too, applied. A plan that could meet the minimum
    (an offer of the pool breaks no rule) and does not, or takes an instance it can keep, is refused now; the
    planner's own plans where it cannot (its zone in a capacity cool-off; a cloud quota with room for one more) are not."""
    from providers.base import Quota
    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, instance, pool, tenant, topology, write_config

    i0 = instance("i0", "cpu", "aws", "us-east-1", "us-east-1a", "m6i.xlarge")
    desired = load(write_config(tmp_path, [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], lo=3, hi=4)]))

    def planned(**observed_too):
        """The planners' plans (CP-SAT's, greedy's) and the re-check of a plan."""
        observed = replace(catalog_observed(desired, [i0], {}), **observed_too)
        problem = build_problem(desired, observed)
        plans = [make_plan(desired, observed, problem, solve(problem, time_limit=tl)) for tl in (10, 0)]
        return plans, lambda plan: recheck(plan, desired, observed, build_problem(desired, observed))[1]

    plans, check = planned()
    for plan in plans:
        assert len(plan.creates) == 2 and check(plan) == []
        assert check(replace(plan, creates=plan.creates[:1])) == [
            "pool cpu: the plan leaves 2 instances, under its min_instances 3, where one more on-demand m6i.xlarge in "
            "us-east-1a breaks no rule (the planner buys it)"]
        assert check(_deleting(replace(plan, creates=()), i0)) == [
            "pool cpu: the plan leaves 0 instances, under its min_instances 3, where the fleet keeps 1 instance (a pool under its "
            "minimum may not lose an instance it can keep)"]
    plans, check = planned(short=frozenset({("aws", "us-east-1a", "m6i.xlarge", "on-demand")}))
    for plan in plans:
        assert not plan.creates and not plan.deletes and check(plan) == []
    quota = Quota("aws", "us-east-1", "Running On-Demand Standard instances", "vCPUs", 8, 4, (("m6i.xlarge", "on-demand", 4),))
    plans, check = planned(quotas=(quota,))
    for plan in plans:
        assert len(plan.creates) == 1 and check(plan) == []
        assert check(replace(plan, creates=())) == [
            "pool cpu: the plan leaves 1 instance, under its minimum 2 (min_instances 3 lowered to 2: cloud quota aws Running "
            "On-Demand Standard instances in us-east-1 has no room for more), where one more on-demand m6i.xlarge in "
            "us-east-1a breaks no rule (the planner buys it)"]


def test_a_saved_plans_notes_and_claims_are_not_printed_as_the_tools_own(tmp_path):
    """`apply --plan` printed the file's notes, solver line and job reasons as written: a forged "Note: approved by
    security" read as the tool's own word. Notes are what observe says now (the fleet as apply sees it); the solver's
    claims and the reasons, which only a solve could recompute, are printed marked as the plan file's words."""
    cfg = copy_quickstart(tmp_path)
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0

    def forge(raw):
        raw["notes"] = ["approved by security"]
        raw["solver"].update(status="GREEDY_FALLBACK", note="signed off by security")
        next(j for j in raw["jobs"] if j["action"] == "place")["reason"] = "cleared by security"
    _edit(out, forge)
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output
    assert "approved by security" not in res.output, res.output
    said = [line for line in res.output.splitlines() if "signed off by security" in line]
    assert said and all(line.startswith("The plan file says: ") for line in said), res.output
    assert "cleared by security" in res.output and "note (the plan file's)" in res.output, res.output
