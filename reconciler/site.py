"""Site: where an instance runs or would be bought, and what it is: one value shared by the problem's
hosts and offers and the plan's creates and deletes, so the seven fields are declared once."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

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

    @property
    def offer_key(self) -> str:
        """(pool, zone, type, market): the class of new instances this site belongs to."""
        return f"{self.pool}/{self.zone}/{self.instance_type}/{self.market}"

    @property
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


__all__ = ["SITE_FIELDS", "OnSite", "Site"]
