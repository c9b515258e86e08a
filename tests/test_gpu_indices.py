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


def _nvlink_beside_running(domain: int):
    """One 8-GPU host running r (1 GPU at index 0), the pool at max 1, and n (2 GPUs, nvlink) pending: plain data."""
    from reconciler.model import PlacementPolicySpec, SpotPolicySpec
    from reconciler.problem import Demand, Host, Offer, Problem, TenantRules
    from reconciler.site import Site

    def site(zone):
        return Site("p", "sim", "aws", "us-east-1", zone, "p4d", "on-demand")

    shape = dict(gpus=8, gpu_type="A100", cpu=96.0, memory_gib=1152.0, price=22.0, on_demand_price=22.0, nvlink_domain=domain)
    host = Host(key="i0", site=site("a"), **shape, instance_id="i0", residents=(("r", "r", 1),))
    offer = Offer(key="p/b/p4d/on-demand", site=site("b"), **shape, max_new=1)

    def demand(key, gpus, nvlink, running=()):
        return Demand(key=key, jobs=(key,), replicas=1, bundle=1, tenant="t", gpus=gpus, gpu_type="A100", mig=None, nvlink=nvlink,
                      cpu=8.0, memory_gib=60.0, priority=1, spot="eligible", gang_mode="zone", pools=None, regions=None, clouds=None,
                      zones=None, data_location=None, data_gib=0.0, hours=24.0, running=running)

    demands = (demand("r", 1, False, (("r", ("i0",)),)), demand("n", 2, True))
    return Problem(demands=demands, capacities=(host, offer), groups={"gr": ("r",), "gn": ("n",)}, pool_bounds={"p": (0, 1)},
                   tenants={"t": TenantRules("t", 1.0, {}, {})}, desired_spot=SpotPolicySpec(), placement=PlacementPolicySpec(),
                   budget=None, fleet_capacity={"gpus": 8.0, "cpu": 96.0, "memory_gib": 1152.0}), host


def test_an_nvlink_job_joins_running_work_where_one_nvlink_domain_spans_the_instance():
    """fleet21: j2 (2 A100, nvlink) could not go on the p4d i0 beside j12 (1 GPU): the solver and greedy kept NVLink work
    off any host with a GPU taken, since running work keeps its GPU indices. On a p4d one NVLink domain spans all 8
    GPUs and the packer takes any free ones, so the count is exact; kept out, the plan (pool at max 1) deleted i0 and
    moved j12 to an identical p4d to place j2. Where an instance has several domains the count cannot tell whether a
    block is free, and NVLink work still goes only where no GPU is taken."""
    from reconciler.greedy import greedy
    from reconciler.pack import Bin
    from reconciler.solve import solve
    from reconciler.solve.model import Model

    problem, host = _nvlink_beside_running(8)
    assert ("gn", "i0") in Model(problem).x  # the solver offers it the host on its own, not only where greedy put it
    assert host.one_nvlink_domain
    g = greedy(problem)
    assert g.x.get(("n", "i0")) == 1 and g.stay.get(("r", "i0")) == 1, (g.x, g.stay)
    sol = solve(problem, time_limit=2)
    assert sol.keep == {"i0"} and not any(sol.new.values()) and sol.x.get(("n", "i0")) == 1, (sol.keep, sol.new, sol.x)
    b = Bin.empty(host, "i0")
    b.gpus_used[0] = True  # r's recorded GPU
    assert b.place(problem.demand("n"), "n", 0) == [(2, 3)]  # the packer finds the block the count promised

    problem, host = _nvlink_beside_running(4)  # two domains of 4 GPUs: r's GPU 0 could leave no block the count sees
    assert not host.one_nvlink_domain
    assert ("n", "i0") not in greedy(problem).x
    assert ("gn", "i0") not in Model(problem).x
    assert ("n", "i0") not in solve(problem, time_limit=2).x
