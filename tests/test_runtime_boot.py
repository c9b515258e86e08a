"""The node agent's bootstrap on the clouds, read back from each test server: moto's
DescribeInstanceAttribute userData, the GCE fake's instance metadata, the ARM fake's customData."""

from __future__ import annotations

import base64
import subprocess

import boto3

from providers.aws import AwsProvider
from providers.azure import AzureProvider
from providers.base import CreateRequest, PoolTarget, ProviderContext, ownership_tags
from providers.gcp import GcpProvider
from providers.bootstrap import bootstrap_script, package_version
from tests.conftest import ARM_RESOURCE_GROUP, ARM_SUBNET, arm_options

STATE = "s3://acme-fleet-state/fleets/prod"
AGENT = "/opt/fleetops/bin/reconcile agent"


def _checks(script: str, cloud: str, who: str) -> None:
    assert script.startswith("#!/bin/bash\n")
    assert f"/opt/fleetops/bin/pip install --quiet 'fleetops-reconciler[aws]=={package_version()}'" in script
    assert (f"ExecStart={AGENT} {who} --state {STATE} --runtime docker --notice {cloud} "
            "--workdir /var/lib/fleetops --checkpoint-root /var/lib/fleetops/checkpoints") in script
    assert "systemctl enable --now fleetops-agent.service" in script
    assert "\nKillMode=process\n" in script and "\nRestart=always\n" in script  # a restarted agent adopts its replicas
    assert subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0  # it parses


def test_the_bootstrap_quotes_what_it_is_given(monkeypatch):
    script = bootstrap_script("gcp", "s3://b/x; rm -rf /", "projects/p/zones/z/instances/n", version="1.2.3")
    assert "--state 's3://b/x; rm -rf /'" in script and "'fleetops-reconciler[aws]==1.2.3'" in script
    # A development build is on no index: the package to install can be named instead.
    monkeypatch.setenv("FLEETOPS_AGENT_PACKAGE", "fleetops-reconciler[aws] @ https://example.com/f-0.2.1.dev3-py3-none-any.whl")
    assert "pip install --quiet 'fleetops-reconciler[aws] @ https://example.com/f-0.2.1.dev3-py3-none-any.whl'" in \
        bootstrap_script("aws", "s3://b/x", None, version="0.2.1.dev3+gabc")


def test_the_agents_unit_starts_it_with_the_state_url_as_written(tmp_path):
    """systemd expands `%` specifiers and `$VAR` in ExecStart even inside quotes: a bus prefix with `%2F` failed the
    unit ("Failed to resolve unit specifiers", the agent never started) and `$HOME` named another bus. The unit writes
    them `%%` and `$$`; undone as systemd does, the command line is the agent's with the URL as given."""
    import shlex
    import shutil

    url = "s3://acme-fleet-state/fleets/team%2Fa/$HOME/prod"
    script = bootstrap_script("aws", url, "i-0abc", version="1.2.3")
    line = next(ln for ln in script.splitlines() if ln.startswith("ExecStart="))[len("ExecStart="):]
    assert "%" not in line.replace("%%", ""), line  # every % doubled
    argv = shlex.split(line.replace("%%", "%").replace("$$", "$"))
    assert argv[argv.index("--state") + 1] == url
    if shutil.which("systemd-analyze"):  # (where systemd's own parser is at hand: it resolves the unit's specifiers)
        unit = tmp_path / "fleetops-agent.service"
        unit.write_text(script.split("<<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0] + "\n")
        out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert "specifier" not in (out.stdout + out.stderr), out.stdout + out.stderr


def test_no_credential_of_the_agent_package_goes_into_user_data(monkeypatch, tmp_path):
    """User data is no place for secrets: EC2 says not to store passwords or keys in it (any process on the instance
    reads it from the metadata service; DescribeInstanceAttribute shows it), and GCE metadata and Azure customData are
    alike. A private index's token in FLEETOPS_AGENT_PACKAGE (git+https://USER:TOKEN@..., a presigned wheel URL) is
    refused before any instance is launched, and the error shows no secret; instances get roles, not keys."""
    import pytest

    from reconciler.errors import ReconcileError
    from reconciler.load import load
    from reconciler.runtime.publish import agent_bus
    from tests.fleetkit import job, pool, tenant, topology, write_config

    runs = load(write_config(tmp_path, [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
                                        job("j", cpu=1, run={"command": ["true"]})]))
    for spec in ("git+https://x-access-token:ghp_SECRET123@github.com/acme/fleetops@0123abc",
                 "fleetops-reconciler[aws] @ https://b.s3.amazonaws.com/f-0.2.1-py3-none-any.whl?X-Amz-Signature=SECRET123"):
        monkeypatch.setenv("FLEETOPS_AGENT_PACKAGE", spec)
        for make in (lambda: bootstrap_script("aws", STATE, None, version="0.2.1"), lambda: agent_bus(runs, STATE)):
            with pytest.raises(ReconcileError, match="FLEETOPS_AGENT_PACKAGE") as e:
                make()
            assert "SECRET123" not in str(e.value)
    monkeypatch.setenv("FLEETOPS_AGENT_PACKAGE", "git+https://github.com/acme/fleetops@0123abc")  # public: fine
    assert "pip install --quiet git+https://github.com/acme/fleetops@0123abc" in bootstrap_script("aws", STATE, None)
    assert agent_bus(runs, STATE) == STATE


def test_aws_user_data_boots_the_agent(aws_env, tmp_path):
    prov = AwsProvider(ProviderContext(fleet="boot-aws", state_dir=tmp_path, options={"endpoint_url": aws_env}))
    pool = PoolTarget(name="a10g", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("g5.xlarge",),
                      settings={"ami": "ami-12c6146b", "security_groups": [], "subnets": {}})
    inst = prov.create(CreateRequest(key="k-boot", pool=pool, zone="us-east-1a", instance_type="g5.xlarge", market="on-demand",
                                     tags=ownership_tags("boot-aws", "a10g", "k-boot"), agent_state_url=STATE))
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)
    raw = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")["UserData"]["Value"]
    _checks(base64.b64decode(raw).decode(), "aws", "--instance-from-metadata aws")
    # Without a remote bus (or without work that runs) nothing is passed. (Its key is its own: the moto server and its
    # ClientTokens are shared by the session, and test_aws_provider launches a "k-plain" with other parameters.)
    plain = prov.create(CreateRequest(key="k-boot-plain", pool=pool, zone="us-east-1a", instance_type="g5.xlarge", market="on-demand",
                                      tags=ownership_tags("boot-aws", "a10g", "k-boot-plain")))
    assert "Value" not in ec2.describe_instance_attribute(InstanceId=plain.id, Attribute="userData")["UserData"]


def test_gce_startup_script_boots_the_agent(gce, tmp_path):
    project = "boot-project"
    prov = GcpProvider(ProviderContext(fleet="boot-gcp", state_dir=tmp_path, options={"endpoint": gce.url, "project": project}))
    pool = PoolTarget(name="l4", cloud="gcp", region="us-central1", zones=("us-central1-a",), instance_types=("g2-standard-4",), settings={})
    inst = prov.create(CreateRequest(key="k-boot", pool=pool, zone="us-central1-a", instance_type="g2-standard-4", market="on-demand",
                                     tags=ownership_tags("boot-gcp", "l4", "k-boot"), agent_state_url=STATE))
    stored = next(i for i in gce.instances(project) if inst.id.endswith("/" + i["name"]))
    items = {m["key"]: m["value"] for m in stored["metadata"]["items"]}
    _checks(items["startup-script"], "gcp", inst.id)
    assert "nvidia-smi" not in items["startup-script"]  # no MIG layout, no partitioning
    # A MIG pool's instances partition their GPUs before the agent starts.
    mig = PoolTarget(name="mig", cloud="gcp", region="us-central1", zones=("us-central1-a",), instance_types=("a2-ultragpu-8g",),
                     settings={}, mig=("2g.20gb", "3g.40gb", "2g.20gb"))
    inst = prov.create(CreateRequest(key="k-mig", pool=mig, zone="us-central1-a", instance_type="a2-ultragpu-8g", market="on-demand",
                                     tags=ownership_tags("boot-gcp", "mig", "k-mig"), agent_state_url=STATE))
    stored = next(i for i in gce.instances(project) if inst.id.endswith("/" + i["name"]))
    script = {m["key"]: m["value"] for m in stored["metadata"]["items"]}["startup-script"]
    _checks(script, "gcp", inst.id)
    assert 'nvidia-smi mig -i "$gpu" -cgi 3g.40gb,2g.20gb,2g.20gb -C' in script
    assert script.index("nvidia-smi mig -i") < script.index("systemctl enable --now fleetops-agent.service")


def test_azure_custom_data_boots_the_agent(arm, tmp_path):
    prov = AzureProvider(ProviderContext(fleet="boot-azure", state_dir=tmp_path, options=arm_options(arm)))
    subnet = ARM_SUBNET
    pool = PoolTarget(name="t4", cloud="azure", region="eastus", zones=("eastus-1",), instance_types=("Standard_NC4as_T4_v3",),
                      settings={"subscription_id": None, "resource_group": ARM_RESOURCE_GROUP, "image": None, "subnet_id": subnet,
                                "admin_username": "fleetops", "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBoot boot@test"})
    inst = prov.create(CreateRequest(key="k-boot", pool=pool, zone="eastus-1", instance_type="Standard_NC4as_T4_v3", market="on-demand",
                                     tags=ownership_tags("boot-azure", "t4", "k-boot"), agent_state_url=STATE))
    (script,) = arm.custom_data.values()
    _checks(script, "azure", inst.id)


def test_instances_get_an_agent_only_with_a_remote_bus_and_work_that_runs(tmp_path):
    from reconciler.load import load
    from reconciler.runtime.publish import agent_bus
    from tests.fleetkit import job, pool, tenant, topology, write_config

    base = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"])]
    runs = load(write_config(tmp_path / "a", [*base, job("j", cpu=1, run={"command": ["true"]})]))
    holds = load(write_config(tmp_path / "b", [*base, job("j", cpu=1)]))
    assert agent_bus(runs, STATE) == STATE
    assert agent_bus(runs, None) is None and agent_bus(runs, "local") is None  # a cloud instance cannot reach .reconcile/
    assert agent_bus(holds, STATE) is None  # reservations only: nothing to run, no agent


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  -L) cat "$LISTING" ;;
  --query-gpu=index*) printf '0\\n1\\n' ;;
  --query-gpu=mig.mode.current*) printf 'Enabled\\nEnabled\\n' ;;
esac
"""


def test_the_mig_partition_runs_once_per_instance_with_large_profiles_first(tmp_path):
    """The bootstrap's MIG lines, run by bash against an nvidia-smi that records its calls (no GPUs on CI):
    MIG mode on, then every GPU partitioned, the 3g before the 2g's; at a reboot, with MIG devices listed,
    nothing is touched (the agent may be running replicas on them)."""
    from providers.bootstrap import mig_partition

    (tmp_path / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    listing, calls = tmp_path / "listing", tmp_path / "calls"
    listing.write_text("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\nGPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-2)\n")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CALLS": str(calls), "LISTING": str(listing)}
    script = "set -euo pipefail\n" + mig_partition(("2g.20gb", "2g.20gb", "3g.40gb"))
    assert subprocess.run(["bash", "-c", script], env=env).returncode == 0
    assert calls.read_text().splitlines() == [
        "-L", "-mig 1", "--query-gpu=mig.mode.current --format=csv,noheader", "--query-gpu=index --format=csv,noheader",
        "mig -i 0 -cgi 3g.40gb,2g.20gb,2g.20gb -C", "mig -i 1 -cgi 3g.40gb,2g.20gb,2g.20gb -C"]
    calls.unlink()
    listing.write_text(listing.read_text() + "  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n")
    assert subprocess.run(["bash", "-c", script], env=env).returncode == 0
    assert calls.read_text().splitlines() == ["-L"]


def test_a_pools_mig_layout_reaches_the_launch(tmp_path):
    from reconciler.load import load
    from reconciler.observe import pool_target
    from tests.fleetkit import pool, tenant, topology, write_config

    p = pool("mig", "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"])  # one A100-80GB
    p["spec"]["mig"] = ["3g.40gb", "2g.20gb", "2g.20gb"]
    d = load(write_config(tmp_path, [topology(), tenant("t"), p]))
    assert pool_target(d.pools["mig"]).mig == ("3g.40gb", "2g.20gb", "2g.20gb")


FAKE_PYTHON3 = """#!/bin/sh
# A Debian/Ubuntu python3 without the python3-venv package: no ensurepip, so `-m venv` fails as Debian's does.
echo "python3 $*" >> "$CALLS"
if [ -e "$HAS_VENV" ]; then exit 0; fi
case "$*" in
  "-m venv"*) echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1 ;;
  -c*) exit 1 ;;
esac
"""

FAKE_APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$CALLS"
case "$*" in *install*python3-venv*) touch "$HAS_VENV" ;; esac
"""


def test_the_bootstrap_installs_python3_venv_where_python3_comes_without_it(tmp_path):
    """Debian and Ubuntu ship venv's ensurepip in a separate package, python3-venv, that their cloud images (GCE's
    debian-12, the Azure CPU default Ubuntu 24.04) do not install, though python3 is there: the bootstrap's lines up to
    the venv, run by bash with a python3 like theirs, install it, and `python3 -m venv` then succeeds."""
    for name, text in (("python3", FAKE_PYTHON3), ("apt-get", FAKE_APT_GET)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    calls, has_venv = tmp_path / "calls", tmp_path / "has-venv"
    script = bootstrap_script("gcp", STATE, "projects/p/zones/z/instances/n", version="1.2.3")
    upto_venv = script[:script.index("python3 -m venv /opt/fleetops\n")] + f"python3 -m venv {tmp_path / 'venv'}\n"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CALLS": str(calls), "HAS_VENV": str(has_venv)}
    run = subprocess.run(["bash", "-c", upto_venv], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert any(c.startswith("apt-get") and "install" in c and "python3-venv" in c for c in calls.read_text().splitlines())
    # Where python3 has venv (Amazon Linux, or once installed), nothing is installed.
    calls.unlink()
    assert subprocess.run(["bash", "-c", upto_venv], env=env).returncode == 0
    assert not any(c.startswith("apt-get") for c in calls.read_text().splitlines())
