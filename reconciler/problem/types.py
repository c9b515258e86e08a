"""The solver's problem as plain frozen data: demands (classes of identical work), capacity (existing
instances and offers of new ones), tenants' rules and the Problem that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Callable

from reconciler.ledger import DIMS, LicenseRules, ReservationRules, item_share, mig_compute, spot_units  # noqa: F401 (DIMS: the ledger's, re-exported)
from reconciler.model import PRIORITY_CLASSES, PlacementPolicySpec, SpotPolicySpec
from reconciler.site import Capacity, Host, Offer


def priority_class(priority: int) -> int:
    """0 low, 1 normal, 2 high, 3 critical: the bands of the named classes (1, 10, 100, 1000)."""
    return 0 if priority < 10 else 1 if priority < 100 else 2 if priority < 1000 else 3


def priority_band(priority: int) -> str:
    """The class an integer priority ranks in and the integers that rank alike with it, as explain prints it:
    "class normal: 10-99" (preemption and the solver's tiers compare these classes, not the integers)."""
    names, values = list(PRIORITY_CLASSES), list(PRIORITY_CLASSES.values())
    k = priority_class(priority)
    lo = 0 if k == 0 else values[k]
    return f"class {names[k]}: {lo}-{values[k + 1] - 1}" if k + 1 < len(values) else f"class {names[k]}: {lo} and above"


# The solver's first tier (objective.protected_tier), as the plan reports it and plan.quality checks it against the
# emitted plan: each tenant's protected jobs (TenantRules.protected_jobs) kept.
GUARANTEES_TIER = "guarantees kept"
# Its next tier (objective.guarantees_tiers): the same count with the tenants' running jobs that must move.
RUNNING_GUARANTEES_TIER = "guaranteed running work kept"


@dataclass(frozen=True)
class Demand:
    """One class of identical work: a gang (one job, all replicas) or identical 1-replica jobs.

    An item is what lands on one instance: a replica, or for a same-instance gang the
    whole job (`bundle` replicas)."""

    key: str
    jobs: tuple[str, ...]
    replicas: int  # items per job
    bundle: int  # job replicas per item (>1 only for gang: instance)
    tenant: str
    gpus: int  # per item
    gpu_type: str | None
    mig: tuple[str, int] | None  # (profile, devices) per item
    nvlink: bool
    cpu: float
    memory_gib: float
    priority: int  # effective: aged while pending
    spot: str
    gang_mode: str  # zone | placement-group | instance
    pools: frozenset[str] | None
    regions: tuple[str, ...] | None
    clouds: frozenset[str] | None
    zones: frozenset[tuple[str, str]] | None  # (cloud, zone) within the data's max_latency_ms
    data_location: str | None
    data_gib: float
    hours: float
    running: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (job, host per item) of jobs running now
    base_priority: int = 0
    reshaped: frozenset[str] = frozenset()  # running jobs whose resources changed since they were placed: they restart
    # (job, (gpus, gpu_type, mig (profile, count) or None, nvlink, cpu, memory_gib) per replica) of the reshaped jobs:
    # the shape each runs in now, as apply recorded it
    ran_as: tuple[tuple[str, tuple], ...] = ()
    licenses: tuple[tuple[str, int], ...] = ()  # (License, held per item) while it runs
    deadline_rank: int = 0  # within its class: above work without a deadline, the closer the higher (deadlines.py)
    deadline_critical: bool = False  # must start within its expected_hours: may use the on-demand buffer's capacity

    @property
    def gang(self) -> bool:
        return self.replicas > 1

    @cached_property
    def klass(self) -> int:
        """(Made once a demand, as size and job_size, like site.Capacity's cached properties: the fields are frozen.
        Asked ~1.5M times a plan of the applied 5k fleet, by the guarantees tier's stand-ins above all.)"""
        return priority_class(self.priority)

    @cached_property
    def size(self) -> int:
        """Work units of one item: 7 per GPU (a MIG compute slice is 1), 1 per replica of CPU work. (A same-instance
        gang's item holds `bundle` replicas: its GPUs and slices count them all, and its CPU work counted 1, so a 2-replica
        CPU gang on spot was half the work in its tenant's spot share that the same job as a zone gang was, and the
        tenant ended over its share: audit20 finding 1.)"""
        if self.mig is not None:
            return mig_compute(self.mig[0]) * self.mig[1]
        return 7 * self.gpus if self.gpus else self.bundle

    @cached_property
    def job_size(self) -> int:
        return self.size * self.replicas

    @property
    def weight(self) -> int:
        """Objective weight of one job inside its priority class."""
        return self.priority * self.job_size

    @property
    def running_jobs(self) -> int:
        return len(self.running)

    @property
    def running_items(self) -> int:
        """Items running now (a same-instance gang's replicas are one item)."""
        return sum(len(h) // self.bundle for _, h in self.running)

    def as_it_runs(self, job: str) -> Demand:
        """This demand as running job `job` runs now: in the shape it was placed with, where its resources changed
        since, and with the replicas it runs (a gang grown or short of a replica: its quota counts what runs, as
        rules.running_use does; counted at the replicas it asks, a gang grown from 2 to 3 read its tenant over its
        ceiling now, and any of the tenant's work could be stopped for it, a swap). The fleet as it runs, which apply's
        re-check compares a plan with, holds it so."""
        d = self
        for j, (gpus, gpu_type, mig, nvlink, cpu, mem) in self.ran_as:
            if j == job:
                b = self.bundle
                d = replace(self, gpus=gpus * b, gpu_type=gpu_type, mig=(mig[0], mig[1] * b) if mig else None, nvlink=nvlink,
                            cpu=cpu * b, memory_gib=mem * b, reshaped=frozenset(), ran_as=())
                break
        if self.replicas > 1:  # (a gang: one job, so `running` holds one entry at most)
            items = next((len(ids) // self.bundle for j, ids in self.running if j == job), self.replicas)
            if 0 < items != self.replicas:
                d = replace(d, replicas=items)
        return d

    def req(self, dim: str) -> float:
        if dim == "gpus":
            return self.gpus
        if dim == "cpu":
            return self.cpu
        if dim == "memory_gib":
            return self.memory_gib
        if self.mig is not None and dim == f"mig:{self.mig[0]}":
            return self.mig[1]
        return 0.0

    @property
    def dims(self) -> tuple[str, ...]:
        mig = (f"mig:{self.mig[0]}",) if self.mig else ()
        return (("gpus",) if self.gpus else ()) + mig + ("cpu", "memory_gib")


@dataclass(frozen=True)
class TenantRules:
    name: str
    weight: float
    cap: dict[str, float]  # hard ceilings (burst, else quota); a missing dimension is unlimited
    guarantee: dict[str, float]  # guaranteed amounts; a missing dimension is fully guaranteed
    budget: float | None = None  # USD/h of its replicas
    spot_fraction: float | None = None
    protected: int = 0  # work units of its running jobs inside its guarantee now
    protected_jobs: tuple[str, ...] = ()  # those jobs: no other tenant's work and no fleet limit may take them
    moving_jobs: tuple[str, ...] = ()  # running jobs that must move, in what the guarantee leaves: kept next (objective)
    dominant: str = "gpus"  # the dimension its fair share is measured in


@dataclass(frozen=True)
class Problem:
    demands: tuple[Demand, ...]
    capacities: tuple[Capacity, ...]
    groups: dict[str, tuple[str, ...]]  # group key -> demand keys sharing placement variables
    pool_bounds: dict[str, tuple[int, int]]
    tenants: dict[str, TenantRules]
    desired_spot: SpotPolicySpec  # the SpotPolicy spec, a frozen model
    placement: PlacementPolicySpec
    budget: float | None
    fleet_capacity: dict[str, float]  # per dimension, for fair shares
    static_pending: dict[str, str] = field(default_factory=dict)  # job -> why nothing can ever host it
    job_remaining: dict[str, float] = field(default_factory=dict)  # running job -> expected hours left
    job_end: dict[str, float] = field(default_factory=dict)  # running job -> when it is expected to end (epoch s)
    coef: dict[tuple[str, str], float] = field(default_factory=dict)  # (demand, zone site) -> USD/h per item
    now: datetime | None = None
    licenses: dict[str, LicenseRules] = field(default_factory=dict)
    reservations: dict[str, ReservationRules] = field(default_factory=dict)  # the active ones
    deadlines: dict[str, tuple[datetime, float]] = field(default_factory=dict)  # job -> (deadline, hours it still needs)
    quotas: tuple = ()  # providers.base.Quota: the cloud account quotas some offer's new instances count against
    quota_floors: dict[str, str] = field(default_factory=dict)  # pool -> why its min_instances was lowered to fit a quota
    # pool -> what its lowered minimum lacks, per quota that holds it back: (quota_scope, units, "1 m6i.4xlarge"); a raise
    # of that quota goes to the minimum first (a job's reason that counted only its own units, raised by them, left it pending)
    quota_floor_gaps: dict[str, tuple[tuple[str, int, str], ...]] = field(default_factory=dict)
    gpu_fleet: bool | None = None  # do the fleet's pools offer GPUs (the spot share counts GPUs)? None: read the capacities
    # demand -> running jobs of it a plan keeps, at least: set where an answer stopped some that no rule requires
    # stopping (api._lawful), so the search again is for a plan that keeps them
    held: dict[str, int] = field(default_factory=dict)
    # count a tenant's new higher-class work in its lost lower job's place only where it takes that job's room
    # (objective.stand_in_room): set where an answer counted without it stopped a job no rule requires stopping
    # (api._lawful); the model without it is the looser one, as fast as before, and its lawful answers stand
    stand_in_rooms: bool = False

    @property
    def spot(self) -> SpotPolicySpec:
        return self.desired_spot

    def demand(self, key: str) -> Demand:
        return self._demand_index[key]

    @property
    def _demand_index(self) -> dict[str, Demand]:
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = {d.key: d for d in self.demands}
            object.__setattr__(self, "_idx", idx)
        return idx

    def never_hosted(self, d: Demand) -> bool:
        """No capacity the fleet could have ever hosts d (its jobs are in `static_pending`, all alike): it is never
        placed, so it takes no room, no job's place (the freezer, the model's candidates) and no tier's bound."""
        return hopeless(d, self.static_pending)

    def hosts(self) -> list[Host]:
        """The instances running now, in the capacities' order (they come before the offers)."""
        return [c for c in self.capacities if isinstance(c, Host)]

    def offers(self) -> list[Offer]:
        return [c for c in self.capacities if isinstance(c, Offer)]

    def cost_coef(self, d: Demand, c: Capacity) -> float:
        """USD/h per item of d on c beyond the instance price: data egress, latency, and the
        premium a spot-preferred job pays for falling back to on-demand."""
        site = c.site  # (asked 300k times by greedy on a 10k-job fleet: its zone_site is made once)
        v = self.coef.get((d.key, site.zone_site), 0.0)
        if d.spot == "preferred" and site.market != "spot":
            v += 0.5 * c.on_demand_price * share(d, c)
        return v


def hopeless(d: Demand, static_pending: dict[str, str]) -> bool:
    """Problem.never_hosted, for build_problem's freezer (before the Problem exists)."""
    return d.jobs[0] in static_pending


def share(d: Demand, c: Capacity) -> float:
    """The fraction of an instance one item of d uses, in the instance's primary resource:
    what its cost is attributed by (status, tenant budgets): the ledger's definition."""
    return item_share(d, c)


def spot_measure(capacities, gpu_fleet: bool | None = None) -> tuple[str, Callable[[Capacity], float]]:
    """What the spot share and the on-demand buffer count, one definition for the solver, the
    warm start, the packer and the freezer: GPUs in a GPU fleet (CPU instances count 0), vCPUs in
    a CPU-only fleet (ledger.spot_units). Returns the dimension and the measure of an instance."""
    return spot_units(capacities, gpu_fleet)


def type_class(x) -> tuple:
    """(GPU model or None for CPU-only, MIG or not): capacity and work of different classes never meet."""
    if isinstance(x, Capacity):
        return (x.gpu_type if x.gpus else None, bool(x.mig))
    return (x.gpu_type if (x.gpus or x.mig) else None, x.mig is not None)
