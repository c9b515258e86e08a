"""An instance whose MIG layout is not its pool's is drifted and replaced (as Karpenter replaces a node whose
NodePool's requirements changed): the layout is applied once, at launch (providers/bootstrap.py), so no
replica restarts "in place" on GPUs partitioned otherwise. Each instance records its layout at launch
(`fleetops.io/mig`), observe reads it back and the drift check compares it with the pool's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

import yaml

from providers.base import Instance, mig_of
from providers.sim import SimCloud
from reconciler import api
from reconciler.state import load_state, state_dir
from tests.fleetkit import doc, pool, tenant, topology, write_config
from tests.invariants import check_plan, check_stability


def mig_fleet(layout: list[str], profile: str) -> list[dict]:
    p = pool("mig1", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=4)  # one A100 (40 GB)
    p["spec"]["mig"] = layout
    jobs = [doc("Job", n, {"tenant": "t", "resources": {"gpu_type": "A100", "mig": {"profile": profile, "count": 1},
                                                          "cpu": 4, "memory_gib": 16}}) for n in ("m-a", "m-b")]
    return [topology(), tenant("t"), p, *jobs]


def live(cfg) -> dict[str, dict]:
    return {i["id"]: i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"}


def checked(cfg):
    res = api.plan(cfg, time_limit=5)
    check_plan(res.desired, res.observed, res.plan)
    check_stability(res.desired, res.observed, res.plan)
    return res


def test_a_changed_mig_layout_replaces_the_instance_and_then_converges(tmp_path):
    cfg = write_config(tmp_path / "cfg", mig_fleet(["3g.20gb", "3g.20gb"], "3g.20gb"))
    api.apply(cfg, time_limit=5)
    old = live(cfg)
    (old_id,) = old
    assert set(load_state(cfg).placements) == {"m-a", "m-b"}

    write_config(cfg, mig_fleet(["2g.10gb", "2g.10gb", "2g.10gb"], "2g.10gb"))
    res = checked(cfg)
    plan = res.plan
    assert [d.instance_id for d in plan.deletes] == [old_id]
    assert "MIG layout" in plan.deletes[0].reason and "3g.20gb" in plan.deletes[0].reason and "2g.10gb" in plan.deletes[0].reason
    assert len(plan.creates) == 1
    for j in plan.jobs:
        assert j.action == "move" and j.previous == (old_id,) and j.instances == (plan.creates[0].ref,), j
        assert "restarts in place" not in j.reason and "MIG layout" in j.reason, j.reason

    assert old[old_id]["tags"]["fleetops.io/mig"] == "3g.20gb-3g.20gb"  # recorded at launch
    api.apply(cfg, time_limit=5)
    now = live(cfg)
    assert old_id not in now and [i["tags"]["fleetops.io/mig"] for i in now.values()] == ["2g.10gb-2g.10gb-2g.10gb"]
    again = checked(cfg).plan
    assert not again.creates and not again.deletes and all(j.action == "keep" for j in again.jobs), again.jobs



def test_a_job_that_did_not_change_leaves_a_drifted_instance_saying_why(tmp_path):
    """The pool's layout changes under a job that still asks what the new layout has too: the job moves (its GPU keeps
    the old devices, the new layout's indices would name others) and says which rule moves it."""
    cfg = write_config(tmp_path / "cfg", mig_fleet(["3g.20gb", "3g.20gb"], "3g.20gb"))
    api.apply(cfg, time_limit=5)
    (old_id,) = live(cfg)
    write_config(cfg, mig_fleet(["3g.20gb", "2g.10gb", "1g.5gb"], "3g.20gb"))  # one 3g.20gb a GPU now
    plan = checked(cfg).plan
    assert [d.instance_id for d in plan.deletes] == [old_id] and len(plan.creates) == 2
    for j in plan.jobs:
        assert j.action == "move" and j.reason == (
            f"leaves {old_id}: drifted from Pool/mig1: its MIG layout [3g.20gb, 3g.20gb] is not the pool's "
            "[3g.20gb, 2g.10gb, 1g.5gb] (a layout is applied only at launch)"), j


def _set_tag(cfg, iid: str, value: str | None) -> None:
    with SimCloud(state_dir(cfg)).world() as w:
        d = dict(w["instances"][iid])
        d["tags"] = {k: v for k, v in d["tags"].items() if k != "fleetops.io/mig"} | ({"fleetops.io/mig": value} if value else {})
        w["instances"][iid] = d


def test_an_instance_launched_before_layouts_were_recorded_has_its_pools_layout(tmp_path):
    """No `fleetops.io/mig` (an older version launched it): its pool's layout, as before, so upgrading replaces
    nothing. Reordering a layout is no drift either: the GPU holds the same devices (the bootstrap creates the larger
    first, the agent matches devices by profile)."""
    cfg = write_config(tmp_path / "cfg", mig_fleet(["3g.20gb", "2g.10gb", "2g.10gb"], "2g.10gb"))
    api.apply(cfg, time_limit=5)
    (iid,) = live(cfg)
    _set_tag(cfg, iid, None)
    assert not checked(cfg).plan.has_changes
    _set_tag(cfg, iid, "2g.10gb-3g.20gb-2g.10gb")
    assert not checked(cfg).plan.has_changes
    _set_tag(cfg, iid, "none")  # launched for whole GPUs: drifted
    plan = checked(cfg).plan
    assert [d.instance_id for d in plan.deletes] == [iid] and "its MIG layout none (whole GPUs)" in plan.deletes[0].reason


def test_devices_are_named_by_the_layout_the_instance_was_launched_with(tmp_path):
    """The assignment's `G:M` indices follow the layout the instance recorded, not its pool's now: a reordered pool
    layout does not rename a running replica's device. An instance that records none: its pool's."""
    from reconciler.load import load
    from reconciler.runtime.publish import mig_hosts

    d = load(write_config(tmp_path / "cfg", mig_fleet(["1g.5gb", "3g.20gb", "2g.10gb"], "2g.10gb")))

    def inst(iid: str, layout: str | None = None) -> Instance:
        return Instance(iid, "sim", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "on-demand", "running", "mig1",
                        tags={"fleetops.io/pool": "mig1", **({"fleetops.io/mig": layout} if layout else {})})

    hosts = mig_hosts(d, [inst("i-1", "3g.20gb-2g.10gb-1g.5gb"), inst("i-2"), inst("i-3", "none")])
    assert hosts == {"i-1": (("3g.20gb", "2g.10gb", "1g.5gb"), 1), "i-2": (("1g.5gb", "3g.20gb", "2g.10gb"), 1)}


# ---------------------------------------------------------------- every cloud: the same through its tags or labels


def cloud_mig_config(cfg: Path, pool: str, itype: str, gpu_type: str, layout: list[str], profile: str, like: str | None = None,
                     fleet: str | None = None) -> Path:
    """An example config (examples/<cloud>-only) cut down to one on-demand MIG pool of `itype` in one zone (its cloud
    settings those of its pool `like`, else `pool`'s) and two jobs of one `profile` device each; `fleet`: its
    Topology's name (a fleet of its own where the cloud outlives the test: moto's server serves the whole session)."""
    docs = [d for d in yaml.safe_load_all((cfg / "fleet.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "Topology" and fleet:
            d["metadata"]["name"] = fleet
    pools = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pool"}
    base = pools[pool] if pool in pools and pools[pool]["spec"].get("mig") else pools[like or pool]  # (edited again: itself)
    p = copy.deepcopy(base)
    p["metadata"]["name"] = pool
    p["spec"].update(instance_types=[itype], market="on-demand", zones=base["spec"]["zones"][:1], max_instances=2, mig=layout)
    for d in docs:
        if d["kind"] == "GuardrailPolicy":
            d["spec"]["max_hourly_budget"] = 100
    (cfg / "fleet.yaml").write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "Pool"] + [p], sort_keys=False))
    jobs = [doc("Job", n, {"tenant": "research", "resources": {"gpu_type": gpu_type, "mig": {"profile": profile, "count": 1},
                                                                "cpu": 2, "memory_gib": 8}}) for n in ("m-a", "m-b")]
    (cfg / "jobs" / "jobs.yaml").write_text(yaml.safe_dump_all(jobs, sort_keys=False))
    return cfg


def check_mig_drift_on(cfg: Path, provider: str, options: dict, edit: Callable[[list[str], str], Path], before: list[str],
                       after: list[str], profiles: tuple[str, str], raw: Callable[[Instance], str], wire: Callable[[str], str]) -> None:
    """Apply a MIG pool on `provider`: each instance records its layout in the cloud's own tag or label (`raw` reads it,
    spelled as `wire` spells the logical value) and observe reads it back exact. The layout edited: the plan replaces
    the instance, and after the apply the next plan is a no-op."""
    edit(before, profiles[0])
    res = api.apply(cfg, provider=provider, options=options)
    assert res.report.ok and res.plan.creates
    first = api.plan(cfg, provider=provider, options=options)
    assert not first.plan.has_changes, first.plan.jobs
    old = {i.id: i for i in first.observed.instances}
    for i in old.values():
        assert mig_of(i.tags) == tuple(before) and raw(i) == wire("-".join(before)), (i.tags, raw(i))
    edit(after, profiles[1])
    plan = api.plan(cfg, provider=provider, options=options).plan
    assert sorted(d.instance_id for d in plan.deletes) == sorted(old) and plan.creates
    assert all("MIG layout" in d.reason for d in plan.deletes), plan.deletes
    assert not any("restarts in place" in j.reason for j in plan.jobs), plan.jobs
    assert api.apply(cfg, provider=provider, options=options).report.ok
    again = api.plan(cfg, provider=provider, options=options)
    assert not again.plan.has_changes, again.plan.jobs
    assert not set(old) & {i.id for i in again.observed.instances}
    assert all(mig_of(i.tags) == tuple(after) and raw(i) == wire("-".join(after)) for i in again.observed.instances)
