"""Live spot prices at plan time, cached with a TTL, for providers whose cloud publishes them.

Spot prices move between catalog refreshes (Azure's and AWS's daily; GCP's up to once every 30 days), so a plan on a
real account prices spot with what the cloud says now and the dated catalog otherwise. Each read is kept in
`.reconcile/cache/` for `ttl` seconds (providers/offercache.py), so a controller that plans every minute does not
page the price API every minute. Every offering says which price it carries: a live one names its API and the time it
was read ("spot: live Azure Retail Prices API, read 2026-11-26T08:30Z"), one that could not be read keeps the
catalog's and says why. On-demand list prices stay the catalog's: they change on the scale of months, and the catalog
names their source and date.

- Azure: the Retail Prices API (prices.azure.com/api/retail/prices), public and unauthenticated: per region and VM
  size, `$filter=serviceName eq 'Virtual Machines' and armRegionName eq '<region>' and armSkuName eq '<size>' and
  priceType eq 'Consumption'`; the Linux meter whose skuName ends in " Spot" is the spot price.
- GCP: the Cloud Billing Catalog API (services/6F81-5844-456A/skus, the "Preemptible" usage type), which needs an API
  key: read only when GOOGLE_API_KEY (or FLEETOPS_GCP_API_KEY) is set, the catalog otherwise.
- AWS reads DescribeSpotPriceHistory itself (providers/aws.py)."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from providers.base import Offering
from providers.offercache import cached
from providers.errors import ReconcileError

DEFAULT_SPOT_TTL_S = 3600.0


def read_spot(state_dir: Path, name: str, parts: Sequence[str], ttl: float,
              fetch: Callable[[], dict[str, dict[str, float]]]) -> tuple[dict[str, dict[str, float]], str]:
    """({region: {type: spot price}}, when it was read: ISO minute UTC), from the cache when younger than `ttl`."""
    def read() -> dict:
        return {"read_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "prices": fetch()}

    key = f"spot-{name}-" + hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]
    data = cached(state_dir, key, ttl, read)
    return data["prices"], data["read_at"]


def with_live_spot(offers: list[Offering], prices: dict[str, dict[str, float]], api: str, read_at: str) -> list[Offering]:
    """The offerings with the spot price the API gave for their region and type; the others unchanged. The label
    keeps the catalog's source and date for the on-demand price and dates the spot price by its read."""
    out = []
    for o in offers:
        live = prices.get(o.region, {}).get(o.instance_type)
        if live is None:
            out.append(o)
            continue
        catalog = f"{o.price_source} ({o.prices_as_of})" if o.prices_as_of else o.price_source
        out.append(dataclasses.replace(o, spot_price=float(live), prices_as_of="",
                                       price_source=f"{catalog}; spot: live {api}, read {read_at}"))
    return out


def unread(offers: list[Offering], api: str, error: ReconcileError) -> list[Offering]:
    """The offerings with their catalog prices, each saying that the live read failed and why (the plan goes on:
    the catalog's spot prices are dated and sourced, only older)."""
    why = str(error).split("; nothing was written")[0]
    return [dataclasses.replace(o, price_source=f"{o.price_source} ({o.prices_as_of}); spot: catalog, the live {api} "
                                f"could not be read ({why})", prices_as_of="") if o.prices_as_of else o for o in offers]


def azure_spot(region: str, sizes: Sequence[str], endpoint: str | None = None) -> dict[str, float]:
    """{size: spot USD/h} for the sizes the Retail Prices API has a Linux spot meter for in `region`."""
    import urllib.parse

    from providers.pricesources import _azure_item, _get_json, azure_endpoint

    out: dict[str, dict] = {}
    for size in sorted(set(sizes)):
        flt = (f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and armSkuName eq '{size}' "
               "and priceType eq 'Consumption'")
        url: str | None = f"{azure_endpoint(endpoint)}/api/retail/prices?{urllib.parse.urlencode({'$filter': flt})}"
        for _ in range(100):  # a size has a handful of meters in a region: one page, rarely two
            if not url:
                break
            page = _get_json(url, f"azure Retail Prices API ({region}, {size})")
            for item in page.get("Items", []):
                _azure_item(item, {size}, region, out)
            url = page.get("NextPageLink")
    return {size: p[region]["spot"] for size, p in out.items() if "spot" in p.get(region, {})}


def gcp_spot(catalog, types: Sequence[str], regions: Sequence[str], endpoint: str | None = None) -> dict[str, dict[str, float]]:
    """{region: {type: spot USD/h}} from the Cloud Billing Catalog's Preemptible SKUs (the same arithmetic as
    `reconcile catalog update`: the family's per-vCPU and per-GiB prices times the shape, plus its GPUs)."""
    from providers.pricesources import gcp_prices

    prices, _ = gcp_prices(catalog, sorted(set(types)), sorted(set(regions)), endpoint)
    return {r: {t: p[r]["spot"] for t, p in prices.items() if "spot" in p.get(r, {})} for r in regions}
