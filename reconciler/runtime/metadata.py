"""The instance's own id, from its cloud's metadata service (the bootstrap passes the id itself
where the provider names the instance before it exists: GCE and Azure)."""

from __future__ import annotations

from reconciler.errors import ReconcileError
from reconciler.runtime.notices import _get


def instance_id_from_metadata(cloud: str, base: str = "http://169.254.169.254") -> str:
    if cloud != "aws":
        raise ReconcileError(f"--instance-from-metadata supports aws; on {cloud} the bootstrap passes the instance id")
    status, token = _get(f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, "PUT")
    status, body = _get(f"{base}/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": token} if status == 200 else {})
    if status != 200 or not body.startswith("i-"):
        raise ReconcileError(f"cannot read the instance id from the EC2 metadata service at {base} (HTTP {status or 'unreachable'})")
    return body.strip()
