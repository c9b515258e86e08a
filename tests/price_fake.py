"""A local HTTP fake of the three public price sources `reconcile catalog update` reads, answering in their
documented response shapes (hand-written: this machine has no internet to record real answers):

- AWS Price List Query API, pricing:GetProducts (JSON 1.1, X-Amz-Target AWSPriceListService.GetProducts): PriceList
  is a list of JSON *strings*, each {product: {attributes}, terms: {OnDemand: {..: {priceDimensions: {..: {unit,
  pricePerUnit: {USD}}}}}}}; TERM_MATCH filters select products by attribute, as the API does.
- EC2 DescribeSpotPriceHistory (Query API, XML): with StartTime = EndTime = now, EC2 answers, per type and zone, the
  last price change at or before the start time (however old) and the changes inside the window (EC2 API reference).
- Cloud Billing Catalog services.skus.list: {skus: [{description, category: {usageType}, serviceRegions,
  pricingInfo: [{pricingExpression: {usageUnit, tieredRates: [{startUsageAmount, unitPrice: {units, nanos}}]}}]}],
  nextPageToken} in pages.
- Azure Retail Prices API: {Items: [{armSkuName, skuName, productName, retailPrice, unitOfMeasure, type, ...}],
  NextPageLink} in pages; NextPageLink is an absolute URL on the same host, as the real one's is.

The on-demand numbers are the public list prices in providers/data/catalog.json's skypilot-v8 source and the GCP
A2 rates that reproduce a2-highgpu-1g's $3.6735/h; spot rows are made up for the semantics under test."""

from __future__ import annotations

import json
import threading
import urllib.parse
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AWS_ON_DEMAND = {  # (type, region) -> USD/h
    ("p5.48xlarge", "us-east-1"): "55.0400000000", ("p4d.24xlarge", "us-east-1"): "21.9576420000",
    ("g5.xlarge", "us-east-1"): "1.0060000000", ("g5.12xlarge", "us-east-1"): "5.6720000000",
    ("m6i.4xlarge", "us-east-1"): "0.7680000000", ("c6i.8xlarge", "us-east-1"): "1.3600000000",
}
# (type, zone, hours ago, price): p5 in us-east-1a last changed 10 days ago (still today's price); in -1b a change
# 3 days ago was superseded an hour ago; -1c changed 2 days ago. Median of today's prices: 25.0.
AWS_SPOT_HISTORY = [
    ("p5.48xlarge", "us-east-1a", 240, "30.000000"),
    ("p5.48xlarge", "us-east-1b", 72, "40.000000"), ("p5.48xlarge", "us-east-1b", 1, "20.000000"),
    ("p5.48xlarge", "us-east-1c", 48, "25.000000"),
    ("g5.xlarge", "us-east-1a", 5, "0.402800"), ("m6i.4xlarge", "us-east-1a", 30, "0.290300"),
]


def _money(usd: float) -> dict:
    units = int(usd)
    return {"currencyCode": "USD", "units": str(units), "nanos": round((usd - units) * 1e9)}


def _sku(sku_id: str, desc: str, usage: str, unit: str, usd: float, regions: list[str]) -> dict:
    return {"name": f"services/6F81-5844-456A/skus/{sku_id}", "skuId": sku_id, "description": desc,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                         "resourceGroup": "GPU" if "GPU" in desc else ("RAM" if "Ram" in desc else "CPU"), "usageType": usage},
            "serviceRegions": regions,
            "pricingInfo": [{"summary": "", "pricingExpression": {"usageUnit": unit, "displayQuantity": 1,
                                                                 "tieredRates": [{"startUsageAmount": 0, "unitPrice": _money(usd)}],
                                                                 "usageUnitDescription": "hour", "baseUnit": "s",
                                                                 "baseUnitConversionFactor": 3600},
                             "currencyConversionRate": 1, "effectiveTime": "2026-11-20T08:00:00.000Z"}],
            "serviceProviderName": "Google"}


US = ["us-central1", "us-east1"]
GCP_SKUS = [
    _sku("A2C1", "A2 Instance Core running in Americas", "OnDemand", "h", 0.031611, US),
    _sku("A2R1", "A2 Instance Ram running in Americas", "OnDemand", "GiBy.h", 0.004237, US),
    _sku("A2C2", "Spot Preemptible A2 Instance Core running in Americas", "Preemptible", "h", 0.009483, US),
    _sku("A2R2", "Spot Preemptible A2 Instance Ram running in Americas", "Preemptible", "GiBy.h", 0.001271, US),
    _sku("A2C3", "Commitment v1: A2 Cpu in Americas for 1 Year", "Commit1Yr", "h", 0.019915, US),  # not on-demand: skipped
    _sku("GPU1", "Nvidia Tesla A100 GPU running in Americas", "OnDemand", "h", 2.933908, US),
    _sku("GPU2", "Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", "h", 0.88, US),
    _sku("G2C1", "G2 Instance Core running in Americas", "OnDemand", "h", 0.024988, US),
    _sku("G2R1", "G2 Instance Ram running in Americas", "OnDemand", "GiBy.h", 0.002927, US),
    _sku("GPU4", "Nvidia L4 GPU running in Americas", "OnDemand", "h", 0.559871, US),
    _sku("N2C1", "N2 Instance Core running in Americas", "OnDemand", "h", 0.031611, US),
    _sku("N2R1", "N2 Instance Ram running in Americas", "OnDemand", "GiBy.h", 0.004237, US),
    _sku("N1C1", "N1 Predefined Instance Core running in Americas", "OnDemand", "h", 0.031611, US),
    _sku("N1R1", "N1 Predefined Instance Ram running in Americas", "OnDemand", "GiBy.h", 0.004237, US),
    _sku("GPU5", "Nvidia Tesla T4 GPU running in Americas", "OnDemand", "h", 0.35, US),
    _sku("GPU6", "Nvidia Tesla V100 GPU running in Americas", "OnDemand", "h", 2.48, US),
]


def _retail(sku: str, name: str, product: str, price: float, region: str = "eastus") -> dict:
    return {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price, "armRegionName": region,
            "location": "US East", "effectiveStartDate": "2026-10-01T00:00:00Z", "meterId": f"m-{sku}-{name}", "meterName": name,
            "productId": "DZH318Z0BQ4M", "skuId": f"DZH318Z0BQ4M/{sku}", "productName": product, "skuName": name,
            "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute", "unitOfMeasure": "1 Hour",
            "type": "Consumption", "isPrimaryMeterRegion": True, "armSkuName": sku}


AZURE_ITEMS = [
    _retail("Standard_NC4as_T4_v3", "NC4as T4 v3", "Virtual Machines NCasT4 v3 Series", 0.526),
    _retail("Standard_NC4as_T4_v3", "NC4as T4 v3 Spot", "Virtual Machines NCasT4 v3 Series", 0.0526),
    _retail("Standard_NC4as_T4_v3", "NC4as T4 v3 Low Priority", "Virtual Machines NCasT4 v3 Series", 0.1052),
    _retail("Standard_NC4as_T4_v3", "NC4as T4 v3", "Virtual Machines NCasT4 v3 Series Windows", 0.71),
    _retail("Standard_NC24ads_A100_v4", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series", 3.673),
    _retail("Standard_NC24ads_A100_v4", "NC24ads A100 v4 Spot", "Virtual Machines NCadsA100v4 Series", 0.7346),
    _retail("Standard_D16s_v5", "D16s v5", "Virtual Machines Dsv5 Series", 0.768),
]


class PriceFake:
    """Serves the four APIs on 127.0.0.1 (a free port). `broken` names an API to answer garbage for."""

    def __init__(self):
        self.broken: str | None = None
        self.now = datetime.now(timezone.utc)
        self.azure_items = [dict(i) for i in AZURE_ITEMS]  # a test may change a price
        self.requests: list[tuple[str, str]] = []
        self.keys: list[str] = []  # the API keys the GCP API was sent
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                if u.path == "/v1/services/6F81-5844-456A/skus":
                    fake.requests.append(("gcp", q.get("pageToken", "")))
                    fake.keys.extend([q["key"]] if "key" in q else [])
                    if "key" not in q and "Authorization" not in self.headers:  # the API takes a key or OAuth credentials
                        return self._send(403, json.dumps({"error": {"code": 403, "status": "PERMISSION_DENIED",
                                                                     "message": "The request is missing a valid API key."}}).encode(),
                                          "application/json")
                    if fake.broken == "gcp":
                        return self._send(200, json.dumps({"skus": [{"skuId": "X", "description": "A2 Instance Core running in Americas"}]}).encode(),
                                          "application/json")
                    start = int(q.get("pageToken") or 0)
                    page = GCP_SKUS[start:start + 10]
                    nxt = str(start + 10) if start + 10 < len(GCP_SKUS) else ""
                    return self._send(200, json.dumps({"skus": page, "nextPageToken": nxt}).encode(), "application/json")
                if u.path == "/api/retail/prices":
                    fake.requests.append(("azure", q.get("$filter", "")))
                    if fake.broken == "azure":
                        return self._send(503, b'{"Error": "Service Unavailable"}', "application/json")
                    # The documented filter fields this client uses: armRegionName, and armSkuName when given (values
                    # are case sensitive since api-version 2023-01-01-preview; matched exactly here).
                    flt = q.get("$filter", "")
                    region = flt.split("armRegionName eq '")[1].split("'")[0]
                    sku = flt.split("armSkuName eq '")[1].split("'")[0] if "armSkuName eq '" in flt else None
                    items = [i for i in fake.azure_items if i["armRegionName"] == region and sku in (None, i["armSkuName"])]
                    skip = int(q.get("$skip") or 0)
                    page = items[skip:skip + 4]
                    nxt = None
                    if skip + 4 < len(items):
                        host = self.headers.get("Host")
                        nxt = f"http://{host}/api/retail/prices?" + urllib.parse.urlencode({"$filter": q["$filter"], "$skip": skip + 4})
                    body = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                            "Items": page, "NextPageLink": nxt, "Count": len(page)}
                    return self._send(200, json.dumps(body).encode(), "application/json")
                self._send(404, b"{}", "application/json")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if target == "AWSPriceListService.GetProducts":
                    req = json.loads(body)
                    want = {f["Field"]: f["Value"] for f in req.get("Filters", [])}
                    items = []
                    for (t, region), usd in AWS_ON_DEMAND.items():
                        attrs = {"instanceType": t, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
                                 "preInstalledSw": "NA", "capacitystatus": "Used", "location": "US East (N. Virginia)"}
                        if all(attrs.get(k) == v for k, v in want.items()):
                            sku = f"SKU{abs(hash((t, region))) % 10**6}"
                            items.append(json.dumps({
                                "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
                                "serviceCode": "AmazonEC2",
                                "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
                                    "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                        "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                                        "description": f"${float(usd):g} per On Demand Linux {t} Instance Hour",
                                        "pricePerUnit": {"USD": usd}}},
                                    "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
                                    "termAttributes": {}}}},
                                "version": "20261120000000", "publicationDate": "2026-11-20T00:00:00Z"}))
                    return self._send(200, json.dumps({"FormatVersion": "aws_v1", "PriceList": items}).encode(),
                                      "application/x-amz-json-1.1")
                form = dict(urllib.parse.parse_qsl(body.decode()))
                if form.get("Action") == "DescribeSpotPriceHistory":
                    return self._send(200, fake._spot_xml(form), "text/xml")
                self._send(400, b"{}", "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _spot_xml(self, form: dict) -> bytes:
        types = {v for k, v in form.items() if k.startswith("InstanceType.")}
        start = datetime.fromisoformat(form["StartTime"].replace("Z", "+00:00"))
        rows = [(t, z, self.now - timedelta(hours=h), p) for t, z, h, p in AWS_SPOT_HISTORY if not types or t in types]
        picked = []
        for key in sorted({(t, z) for t, z, _, _ in rows}):
            before = [r for r in rows if (r[0], r[1]) == key and r[2] <= start]
            if before:
                picked.append(max(before, key=lambda r: r[2]))  # the last change at or before the start time
        items = "".join(
            f"<item><instanceType>{t}</instanceType><productDescription>Linux/UNIX</productDescription>"
            f"<spotPrice>{p}</spotPrice><timestamp>{ts.strftime('%Y-%m-%dT%H:%M:%S.000Z')}</timestamp>"
            f"<availabilityZone>{z}</availabilityZone></item>" for t, z, ts, p in picked)
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
                f"<requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLE</requestId><spotPriceHistorySet>{items}</spotPriceHistorySet>"
                f"<nextToken/></DescribeSpotPriceHistoryResponse>").encode()

    def start(self) -> PriceFake:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        return {"FLEETOPS_AWS_PRICING_ENDPOINT": self.url, "FLEETOPS_EC2_ENDPOINT": self.url,
                "FLEETOPS_GCP_BILLING_ENDPOINT": self.url, "FLEETOPS_AZURE_PRICES_ENDPOINT": self.url,
                "FLEETOPS_GCP_API_KEY": "fake-api-key-for-tests"}
