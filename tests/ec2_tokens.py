"""EC2's RunInstances ClientToken rules, in front of the moto server (moto 5 stores the token and ignores it).

As "Ensuring idempotency in Amazon EC2 API requests" documents them:
* a token is the account's and the Region's; it stays valid for at least 24 hours after the last
  instance it launched terminated (here: for the whole test session);
* the same token with the same parameters answers with the original launch and launches nothing,
  with the instances' current state ("the result might contain updated information"): a
  terminated instance comes back terminated;
* the same token with any other parameter changed (a tag, the type; not the Region or the
  Availability Zone) fails with IdempotentParameterMismatch and launches nothing.

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


class ClientTokens:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        self.tokens: dict[tuple[str, str], tuple[tuple, bytes, list[str]]] = {}  # (region, token) -> (params, body, ids)
        self.replays = 0
        self.mismatches = 0

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        form = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        fields = dict(form)
        if fields.get("Action") != "RunInstances" or not fields.get("ClientToken"):
            return self.app(environ, start_response)
        m = _REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
        key = (m.group(1) if m else "us-east-1", fields["ClientToken"])
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

    def _with_current_state(self, environ, original: bytes, ids: list[str]) -> bytes:
        """The original RunInstances answer with each instance's state as DescribeInstances gives it now."""
        query = urlencode([("Action", "DescribeInstances"), ("Version", "2016-11-15")]
                          + [(f"InstanceId.{n}", i) for n, i in enumerate(ids, 1)]).encode()
        env = {**environ, "wsgi.input": io.BytesIO(query), "CONTENT_LENGTH": str(len(query))}
        described = ET.fromstring(b"".join(self.app(env, lambda s, h, exc=None: (lambda data: None))))
        now = {i.findtext(f"{NS}instanceId"): i.find(f"{NS}instanceState") for i in described.iter(f"{NS}item")
               if i.find(f"{NS}instanceState") is not None}
        root = ET.fromstring(original)
        for item in root.find(f"{NS}instancesSet") or ():
            state, current = item.find(f"{NS}instanceState"), now.get(item.findtext(f"{NS}instanceId"))
            if state is not None and current is not None:
                item[list(item).index(state)] = current
        return ET.tostring(root, xml_declaration=True, encoding="utf-8")


def _error(start_response, code: str, message: str):
    out = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
           f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()
    start_response("400 Bad Request", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
    return [out]
