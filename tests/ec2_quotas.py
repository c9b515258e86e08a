"""EC2's vCPU-based instance quotas and the Service Quotas API that reports them, in front of the moto server.

moto (5.x) has no account limits: RunInstances launches anything, and Service Quotas knows only a few VPC quotas
(GetServiceQuota for ec2 answers NoSuchResourceException). Real accounts have, per Region, one quota per group of
instance families and market, counted in vCPUs ("On-Demand Instance quotas", EC2 User Guide): Running On-Demand
Standard (A, C, D, H, I, M, R, T, Z) instances (L-1216C47A), Running On-Demand P instances (L-417A185B), ... and
All P Spot Instance Requests (L-7212CCBC) and so on for Spot. This WSGI layer:

* answers Service Quotas' GetServiceQuota and ListServiceQuotas (JSON, X-Amz-Target ServiceQuotasV20190624.*) for
  ServiceCode ec2 with each quota's applied value (set_limit; else DEFAULT_LIMIT), in the documented shape
  ({"Quota": {"ServiceCode", "QuotaCode", "QuotaName", "Value", "Unit", "Adjustable", "GlobalQuota", ...}}); an
  unknown quota code is NoSuchResourceException, as the API answers;
* refuses a RunInstances whose vCPUs (the type's default vCPUs, times MinCount) would take the running and pending
  instances of its quota past the limit: VcpuLimitExceeded for On-Demand, MaxSpotInstanceCountExceeded for Spot,
  with EC2's messages, launching nothing.

Usage is counted from moto's own instances (every instance in the Region, whoever launched it). Everything else
passes through untouched.
"""

from __future__ import annotations

import io
import json
import re
import threading
import uuid
from urllib.parse import parse_qsl

ACCOUNT = "123456789012"  # moto's default account
DEFAULT_LIMIT = 100000.0  # vCPUs: no test fleet reaches it unless a test lowers a quota
_REGION = re.compile(r"Credential=[^/]+/\d+/([a-z0-9-]+)/")
# Family letters -> (On-Demand quota, Spot quota), as the EC2 User Guide groups them; anything else is Standard.
# Written out again on purpose, not imported from providers/aws.py's VCPU_QUOTAS: this layer plays EC2, and a
# table shared with the code under test would agree with it however wrong it were.
QUOTAS = {
    "p": (("L-417A185B", "Running On-Demand P instances"), ("L-7212CCBC", "All P Spot Instance Requests")),
    "g": (("L-DB2E81BA", "Running On-Demand G and VT instances"), ("L-3819A6DF", "All G and VT Spot Instance Requests")),
    "vt": (("L-DB2E81BA", "Running On-Demand G and VT instances"), ("L-3819A6DF", "All G and VT Spot Instance Requests")),
    "inf": (("L-1945791B", "Running On-Demand Inf instances"), ("L-B5D1601B", "All Inf Spot Instance Requests")),
    "trn": (("L-2C3B7624", "Running On-Demand Trn instances"), ("L-6B0D517C", "All Trn Spot Instance Requests")),
    "x": (("L-7295265B", "Running On-Demand X instances"), ("L-E3A00192", "All X Spot Instance Requests")),
    "f": (("L-74FC7D96", "Running On-Demand F instances"), ("L-88CF9481", "All F Spot Instance Requests")),
    "dl": (("L-6E869C2A", "Running On-Demand DL instances"), ("L-85EED4F7", "All DL Spot Instance Requests")),
    "hpc": (("L-F7808C92", "Running On-Demand HPC instances"),) * 2,  # On-Demand only
    "u": (("L-43DA4232", "Running On-Demand High Memory instances"),) * 2,  # u-6tb1, u7i-12tb: On-Demand only
}
STANDARD = (("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
            ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"))
NAMES = dict([q for pair in QUOTAS.values() for q in pair] + list(STANDARD))


def quota_of(instance_type: str, spot: bool) -> str:
    letters = "".join(c for c in instance_type.split(".", 1)[0] if c.isalpha())
    key = next((k for k in sorted(QUOTAS, key=len, reverse=True) if letters.startswith(k)), None)
    return (QUOTAS[key] if key else STANDARD)[1 if spot else 0][0]


def vcpus(instance_type: str) -> int:
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    return int(INSTANCE_TYPES.get(instance_type, {}).get("VCpuInfo", {}).get("DefaultVCpus", 1))


class Ec2Quotas:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        self.limits: dict[tuple[str, str], float] = {}  # (region, quota code) -> applied value
        self.refused = 0

    def set_limit(self, region: str, code: str, value: float) -> None:
        with self.lock:
            self.limits[(region, code)] = float(value)

    def reset(self) -> None:
        with self.lock:
            self.limits.clear()
            self.refused = 0

    def used(self, region: str, code: str) -> int:
        from moto.ec2.models import ec2_backends

        total = 0
        for r in ec2_backends[ACCOUNT][region].reservations.values():
            for i in r.instances:
                if i.state in ("pending", "running") and quota_of(i.instance_type, i.lifecycle == "spot") == code:
                    total += vcpus(i.instance_type)
        return total

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        m = _REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
        region = m.group(1) if m else "us-east-1"
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("ServiceQuotasV20190624."):
            req = json.loads(body or b"{}")
            if req.get("ServiceCode") == "ec2":
                return self._service_quotas(start_response, target.split(".", 1)[1], req, region)
            return self.app(environ, start_response)
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if fields.get("Action") == "RunInstances":
            itype, spot = fields.get("InstanceType", "m1.small"), fields.get("InstanceMarketOptions.MarketType") == "spot"
            code = quota_of(itype, spot)
            need = vcpus(itype) * int(fields.get("MinCount", "1"))
            with self.lock:
                limit = self.limits.get((region, code), DEFAULT_LIMIT)
                if self.used(region, code) + need > limit:
                    self.refused += 1
                    if spot:
                        return _error(start_response, "MaxSpotInstanceCountExceeded", "Max spot instance count exceeded")
                    return _error(start_response, "VcpuLimitExceeded", (
                        f"You have requested more vCPU capacity than your current vCPU limit of {limit:g} allows for the "
                        "instance bucket that the specified instance type belongs to. Please visit "
                        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."))
        return self.app(environ, start_response)

    def _quota(self, region: str, code: str) -> dict:
        return {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                "QuotaArn": f"arn:aws:servicequotas:{region}:{ACCOUNT}:ec2/{code}", "QuotaCode": code,
                "QuotaName": NAMES[code], "Value": self.limits.get((region, code), DEFAULT_LIMIT), "Unit": "None",
                "Adjustable": True, "GlobalQuota": False,
                "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                                "MetricDimensions": {"Class": "None", "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
                                "MetricStatisticRecommendation": "Maximum"}}

    def _service_quotas(self, start_response, op: str, req: dict, region: str):
        with self.lock:
            if op == "GetServiceQuota":
                code = req.get("QuotaCode", "")
                if code not in NAMES:
                    return _json(start_response, 400, {"__type": "NoSuchResourceException",
                                                       "Message": f"The request failed because the specified quota {code} does not exist."})
                return _json(start_response, 200, {"Quota": self._quota(region, code)})
            if op == "ListServiceQuotas":
                return _json(start_response, 200, {"Quotas": [self._quota(region, c) for c in sorted(NAMES)]})
        return _json(start_response, 400, {"__type": "InvalidParameterValueException", "Message": f"{op} is not supported here"})


def _json(start_response, status: int, body: dict):
    out = json.dumps(body).encode()
    start_response(f"{status} {'OK' if status == 200 else 'Bad Request'}",
                   [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(out))),
                    ("x-amzn-RequestId", str(uuid.uuid4()))])
    return [out]


def _error(start_response, code: str, message: str):
    out = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
           f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()
    start_response("400 Bad Request", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
    return [out]
