"""EC2's RunInstances ClientToken rules, in front of the moto server (moto 5 stores the token and ignores it).

As "Ensuring idempotency in Amazon EC2 API requests" documents them:
* a token is the account's and the Region's; it stays valid for at least 24 hours after the last
  instance it launched terminated (here: for the whole test session);
* the same token with the same parameters answers with the original launch and launches nothing,
  with the instances' current state ("the result might contain updated information"): a
  terminated instance comes back terminated;
* the same token with any other parameter changed (a tag, the type; not the Region or the
  Availability Zone) fails with IdempotentParameterMismatch and launches nothing;
* DescribeInstances takes the `client-token` filter ("The idempotency token you provided when you
  launched the instance", EC2 API reference), which moto does not implement: answered with the
  instances the token launched.

And how long EC2 lists a terminated instance ("Recently terminated instances might appear in the returned
results. This interval is usually less than one hour", DescribeInstances in the EC2 API reference), on demand:
expire(region, ids) takes terminated instances out of moto (which lists them forever), as an hour later, so
DescribeInstances shows them no more (by id: InvalidInstanceID.NotFound) while their tokens live on: replayed as
they were, they answer the launch with its instances terminated.

And how long EC2 keeps a token ("valid for at least 24 hours after the termination of the instance"; no longer is
promised), on demand: forget(region, token) drops it, as EC2 may once that day is over: the token is then new and
launches again.

And EC2's eventual consistency for tag-filtered listings, on demand: lag_tag(key, value) leaves the
instances tagged key=value out of the next DescribeInstances that filters on that tag, as a listing
that does not show a just-launched instance yet.

A WSGI middleware around moto's own application, so every client (the providers under test,
the CLI in a subprocess, the tests' own boto3 clients) meets the same rules over HTTP."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
import threading
import uuid
from urllib.parse import parse_qsl, urlencode

IGNORED = {"Action", "Version", "ClientToken", "Placement.AvailabilityZone"}
_INSTANCE_ID = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")  # RunInstances' instances (tags hold no ids)
NS = "{http://ec2.amazonaws.com/doc/2016-11-15}"
ET.register_namespace("", NS[1:-1])
_REGION = re.compile(r"Credential=[^/]+/\d+/([a-z0-9-]+)/ec2/")
_FILTER = re.compile(r"Filter\.(\d+)\.(Name|Value\.\d+)")
_EMPTY = (f'<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="{NS[1:-1]}"><requestId>{{}}</requestId>'
          "<reservationSet/></DescribeInstancesResponse>")


class ClientTokens:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        self.tokens: dict[tuple[str, str], tuple[tuple, bytes, list[str]]] = {}  # (region, token) -> (params, body, ids)
        self.replays = 0
        self.mismatches = 0
        self.lagging: dict[tuple[str, str], int] = {}  # (tag key, value) -> tag-filtered listings left that miss it
        self.expired: set[str] = set()  # terminated instances EC2 lists no more (expire)

    def expire(self, region: str, ids: list[str]) -> None:
        """An hour after their termination: the terminated instances `ids` leave every listing (moto's own state)."""
        from moto.ec2.models import ec2_backends

        from tests.ec2_quotas import ACCOUNT

        with self.lock:
            backend = ec2_backends[ACCOUNT][region]
            for rid, reservation in list(backend.reservations.items()):
                for instance in list(reservation.instances):
                    if instance.id in ids:
                        assert instance.state == "terminated", f"{instance.id} is {instance.state}, not terminated"
                        reservation.instances.remove(instance)
                        self.expired.add(instance.id)
                if not reservation.instances:
                    del backend.reservations[rid]

    def forget(self, region: str, token: str) -> None:
        """A day or more after its last instance terminated: EC2 no longer knows the token."""
        with self.lock:
            self.tokens.pop((region, token), None)

    def lag_tag(self, key: str, value: str, reads: int = 1) -> None:
        """The next `reads` DescribeInstances filtered on tag:`key` with `value` do not show the instances carrying it."""
        with self.lock:
            self.lagging[(key, value)] = reads

    def reset(self) -> None:
        with self.lock:
            self.lagging.clear()

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        form = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        fields = dict(form)
        if fields.get("Action") == "DescribeInstances":
            return self._describe(environ, start_response, form)
        if fields.get("Action") != "RunInstances" or not fields.get("ClientToken"):
            return self.app(environ, start_response)
        key = (_region(environ), fields["ClientToken"])
        params = tuple(sorted((k, v) for k, v in form if k not in IGNORED))
        with self.lock:  # one launch per token, even for concurrent retries
            seen = self.tokens.get(key)
            if seen is not None:
                if seen[0] != params:
                    self.mismatches += 1
                    return _error(start_response, "IdempotentParameterMismatch",
                                  f"Arguments on this idempotent request are inconsistent with arguments used in previous "
                                  f"request(s) with the same client token ({fields['ClientToken']}).")
                self.replays += 1
                out = self._with_current_state(environ, seen[1], seen[2])
                start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
                return [out]
            status: list = []
            chunks = self.app(environ, lambda s, h, exc=None: status.append((s, h)) or (lambda data: None))
            out = b"".join(chunks)
            if status and status[0][0].startswith("200"):
                self.tokens[key] = (params, out, [i.decode() for i in _INSTANCE_ID.findall(out)])
            start_response(*status[0])
            return [out]

    def _describe(self, environ, start_response, form: list[tuple[str, str]]):
        """DescribeInstances: a `client-token` filter becomes an `instance-id` filter on the ids the token launched
        (no launch: nothing matches); a lagging tag's instances are left out of a listing filtered on that tag."""
        filters: dict[str, tuple[str, list[str]]] = {}
        for k, v in form:
            if m := _FILTER.fullmatch(k):
                name, values = filters.setdefault(m.group(1), ("", []))
                filters[m.group(1)] = (v, values) if m.group(2) == "Name" else (name, values + [v])
        rest = [(k, v) for k, v in form if not _FILTER.fullmatch(k)]
        if not any(name == "client-token" or name.startswith("tag:") for name, _ in filters.values()):
            return self.app(environ, start_response)
        region, lagged, by_token = _region(environ), None, False
        with self.lock:
            kept = []
            for name, values in filters.values():
                if name == "client-token":
                    by_token = True
                    ids = sorted({i for t in values for i in self.tokens.get((region, t), ((), b"", []))[2]})
                    if not ids:
                        return _respond(start_response, _EMPTY.format(uuid.uuid4()).encode())
                    name, values = "instance-id", ids
                elif name.startswith("tag:") and lagged is None:
                    lagged = next(((name[4:], v) for v in values if self.lagging.get((name[4:], v), 0) > 0), None)
                    if lagged:
                        self.lagging[lagged] -= 1
                kept.append((name, values))
        if not by_token and lagged is None:
            return self.app(environ, start_response)
        query = rest + [kv for n, (name, values) in enumerate(kept, 1)
                        for kv in [(f"Filter.{n}.Name", name)] + [(f"Filter.{n}.Value.{j}", v) for j, v in enumerate(values, 1)]]
        body = urlencode(query).encode()
        env = {**environ, "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))}
        if lagged is None:
            return self.app(env, start_response)
        status: list = []
        out = b"".join(self.app(env, lambda s, h, exc=None: status.append((s, h)) or (lambda data: None)))
        if not status or not status[0][0].startswith("200"):
            start_response(*status[0])
            return [out]
        root = ET.fromstring(out)
        reservations = root.find(f"{NS}reservationSet")
        for res in list(reservations if reservations is not None else ()):
            instances = res.find(f"{NS}instancesSet")
            for item in list(instances if instances is not None else ()):
                tags = {(t.findtext(f"{NS}key"), t.findtext(f"{NS}value")) for t in item.findall(f"{NS}tagSet/{NS}item")}
                if lagged in tags:
                    instances.remove(item)  # type: ignore[union-attr]
            if instances is None or not len(instances):
                reservations.remove(res)  # type: ignore[union-attr]
        return _respond(start_response, ET.tostring(root, xml_declaration=True, encoding="utf-8"))

    def _with_current_state(self, environ, original: bytes, ids: list[str]) -> bytes:
        """The original RunInstances answer with each instance's state as DescribeInstances gives it now (an expired
        one's: terminated)."""
        listed = [i for i in ids if i not in self.expired]
        query = urlencode([("Action", "DescribeInstances"), ("Version", "2016-11-15")]
                          + [(f"InstanceId.{n}", i) for n, i in enumerate(listed, 1)]).encode()
        env = {**environ, "wsgi.input": io.BytesIO(query), "CONTENT_LENGTH": str(len(query))}
        described = ET.fromstring(b"".join(self.app(env, lambda s, h, exc=None: (lambda data: None)))) if listed else None
        now = {i.findtext(f"{NS}instanceId"): i.find(f"{NS}instanceState") for i in
               (described.iter(f"{NS}item") if described is not None else ()) if i.find(f"{NS}instanceState") is not None}
        for iid in set(ids) & self.expired:
            now[iid] = ET.fromstring(f'<instanceState xmlns="{NS[1:-1]}"><code>48</code><name>terminated</name></instanceState>')
        root = ET.fromstring(original)
        for item in root.find(f"{NS}instancesSet") or ():
            state, current = item.find(f"{NS}instanceState"), now.get(item.findtext(f"{NS}instanceId"))
            if state is not None and current is not None:
                item[list(item).index(state)] = current
        return ET.tostring(root, xml_declaration=True, encoding="utf-8")


def _region(environ) -> str:
    m = _REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
    return m.group(1) if m else "us-east-1"


def _respond(start_response, out: bytes):
    start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
    return [out]


def _error(start_response, code: str, message: str):
    out = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
           f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()
    start_response("400 Bad Request", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
    return [out]
