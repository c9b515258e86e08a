"""Which AWS API actions reach the moto server, by their IAM names (`ec2:RunInstances`, `ssm:GetParameter`), so a
test can hold the README's minimal IAM policy to what the provider really calls: moto enforces no IAM, and a policy
missing an action the provider needs is only found by a user, as UnauthorizedOperation, on a real account.

The service is the one the request is signed for (SigV4's credential scope names it); the action is the query
protocol's Action (EC2) or the JSON protocol's X-Amz-Target operation (SSM, Service Quotas); REST protocols (S3) are
not recorded. A WSGI middleware, like
tests/ec2_tokens.py, outermost in front of the session's moto server."""

from __future__ import annotations

import io
import re
import threading
from urllib.parse import parse_qsl

_SCOPE = re.compile(r"Credential=[^/]+/\d+/[a-z0-9-]+/([a-z0-9-]+)/aws4_request")


class ApiCalls:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        self.seen: set[str] = set()

    def __call__(self, environ, start_response):
        scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        action = target.rsplit(".", 1)[-1] if target else ""
        if not action and scope and scope.group(1) == "ec2" and environ.get("REQUEST_METHOD") == "POST":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            action = dict(parse_qsl(body.decode("utf-8", "replace"))).get("Action", "")
        if scope and action:
            with self.lock:
                self.seen.add(f"{scope.group(1)}:{action}")
        return self.app(environ, start_response)

    def take(self) -> set[str]:
        """The actions seen since the last take()."""
        with self.lock:
            seen, self.seen = self.seen, set()
            return seen
