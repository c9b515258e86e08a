"""A fleet's life as a sequence: config edits and cloud events between plans and applies, on the simulated cloud.

A hypothesis state machine (`RuleBasedStateMachine`) keeps a config directory and drives the real planner and
`api.apply` on the sim (no agents: FLEETOPS_SIM_AGENTS=0). Its rules are what happens to a fleet between plans: a
job added (GPU or CPU shape, priority, tenant, spot mode, gang), removed, re-prioritised or reshaped; a tenant's
guarantee or burst changed; a pool's max_instances or instance types changed; a GuardrailPolicy set (fleet and
tenant budgets, a destroy limit); a spot instance reclaimed (SimCloud.interrupt); a plan; an apply.

After every plan and apply it checks what users are promised, with the checks the single-plan tests use
(tests/invariants.py; nothing is redefined here):

- every rule on the plan's after-state (`check_plan`: capacity and GPU indices, tenants, pools, spot, guardrails) and no
  running work stopped without a rule (`check_stability`, and the planner's own `plancheck.unlawful_evictions`);
- after an apply: no instance's GPUs, vCPUs or memory overcommitted by the replicas the state places there (GPU indices
  distinct and on the instance), the fleet's instances within the fleet budget, and the instances the fleet does not
  own (planted at the start: a colleague's and another fleet's, in the zones and types the pools use) untouched;
- an apply refused (a guardrail) changes nothing in the cloud;
- a plan right after an apply, nothing changed since, is a no-op (converged);
- a pending job's reason names a limit that, lifted alone, places it (tests/test_truth.py's `lifting_places`).

The CI tier runs a few derandomized sequences; `-m slow` draws many new ones (FLEETOPS_LIFE_EXAMPLES lives of up to
FLEETOPS_LIFE_STEPS steps; FLEETOPS_LIFE_TIME_LIMIT=0 plans and applies with greedy best-fit alone, the fallback).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from providers.base import TAG_FLEET, TAG_POOL
from providers.catalog import load_catalog
from providers.sim import SimCloud
from reconciler import api
from reconciler.errors import ConfigError, GuardrailError
from reconciler.plancheck import unlawful_evictions
from reconciler.state import load_state, state_dir
from tests.fleetkit import doc, pool, tenant, topology, write_config
from tests.invariants import check_plan, check_stability, fleet_after
from tests.test_properties import SHAPES, Fleet
from tests.test_truth import lifting_places

TIME_LIMIT = float(os.environ.get("FLEETOPS_LIFE_TIME_LIMIT", "3"))  # seconds per solve (small fleets: proven optimal within it); 0: greedy alone
FLEET = "life"
# name -> (cloud, region, zones, instance types, markets it may take, kinds of work it serves)
POOLS = {
    "a10g": ("aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], ("either", "spot", "on-demand"), ("a10g",)),
    "a100": ("gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-4g"],
             ("either", "on-demand"), ("a100", "a100nv", "gang2")),
    "cpu": ("aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], ("on-demand", "either"), ("cpu",)),
    "cpu-spot": ("gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], ("spot",), ("cpu",)),
}
KINDS = ("a10g", "a100", "a100nv", "gang2", "cpu")
TENANTS = ("t1", "t2", "t3")
PRIORITIES = ("low", "normal", "high", "critical")
SPOT = ("eligible", "eligible", "never", "required", "preferred")
QUOTAS = (None, {"gpus": 0}, {"gpus": 2}, {"gpus": 4, "burst": {"gpus": 8}}, {"gpus": 8}, {"gpus": 2, "cpu": 16, "burst": {"gpus": 4, "cpu": 32}})


def _job(name: str, kind: str, shape: int, tenant_: str, priority: str, spot: str, replicas: int, gang: str) -> dict:
    shapes = SHAPES[kind]
    gpus, gpu_type, cpu, mem, nvlink = shapes[shape % len(shapes)]
    res: dict = {"gpus": gpus, "cpu": cpu, "memory_gib": mem}
    if gpu_type:
        res["gpu_type"] = gpu_type
    if nvlink:
        res["nvlink"] = True
    spec: dict = {"tenant": tenant_, "priority": priority, "spot": spot, "resources": res,
                  "replicas": replicas if kind == "gang2" else 1}
    if spec["replicas"] > 1:
        spec["gang"] = gang
    return doc("Job", name, spec)


class FleetLife(RuleBasedStateMachine):
    """One config directory on the simulated cloud, edited, planned and applied in turn."""

    def __init__(self):
        super().__init__()
        self._env = os.environ.get("FLEETOPS_SIM_AGENTS")
        os.environ["FLEETOPS_SIM_AGENTS"] = "0"  # no agent processes (as conftest sets for every test)
        self.tmp = Path(tempfile.mkdtemp(prefix="fleet-life-"))
        self.cfg = self.tmp / "cfg"
        self.docs: list[dict] = []
        self.serial = 0  # names of added jobs
        self.plan = None  # the last plan, while nothing changed since it was made
        self.res = None  # and its PlanResult
        self.applied = False  # an apply ran and nothing changed since
        self.foreign: dict[str, dict] = {}

    def teardown(self):
        if self._env is None:
            os.environ.pop("FLEETOPS_SIM_AGENTS", None)
        else:
            os.environ["FLEETOPS_SIM_AGENTS"] = self._env
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    def _write(self) -> None:
        (self.cfg / "fleet.yaml").write_text(yaml.safe_dump_all(self.docs, sort_keys=False))
        self.plan, self.applied = None, False

    def _of(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]

    def _named(self, kind: str, name: str) -> dict:
        return next(d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name)

    def _sim(self) -> SimCloud:
        return SimCloud(state_dir(self.cfg))

    def _job_kind(self, d: dict) -> str:
        r = d["spec"]["resources"]
        return {None: "cpu", "A10G": "a10g", "A100": "a100"}[r.get("gpu_type")]

    def _checked_plan(self, what: str):
        now = datetime.now(timezone.utc)
        res = api.plan(self.cfg, time_limit=TIME_LIMIT, now=now)
        note(f"{what}: {res.plan.counts()}, ${res.plan.cost_before}/h -> ${res.plan.cost_after}/h, "
             + "; ".join(f"{j.job} {j.action} {j.reason}" for j in res.plan.jobs if j.action not in ("keep",)))
        check_plan(res.desired, res.observed, res.plan, now=now)
        check_stability(res.desired, res.observed, res.plan)
        assert not (wrong := unlawful_evictions(res.plan, res.observed, res.problem)), wrong
        # a plan never breaks the fleet budget (a destroy limit is the only guardrail a plan may meet: apply refuses it)
        assert all(v.startswith("max_destroy_per_apply") for v in res.plan.violations), res.plan.violations
        return res

    # ------------------------------------------------------------------ the fleet at the start

    @initialize(data=st.data())
    def start(self, data):
        draw = data.draw
        docs = [topology(FLEET)]
        for t in TENANTS:
            q = draw(st.sampled_from(QUOTAS), label=f"quota {t}")
            docs.append(tenant(t, **q) if q else tenant(t))
        for name, (cloud, region, zones, types, markets, _) in POOLS.items():
            docs.append(pool(name, cloud, region, zones, types, market=draw(st.sampled_from(markets), label=f"market {name}"),
                             hi=draw(st.integers(1, 3), label=f"max {name}")))
        docs.append(doc("SpotPolicy", "sp", {"max_spot_fraction": draw(st.sampled_from([0.5, 1.0, 1.0])),
                                              "on_demand_buffer_percent": draw(st.sampled_from([0, 0, 25]))}))
        docs.append(doc("PlacementPolicy", "pp", {"consolidation": draw(st.sampled_from(["WhenUnderutilized", "WhenEmpty"])),
                                                   "preemption": draw(st.sampled_from(["LowerPriority", "Never"]))}))
        self.docs = docs
        for _ in range(draw(st.integers(1, 5), label="jobs")):
            self.add_job(draw)
        write_config(self.cfg, self.docs)
        # Instances the fleet does not own, where its pools work: a colleague's, and another fleet's tagged for a pool
        # of the same name.
        sim = self._sim()
        for tags, (cloud, region, zone, itype, market) in (
                ({"owner": "someone"}, ("aws", "us-east-1", "us-east-1a", "g5.xlarge", "on-demand")),
                ({TAG_FLEET: "another-fleet", TAG_POOL: "cpu"}, ("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", "on-demand")),
                ({TAG_FLEET: "another-fleet", TAG_POOL: "cpu-spot"}, ("gcp", "us-central1", "us-central1-a", "n2-standard-16", "spot"))):
            iid = sim.plant(cloud, region, zone, itype, tags, market=market)
            self.foreign[iid] = next(i for i in sim.instances() if i["id"] == iid)
        self.apply_it(saved=False, allow=True)  # every life starts with work running

    # ------------------------------------------------------------------ config edits

    def add_job(self, draw) -> str:
        self.serial += 1
        d = _job(f"j{self.serial}", draw(st.sampled_from(KINDS)), draw(st.integers(0, 1)), draw(st.sampled_from(TENANTS)),
                 draw(st.sampled_from(PRIORITIES)), draw(st.sampled_from(SPOT)), draw(st.integers(2, 3)),
                 draw(st.sampled_from(["zone", "placement-group", "instance"])))
        self.docs.append(d)
        return f"add {d['spec']}"

    def remove_job(self, draw) -> str:
        gone = draw(st.sampled_from(self._of("Job")))
        self.docs = [d for d in self.docs if d is not gone]
        return f"remove {gone['metadata']['name']}"

    def change_priority(self, draw) -> str:
        d = draw(st.sampled_from(self._of("Job")))
        d["spec"]["priority"] = draw(st.sampled_from(PRIORITIES))
        return f"{d['metadata']['name']} priority {d['spec']['priority']}"

    def change_resources(self, draw) -> str:
        """Another shape of its kind of work (GPUs, vCPUs, memory), or half the vCPUs where its kind has one shape."""
        d = draw(st.sampled_from(self._of("Job")))
        shape = draw(st.integers(0, 1))
        kind = self._job_kind(d)
        r = d["spec"]["resources"]
        if kind == "a100" and d["spec"]["replicas"] == 1:
            kind = "a100nv" if shape else "a100"
        if d["spec"]["replicas"] > 1:
            kind = "gang2"
        gpus, _, cpu, mem, nvlink = SHAPES[kind][shape % len(SHAPES[kind])]
        new = {**r, "gpus": gpus, "cpu": cpu, "memory_gib": mem}
        new.pop("nvlink", None)
        if nvlink:
            new["nvlink"] = True
        if new == r:
            new["cpu"] = r["cpu"] / 2
        d["spec"]["resources"] = new
        return f"{d['metadata']['name']} resources {r} -> {new}"

    def change_tenant_quota(self, draw) -> str:
        t, quota = draw(st.sampled_from(TENANTS)), draw(st.sampled_from(QUOTAS))
        self._named("Tenant", t)["spec"] = {"quota": quota} if quota else {}
        return f"tenant {t} quota {quota}"

    def change_pool(self, draw) -> str:
        """max_instances, and the instance types: all the pool's, or its first or last alone."""
        name, hi, types = draw(st.sampled_from(sorted(POOLS))), draw(st.integers(0, 3)), draw(st.integers(0, 2))
        d = self._named("Pool", name)
        every = POOLS[name][3]
        d["spec"]["max_instances"] = hi
        d["spec"]["instance_types"] = [every, every[:1], every[-1:]][types]
        return f"pool {name} max {hi} types {d['spec']['instance_types']}"

    def set_guardrails(self, draw) -> str:
        budget, tenant_budget = draw(st.sampled_from([None, 3.0, 8.0, 20.0, 60.0])), draw(st.sampled_from([None, 1.0, 5.0]))
        t, destroy = draw(st.sampled_from(TENANTS)), draw(st.sampled_from([None, None, 0, 1]))
        spec: dict = {}
        if budget is not None:
            spec["max_hourly_budget"] = budget
        if tenant_budget is not None:
            spec["tenant_hourly_budgets"] = {t: tenant_budget}
        if destroy is not None:
            spec["max_destroy_per_apply"] = destroy
        self.docs = [d for d in self.docs if d["kind"] != "GuardrailPolicy"] + [doc("GuardrailPolicy", "g", spec)]
        return f"guardrails {spec}"

    @rule(data=st.data(), kind=st.sampled_from(["add_job", "add_job", "remove_job", "change_priority", "change_resources",
                                                "change_tenant_quota", "change_pool", "set_guardrails"]))
    def edit(self, data, kind):
        """One config edit, as a user makes them (on no job, a job is added instead)."""
        if kind not in ("change_tenant_quota", "change_pool", "set_guardrails") and not self._of("Job"):
            kind = "add_job"
        before, applied = copy.deepcopy(self.docs), self.applied
        note(getattr(self, kind)(data.draw))
        self._write()
        try:
            api.validate(self.cfg)
        except ConfigError as e:
            # An edit the loader refuses (e.g. a pool's types cut to ones no job of it fits): a clear error naming the
            # file, line and field; the user puts the config back, and nothing in the cloud changed.
            assert str(e).count("fleet.yaml:") >= 1, str(e)
            note(f"refused: {e}")
            self.docs = before
            self._write()
            self.applied = applied  # (the same config as before the edit)

    # ------------------------------------------------------------------ events in the cloud

    @rule(pick=st.integers(0, 100))
    def reclaim_spot(self, pick):
        """The cloud reclaims one of the fleet's spot instances (none: nothing happens)."""
        sim = self._sim()
        spot = sorted(i["id"] for i in sim.instances()
                      if i["state"] == "running" and i["market"] == "spot" and i["id"] not in self.foreign)
        if spot:
            sim.interrupt(spot[pick % len(spot)])
            note(f"reclaimed {spot[pick % len(spot)]}")
            self.plan, self.applied = None, False

    # ------------------------------------------------------------------ plan and apply

    @rule()
    def plan_it(self):
        res = self._checked_plan("plan")
        if self.applied:
            self._converged(res)
        self.plan, self.res = res.plan, res

    @rule(saved=st.booleans(), allow=st.booleans())
    def apply_it(self, saved, allow):
        """Apply a plan (saved: the last one, checked, or one made and checked now; else the plan apply makes), then plan
        again: a no-op."""
        if saved and self.plan is None:
            self.plan_it()
        before = {i["id"]: i for i in self._sim().instances()}
        try:
            api.apply(self.cfg, saved_plan=self.plan if saved else None, time_limit=TIME_LIMIT,
                      allow_destroy=100 if allow else None)
        except GuardrailError as e:
            note(f"apply refused: {e}")
            after = {i["id"]: i for i in self._sim().instances()}
            assert after == before, "an apply refused by a guardrail changed the cloud"
            self.plan = None
            return
        self.plan, self.applied = None, True
        self._check_applied()
        res = self._checked_plan("plan after apply")
        self._converged(res)
        self.plan, self.res = res.plan, res

    @precondition(lambda self: self.plan is not None and any(j.action in ("pending", "evict") for j in self.plan.jobs))
    @rule()
    def pending_reasons_hold(self):
        """tests/test_truth.py's check of the last plan's first pending job: its reason names a limit that, lifted
        alone, places it (re-planned against the same fleet without the other pending jobs)."""
        res = self.res
        if res.observed.short:
            return  # a capacity cool-off the catalog-only re-plan would not see
        pending = [j for j in res.plan.jobs if j.action in ("pending", "evict")]
        fleet = Fleet(self.docs, list(res.observed.instances), dict(res.observed.placements), dict(res.observed.gpu_indices))
        for jc in pending[:1]:
            assert "could not be packed" not in jc.reason or "several" in jc.reason or "max_instances" in jc.reason, jc.reason
            assert not jc.reason.startswith("not placed by this plan"), (jc.job, jc.reason)
            lifting_places(fleet, jc, pending)

    # ------------------------------------------------------------------ what an apply leaves

    def _converged(self, res) -> None:
        changes = [(j.job, j.action, j.previous, j.instances, j.reason) for j in res.plan.jobs if j.action in ("move", "evict", "place")]
        assert not res.plan.has_changes, (
            f"the plan right after an apply is not a no-op: {len(res.plan.creates)} creates, {len(res.plan.deletes)} deletes, "
            f"jobs {changes}")
        # the fleet as it runs keeps the fleet budget
        hosts = fleet_after(res.observed, replace(res.plan, creates=(), deletes=()), res.desired)
        budget = res.desired.guardrails.max_hourly_budget
        cost = sum(h.price for h in hosts.values())
        assert budget is None or cost <= budget + 1e-6, f"the fleet runs at ${cost:.4f}/h, over max_hourly_budget {budget}"

    def _check_applied(self) -> None:
        world = {i["id"]: i for i in self._sim().instances()}
        for iid, was in self.foreign.items():
            assert world.get(iid) == was, f"an instance the fleet does not own changed: {was} -> {world.get(iid)}"
        state = load_state(self.cfg)
        cat = load_catalog()
        use: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
        indices: dict[str, list[int]] = defaultdict(list)
        jobs = {d["metadata"]["name"]: d for d in self._of("Job")}
        for name, ids in state.placements.items():
            assert name in jobs, f"the state places {name}, which the config no longer has"
            r = jobs[name]["spec"]["resources"]
            gpus = state.gpus.get(name) or [[]] * len(ids)
            assert len(gpus) == len(ids), (name, ids, gpus)
            for iid, g in zip(ids, gpus):
                inst = world.get(iid)
                assert inst is not None and inst["state"] == "running" and iid not in self.foreign, (
                    f"{name} placed on {iid}, which is not a running instance of the fleet: {inst}")
                assert len(g) == r.get("gpus", 0), f"{name} on {iid} holds GPUs {g}, asks {r.get('gpus', 0)}"
                u = use[iid]
                u[0] += r.get("gpus", 0)
                u[1] += r["cpu"]
                u[2] += r["memory_gib"]
                indices[iid] += list(g)
        for iid, (gpus, cpu, mem) in use.items():
            shape = cat.shape(world[iid]["cloud"], world[iid]["instance_type"])
            assert gpus <= shape.gpus and cpu <= shape.cpu + 1e-9 and mem <= shape.memory_gib + 1e-9, (
                f"{iid} ({world[iid]['instance_type']}) overcommitted: {gpus} GPUs, {cpu} vCPU, {mem} GiB placed")
            assert len(set(indices[iid])) == len(indices[iid]) and all(0 <= g < shape.gpus for g in indices[iid]), (
                f"{iid}: GPU indices {sorted(indices[iid])} shared or off the instance's {shape.gpus}")

    @invariant()
    def foreign_untouched(self):
        if not self.foreign:
            return
        world = {i["id"]: i for i in self._sim().instances()}
        for iid, was in self.foreign.items():
            assert world.get(iid) == was, f"an instance the fleet does not own changed: {was} -> {world.get(iid)}"


SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

FleetLife.TestCase.settings = settings(max_examples=8, stateful_step_count=8, derandomize=True, **SETTINGS)
test_a_fleets_life_keeps_its_promises = FleetLife.TestCase


class FleetLifeSlow(FleetLife):
    pass


FleetLifeSlow.TestCase.settings = settings(max_examples=int(os.environ.get("FLEETOPS_LIFE_EXAMPLES", "300")),
                                           stateful_step_count=int(os.environ.get("FLEETOPS_LIFE_STEPS", "14")), **SETTINGS)
test_a_fleets_life_keeps_its_promises_on_long_runs = pytest.mark.slow(FleetLifeSlow.TestCase)
