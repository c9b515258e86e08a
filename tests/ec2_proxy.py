"""A thin HTTP layer in front of moto that answers a few EC2 calls the way real EC2 does where moto is lenient.

moto is strongly consistent and has no account limits; EC2 is neither. The proxy forwards every request to the
moto server unchanged, except:

* eventual consistency (lag(n)): EC2's API reference ("Eventual consistency in the Amazon EC2 API") says a
  DescribeInstances naming an instance launched a moment ago may answer InvalidInstanceID.NotFound. With lag(n),
  each instance RunInstances returned through the proxy is "not found" by the next n DescribeInstances (or
  TerminateInstances / CreateTags) calls that name it by id;
* injected errors (fail(action, code, message, count)): the next `count` calls of `action` answer this EC2 error
  (HTTP 400, EC2's XML error body), e.g. VcpuLimitExceeded from RunInstances;
* the cluster placement group limit (placement_group_limit): CreatePlacementGroup beyond it answers
  PlacementGroupLimitExceeded, as EC2 does at its per-Region quota (500 groups per account per Region).

Requests are EC2 query requests (form-encoded POST bodies with Action=...); other services pass through untouched.
"""

from __future__ import annotations

import http.client
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

_REGION = re.compile(r"/([a-z]{2}-[a-z]+-[0-9])/ec2/aws4_request")


def ec2_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


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
        self.url = ""
        self._server: ThreadingHTTPServer | None = None

    # -- test side -----------------------------------------------------------------
    def lag(self, reads: int) -> None:
        with self.lock:
            self.lag_reads = reads

    def fail(self, action: str, code: str, message: str, count: int = 1) -> None:
        with self.lock:
            self.failures.append([action, code, message, count])

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
        """An EC2 error body to answer instead of forwarding, or None."""
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
        if action == "CreatePlacementGroup" and self.placement_group_limit is not None:
            if self._count_groups(region) >= self.placement_group_limit:
                return ec2_error("PlacementGroupLimitExceeded", "You've reached the limit of placement groups in this Region.")
        return None

    def _count_groups(self, region: str) -> int:
        import boto3

        ec2 = boto3.client("ec2", region_name=region, endpoint_url=f"http://{self.upstream[0]}:{self.upstream[1]}")
        return len(ec2.describe_placement_groups()["PlacementGroups"])

    def launched(self, body: bytes) -> None:
        ids = re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", body)
        with self.lock:
            for iid in ids:
                if self.lag_reads:
                    self.unseen[iid.decode()] = self.lag_reads


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
        if action:
            err = self.owner.intercept(action, params, m.group(1) if m else "us-east-1")
            if err is not None:
                return self._reply(400, {"Content-Type": "text/xml;charset=UTF-8"}, err)
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            conn.request(method, self.path, body=raw or None, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            if action == "RunInstances" and resp.status == 200:
                self.owner.launched(body)
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
