"""A thin HTTP layer in front of moto that answers a few EC2 calls the way real EC2 does where moto is lenient.

moto is strongly consistent and has no account limits; EC2 is neither. The proxy forwards every request to the
moto server unchanged, except:

* boot time (boot(seconds)): EC2 reports a new instance `pending` until it runs ("pending", then "running": Amazon
  EC2 instance state changes, EC2 User Guide), moto `running` at once. With boot(s), each instance RunInstances
  launches through the proxy is pending (code 0) in RunInstances' and DescribeInstances' answers for s seconds;
* eventual consistency (lag(n)): EC2's API reference ("Eventual consistency in the Amazon EC2 API") says a
  DescribeInstances naming an instance launched a moment ago may answer InvalidInstanceID.NotFound. With lag(n),
  each instance RunInstances returned through the proxy is "not found" by the next n DescribeInstances (or
  TerminateInstances / CreateTags) calls that name it by id;
* injected errors (fail(action, code, message, count)): the next `count` calls of `action` answer this EC2 error
  (EC2's XML error body), e.g. VcpuLimitExceeded from RunInstances, with the HTTP status EC2 gives the code: 400 for a
  client error, 500-series for the server error codes ("Error codes for the Amazon EC2 API": InsufficientInstanceCapacity
  is answered 500, RequestLimitExceeded 503), which SDKs retry as server errors;
* spot price history (spot_history, when set): DescribeSpotPriceHistory answered from it with EC2's documented
  semantics: the rows within [StartTime, EndTime] plus, per type, zone and product, "the last price change before
  the start time, which is the effective price as of the start time" (moto answers a fixed 2006 row), MaxResults
  (1000 by default) a page with a NextToken for the rest, and EC2's limits (tests/ec2_params.py) held;
* placement groups, which moto (5.x) does not implement at all: CreatePlacementGroup (with its tags;
  InvalidPlacementGroup.Duplicate; PlacementGroupLimitExceeded beyond placement_group_limit groups in the
  Region, EC2's per-account-per-Region limit, 500 on real accounts), DescribePlacementGroups (GroupName.N,
  Filter tag:KEY), DeletePlacementGroup (InvalidPlacementGroup.InUse while a launched member is not
  terminated, InvalidPlacementGroup.Unknown); RunInstances' Placement.GroupName must name an existing group
  (InvalidPlacementGroup.Unknown otherwise) and makes the launched instance a member;
* capacity reservations, which moto (5.x) ignores (RunInstances accepts and drops CapacityReservationSpecification):
  reserve(id, type, zone, count) registers an active targeted reservation; a RunInstances that targets one
  (CapacityReservationTarget.CapacityReservationId) must name a known reservation
  (InvalidCapacityReservationId.NotFound), launch on-demand (a spot launch cannot use one) of its instance type in
  its Availability Zone ("You can only launch an instance into a Capacity Reservation that has matching attributes
  ... and sufficient available capacity", EC2 User Guide; InvalidParameterCombination otherwise) while it has room
  (ReservationCapacityExceeded once its count of launched instances are alive); the launched instance is counted in
  it. Every RunInstances' parameters are kept in `run_requests`, to check the request body;
* images: RunInstances with an ImageId moto does not hold answers InvalidAMIID.NotFound, as EC2 does (moto launches
  it); the proxy asks moto's DescribeImages;
* public SSM parameters (public_parameters): AWS publishes parameters such as the Deep Learning AMIs' under
  /aws/service/, which moto does not hold and will not let anyone put (a reserved name); GetParameter of one answers
  its value, in SSM's JSON.

Requests are EC2 query requests (form-encoded POST bodies with Action=...); other services pass through untouched,
but for SSM's GetParameter of a public parameter.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

_REGION = re.compile(r"/([a-z]{2}-[a-z]+-[0-9])/ec2/aws4_request")


# EC2's server error codes and the status each comes with (the API reference's "Server error codes"; the statuses are
# those seen on the wire: InsufficientInstanceCapacity 500, RequestLimitExceeded 503). Any other code is a client error.
SERVER_ERRORS = {"InsufficientAddressCapacity": 500, "InsufficientCapacity": 500, "InsufficientHostCapacity": 500,
                 "InsufficientInstanceCapacity": 500, "InsufficientReservedInstanceCapacity": 500,
                 "InsufficientVolumeCapacity": 500, "InternalError": 500, "InternalFailure": 500,
                 "RequestLimitExceeded": 503, "ServiceUnavailable": 503, "Unavailable": 503}
_CODE = re.compile(rb"<Code>([^<]*)</Code>")


def error_status(body: bytes) -> int:
    """The HTTP status EC2 answers an error body with."""
    m = _CODE.search(body)
    if m and m.group(1) == b"DryRunOperation":
        return 412  # EC2's answer to a dry run that would have succeeded
    return SERVER_ERRORS.get(m.group(1).decode(), 400) if m else 400


def ec2_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


def _group_xml(name: str, g: dict) -> str:
    tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in sorted(g["tags"].items()))
    return (f"<groupName>{escape(name)}</groupName><state>available</state><strategy>{g['strategy']}</strategy>"
            f"<groupId>{g['id']}</groupId><tagSet>{tags}</tagSet>")


class Ec2Proxy:
    def __init__(self, upstream: str):
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.lock = threading.Lock()
        self.lag_reads = 0
        self.unseen: dict[str, int] = {}  # instance id -> describes left that do not see it yet
        self.failures: list[list] = []  # [action, code, message, remaining]
        self.placement_group_limit: int | None = None
        self.calls: list[str] = []  # every EC2 Action seen
        self.groups: dict[tuple[str, str], dict] = {}
        self.reservations: dict[str, dict] = {}  # capacity reservation id -> {"type", "zone", "count", "members"}
        self.run_requests: list[dict[str, str]] = []  # the parameters of every RunInstances seen
        self.spot_history: list[tuple[str, str, str, float, str]] | None = None  # (type, zone, product, price, ISO time)  # (region, name) -> {"id", "strategy", "tags", "members"}
        self.public_parameters: dict[str, str] = {}  # SSM name -> value, in every region
        self.boot_s = 0.0
        self.booting: dict[str, float] = {}  # instance id -> time.monotonic() it runs at
        self.url = ""
        self._server: ThreadingHTTPServer | None = None

    # -- test side -----------------------------------------------------------------
    def lag(self, reads: int) -> None:
        with self.lock:
            self.lag_reads = reads

    def boot(self, seconds: float) -> None:
        with self.lock:
            self.boot_s = seconds

    def fail(self, action: str, code: str, message: str, count: int = 1) -> None:
        with self.lock:
            self.failures.append([action, code, message, count])

    def reserve(self, rid: str, instance_type: str, zone: str, count: int) -> None:
        with self.lock:
            self.reservations[rid] = {"type": instance_type, "zone": zone, "count": count, "members": set()}

    def start(self) -> "Ec2Proxy":
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- the EC2 behaviour ---------------------------------------------------------
    def intercept(self, action: str, params: dict[str, list[str]], region: str) -> bytes | None:
        """An EC2 error body to answer instead of forwarding, or None. A dry run (apply's permission check) goes to moto as
        it is (EC2 checks its permissions only, and it is no call a test counts or injects a failure into), but for the
        placement groups this layer keeps itself, which it answers as EC2 answers a permitted dry run."""
        if params.get("DryRun", ["false"])[0].lower() == "true":
            if action in ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"):
                return ec2_error("DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
            return None
        with self.lock:
            self.calls.append(action)
            for f in self.failures:
                if f[0] == action and f[3] > 0:
                    f[3] -= 1
                    return ec2_error(f[1], f[2])
            if action in ("DescribeInstances", "TerminateInstances", "CreateTags"):
                named = [v[0] for k, v in params.items() if re.fullmatch(r"(InstanceId|ResourceId)\.\d+", k)]
                for iid in named:
                    if self.unseen.get(iid, 0) > 0:
                        self.unseen[iid] -= 1
                        return ec2_error("InvalidInstanceID.NotFound", f"The instance ID '{iid}' does not exist")
            if action == "RunInstances":
                self.run_requests.append({k: v[0] for k, v in params.items()})
                err = self._reservation_refusal(params, region)
                if err is not None:
                    return err
            if action == "RunInstances" and params.get("Placement.GroupName"):
                if (region, params["Placement.GroupName"][0]) not in self.groups:
                    return ec2_error("InvalidPlacementGroup.Unknown",
                                     f"The Placement Group '{params['Placement.GroupName'][0]}' is unknown.")
            if action == "RunInstances" and params.get("ImageId") and not self._image_exists(region, params["ImageId"][0]):
                return ec2_error("InvalidAMIID.NotFound", f"The image id '[{params['ImageId'][0]}]' does not exist")
            if action == "DescribeSpotPriceHistory" and self.spot_history is not None:
                return self._spot_history(params)
            if action in ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"):
                return self._placement_groups(action, params, region)
        return None

    def _image_exists(self, region: str, ami: str) -> bool:
        """moto's DescribeImages, asked directly (moto does not check signatures; the scope names the region)."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request("POST", "/", body=f"Action=DescribeImages&Version=2016-11-15&ImageId.1={ami}",
                         headers={"Content-Type": "application/x-www-form-urlencoded",
                                  "Authorization": f"AWS4-HMAC-SHA256 Credential=testing/20250101/{region}/ec2/aws4_request, "
                                                   "SignedHeaders=host, Signature=0"})
            resp = conn.getresponse()
            return resp.status == 200 and b"<imageId>" in resp.read()
        finally:
            conn.close()

    def _reservation_refusal(self, params: dict[str, list[str]], region: str) -> bytes | None:
        rid = (params.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId") or [None])[0]
        if rid is None:
            return None
        r = self.reservations.get(rid)
        if r is None:
            return ec2_error("InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist")
        itype = (params.get("InstanceType") or [""])[0]
        zone = (params.get("Placement.AvailabilityZone") or [""])[0]
        if params.get("InstanceMarketOptions.MarketType") or itype != r["type"] or zone != r["zone"]:
            return ec2_error("InvalidParameterCombination", f"The instance's attributes ({itype} in {zone or 'any zone'}"
                             f"{', spot' if params.get('InstanceMarketOptions.MarketType') else ''}) do not match Capacity "
                             f"Reservation {rid} ({r['type']} in {r['zone']}, on-demand)")
        if sum(1 for iid in r["members"] if self._alive(region, iid)) >= r["count"]:
            return ec2_error("ReservationCapacityExceeded", f"There is not enough capacity in Capacity Reservation {rid}")
        return None

    def _spot_history(self, params: dict[str, list[str]]) -> bytes:
        """The history's answer: refused past EC2's limits (tests/ec2_params.py, as moto's layer refuses them), else
        the rows in time order, MaxResults (default 1000) a page, the rest behind a NextToken."""
        from datetime import datetime, timezone

        from tests.ec2_params import SPOT_PAGE_MAX, spot_history_refusal

        def when(text: str) -> datetime:
            return datetime.fromisoformat(text.replace("Z", "+00:00"))

        one = {k: v[0] for k, v in params.items()}
        refused = spot_history_refusal(one)
        if refused is not None:
            return ec2_error(*refused)
        types = {v for k, v in one.items() if re.fullmatch(r"InstanceType\.\d+", k)}
        products = {v for k, v in one.items() if re.fullmatch(r"ProductDescription\.\d+", k)}
        now = datetime.now(timezone.utc)
        start = when(one["StartTime"]) if "StartTime" in one else now
        end = when(one["EndTime"]) if "EndTime" in one else now
        rows = [r for r in self.spot_history if (not types or r[0] in types) and (not products or r[2] in products)]
        keep = [r for r in rows if start <= when(r[4]) <= end]
        last_before: dict[tuple[str, str, str], tuple] = {}
        for r in rows:
            if when(r[4]) < start and ((r[0], r[1], r[2]) not in last_before or when(r[4]) > when(last_before[(r[0], r[1], r[2])][4])):
                last_before[(r[0], r[1], r[2])] = r
        keep = sorted(keep + list(last_before.values()), key=lambda r: (r[4], r[0], r[1], r[2]))
        first = int(one.get("NextToken") or 0)
        page = keep[first:first + int(one.get("MaxResults") or SPOT_PAGE_MAX)]
        token = str(first + len(page)) if first + len(page) < len(keep) else ""
        items = "".join(f"<item><instanceType>{t}</instanceType><productDescription>{escape(p)}</productDescription>"
                        f"<spotPrice>{price:.6f}</spotPrice><timestamp>{ts}</timestamp><availabilityZone>{z}</availabilityZone>"
                        "</item>" for t, z, p, price, ts in page)
        return b"ok:" + (f'<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>'
                         f"{uuid.uuid4()}</requestId><spotPriceHistorySet>{items}</spotPriceHistorySet><nextToken>{token}</nextToken>"
                         "</DescribeSpotPriceHistoryResponse>").encode()

    def _placement_groups(self, action: str, params: dict[str, list[str]], region: str) -> bytes:
        """EC2's placement group calls, answered here (moto has none); a non-error answer is returned as an
        `ok:` prefixed body the handler sends with 200."""
        one = {k: v[0] for k, v in params.items()}
        ns = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
        if action == "CreatePlacementGroup":
            name = one.get("GroupName", "")
            if (region, name) in self.groups:
                return ec2_error("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
            if self.placement_group_limit is not None and \
                    sum(r == region for r, _ in self.groups) >= self.placement_group_limit:
                return ec2_error("PlacementGroupLimitExceeded",
                                 "You've reached the limit of placement groups that you can create in this Region.")
            tags = {}
            for k, v in one.items():
                m = re.fullmatch(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.Key", k)
                if m:
                    tags[v] = one.get(f"TagSpecification.{m.group(1)}.Tag.{m.group(2)}.Value", "")
            g = {"id": f"pg-{uuid.uuid4().hex[:17]}", "strategy": one.get("Strategy", "cluster"), "tags": tags, "members": set()}
            self.groups[(region, name)] = g
            return b"ok:" + (f"<CreatePlacementGroupResponse {ns}><requestId>{uuid.uuid4()}</requestId>"
                             f"<placementGroup>{_group_xml(name, g)}</placementGroup></CreatePlacementGroupResponse>").encode()
        if action == "DescribePlacementGroups":
            names = {v for k, v in one.items() if re.fullmatch(r"GroupName\.\d+", k)}
            wanted: list[tuple[str, set[str]]] = []
            for k, v in one.items():
                m = re.fullmatch(r"Filter\.(\d+)\.Name", k)
                if m and v.startswith("tag:"):
                    values = {vv for kk, vv in one.items() if kk.startswith(f"Filter.{m.group(1)}.Value.")}
                    wanted.append((v[4:], values))
            rows = [(n, g) for (r, n), g in sorted(self.groups.items()) if r == region and (not names or n in names)
                    and all(g["tags"].get(key) in values for key, values in wanted)]
            missing = names - {n for n, _ in rows}
            if missing:
                return ec2_error("InvalidPlacementGroup.Unknown", f"The Placement Group '{min(missing)}' is unknown.")
            items = "".join(f"<item>{_group_xml(n, g)}</item>" for n, g in rows)
            return b"ok:" + (f"<DescribePlacementGroupsResponse {ns}><requestId>{uuid.uuid4()}</requestId>"
                             f"<placementGroupSet>{items}</placementGroupSet></DescribePlacementGroupsResponse>").encode()
        name = one.get("GroupName", "")
        g = self.groups.get((region, name))
        if g is None:
            return ec2_error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        if any(self._alive(region, iid) for iid in g["members"]):
            return ec2_error("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use and may not be deleted.")
        del self.groups[(region, name)]
        return b"ok:" + (f"<DeletePlacementGroupResponse {ns}><requestId>{uuid.uuid4()}</requestId>"
                         "<return>true</return></DeletePlacementGroupResponse>").encode()

    def show_groups(self, body: bytes, region: str) -> bytes:
        """Put each member's placement group in its <placement> (EC2 reports Placement.GroupName; moto has none)."""
        with self.lock:
            member = {iid: name for (r, name), g in self.groups.items() if r == region for iid in g["members"]}
        if not member:
            return body
        text = body.decode()
        out, pos = [], 0
        for mm in re.finditer(r"<instanceId>(i-[0-9a-f]+)</instanceId>", text):
            name = member.get(mm.group(1))
            if name is None or mm.start() < pos:
                continue
            start = text.find("<placement>", mm.end())
            end = text.find("</placement>", start)
            if start < 0 or end < 0:
                continue
            inner = re.sub(r"<groupName>[^<]*</groupName>|<groupName/>", "", text[start + len("<placement>"):end])
            out.append(text[pos:start] + f"<placement><groupName>{escape(name)}</groupName>{inner}")
            pos = end
        return ("".join(out) + text[pos:]).encode()

    def show_pending(self, body: bytes) -> bytes:
        """An instance still booting is `pending` (code 0), whatever moto says; a stopped or terminated one as it is."""
        now = time.monotonic()
        with self.lock:
            booting = {iid for iid, ready in self.booting.items() if ready > now}
        if not booting:
            return body
        text, out, pos = body.decode(), [], 0
        for mm in re.finditer(r"<instanceId>(i-[0-9a-f]+)</instanceId>", text):
            if mm.group(1) not in booting or mm.start() < pos:
                continue
            state = re.compile(r"<instanceState>\s*<code>16</code>\s*<name>running</name>\s*</instanceState>").search(text, mm.end())
            if state is None or text.find("<instanceId>", mm.end(), state.start()) >= 0:
                continue  # no state of its own, or not running
            out.append(text[pos:state.start()] + "<instanceState><code>0</code><name>pending</name></instanceState>")
            pos = state.end()
        return ("".join(out) + text[pos:]).encode()

    def _alive(self, region: str, iid: str) -> bool:
        import boto3

        ec2 = boto3.client("ec2", region_name=region, endpoint_url=f"http://{self.upstream[0]}:{self.upstream[1]}")
        found = [d for r in ec2.describe_instances(InstanceIds=[iid])["Reservations"] for d in r["Instances"]]
        return any(d["State"]["Name"] != "terminated" for d in found)

    def launched(self, body: bytes, params: dict[str, list[str]], region: str) -> None:
        ids = re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", body)
        with self.lock:
            for iid in ids:
                if self.lag_reads:
                    self.unseen[iid.decode()] = self.lag_reads
                if self.boot_s:
                    self.booting[iid.decode()] = time.monotonic() + self.boot_s
                group = self.groups.get((region, (params.get("Placement.GroupName") or [""])[0]))
                if group is not None:
                    group["members"].add(iid.decode())
                rid = (params.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId") or [""])[0]
                if rid in self.reservations:
                    self.reservations[rid]["members"].add(iid.decode())


class _Handler(BaseHTTPRequestHandler):
    owner: Ec2Proxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        params = parse_qs(raw.decode("utf-8", "replace")) if method == "POST" else parse_qs(urlsplit(self.path).query)
        action = (params.get("Action") or [""])[0]
        m = _REGION.search(self.headers.get("Authorization", ""))
        if self.headers.get("X-Amz-Target") == "AmazonSSM.GetParameter":
            name = json.loads(raw or b"{}").get("Name", "")
            if name in self.owner.public_parameters:
                return self._reply(200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps({"Parameter": {
                    "Name": name, "Type": "String", "Value": self.owner.public_parameters[name], "Version": 1,
                    "DataType": "text", "ARN": f"arn:aws:ssm:us-east-1::parameter{name}"}}).encode())
        if action:
            region = m.group(1) if m else "us-east-1"
            err = self.owner.intercept(action, params, region)
            if err is not None and err.startswith(b"ok:"):
                return self._reply(200, {"Content-Type": "text/xml;charset=UTF-8"}, err[3:])
            if err is not None:
                return self._reply(error_status(err), {"Content-Type": "text/xml;charset=UTF-8"}, err)
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            conn.request(method, self.path, body=raw or None, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            if action == "RunInstances" and resp.status == 200:
                self.owner.launched(body, params, m.group(1) if m else "us-east-1")
            if action in ("RunInstances", "DescribeInstances") and resp.status == 200:
                body = self.owner.show_pending(self.owner.show_groups(body, m.group(1) if m else "us-east-1"))
            self._reply(resp.status, {k: v for k, v in resp.getheaders()
                                      if k.lower() not in ("content-length", "transfer-encoding", "connection")}, body)
        finally:
            conn.close()

    def _reply(self, status: int, headers: dict, body: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self._serve("GET")

    def do_POST(self):  # noqa: N802
        self._serve("POST")

    def do_DELETE(self):  # noqa: N802
        self._serve("DELETE")

    def do_PUT(self):  # noqa: N802
        self._serve("PUT")
