"""GPU indices survive across runs: apply records each replica's GPUs in the state, the next plan
keeps running replicas on the GPUs they have and gives new ones only what is free."""

from __future__ import annotations

import json

from reconciler import api
from reconciler.state import state_dir
from tests.fleetkit import job, pool, tenant, topology, write_config


def _docs(jobs):
    return [topology("gpus", clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t"),
            pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1), *jobs]


def test_running_replicas_keep_their_gpus_and_new_ones_take_what_is_free(tmp_path):
    cfg = tmp_path / "cfg"
    a = job("a", gpus=2, gpu_type="A100", cpu=8, mem=60)
    b = job("b", gpus=1, gpu_type="A100", cpu=8, mem=60)
    c = job("c", gpus=4, gpu_type="A100", cpu=8, mem=60)
    # b first, then a and c join it: where they land depends on what b took, which no packing
    # of {a, b, c} from scratch would reproduce (it would put c, the largest, at 0-3).
    write_config(cfg, _docs([b]))
    api.apply(cfg, time_limit=5)
    write_config(cfg, _docs([a, b, c]))
    res = api.apply(cfg, time_limit=5)
    gpus = {j.job: j.gpus for j in res.plan.jobs}
    assert gpus["c"] != ((0, 1, 2, 3),)
    saved = json.loads((state_dir(cfg) / "state.json").read_text())["gpus"]
    assert saved == {k: [list(g) for g in v] for k, v in gpus.items()}
    used = sorted(i for v in gpus.values() for g in v for i in g)
    assert used == sorted(set(used)) and len(used) == 7
    # b finishes; d (2 GPUs) arrives: a and c keep their GPUs, d gets an aligned free pair.
    write_config(cfg, _docs([a, c, job("d", gpus=2, gpu_type="A100", cpu=8, mem=60)]))
    res2 = api.apply(cfg, time_limit=5)
    after = {j.job: j for j in res2.plan.jobs}
    assert after["a"].action == "keep" and after["a"].gpus == gpus["a"]
    assert after["c"].action == "keep" and after["c"].gpus == gpus["c"]
    d = after["d"].gpus[0]
    taken = {i for k in ("a", "c") for g in gpus[k] for i in g}
    assert not set(d) & taken and d[0] % 2 == 0 and d[1] == d[0] + 1
    assert not res2.plan.creates  # it fits on the instance that is there
    # Nothing changed since: the next plan shows the same GPUs and no changes.
    again = api.plan(cfg, time_limit=5).plan
    assert not again.has_changes and {j.job: j.gpus for j in again.jobs} == {k: v.gpus for k, v in after.items()}


def test_a_same_instance_gang_kept_where_it_runs_keeps_its_gpus(tmp_path):
    """Found by the property tier: t1 runs an instance gang (2 x 2 GPUs on GPUs 0-1 and 2-3) and a 1-GPU job on a
    p4d.24xlarge (max_instances 1), with 1- and 2-GPU work pending. The plan kept the gang where it runs but gave
    it GPUs 6-7 and 0-1, and a new job GPUs 2-3: a running replica's GPUs changed under it (the packing that put
    an identical new instance's work back on the instance left bundled items out of 'home')."""
    from tests.fleetkit import doc, instance, plan_for, pool, topology
    one = {"gpus": 1, "gpu_type": "A100", "cpu": 8, "memory_gib": 60}
    near = {"data": {"location": "aws/us-east-1", "size_gib": 0}}
    jobs = {"j0": {}, "j1": {}, "j2": {"replicas": 2, "gang": "instance", "resources": {**one, "gpus": 2, "cpu": 16, "memory_gib": 120}},
            "j3": {}, "j4": near, "j5": {}, "j6": {},
            "j7": {"priority": "normal", "resources": {**one, "gpus": 2, "cpu": 16, "memory_gib": 120, "nvlink": True}, **near},
            "j8": near}
    docs = [topology(), doc("SpotPolicy", "sp", {"max_spot_fraction": 0.25}),
            doc("Tenant", "t1", {"quota": {"gpus": 4, "burst": {"gpus": 8}}}), doc("Tenant", "t2", {}), doc("Tenant", "t3", {}),
            pool("aws-a100", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=1),
            *[doc("Job", name, {"tenant": "t1", "priority": "low", "resources": one, **spec}) for name, spec in jobs.items()]]
    fleet = [instance("i0", "aws-a100", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")]
    plan = plan_for(tmp_path, docs, fleet, {"j2": ("i0", "i0"), "j3": ("i0",)}, time_limit=4, workers=1,
                    gpu_indices={"j2": ((0, 1), (2, 3)), "j3": ((4,),)})
    gang = next(j for j in plan.jobs if j.job == "j2")
    assert gang.action == "keep" and gang.gpus == ((0, 1), (2, 3)), gang
