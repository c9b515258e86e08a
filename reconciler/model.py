"""The desired state: one strict pydantic model per kind of YAML document.

Documents have the Kubernetes shape (apiVersion, kind, metadata.name, spec).
Unknown fields are errors and types are not coerced ("8" is not 8), so a typo
in the config repo fails validation instead of silently meaning something else.
"""

from __future__ import annotations

from datetime import date, datetime
from fractions import Fraction
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from reconciler.units import written_exactly

API_VERSION = "fleetops.io/v1alpha1"

#: Named priority classes and the weight each contributes to the objective.
PRIORITY_CLASSES: dict[str, int] = {"low": 1, "normal": 10, "high": 100, "critical": 1000}

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]
NonNeg = Annotated[float, Field(ge=0, le=1e9)]


def _iso_time(v: object) -> object:
    """An ISO 8601 string is a time, as the published schema (`format: date-time`) says: a quoted timestamp, or
    one in a JSON document, was refused as 'not a valid datetime' by strict mode. A time without a zone is UTC."""
    return datetime.fromisoformat(v) if isinstance(v, str) else v


def _plausible_year(v: datetime) -> datetime:
    """A time the planner can do arithmetic on: 1970-2999. `submitted: 0001-01-01` and a deadline near it, less
    expected_hours, fell before year 1: an OverflowError in plan ("a bug in reconcile"), not a config error."""
    if not 1970 <= v.year <= 2999:
        raise ValueError(f"year {v.year} is outside 1970-2999")
    return v


Timestamp = Annotated[datetime, BeforeValidator(_iso_time), AfterValidator(_plausible_year)]


def _allows_something(v: object) -> object:
    """An allowlist names at least one entry: `pools: []` (a template's empty expansion) allowed nothing, and the job
    waited with "no pool offers 2 vCPU / 4 GiB"; `allowed_clouds: []` left every job pending. Absent allows all."""
    if isinstance(v, list) and not v:
        raise ValueError("an empty list allows nothing: name at least one, or leave the field out to allow all")
    return v


Allowlist = Annotated[list[str] | None, AfterValidator(_allows_something)]
NameAllowlist = Annotated[list[Name] | None, AfterValidator(_allows_something)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Market = Literal["spot", "on-demand"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Metadata(Strict):
    name: Name
    labels: dict[str, str] = {}


# ---------------------------------------------------------------- Tenant


def _held_exactly(v: float) -> float:
    """A vCPU or GiB amount the planner's integer rows hold exactly (reconciler.units.written_exactly), so the solver,
    greedy and apply's re-check admit the same work under a quota and on an instance; past that the ledger's float
    tolerance could admit what a row refuses."""
    if not written_exactly(v):
        raise ValueError(f"{v!r} has more than 6 decimal places (write at most 6, or a whole number of MiB: n/1024 GiB)")
    return v


Amount = Annotated[float, Field(ge=0, le=1e9), AfterValidator(_held_exactly)]


class Limits(Strict):
    """Resource amounts; a field left out means 'no limit on this dimension'."""

    gpus: Count | None = None
    cpu: Amount | None = None
    memory_gib: Amount | None = None


class Quota(Limits):
    """Guaranteed amounts, plus an optional burst ceiling (the hard cap)."""

    burst: Limits | None = None

    @model_validator(mode="after")
    def _burst_not_below_guarantee(self) -> "Quota":
        if self.burst is None:
            return self
        for dim in ("gpus", "cpu", "memory_gib"):
            g, b = getattr(self, dim), getattr(self.burst, dim)
            if g is not None and b is not None and b < g:
                raise ValueError(f"burst.{dim} ({b}) is below the guaranteed {dim} ({g})")
        return self

    def cap(self, dim: str) -> float | None:
        """The hard ceiling on one dimension: burst if given, else the guarantee."""
        if self.burst is not None and getattr(self.burst, dim) is not None:
            return getattr(self.burst, dim)
        return getattr(self, dim)


class TenantSpec(Strict):
    quota: Quota = Quota()
    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0


# ---------------------------------------------------------------- Pool


class AwsPoolSpec(Strict):
    """Launch settings for pools served by the AWS provider."""

    ami: str | None = None
    launch_template: str | None = None
    subnets: dict[str, str] = {}  # zone -> subnet id
    security_groups: list[str] = []
    key_name: str | None = None
    iam_instance_profile: str | None = None


class GcpPoolSpec(Strict):
    """Launch settings for pools served by the GCP provider."""

    project: str | None = None
    image: str | None = None
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None


class AzurePoolSpec(Strict):
    """Launch settings for pools served by the Azure provider."""

    subscription_id: str | None = None
    resource_group: str | None = None
    image: str | None = None
    subnet_id: str | None = None
    admin_username: str = "fleetops"
    ssh_public_key: str | None = None


class PoolSpec(Strict):
    cloud: Name
    provider: Name | None = None  # default: the run's --provider (sim)
    region: Name
    zones: Annotated[list[Name], Field(min_length=1)]
    instance_types: Annotated[list[str], Field(min_length=1)]
    market: Literal["spot", "on-demand", "either"] = "on-demand"
    min_instances: Count = 0
    max_instances: Count = 100
    aws: AwsPoolSpec | None = None
    gcp: GcpPoolSpec | None = None
    azure: AzurePoolSpec | None = None
    # MIG layout applied to every GPU of the pool's instances, e.g. [3g.40gb, 2g.20gb, 2g.20gb]
    # or seven 1g.10gb. Such instances serve only jobs that ask for mig devices.
    mig: Annotated[list[Annotated[str, Field(pattern=r"^[1-7]g\.[0-9]+gb$")]], Field(min_length=1, max_length=7)] | None = None

    @model_validator(mode="after")
    def _min_le_max(self) -> "PoolSpec":
        if self.min_instances > self.max_instances:
            raise ValueError(f"min_instances ({self.min_instances}) exceeds max_instances ({self.max_instances})")
        return self

    def markets(self) -> tuple[Market, ...]:
        return ("spot", "on-demand") if self.market == "either" else (self.market,)


# ---------------------------------------------------------------- Job


class MigRequest(Strict):
    """MIG devices of one profile (e.g. 1g.10gb) instead of whole GPUs."""

    profile: Annotated[str, Field(pattern=r"^[1-7]g\.[0-9]+gb$")]
    count: Annotated[int, Field(ge=1, le=56)] = 1


class Resources(Strict):
    """What one replica needs."""

    gpus: Count = 0
    gpu_type: str | None = None
    mig: MigRequest | None = None
    # The replica's GPUs must share one NVLink domain (tensor parallelism); types whose
    # domain is smaller are not considered. Without it, GPUs are still given in one domain
    # when they fit in one.
    nvlink: bool = False
    # At least a thousandth (the model counts vCPU and GiB in thousandths or finer: reconciler.units.scale), and a smaller ask
    # (cpu: 1.0e-20) was a 1.6e21-replica bound that crashed the solver on a config that validated.
    cpu: Annotated[float, Field(ge=0.001, le=100_000), AfterValidator(_held_exactly)] = 1.0
    memory_gib: Annotated[float, Field(ge=0.001, le=1_000_000), AfterValidator(_held_exactly)] = 1.0

    @model_validator(mode="after")
    def _gpu_type_iff_gpus(self) -> "Resources":
        if self.mig is not None:
            if self.gpus:
                raise ValueError("ask for either whole gpus or mig devices, not both")
            if not self.gpu_type:
                raise ValueError("gpu_type is required with mig (e.g. A100-80GB)")
            if self.nvlink:
                raise ValueError("nvlink applies to whole GPUs, not mig devices")
            return self
        if self.gpus > 0 and not self.gpu_type:
            raise ValueError("gpu_type is required when gpus > 0")
        if self.gpus == 0 and self.gpu_type:
            raise ValueError("gpu_type is set but gpus is 0")
        if self.nvlink and self.gpus < 2:
            raise ValueError("nvlink needs gpus >= 2")
        return self


class DataSpec(Strict):
    location: str  # a topology node: "aws", "aws/us-east-1" or "aws/us-east-1/us-east-1a"
    size_gib: NonNeg = 0.0
    max_latency_ms: NonNeg | None = None  # hard: zones farther than this from the data are not used


# A container image reference as `docker run` takes it ([registry[:port]/]name[:tag][@digest]): never starting with `-`,
# which docker read as one of its own options (`image: --privileged` ran the job privileged, `--volume=/:/host` with the
# host's root mounted), and no space or control character.
ImageRef = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$", max_length=512)]


def _checkpoint_dir(v: object) -> object:
    """An absolute path inside the container, without `..` (the agent makes it under its --checkpoint-root:
    `/x/../../../../etc` was the host's /etc, made by the agent and mounted into the container read-write) and without
    `:` or `,`, which `docker run --volume` reads as its own separators."""
    if isinstance(v, str):
        if not v.startswith("/"):
            raise ValueError("must be an absolute path (the checkpoint directory as the job sees it, e.g. /ckpt)")
        if ".." in v.split("/"):
            raise ValueError("must not contain `..`: it would leave the job's checkpoint directory on the host")
        if ":" in v or "," in v or not v.isprintable():
            raise ValueError("must not contain `:`, `,` or control characters (docker's --volume reads them as separators)")
    return v


def _no_nul(v: str) -> str:
    """exec takes C strings: a NUL in an argument or an environment value killed the node agent starting it."""
    if "\0" in v:
        raise ValueError("holds a NUL character (\\0), which no process's arguments or environment can hold")
    return v


ExecText = Annotated[str, AfterValidator(_no_nul)]


class RunSpec(Strict):
    """What a replica runs: a container image on the clouds, `command` as a local process on the sim."""

    image: ImageRef | None = None
    command: Annotated[list[Annotated[ExecText, Field(min_length=1)]], Field(min_length=1)]
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ExecText] = {}


class RestartSpec(Strict):
    """OnFailure: a failed replica (and its whole gang) starts again, up to backoff_limit
    times, after delays that double; Never: the first failure fails the job."""

    policy: Literal["OnFailure", "Never"] = "OnFailure"
    backoff_limit: Annotated[int, Field(ge=0, le=1000)] = 3


class CheckpointSpec(Strict):
    """Before a stop the replica can survive (spot notice, move, unassignment) it gets `signal`
    and `grace_seconds` to write a checkpoint under `dir`; then it is killed."""

    dir: Annotated[str, Field(min_length=1, max_length=1024), BeforeValidator(_checkpoint_dir)]
    signal: Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"] = "SIGTERM"
    grace_seconds: Annotated[float, Field(ge=0, le=3600)] = 30.0


class JobSpec(Strict):
    tenant: Name
    priority: Annotated[int, Field(ge=0, le=1_000_000)] | Literal["low", "normal", "high", "critical"] = "normal"
    resources: Resources
    replicas: Annotated[int, Field(ge=1, le=10_000)] = 1  # a gang: all replicas run, or none
    # Where a gang's replicas must be together: one zone, one placement group (one zone and
    # one instance type, launched into a cluster placement group), or one instance.
    gang: Literal["zone", "placement-group", "instance"] = "zone"
    # eligible: spot or on-demand, whichever is cheaper; preferred: spot, falling back to
    # on-demand when spot is short; required: spot or nothing; never: on-demand only.
    spot: Literal["eligible", "preferred", "required", "never"] = "eligible"
    data: DataSpec | None = None
    regions: Allowlist = None  # allowlist: "us-east-1" or "aws/us-east-1"
    clouds: NameAllowlist = None  # allowlist of clouds
    pools: NameAllowlist = None  # allowlist of Pool names
    expected_hours: Annotated[float, Field(gt=0, le=100_000)] = 24.0  # amortises data egress
    submitted: Timestamp | None = None
    # Must finish by then: it must start by deadline - expected_hours. Ranks above work of its
    # class without one (the closer, the higher); flagged DeadlineAtRisk / DeadlineMissed.
    deadline: Timestamp | None = None
    # Floating licenses each replica holds while it runs (License documents by name), e.g. {matlab: 1}.
    licenses: dict[Name, Annotated[int, Field(ge=1, le=1_000_000)]] = {}
    # The workload (reconciler/runtime). Without `run` a Job is a reservation: it is placed,
    # and nothing is started.
    run: RunSpec | None = None
    mode: Literal["batch", "service"] | None = None  # default batch when `run` is set
    restart: RestartSpec | None = None
    time_limit_hours: Annotated[float, Field(gt=0, le=100_000)] | None = None
    checkpoint: CheckpointSpec | None = None

    @model_validator(mode="after")
    def _workload_needs_run(self) -> "JobSpec":
        if self.run is None:
            extra = [f for f in ("mode", "restart", "time_limit_hours", "checkpoint") if getattr(self, f) is not None]
            if extra:
                raise ValueError(f"{', '.join(extra)} apply only to a job that runs something: add run.command")
        return self

    @property
    def run_mode(self) -> str:
        return self.mode or "batch"

    @property
    def restart_policy(self) -> RestartSpec:
        return self.restart or RestartSpec()

    def priority_weight(self) -> int:
        p = self.priority
        return PRIORITY_CLASSES[p] if isinstance(p, str) else p


# ---------------------------------------------------------------- Policies


def _decimals_at_most(places: int):
    """A spot rule's number with at most `places` decimals: the planner's integer rows hold it exactly (ledger.share_row,
    buffer_row), so the solver, greedy, load and apply's re-check accept the same fleets; past that their float
    tolerance could accept what a row refuses."""
    def check(v: float) -> float:
        if (Fraction(repr(float(v))) * 10**places).denominator != 1:
            raise ValueError(f"{v!r} has more than {places} decimal places (write at most {places})")
        return v
    return AfterValidator(check)


SpotFraction = Annotated[float, Field(ge=0, le=1), _decimals_at_most(6)]


class SpotPolicySpec(Strict):
    max_spot_fraction: SpotFraction = 1.0  # of the fleet's GPUs (or vCPUs for a CPU-only fleet)
    tenant_max_spot_fraction: dict[Name, SpotFraction] = {}  # of each named tenant's placed work (7 per GPU, 1 per MIG slice or CPU replica)
    # Idle on-demand GPUs kept as a landing zone for interrupted spot work, as a percentage
    # of the GPUs on spot instances.
    on_demand_buffer_percent: Annotated[float, Field(ge=0, le=100), _decimals_at_most(4)] = 0.0
    min_instance_types: Annotated[int, Field(ge=1, le=100)] = 1  # distinct types whenever spot is used
    min_zones: Annotated[int, Field(ge=1, le=100)] = 1  # distinct zones whenever spot is used
    max_price_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0  # spot price / on-demand price


class GuardrailPolicySpec(Strict):
    allowed_regions: Allowlist = None  # "us-east-1" or "aws/us-east-1"
    allowed_clouds: NameAllowlist = None
    max_hourly_budget: NonNeg | None = None
    tenant_hourly_budgets: dict[Name, NonNeg] = {}  # USD/h of each named tenant's replicas
    max_destroy_per_apply: Count | None = None
    # Budget at a pinned catalog.json's prices where they are below the shipped public ones (negotiated discounts,
    # on-prem pools the team prices); by default the budget guardrail takes the public price (catalog.price_override).
    allow_negotiated_prices: bool = False


class AgingSpec(Strict):
    """Pending jobs climb one priority class (x10) per `step_hours` since `submitted`."""

    step_hours: Annotated[float, Field(gt=0, le=100_000)] = 24.0
    max_priority: Literal["low", "normal", "high", "critical"] = "high"


class PlacementPolicySpec(Strict):
    """How eagerly the fleet changes what already runs."""

    # A moved replica loses this much (restart, checkpoint reload), one-time, in USD: per GPU
    # for GPU work, per replica for CPU work. A move is made only when it pays for itself
    # within payback_hours.
    move_cost_per_gpu: NonNeg = 2.0
    move_cost_per_replica: NonNeg = 0.25
    payback_hours: Annotated[float, Field(gt=0, le=100_000)] = 24.0
    # WhenUnderutilized: move replicas to delete or downsize instances when it pays;
    # WhenEmpty: only instances with nothing on them are deleted.
    consolidation: Literal["WhenUnderutilized", "WhenEmpty"] = "WhenUnderutilized"
    # LowerPriority: a tenant's higher-priority job may evict its own lower-priority ones
    # inside its guarantee; Never: only borrowed capacity is ever reclaimed.
    preemption: Literal["LowerPriority", "Never"] = "LowerPriority"
    latency_cost_per_ms: NonNeg = 0.0  # USD/h per replica per ms between the job's data and its zone
    aging: AgingSpec = AgingSpec()


# ---------------------------------------------------------------- Licenses, reservations


class LicenseSpec(Strict):
    """A fleet-wide pool of `count` floating licenses, held by running replicas (Slurm's licenses)."""

    count: Count
    tenant_quotas: dict[Name, Count] = {}  # most a named tenant's replicas may hold at once
    cost_per_hour: NonNeg = 0.0  # USD per license-hour, charged to the holder's tenant


class ReservationTarget(Strict):
    """The cloud's id of the reservation, which launches name: an AWS capacity reservation `cr-...`, a GCE reservation's
    name (or projects/P/reservations/NAME), an Azure capacity reservation group's name or id."""

    reservation_id: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^/?[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


class ReservationSpec(Strict):
    """Capacity paid for whether used or not (reserved instances, savings plans, capacity
    reservations and blocks, committed use): `count` instances of one type in one zone at
    `hourly_cost` each, until `until`. Its marginal price while unused is zero."""

    cloud: Name
    region: Name
    zone: Name
    instance_type: str
    count: Annotated[int, Field(ge=1, le=100_000)]
    hourly_cost: NonNeg  # USD per reserved instance-hour, paid used or not
    until: date | datetime | None = None  # after this it is gone (not planned on)
    pool: Name | None = None  # the Pool its instances belong to (default: the one pool that matches)
    target: ReservationTarget | None = None


# ---------------------------------------------------------------- Topology


class RegionTopology(Strict):
    zones: Annotated[list[Name], Field(min_length=1)]


class CloudTopology(Strict):
    regions: dict[Name, RegionTopology]


class Link(Strict):
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    latency_ms: NonNeg
    egress_per_gb: NonNeg


class TopologyDefaults(Strict):
    """Costs of the implicit edges of the hierarchy, as public clouds bill them."""

    zone_latency_ms: NonNeg = 1.0
    zone_egress_per_gb: NonNeg = 0.0  # region store -> zone in the same region
    region_latency_ms: NonNeg = 30.0
    region_egress_per_gb: NonNeg = 0.02  # between regions of one cloud
    cloud_latency_ms: NonNeg = 60.0
    cloud_egress_per_gb: NonNeg = 0.09  # out of one cloud into another


class TopologySpec(Strict):
    clouds: dict[Name, CloudTopology]
    links: list[Link] = []
    defaults: TopologyDefaults = TopologyDefaults()


# ---------------------------------------------------------------- Documents


class _Doc(Strict):
    apiVersion: Literal["fleetops.io/v1alpha1"]
    metadata: Metadata

    @property
    def name(self) -> str:
        return self.metadata.name


class Tenant(_Doc):
    kind: Literal["Tenant"]
    spec: TenantSpec


class Pool(_Doc):
    kind: Literal["Pool"]
    spec: PoolSpec


class Job(_Doc):
    kind: Literal["Job"]
    spec: JobSpec


class SpotPolicy(_Doc):
    kind: Literal["SpotPolicy"]
    spec: SpotPolicySpec


class GuardrailPolicy(_Doc):
    kind: Literal["GuardrailPolicy"]
    spec: GuardrailPolicySpec


class Topology(_Doc):
    kind: Literal["Topology"]
    spec: TopologySpec


class PlacementPolicy(_Doc):
    kind: Literal["PlacementPolicy"]
    spec: PlacementPolicySpec


class License(_Doc):
    kind: Literal["License"]
    spec: LicenseSpec


class Reservation(_Doc):
    kind: Literal["Reservation"]
    spec: ReservationSpec


Document = Union[Tenant, Pool, Job, SpotPolicy, GuardrailPolicy, PlacementPolicy, Topology, License, Reservation]
KINDS: dict[str, type[_Doc]] = {
    cls.model_fields["kind"].annotation.__args__[0]: cls  # type: ignore[union-attr]
    for cls in (Tenant, Pool, Job, SpotPolicy, GuardrailPolicy, PlacementPolicy, Topology, License, Reservation)
}


class DesiredState(BaseModel):
    """Every validated document of one config directory, by kind and name."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    topology: Topology
    tenants: dict[str, Tenant]
    pools: dict[str, Pool]
    jobs: dict[str, Job]
    spot_policy: SpotPolicySpec = SpotPolicySpec()
    guardrails: GuardrailPolicySpec = GuardrailPolicySpec()
    placement: PlacementPolicySpec = PlacementPolicySpec()
    licenses: dict[str, License] = {}
    reservations: dict[str, Reservation] = {}
    digest: str = ""  # sha256 over the documents: a saved plan is stale when it changes

    @property
    def fleet(self) -> str:
        """The fleet's name, written on every instance it owns: the Topology's name."""
        return self.topology.name

    @field_validator("jobs", "pools", "tenants", "licenses", "reservations")
    @classmethod
    def _sorted(cls, v: dict) -> dict:
        return dict(sorted(v.items()))


def region_matches(allow: list[str] | None, cloud: str, region: str) -> bool:
    """True if `cloud/region` is in an allowlist of 'region' or 'cloud/region' entries."""
    if allow is None:
        return True
    return region in allow or f"{cloud}/{region}" in allow


def quota_guarantee(quota: Quota, dim: str) -> float | None:
    """The guaranteed amount of one dimension (None: unlimited). A dimension with only a
    burst ceiling guarantees nothing: all of it is borrowed."""
    g = getattr(quota, dim)
    if g is not None:
        return g
    if quota.burst is not None and getattr(quota.burst, dim) is not None:
        return 0.0
    return None
