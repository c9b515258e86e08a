"""A moto server that enforces IAM (`INITIAL_NO_AUTH_ACTION_COUNT=0` in its process's environment: every request is
authorised against the policies of the IAM user that signed it), with EC2's answers where moto's differ, so a test
can run the provider under the README's policy with one action taken away (tests/test_aws_iam.py).

moto's evaluation, and what this layer does about it:
* moto checks the action only: a statement's Resource is matched against "*", and a Condition it evaluates with no
  context, so an Allow with a condition reads as an explicit Deny. Users here get the README's actions allowed on
  "*" without conditions (`allow`); the ownership conditions are held by the provider's own checks (its tests).
* moto answers a denied EC2 call `AccessDenied`; EC2 answers `UnauthorizedOperation` (HTTP 403), "You are not
  authorized to perform this operation. User: <arn> is not authorized to perform: <action> on resource: <arn>
  because no identity-based policy allows the <action> action. Encoded authorization failure message: <opaque>", or,
  for a launch, a terminate or a tag write (ENCODED_ONLY), "You are not authorized to perform this operation. Encoded
  authorization failure message: <opaque>", naming no action. This layer authorises EC2 calls itself with moto's own
  evaluation and answers as EC2 does.
* Tag on create: RunInstances (or CreatePlacementGroup) with TagSpecifications also needs `ec2:CreateTags`; without it
  EC2 refuses the whole launch, UnauthorizedOperation (EC2 User Guide, "Grant permission to tag resources during
  creation"). moto checks only the call's own action: this layer checks both. Likewise a launch with an instance
  profile needs `iam:PassRole` for its role ("Using an IAM role to grant permissions to applications running on
  Amazon EC2 instances").
* DryRun: moto answers a permitted dry run DryRunOperation after the authorisation above, as EC2 does.
* Service Quotas for ec2: moto knows none; tests/ec2_quotas.py answers them behind this layer (its default limits).

Run as `python -m tests.ec2_iam` in its own process (moto's IAM switch is one per process; the session's moto server
in the test workers enforces nothing): it prints one JSON line, {"url", "admin": [key id, secret]}, and serves until
killed. The admin user, allowed everything, plants and checks."""

from __future__ import annotations

import io
import json
import secrets
import sys
import uuid
from pathlib import Path
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

_TAG_SPEC = "TagSpecification."
# Writes whose refusal names no action, only the encoded message (the form AWS's "decode an UnauthorizedOperation
# error for EC2 instance launch failures" quotes for RunInstances): which permission of the several a launch needs was
# missing is left to the caller to find out.
ENCODED_ONLY = {"RunInstances", "TerminateInstances", "CreateTags", "DeleteTags", "CreatePlacementGroup",
                "DeletePlacementGroup"}
TAG_ON_CREATE = {"RunInstances", "CreatePlacementGroup"}


def readme_policy_actions() -> set[str]:
    """The actions the README's minimal IAM policy allows (its JSON block), as IAM names."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("Minimal IAM policy", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    return {a for st in json.loads(block)["Statement"] if st["Effect"] == "Allow"
            for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}


def allow(actions: set[str]) -> str:
    """An IAM policy document allowing `actions` on every resource, as moto can evaluate it (see above)."""
    return json.dumps({"Version": "2012-10-17",
                       "Statement": [{"Effect": "Allow", "Action": sorted(actions), "Resource": "*"}] if actions else []})


def _unauthorized(arn: str, call: str, action: str, region: str) -> bytes:
    encoded = secrets.token_urlsafe(300)  # opaque, as EC2's is (sts:DecodeAuthorizationMessage reads it)
    named = "" if call in ENCODED_ONLY else (
        f" User: {arn} is not authorized to perform: {action} on resource: arn:aws:ec2:{region}:123456789012:instance/* "
        f"because no identity-based policy allows the {action} action.")
    message = f"You are not authorized to perform this operation.{named} Encoded authorization failure message: {encoded}"
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>UnauthorizedOperation</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


class Ec2Iam:
    """WSGI middleware in front of moto: EC2 calls authorised as EC2 does (above); other services left to moto."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        auth = environ.get("HTTP_AUTHORIZATION", "")
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target and "Credential=" in auth:
            return self._json(environ, start_response, auth, target)
        if environ.get("REQUEST_METHOD") != "POST" or "/ec2/aws4_request" not in auth:
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        action = fields.get("Action", "")
        needed = [f"ec2:{action}"]
        if action in TAG_ON_CREATE and any(k.startswith(_TAG_SPEC) for k in fields):
            needed.append("ec2:CreateTags")
        if action == "RunInstances" and any(k.startswith("IamInstanceProfile.") for k in fields):
            needed.append("iam:PassRole")
        key_id, region = auth.split("Credential=", 1)[1].split("/")[0], auth.split("Credential=", 1)[1].split("/")[2]
        denied = _denied(key_id, needed)
        if denied is None:
            return self.app(environ, start_response)
        arn, missing = denied
        out = _unauthorized(arn, action, missing, region)
        start_response("403 Forbidden", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
        return [out]

    def _json(self, environ, start_response, auth, target):
        """A JSON-protocol call (SSM, Service Quotas): denied as those services answer, HTTP 400
        AccessDeniedException (moto answers them an XML 403 botocore cannot read)."""
        service = auth.split("Credential=", 1)[1].split("/")[3]
        action = f"{service}:{target.rsplit('.', 1)[-1]}"
        denied = _denied(auth.split("Credential=", 1)[1].split("/")[0], [action])
        if denied is None:
            return self.app(environ, start_response)
        out = json.dumps({"__type": "AccessDeniedException", "message": f"User: {denied[0]} is not authorized to perform: "
                          f"{action} because no identity-based policy allows the {action} action"}).encode()
        start_response("400 Bad Request", [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(out)))])
        return [out]


def _denied(key_id: str, actions: list[str]) -> tuple[str, str] | None:
    """(user arn, first action of `actions` its policies do not allow), or None; an unknown key is left to moto."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.access_control import CreateAccessKeyFailure, IAMPolicy, IAMUserAccessKey, PermissionResult

    try:
        user = IAMUserAccessKey(account_id=DEFAULT_ACCOUNT_ID, partition="aws", access_key_id=key_id, headers={})
    except CreateAccessKeyFailure:
        return None
    policies = user.collect_policies()
    for action in actions:
        results = {IAMPolicy(p).is_action_permitted(action) for p in policies}
        if PermissionResult.DENIED in results or PermissionResult.PERMITTED not in results:
            return user.arn, action
    return None


def main() -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends
    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    from tests.ec2_quotas import Ec2Quotas

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    iam.create_user(region_name="us-east-1", user_name="admin")
    iam.put_user_policy("admin", "all", json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key("admin")
    server = make_server("127.0.0.1", 0, Ec2Iam(Ec2Quotas(DomainDispatcherApplication(create_backend_app))), threaded=True,
                         request_handler=MotoRequestHandler)
    host, port = server.server_address[:2]
    print(json.dumps({"url": f"http://{host}:{port}", "admin": [key.access_key_id, key.secret_access_key]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
