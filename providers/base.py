"""The provider contract: observe, offerings, create, delete.

Modelled on SkyPilot's sky/clouds and dstack's Compute backends: a provider is
small, speaks only its cloud's API, and knows nothing of jobs or the solver.
Everything crossing this boundary is plain, immutable data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Protocol, Sequence, runtime_checkable

from providers.placements import PlacementRecord

Market = Literal["spot", "on-demand"]

# Logical ownership tags. Each provider maps them onto its cloud's rules
# (GCE labels allow no '/' or '.', for example) but keeps their meaning.
TAG_FLEET = "fleetops.io/fleet"  # which fleet owns the instance: the only proof of ownership
TAG_POOL = "fleetops.io/pool"  # the Pool document the instance belongs to
TAG_CREATE_KEY = "fleetops.io/create-key"  # the idempotency key it was created with
TAG_RESERVATION = "fleetops.io/reservation"  # the Reservation (its name) the instance was launched into
TAG_FLEET_UID = "fleetops.io/fleet-uid"  # which fleet of that name: generated on its first apply (reconciler/identity.py)
TAG_MIG = "fleetops.io/mig"  # the MIG layout the instance was launched with (mig_tag): what its bootstrap partitioned
NO_MIG = "none"  # TAG_MIG of an instance launched without a MIG layout (whole GPUs, or no GPU)


@dataclass(frozen=True)
class PoolTarget:
    """What a provider needs to know of one Pool to observe or launch into it."""

    name: str
    cloud: str
    region: str
    zones: tuple[str, ...]
    instance_types: tuple[str, ...]
    settings: Mapping[str, object] = field(default_factory=dict)  # the pool's cloud section
    mig: tuple[str, ...] = ()  # the MIG layout of every GPU (the node agent's bootstrap applies it)


@dataclass(frozen=True)
class Offering:
    """One instance type purchasable in one zone, with today's prices (USD/hour)."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    gpus: int
    gpu_type: str | None
    cpu: float
    memory_gib: float
    on_demand_price: float
    spot_price: float | None  # None: no spot market for this type here
    available: bool = True  # False: the provider knows the zone is out of capacity
    nvlink_domain: int = 1  # GPUs per NVLink domain (1: PCIe only, or not known)
    prices_as_of: str = ""  # the date of a static price list (the catalog's source's); "" for live or unknown prices
    price_source: str = ""  # where the prices come from: "catalog: <source>" or a live API ("aws: DescribeSpotPriceHistory")

    def price(self, market: Market) -> float:
        if market == "spot":
            if self.spot_price is None:
                raise ValueError(f"{self.instance_type} has no spot price in {self.zone}")
            return self.spot_price
        return self.on_demand_price


@dataclass(frozen=True)
class Quota:
    """An account quota launches count against, as the cloud reports it when read: its limit and what the whole
    account uses of it now (the fleet's own instances included). Which launches count, and by how much, is the
    provider's to say (`counts`); the arithmetic (an instance's units, the headroom) is reconciler/ledger.py's."""

    cloud: str
    region: str  # "" for a quota over every region of the cloud (GCE GPUS_ALL_REGIONS)
    name: str  # as the cloud names it: "Running On-Demand P instances (L-417A185B)", "NVIDIA_A100_GPUS", "cores"
    unit: str  # what limit and used count, plural: "vCPUs", "GPUs", "instances"
    limit: float
    used: float
    counts: tuple[tuple[str, str, float], ...]  # (instance type, market, units one instance counts)
    how_to_raise: str = ""  # the console page or CLI command that asks for more


@dataclass(frozen=True)
class Instance:
    """An instance as the cloud reports it, owned by this fleet."""

    id: str
    provider: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: Market
    state: Literal["pending", "running", "stopping", "terminated"]
    pool: str
    tags: Mapping[str, str] = field(default_factory=dict)
    launched_at: str = ""
    placement_group: str = ""  # the cluster placement group it runs in, where the cloud says (AWS)

    @property
    def alive(self) -> bool:
        return self.state in ("pending", "running")


@dataclass(frozen=True)
class CreateRequest:
    """Launch one instance. `key` is the idempotency key: the same key twice yields one instance."""

    key: str
    pool: PoolTarget
    zone: str
    instance_type: str
    market: Market
    max_price: float | None = None  # spot: the most we pay per hour
    tags: Mapping[str, str] = field(default_factory=dict)
    # Launch into this cluster placement group (a gang's), creating it if needed. Providers
    # without placement groups ignore it: the solver already keeps the gang in one zone and type.
    placement_group: str | None = None
    # The replicas the plan puts on the new instance, recorded with it at launch by providers
    # that record placements (PlacementRecorder); the others ignore it.
    placements: PlacementRecord | None = None
    # The bus the instance's node agent uses (a remote state URL): the provider passes the agent's
    # bootstrap (providers/bootstrap.py) as the instance's user data. None: no agent.
    agent_state_url: str | None = None
    # Launch into this capacity reservation (the cloud's id, e.g. AWS `cr-...`); None: a plain
    # launch (an open reservation that matches still takes it, as the clouds do).
    capacity_reservation: str | None = None


@dataclass(frozen=True)
class ProviderContext:
    """What the reconciler hands a provider factory."""

    fleet: str
    state_dir: Path  # the config repo's .reconcile/ directory
    options: Mapping[str, str] = field(default_factory=dict)  # e.g. endpoint_url for tests


@runtime_checkable
class Provider(Protocol):
    """A cloud the reconciler can drive. Implementations must never touch an
    instance whose TAG_FLEET is not this fleet's name."""

    name: str

    def observe(self, pools: Sequence[PoolTarget]) -> list[Instance]:
        """Every live instance of this fleet in the pools' regions (any pool, even removed ones)."""
        ...

    def offerings(self, pools: Sequence[PoolTarget]) -> list[Offering]:
        """Offerings for the pools' instance types and zones, with prices."""
        ...

    def create(self, request: CreateRequest) -> Instance:
        """Launch, or return the instance already launched with request.key.
        Raises CapacityError when the zone has no capacity."""
        ...

    def delete(self, instance: Instance) -> None:
        """Terminate an instance this fleet owns; raise OwnershipError otherwise.
        Deleting an instance that is already gone is not an error."""
        ...


@runtime_checkable
class PlacementRecorder(Protocol):
    """An optional capability: a provider that records on each instance which job replicas it
    hosts (providers/placements.py), so the placements outlive the reconciler's state."""

    def record_placements(self, instance: Instance, record: PlacementRecord) -> None:
        """Replace the instance's placement tags with `record`. Raises OwnershipError (writing
        nothing) if the instance is not this fleet's; an instance already gone is not an error."""
        ...


def keeps_placement_groups(provider) -> bool:
    """An optional capability, a class attribute `placement_groups = True` (sim, AWS): the provider launches into a
    request's cluster placement group and reports the group each instance is in (Instance.placement_group). The
    others ignore CreateRequest.placement_group, so that their instances are in none says nothing about a gang."""
    return getattr(provider, "placement_groups", False) is True


@runtime_checkable
class QuotaReader(Protocol):
    """An optional capability: a provider that reads the account quotas its pools' launches count against (AWS
    Service Quotas, GCE regions.get / projects.get quotas, Azure compute usages), so the plan stays within them.
    A provider without it, or whose read fails, plans as before and the plan says quotas were not checked; a launch
    past a quota is still a QuotaError at create time."""

    def quotas(self, pools: Sequence[PoolTarget]) -> list[Quota]:
        """The quotas the pools' instance types count against, in the pools' regions (and global ones), with their
        limits and current usage. Raises ProviderError when they cannot be read."""
        ...


@runtime_checkable
class InstanceFinder(Protocol):
    """An optional capability: a provider whose listing may lag a launch (EC2 is eventually consistent: an instance
    launched a moment ago may be missing from a tag-filtered DescribeInstances). Observe asks it by id for the
    instances the state places work on that its listing left out: one that exists still hosts that work, and read as
    gone its work was launched again beside it (and the original deleted later, as idle)."""

    def find(self, ids: Sequence[str], pools: Sequence[PoolTarget]) -> list[Instance]:
        """Those of `ids` that are this fleet's instances in the pools' regions and not terminated, as observe reports
        them; an id the cloud does not show (gone, or not one of its ids) is left out."""
        ...


@runtime_checkable
class Janitor(Protocol):
    """An optional capability: a provider that creates cloud objects besides instances (AWS cluster placement
    groups) and deletes this fleet's unused ones after an apply."""

    def clean_up(self, pools: Sequence[PoolTarget], in_use: frozenset[str] = frozenset()) -> list[str]:
        """Delete this fleet's objects in the pools' regions that nothing uses (`in_use`: placement groups observed
        instances are in); returns what was deleted."""
        ...


@runtime_checkable
class Preflight(Protocol):
    """An optional capability: a provider that can ask its cloud, without changing anything, whether the credentials
    may make the calls an apply will make (EC2's DryRun), so an apply that could launch but not tag or delete is
    refused before its first launch, not stopped halfway with a replacement running beside what it replaced."""

    def preflight(self, creates: Sequence[CreateRequest], deletes: Sequence[Instance], instances: Sequence[Instance],
                  retag: Sequence[Instance] = ()) -> None:
        """Raise AccessDeniedError naming what the credentials may not do of: launching `creates` as they will be
        sent, deleting `deletes`, rewriting the placement tags of `retag` (PlacementRecorder). `instances`: the fleet's,
        observed. Called at apply time only, for each provider the plan launches, deletes or retags with."""
        ...


def ownership_tags(fleet: str, pool: str, key: str) -> dict[str, str]:
    return {TAG_FLEET: fleet, TAG_POOL: pool, TAG_CREATE_KEY: key}


def mig_tag(layout: Sequence[str]) -> str:
    """TAG_MIG's value for a launch with `layout` (its pool's `mig`, as the bootstrap applies it): the profiles in the
    pool's order joined by `-` ("3g.40gb-2g.20gb-2g.20gb"), or NO_MIG. Profiles are `[1-7]g.<n>gb`, so the value is
    `[a-z0-9.-]` and at most 55 characters with NVIDIA's profiles (seven `1g.NNgb`): every cloud holds it as is,
    GCE labels too (`.` spelled `_`, which reads back exact: gcp.label_value)."""
    return "-".join(layout) if layout else NO_MIG


def mig_of(tags: Mapping[str, str]) -> tuple[str, ...] | None:
    """The MIG layout an instance records (TAG_MIG), () for none; None when it records nothing (launched before
    the tag existed: taken as its pool's layout, reconciler/observe.instance_layout says why)."""
    value = tags.get(TAG_MIG)
    if value is None:
        return None
    return () if value == NO_MIG else tuple(value.split("-"))


@dataclass(frozen=True)
class AgentTarget:
    """Where an instance's node agent finds the bus: the config dir's .reconcile/ or state_url."""

    config_dir: Path
    state_url: str | None = None


@runtime_checkable
class AgentHost(Protocol):
    """An optional capability: a provider that starts the node agent itself (the sim, whose
    instances are not machines). Cloud instances start theirs from the bootstrap user data."""

    def ensure_agent(self, instance: Instance, target: AgentTarget) -> None:
        """Start `reconcile agent` for the instance unless one was started already."""
        ...
