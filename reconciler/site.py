"""Site: where an instance runs or would be bought, and what it is: one value shared by the problem's
hosts and offers and the plan's creates and deletes, so the seven fields are declared once; and the
capacity at a site: a Host (an instance the fleet runs) or an Offer (new instances to buy).

Below the ledger (which counts hosts and offers alike and must tell them apart by their type), so it
imports nothing of the reconciler; reconciler.problem re-exports the capacity types."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from operator import attrgetter
from typing import ClassVar

SITE_FIELDS = ("pool", "provider", "cloud", "region", "zone", "instance_type", "market")


@dataclass(frozen=True)
class Site:
    """(pool, provider, cloud, region, zone, instance type, market). A reservation is not part of it: it is
    a claim on committed capacity that a host gains or loses as Reservations start and end without moving
    (a delete names no reservation), so an offer of reserved capacity is the site plus the reservation's name."""

    pool: str
    provider: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str

    @classmethod
    def of(cls, x) -> Site:
        """The site of anything with the seven fields (an observed instance)."""
        return cls(x.pool, x.provider, x.cloud, x.region, x.zone, x.instance_type, x.market)

    @cached_property  # (asked 200k+ times a 10k-job plan; built once: the fields are frozen)
    def offer_key(self) -> str:
        """(pool, zone, type, market): the class of new instances this site belongs to."""
        return f"{self.pool}/{self.zone}/{self.instance_type}/{self.market}"

    @cached_property
    def zone_site(self) -> str:
        """`cloud/zone`: what the problem's per-item egress and latency costs are keyed by (Problem.coef)."""
        return f"{self.cloud}/{self.zone}"

    @cached_property
    def class_key(self) -> str:
        """The same across the zones of a pool: (pool, type, market)."""
        return f"{self.pool}/*/{self.instance_type}/{self.market}"

    @classmethod
    def from_json(cls, raw: dict) -> Site:
        """From a saved action's fields (plan/file.py keeps them flat)."""
        return cls(*(raw[f] for f in SITE_FIELDS))


class OnSite:
    """Read access to the fields of the Site a value carries (`x.zone` is `x.site.zone`), for what carries one:
    hosts, offers, creates and deletes. Each is an attrgetter, not a Python function: no frame per read."""

    __slots__ = ()
    site: Site


for _f in SITE_FIELDS:
    setattr(OnSite, _f, property(attrgetter(f"site.{_f}"), doc=f"site.{_f}"))


@dataclass(frozen=True, kw_only=True)
class Capacity(OnSite):
    """What a host and an offer share, and all that code treating both alike reads: where (its Site: `c.zone`
    reads `c.site.zone`), one instance's shape and prices, and `most`, how many instances it counts at most.
    Code that must tell them apart takes the hosts, then the offers (Problem.hosts(), Problem.offers())."""

    key: str
    site: Site
    gpus: int  # physical GPUs
    gpu_type: str | None
    cpu: float
    memory_gib: float
    price: float  # USD per hour
    on_demand_price: float
    nvlink_domain: int = 1
    mig: tuple[str, ...] | None = None  # the per-GPU MIG layout of the pool
    reservation: str | None = None  # reserved capacity (a Reservation's name): price 0, its cost is committed
    price_source: str = ""  # where the price comes from, and its date (shown with the plan)
    # For a reader of a mixed list (tests ask them): the planner asks the type, or takes hosts() then offers().
    existing: ClassVar[bool] = False  # a Host
    frozen: ClassVar[bool] = False  # only a host can be frozen (problem/freeze.py)

    @property
    def work_most(self) -> int:
        """Of `most`, the instances that may hold work (an offer's others stand idle: Offer.ballast)."""
        return self.most

    @cached_property
    def offer_key(self) -> str:
        """The (pool, zone, type, market) class this capacity belongs to (a reservation's is its own)."""
        return self.site.offer_key + (f"@{self.reservation}" if self.reservation else "")

    @property
    def one_nvlink_domain(self) -> bool:
        """All its GPUs in one NVLink domain (every NVLink type of the catalog). An NVLink block then fits wherever
        the free GPU count holds it, whatever GPUs running work keeps (their indices are not re-packed; the packer
        takes any free GPUs of the domain, pack.Bin._block), so counting GPUs, as the solver and greedy do, is
        exact. With several domains the kept GPUs can leave no domain a block the count has room for: there
        NVLink work goes only where no GPU is taken."""
        return self.nvlink_domain >= self.gpus

    @cached_property
    def class_key(self) -> str:
        """The same across the zones of a pool: (pool, type, market)."""
        return self.site.class_key + (f"@{self.reservation}" if self.reservation else "")

    @property
    def cloud_zone(self) -> tuple[str, str]:
        return (self.site.cloud, self.site.zone)

    def common(self) -> dict:
        """The fields every capacity has: to make another kind of the same site, shape and price (an idle class)."""
        return {f.name: getattr(self, f.name) for f in fields(Capacity)}

    def cap(self, dim: str) -> float:
        if dim == "gpus":
            return 0 if self.mig else self.gpus
        if dim == "cpu":
            return self.cpu
        if dim == "memory_gib":
            return self.memory_gib
        if dim.startswith("mig:") and self.mig:
            return self.gpus * self.mig.count(dim[4:])
        return 0.0


@dataclass(frozen=True, kw_only=True)
class Host(Capacity):
    """An instance the fleet runs now (observe found it): its residents, and why it must go, if it must."""

    instance_id: str
    keep_blocker: str | None = None  # why it must go (pool removed, drifted from spec)
    residents: tuple[tuple[str, str, int], ...] = ()  # (demand key, job, items here)
    # Where its provider launches into cluster placement groups (Observed.grouped): the placement-group gang (its job)
    # whose group it runs in, as the planner names groups (plan.placement_group_name), '' for none (in no group, or in
    # one no such gang of this fleet names); None where its provider has no groups: nothing to check (rules.gang_split)
    group_of: str | None = None
    frozen: bool = False  # nothing can change here: kept, residents stay, nothing new lands
    existing: ClassVar[bool] = True
    most: ClassVar[int] = 1


@dataclass(frozen=True, kw_only=True)
class Offer(Capacity):
    """Up to max_new new instances of one site (and Reservation), or a zone class: the offers of one (pool,
    type, market) in every zone (`members`), for work that does not care which zone (solve/index.py)."""

    max_new: int = 0
    members: tuple[str, ...] = ()  # a zone class: the offers (one per zone) it stands for
    # Of max_new, the instances an optimum may buy only to stand idle for the spot share and the on-demand buffer
    # (problem/capacity.py, size_offers): counted by the fleet rules and the cost, never given work (no slots).
    ballast: int = 0
    # The work that may land here fills its pool's max_instances of it, counted in sum per dimension
    # (problem/capacity.py, size_offers): the pool, not the work, caps the count (slots.pool_capped).
    fills_pool: bool = False

    @property
    def most(self) -> int:
        return self.max_new

    @property
    def work_most(self) -> int:
        return self.max_new - self.ballast


__all__ = ["SITE_FIELDS", "Capacity", "Host", "Offer", "OnSite", "Site"]
