"""The desired state: one strict pydantic model per kind of YAML document.

Documents have the Kubernetes shape (apiVersion, kind, metadata.name, spec).
Unknown fields are errors and types are not coerced ("8" is not 8), so a typo
in the config repo fails validation instead of silently meaning something else.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

API_VERSION = "fleetops.io/v1alpha1"

#: Named priority classes and the weight each contributes to the objective.
PRIORITY_CLASSES: dict[str, int] = {"low": 1, "normal": 10, "high": 100, "critical": 1000}

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=63)]
NonNeg = Annotated[float, Field(ge=0, le=1e9)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Market = Literal["spot", "on-demand"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Metadata(Strict):
    name: Name
    labels: dict[str, str] = {}


# ---------------------------------------------------------------- Tenant


class Limits(Strict):
    """Resource amounts; a field left out means 'no limit on this dimension'."""

    gpus: Count | None = None
    cpu: NonNeg | None = None
    memory_gib: NonNeg | None = None


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

    @model_validator(mode="after")
    def _min_le_max(self) -> "PoolSpec":
        if self.min_instances > self.max_instances:
            raise ValueError(f"min_instances ({self.min_instances}) exceeds max_instances ({self.max_instances})")
        return self

    def markets(self) -> tuple[Market, ...]:
        return ("spot", "on-demand") if self.market == "either" else (self.market,)


# ---------------------------------------------------------------- Job


class Resources(Strict):
    """What one replica needs."""

    gpus: Count = 0
    gpu_type: str | None = None
    cpu: Annotated[float, Field(gt=0, le=100_000)] = 1.0
    memory_gib: Annotated[float, Field(gt=0, le=1_000_000)] = 1.0

    @model_validator(mode="after")
    def _gpu_type_iff_gpus(self) -> "Resources":
        if self.gpus > 0 and not self.gpu_type:
            raise ValueError("gpu_type is required when gpus > 0")
        if self.gpus == 0 and self.gpu_type:
            raise ValueError("gpu_type is set but gpus is 0")
        return self


class DataSpec(Strict):
    location: str  # a topology node: "aws", "aws/us-east-1" or "aws/us-east-1/us-east-1a"
    size_gib: NonNeg = 0.0


class JobSpec(Strict):
    tenant: Name
    priority: Annotated[int, Field(ge=0, le=1_000_000)] | Literal["low", "normal", "high", "critical"] = "normal"
    resources: Resources
    replicas: Annotated[int, Field(ge=1, le=10_000)] = 1  # a gang: all replicas run, or none
    spot: Literal["eligible", "required", "never"] = "eligible"
    data: DataSpec | None = None
    regions: list[str] | None = None  # allowlist: "us-east-1" or "aws/us-east-1"
    pools: list[Name] | None = None  # allowlist of Pool names
    expected_hours: Annotated[float, Field(gt=0, le=100_000)] = 24.0  # amortises data egress
    submitted: datetime | None = None
    deadline: datetime | None = None

    def priority_weight(self) -> int:
        p = self.priority
        return PRIORITY_CLASSES[p] if isinstance(p, str) else p


# ---------------------------------------------------------------- Policies


Fraction = Annotated[float, Field(ge=0, le=1)]


class SpotPolicySpec(Strict):
    max_spot_fraction: Fraction = 1.0  # of the fleet's GPUs (or vCPUs for a CPU-only fleet)
    on_demand_buffer_percent: Annotated[float, Field(ge=0, le=100)] = 0.0
    min_instance_types: Annotated[int, Field(ge=1, le=100)] = 1
    max_price_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0  # spot price / on-demand price


class GuardrailPolicySpec(Strict):
    allowed_regions: list[str] | None = None  # "us-east-1" or "aws/us-east-1"
    max_hourly_budget: NonNeg | None = None
    max_destroy_per_apply: Count | None = None


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


Document = Union[Tenant, Pool, Job, SpotPolicy, GuardrailPolicy, Topology]
KINDS: dict[str, type[_Doc]] = {
    cls.model_fields["kind"].annotation.__args__[0]: cls  # type: ignore[union-attr]
    for cls in (Tenant, Pool, Job, SpotPolicy, GuardrailPolicy, Topology)
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
    digest: str = ""  # sha256 over the documents: a saved plan is stale when it changes

    @property
    def fleet(self) -> str:
        """The fleet's name, written on every instance it owns: the Topology's name."""
        return self.topology.name

    @field_validator("jobs", "pools", "tenants")
    @classmethod
    def _sorted(cls, v: dict) -> dict:
        return dict(sorted(v.items()))


def region_matches(allow: list[str] | None, cloud: str, region: str) -> bool:
    """True if `cloud/region` is in an allowlist of 'region' or 'cloud/region' entries."""
    if allow is None:
        return True
    return region in allow or f"{cloud}/{region}" in allow
