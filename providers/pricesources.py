"""`reconcile catalog update`: per-region prices from the clouds' public price sources, into a dated catalog.

- AWS: on-demand from the Price List Query API (pricing:GetProducts: Linux, shared tenancy, no pre-installed
  software, capacitystatus Used); spot from EC2 DescribeSpotPriceHistory: the last price change at or before
  now is the current price, however old (the EC2 API reference), the median over the region's zones
  (zone names differ between accounts, so the catalog keeps one spot price per region).
- GCP: the Cloud Billing Catalog API (services/6F81-5844-456A/skus): a machine type is its family's
  per-vCPU and per-GiB prices times its shape, plus its GPUs; spot is the "Preemptible" usage type.
- Azure: the Retail Prices API (prices.azure.com/api/retail/prices): Linux Consumption meters of the VM size;
  a "Spot" meter is the spot price ("Low Priority" and Windows meters are skipped).

Endpoints default to the public ones; FLEETOPS_AWS_PRICING_ENDPOINT / FLEETOPS_EC2_ENDPOINT,
FLEETOPS_GCP_BILLING_ENDPOINT and FLEETOPS_AZURE_PRICES_ENDPOINT point elsewhere (tests serve recorded
responses). Every price written names its source and the date it was read; nothing is multiplied or
jittered, and a type a source does not price in a region gets no price there."""

from __future__ import annotations

import json
import os
import re
import statistics
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from typing import Callable, Iterable

from providers.catalog import Catalog, is_price
from providers.errors import ReconcileError
from providers.redact import redact

GCE_SERVICE = "services/6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
GCP_BILLING = "https://cloudbilling.googleapis.com"  # where a real API key may go
TEST_API_KEY = "fake-api-key-for-tests"  # TEST ONLY: the one key sent to another endpoint (a local fake)
# The Cloud Billing Catalog names GPUs in SKU descriptions ("Nvidia Tesla A100 GPU running in Americas").
GCP_GPU_SKU = {"A100": "Nvidia Tesla A100", "A100-80GB": "Nvidia Tesla A100 80GB", "H100": "Nvidia H100 80GB", "H200": "Nvidia H200 141GB",
               "L4": "Nvidia L4", "T4": "Nvidia Tesla T4", "V100": "Nvidia Tesla V100", "P100": "Nvidia Tesla P100"}


class PriceSourceError(ReconcileError):
    pass


def _get_json(url: str, what: str, headers: dict | None = None) -> dict:
    req = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - https endpoints (or a test's local fake)
            body = resp.read()
    except urllib.error.HTTPError as e:
        raise PriceSourceError(f"{what}: HTTP {e.code} from {redact(url.split('?')[0])}; nothing was written") from None
    except (urllib.error.URLError, OSError) as e:
        raise PriceSourceError(f"{what}: cannot reach {redact(url.split('?')[0])} ({getattr(e, 'reason', e)}); nothing was written") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise PriceSourceError(f"{what}: {redact(url.split('?')[0])} did not answer JSON; nothing was written") from None
    if not isinstance(data, dict):
        raise PriceSourceError(f"{what}: {redact(url.split('?')[0])} answered {type(data).__name__}, not an object; nothing was written")
    return data


def _today() -> str:
    return datetime.now(timezone.utc).date().isoformat()


# -- AWS ------------------------------------------------------------------------------------------------

def aws_prices(types: list[str], regions: list[str]) -> tuple[dict, dict]:
    """({type: {region: {on_demand, spot?}}}, {source key: {date, what}})."""
    import boto3

    from providers.aws import latest_spot_prices

    pricing = boto3.client("pricing", region_name="us-east-1", endpoint_url=os.environ.get("FLEETOPS_AWS_PRICING_ENDPOINT"))
    out: dict[str, dict] = {}
    for region in regions:
        for t in types:
            od = _aws_on_demand(pricing, t, region)
            if od is not None:
                out.setdefault(t, {})[region] = {"on_demand": od}
        ec2 = boto3.client("ec2", region_name=region, endpoint_url=os.environ.get("FLEETOPS_EC2_ENDPOINT"))
        try:
            spot = latest_spot_prices(ec2, types, datetime.now(timezone.utc))
        except Exception as e:  # botocore errors and connection errors
            raise PriceSourceError(f"aws DescribeSpotPriceHistory in {region}: {redact(str(e))}; nothing was written") from None
        by_type: dict[str, list[float]] = {}
        for (t, _zone), price in spot.items():
            by_type.setdefault(t, []).append(price)
        for t, prices in by_type.items():
            if region in out.get(t, {}):
                out[t][region]["spot"] = round(statistics.median(prices), 6)
    today = _today()
    return out, {f"aws-{today}": {"date": today, "what": "AWS Price List Query API (GetProducts: Linux, shared tenancy, on-demand) and "
                                  "EC2 DescribeSpotPriceHistory (the last change at or before the read; median over the region's zones)"}}


def _aws_on_demand(pricing, instance_type: str, region: str) -> float | None:
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
        ("instanceType", instance_type), ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
        ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
    prices = []
    kwargs: dict = {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1"}
    try:
        while True:
            resp = pricing.get_products(**kwargs)
            for item in resp.get("PriceList", []):
                prices.extend(_aws_item_prices(json.loads(item) if isinstance(item, str) else item))
            if not resp.get("NextToken"):
                break
            kwargs["NextToken"] = resp["NextToken"]
    except PriceSourceError:
        raise
    except Exception as e:
        raise PriceSourceError(f"aws pricing GetProducts {instance_type} in {region}: {redact(str(e))}; nothing was written") from None
    return min(prices) if prices else None


def _aws_item_prices(item: dict) -> Iterable[float]:
    """The hourly USD on-demand prices of one GetProducts price list item."""
    try:
        for term in item["terms"].get("OnDemand", {}).values():
            for dim in term["priceDimensions"].values():
                if dim.get("unit") == "Hrs":
                    usd = float(dim["pricePerUnit"]["USD"])
                    if usd > 0:
                        yield usd
    except (KeyError, TypeError, ValueError, AttributeError):
        raise PriceSourceError("aws pricing GetProducts: a price list item is not in the documented shape "
                               "(terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD); nothing was written") from None


# -- GCP ------------------------------------------------------------------------------------------------

def gcp_api_key() -> str | None:
    """FLEETOPS_GCP_API_KEY, else GOOGLE_API_KEY (the generic one, which Google's Gemini SDK reads too)."""
    return os.environ.get("FLEETOPS_GCP_API_KEY") or os.environ.get("GOOGLE_API_KEY")


def gcp_prices(catalog: Catalog, types: list[str], regions: list[str], endpoint: str | None = None) -> tuple[dict, dict]:
    base = (endpoint or os.environ.get("FLEETOPS_GCP_BILLING_ENDPOINT") or GCP_BILLING).rstrip("/")
    key = gcp_api_key()
    if key and key != TEST_API_KEY and base != GCP_BILLING:  # it went as ?key= to any -o prices_endpoint, http:// too
        raise PriceSourceError(f"gcp Cloud Billing Catalog: the API key is only sent to {GCP_BILLING}, not to "
                               f"{redact(base.split('?')[0])} (a local fake takes FLEETOPS_GCP_API_KEY={TEST_API_KEY}); "
                               "nothing was written")
    skus, token = [], ""
    for _ in range(1000):
        q = {"currencyCode": "USD", "pageSize": "5000", **({"pageToken": token} if token else {}), **({"key": key} if key else {})}
        page = _get_json(f"{base}/v1/{GCE_SERVICE}/skus?{urllib.parse.urlencode(q)}", "gcp Cloud Billing Catalog skus.list")
        skus.extend(page.get("skus", []))
        token = page.get("nextPageToken") or ""
        if not token:
            break
    rates = _gcp_rates(skus)
    out: dict[str, dict] = {}
    for t in types:
        shape = catalog.shape("gcp", t)
        if shape is None:
            continue
        machine, _, gpus = t.partition("+")
        family = machine.split("-", 1)[0].upper()
        for region in regions:
            prices = {}
            for usage in ("OnDemand", "Preemptible"):
                core = rates.get((family, "Core", usage, region))
                ram = rates.get((family, "Ram", usage, region))
                gpu = rates.get(("GPU", shape.gpu_type, usage, region)) if shape.gpus else 0.0
                if core is None or ram is None or gpu is None:
                    continue
                prices[usage] = round(core * shape.cpu + ram * shape.memory_gib + (gpu or 0.0) * shape.gpus, 6)
            if "OnDemand" in prices:
                out.setdefault(t, {})[region] = {"on_demand": prices["OnDemand"], **({"spot": prices["Preemptible"]} if "Preemptible" in prices else {})}
    today = _today()
    return out, {f"gcp-{today}": {"date": today, "what": "Cloud Billing Catalog API, Compute Engine SKUs: per-vCPU and per-GiB "
                                  "prices of the machine family plus its GPUs (OnDemand; Preemptible for spot)"}}


_GCP_MACHINE = re.compile(r"^(?:Spot Preemptible )?([A-Z][0-9A-Z]*) (?:Predefined )?Instance (Core|Ram) running in ")
_GCP_GPU = re.compile(r"^(?:Spot Preemptible )?(Nvidia .+?) GPU (?:attached to Spot Preemptible VMs )?running in ")


def _gcp_rates(skus: list[dict]) -> dict[tuple, float]:
    """(family, Core|Ram, usage, region) -> USD per vCPU-hour or GiB-hour; ("GPU", model, usage, region) -> per GPU-hour."""
    gpu_by_sku = {v: k for k, v in GCP_GPU_SKU.items()}
    out: dict[tuple, float] = {}
    for s in skus:
        try:
            desc, usage = s["description"], s["category"]["usageType"]
            expr = s["pricingInfo"][0]["pricingExpression"]
            rate = next(r for r in expr["tieredRates"] if float(r.get("startUsageAmount", 0)) == 0)["unitPrice"]
            price = int(rate.get("units") or 0) + int(rate.get("nanos") or 0) / 1e9
            regions = s.get("serviceRegions", [])
        except (KeyError, TypeError, ValueError, IndexError, StopIteration):
            raise PriceSourceError(f"gcp Cloud Billing Catalog: SKU {s.get('skuId', '?') if isinstance(s, dict) else '?'} is not in the "
                                   "documented shape (description, category.usageType, pricingInfo[0].pricingExpression.tieredRates); "
                                   "nothing was written") from None
        if usage not in ("OnDemand", "Preemptible"):
            continue
        m = _GCP_MACHINE.match(desc)
        if m:
            family, part = m.group(1), m.group(2)
            unit = expr.get("usageUnit", "")
            if part == "Ram" and unit not in ("GiBy.h", "GiBy.mo"):
                continue
            for r in regions:
                out[(family, part, usage, r)] = price
            continue
        g = _GCP_GPU.match(desc)
        if g and g.group(1) in gpu_by_sku:
            for r in regions:
                out[("GPU", gpu_by_sku[g.group(1)], usage, r)] = price
    return out


# -- Azure ----------------------------------------------------------------------------------------------

def azure_endpoint(override: str | None = None) -> str:
    return (override or os.environ.get("FLEETOPS_AZURE_PRICES_ENDPOINT") or "https://prices.azure.com").rstrip("/")


def azure_prices(types: list[str], regions: list[str]) -> tuple[dict, dict]:
    base = azure_endpoint()
    wanted = set(types)
    out: dict[str, dict] = {}
    for region in regions:
        flt = f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'"
        url: str | None = f"{base}/api/retail/prices?{urllib.parse.urlencode({'$filter': flt})}"
        for _ in range(10000):
            if not url:
                break
            page = _get_json(url, f"azure Retail Prices API ({region})")
            for item in page.get("Items", []):
                _azure_item(item, wanted, region, out)
            url = page.get("NextPageLink")
    today = _today()
    return out, {f"azure-{today}": {"date": today, "what": "Azure Retail Prices API (Virtual Machines, Consumption, Linux meters; "
                                    "the Spot meter for spot)"}}


def _azure_item(item: dict, wanted: set[str], region: str, out: dict) -> None:
    try:
        sku, name, product, price = item["armSkuName"], item["skuName"], item["productName"], float(item["retailPrice"])
        unit, kind = item.get("unitOfMeasure", ""), item.get("type", "")
    except (KeyError, TypeError, ValueError):
        raise PriceSourceError("azure Retail Prices API: an item is not in the documented shape (armSkuName, skuName, productName, "
                               "retailPrice); nothing was written") from None
    if sku not in wanted or kind != "Consumption" or unit != "1 Hour" or "Windows" in product or "Low Priority" in name:
        return
    entry = out.setdefault(sku, {}).setdefault(region, {})
    entry["spot" if name.endswith(" Spot") else "on_demand"] = price


# -- the catalog ----------------------------------------------------------------------------------------

FETCHERS: dict[str, Callable[[Catalog, list[str], list[str]], tuple[dict, dict]]] = {
    "aws": lambda cat, types, regions: aws_prices(types, regions),
    "gcp": gcp_prices,
    "azure": lambda cat, types, regions: azure_prices(types, regions),
}


def update_catalog(raw: dict, catalog: Catalog, clouds: list[str], regions: dict[str, list[str]] | None = None) -> tuple[dict, list[str]]:
    """A copy of catalog.json's data with these clouds' prices replaced by what their public sources say now, and
    a line per cloud saying what changed. A type the source does not price in a region loses its price there (the
    plan then does not buy it there), never keeps a stale one silently: the summary names it."""
    new = json.loads(json.dumps(raw))
    lines = []
    for cloud in clouds:
        if cloud not in new.get("clouds", {}):
            raise PriceSourceError(f"the catalog has no cloud {cloud!r} (it has {', '.join(sorted(new.get('clouds', {})))})")
        c = new["clouds"][cloud]
        regs = (regions or {}).get(cloud) or sorted(c["regions"])
        types = sorted(c["instance_types"])
        prices, sources = FETCHERS[cloud](catalog, types, regs)
        (key, _), = sources.items()
        new.setdefault("sources", {}).update(sources)
        priced, missing = 0, []
        for t in types:
            entry = c["instance_types"][t].setdefault("prices", {})
            for r in regs:
                p = prices.get(t, {}).get(r)
                if p is not None and not is_price(p.get("spot")):
                    p = {k: v for k, v in p.items() if k != "spot"}  # a spot price of 0 (or garbage) is no spot market
                if p is None or not is_price(p.get("on_demand")):
                    if entry.pop(r, None) is not None:
                        missing.append(f"{t} in {r}")
                    continue
                entry[r] = {"on_demand": p["on_demand"], **({"spot": p["spot"]} if "spot" in p else {}), "source": key}
                priced += 1
        lines.append(f"{cloud}: {priced} type-region prices from {key}" +
                     (f"; no longer priced (the source has no price): {', '.join(missing)}" if missing else ""))
    used = {p["source"] for c in new["clouds"].values() for t in c["instance_types"].values() for p in t.get("prices", {}).values()}
    new["sources"] = {k: v for k, v in new.get("sources", {}).items() if k in used}
    new["date"] = _today()
    return new, lines
