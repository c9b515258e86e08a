"""EC2's documented limits on tags, ClientTokens and filter values, in front of the moto server (moto checks only
the tag count).

* Tags (the EC2 API reference's Tag type): "Tag keys are case-sensitive and accept a maximum of 127 Unicode
  characters. May not begin with aws:"; "Tag values ... accept a maximum of 256 Unicode characters". moto stores a
  key or value of any length and a user key starting with aws:. Checked on every tag a request writes: RunInstances'
  and CreatePlacementGroup's TagSpecification.N.Tag.M, CreateTags' Tag.N. The 50 tags a resource may carry moto
  enforces itself (TagLimitExceeded).
* ClientToken ("Ensuring idempotency in Amazon EC2 API requests"): "a unique, case-sensitive string of up to 64 ASCII
  characters". moto takes any string.
* Filter values: a Describe call with more than 200 of them (Filter.N.Value.M, all filters together) is refused with
  FilterLimitExceeded, "The maximum number of filter values specified on a single call is 200", as EC2 answers it
  (quoted in the wild: gjbae1212/gossm#31, convox/rack#2205). moto takes any number.
* DescribeSpotPriceHistory: its InstanceType.N and ProductDescription.N "filter the results" (EC2 API reference) as
  its instance-type and product-description filters do, and are counted with its Filter.N.Value.M against the same 200
  values a call (FilterLimitExceeded; this layer's reading: EC2's reference gives the call no limit of its own, and
  the legacy list parameters are filters by another name). MaxResults: "Specify a value between 1 and 1000. The
  default value is 1000" (EC2's API model as botocore shipped it, 2016-12 to 2023-02, boto/botocore@727a1115);
  moto takes any number and pages nothing (tests/ec2_proxy.py pages its history by it).
* DescribeInstanceTypes' InstanceTypes: at most 100 (EC2's API model, RequestInstanceTypeList max 100; botocore
  checks only a list's minimum, so the request goes out). moto takes any number. A type EC2 does not describe fails
  the whole call (InvalidInstanceType, "The following supplied instance types do not exist: [...]"): moto does that.

A request past a tag, token or instance-type limit is answered 400 InvalidParameterValue (the wording is this
layer's), past the filter limit 400 FilterLimitExceeded (EC2's wording); it reaches nothing behind it. A WSGI
middleware around moto's application, like tests/ec2_tokens.py, so every client meets the same rules."""

from __future__ import annotations

import io
import re
import uuid
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

KEY_MAX = 127
VALUE_MAX = 256
TOKEN_MAX = 64
_TAG_KEY = re.compile(r"^(?:TagSpecification\.\d+\.)?Tag\.\d+\.Key$")
TAGGING = {"RunInstances", "CreateTags", "CreatePlacementGroup"}
FILTER_VALUES_MAX = 200
_FILTER_VALUE = re.compile(r"^Filter\.\d+\.Value\.\d+$")
INSTANCE_TYPES_MAX = 100
_INSTANCE_TYPE = re.compile(r"^InstanceType\.\d+$")
_PRODUCT = re.compile(r"^ProductDescription\.\d+$")
SPOT_PAGE_MAX = 1000  # DescribeSpotPriceHistory's MaxResults: 1 to 1000, 1000 by default


def filter_refusal(fields: dict[str, str]) -> str | None:
    """What EC2 says of a Describe call with too many filter values."""
    if sum(1 for name in fields if _FILTER_VALUE.fullmatch(name)) > FILTER_VALUES_MAX:
        return f"The maximum number of filter values specified on a single call is {FILTER_VALUES_MAX}"
    return None


def spot_history_refusal(fields: dict[str, str]) -> tuple[str, str] | None:
    """(code, message) EC2 answers a DescribeSpotPriceHistory past its limits with: more than 200 filter values, its
    instance types and product descriptions counted among them, or a MaxResults outside 1..1000."""
    n = sum(1 for name in fields if _FILTER_VALUE.fullmatch(name) or _INSTANCE_TYPE.fullmatch(name) or _PRODUCT.fullmatch(name))
    if n > FILTER_VALUES_MAX:
        return "FilterLimitExceeded", f"The maximum number of filter values specified on a single call is {FILTER_VALUES_MAX}"
    size = fields.get("MaxResults")
    if size is not None and not (size.isdigit() and 1 <= int(size) <= SPOT_PAGE_MAX):
        return "InvalidParameterValue", f"MaxResults {size!r} is not between 1 and {SPOT_PAGE_MAX}."
    return None


def instance_types_refusal(fields: dict[str, str]) -> str | None:
    """What this layer says of a DescribeInstanceTypes naming more types than EC2 takes."""
    n = sum(1 for name in fields if _INSTANCE_TYPE.fullmatch(name))
    if n > INSTANCE_TYPES_MAX:
        return f"InstanceTypes names {n} instance types; DescribeInstanceTypes takes at most {INSTANCE_TYPES_MAX}."
    return None


def refusal(fields: dict[str, str]) -> str | None:
    """What EC2 says of a request's tags or ClientToken, if it breaks a documented limit."""
    for name, key in fields.items():
        if not _TAG_KEY.fullmatch(name):
            continue
        value = fields.get(name[: -len("Key")] + "Value", "")
        if len(key) > KEY_MAX:
            return f"Tag key '{key[:40]}...' is {len(key)} characters long; a tag key accepts at most {KEY_MAX}."
        if key.lower().startswith("aws:"):
            return f"Tag key '{key}' begins with aws:, which is reserved for AWS use."
        if len(value) > VALUE_MAX:
            return f"The value of tag '{key}' is {len(value)} characters long; a tag value accepts at most {VALUE_MAX}."
    token = fields.get("ClientToken")
    if token is not None and (len(token) > TOKEN_MAX or not token.isascii()):
        return f"ClientToken '{token[:40]}' is not a string of up to {TOKEN_MAX} ASCII characters."
    return None


class ParameterRules:
    def __init__(self, app):
        self.app = app
        self.refused = 0

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        action = fields.get("Action", "")
        code, why = "InvalidParameterValue", refusal(fields) if action in TAGGING else None
        if why is None and action.startswith("Describe"):
            code, why = "FilterLimitExceeded", filter_refusal(fields)
        if why is None and action == "DescribeSpotPriceHistory":
            code, why = spot_history_refusal(fields) or (code, None)
        if why is None and action == "DescribeInstanceTypes":
            code, why = "InvalidParameterValue", instance_types_refusal(fields)
        if why is None:
            return self.app(environ, start_response)
        self.refused += 1
        out = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
               f"<Message>{escape(why)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()
        start_response("400 Bad Request", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
        return [out]
