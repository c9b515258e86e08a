"""The node agent's bootstrap: the user data apply gives every instance it creates when the fleet
runs work through a remote bus (AWS UserData via cloud-init, GCE metadata `startup-script`, Azure
osProfile.customData via cloud-init). It installs this package at the version apply runs, and
starts `reconcile agent` as a systemd service with the fleet's state URL.

Here, beside the providers that pass it as user data (and that import nothing above them), not beside
the agent in reconciler/runtime/: what it shares with the agent is a command line, not code."""

from __future__ import annotations

import os
import shlex

from providers.errors import ProviderError
from providers.redact import redact

PACKAGE = "fleetops-reconciler"
NOTICE = {"aws": "aws", "gcp": "gcp", "azure": "azure"}


def package_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(PACKAGE)
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without an install
        return "0.0.0"  # what reconciler.__version__ says then (it reads the same metadata)


def agent_package() -> str | None:
    """FLEETOPS_AGENT_PACKAGE, what instances install instead of the released package (a development build is on no
    index), or None. It goes into user data, which is no place for secrets (EC2: do not store passwords or long-lived
    keys in user data, which every process on the instance reads from the metadata service; GCE metadata and Azure
    customData alike): one carrying a credential (a URL's USER:TOKEN@, a presigned URL's signature: what redact hides)
    is refused, before any instance is launched."""
    spec = os.environ.get("FLEETOPS_AGENT_PACKAGE") or None
    if spec and redact(spec) != spec:
        raise ProviderError(f"FLEETOPS_AGENT_PACKAGE {spec!r} carries a credential, and it would be written into every "
                            "instance's user data, readable by any process there: name a package the instances can "
                            "install without one (a public URL, or an index they reach with their own role)")
    return spec


def mig_partition(layout: tuple[str, ...]) -> str:
    """Shell lines that partition every GPU with the pool's MIG layout, before the agent starts (the
    agent refuses to run a MIG replica on a GPU not partitioned so). Only when no MIG device exists yet:
    GCE runs its startup-script at every boot, and by then the agent may run replicas on the devices.
    Larger profiles first: NVIDIA's placement rules can refuse a large GPU instance after small ones."""
    if not layout:
        return ""
    order = ",".join(sorted(layout, key=lambda p: -int(p.split("g.", 1)[0])))
    return f"""# MIG: partition every GPU as the pool says ({",".join(layout)}), once.
if [ "$(nvidia-smi -L | grep -c ' MIG ' || true)" = 0 ]; then
  nvidia-smi -mig 1
  if [ "$(nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader | grep -c Disabled || true)" != 0 ]; then nvidia-smi -r; fi
  for gpu in $(nvidia-smi --query-gpu=index --format=csv,noheader); do nvidia-smi mig -i "$gpu" -cgi {shlex.quote(order)} -C; done
fi
"""


def unit_escape(command: str) -> str:
    """A shell-quoted command line as a systemd unit's ExecStart takes it: systemd expands `%` specifiers and `$VAR`
    in it, quoted or not (systemd.service, "Command lines"; systemd.unit, "Specifiers"), so a state URL with `%2F` in
    its prefix failed the unit ("Failed to resolve unit specifiers": the agent never started) and one with `$HOME` was
    another URL. `%%` and `$$` are the literal characters."""
    return command.replace("%", "%%").replace("$", "$$")


def bootstrap_script(cloud: str, state_url: str, instance_id: str | None, version: str | None = None, mig: tuple[str, ...] = ()) -> str:
    """A shell script (cloud-init runs `#!` user data as a script; so does GCE's startup-script).
    `instance_id` None: the agent reads it from the metadata service (EC2 ids are not known before launch).
    `mig`: the pool's MIG layout, applied to every GPU before the agent starts."""
    version = version or package_version()
    who = f"--instance-from-metadata {cloud}" if instance_id is None else shlex.quote(instance_id)
    extra = {"s3": "aws", "gs": "gcp", "azblob": "azure"}.get(state_url.split("://", 1)[0], "")  # the bus's SDK
    spec = f"{PACKAGE}[{extra}]=={version}" if extra else f"{PACKAGE}=={version}"
    # A development build (0.2.1.dev3+gSHA) is on no package index: FLEETOPS_AGENT_PACKAGE names what
    # instances install instead (a wheel URL, `git+https://...@SHA`).
    spec = agent_package() or spec
    agent = (f"/opt/fleetops/bin/reconcile agent {who} --state {shlex.quote(state_url)} --runtime docker "
             f"--notice {NOTICE.get(cloud, 'none')} --workdir /var/lib/fleetops --checkpoint-root /var/lib/fleetops/checkpoints")
    return f"""#!/bin/bash
# fleetops node agent bootstrap, written by `reconcile apply` ({PACKAGE} {version}).
set -euo pipefail
# Debian and Ubuntu ship python3 without venv's ensurepip (package python3-venv; their cloud images have python3, not it).
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  (apt-get update -q && apt-get install -yq -o DPkg::Lock::Timeout=300 python3 python3-venv) || dnf install -yq python3
fi
python3 -m venv /opt/fleetops
/opt/fleetops/bin/pip install --quiet {shlex.quote(spec)}
mkdir -p /var/lib/fleetops
{mig_partition(tuple(mig))}cat > /etc/systemd/system/fleetops-agent.service <<'UNIT'
[Unit]
Description=fleetops node agent
Wants=network-online.target
After=network-online.target docker.service

[Service]
ExecStart={unit_escape(agent)}
Restart=always
RestartSec=5
# A stop signals the agent alone, which checkpoints and stops its replicas itself; when it dies, its
# replicas live on and the restarted agent adopts them (the default, control-group, killed them all).
KillMode=process
KillSignal=SIGTERM
TimeoutStopSec=180

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now fleetops-agent.service
"""
