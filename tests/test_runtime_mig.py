"""MIG replicas get their MIG devices: apply names each replica's devices on its instance (stable
while it runs, never one device twice), and the agent hands them to the command as
CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES: the devices' UUIDs where nvidia-smi lists them, the
`GPU:MIG` indices on the sim. Real agent and replica processes; nvidia-smi is a script printing the
driver's `-L` format (no GPUs on CI machines)."""

from __future__ import annotations

import sys

from providers.sim import SimCloud
from reconciler import api
from reconciler.backend import backend_for
from reconciler.load import load
from reconciler.runtime.assign import build_assignments
from reconciler.runtime.bus import Bus
from reconciler.state import state_dir
from tests.fleetkit import job, pool, tenant, topology, write_config
from tests.test_runtime_adopt import in_process
from tests.test_runtime_agent import entry, run_until, terminal

PY = sys.executable
LAYOUT = ["3g.40gb", "2g.20gb", "2g.20gb"]
SHOW = [PY, "-c", "import os; print(*(os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES', 'FLEETOPS_MIG_DEVICES')))"]


def mig_config(path, *jobs):
    p = pool("mig", "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"], hi=2)  # one A100-80GB
    p["spec"]["mig"] = LAYOUT
    return write_config(path, [topology(), tenant("t"), p, *jobs])


def mig_job(name: str, profile: str, **spec) -> dict:
    j = job(name, **spec)
    j["spec"]["resources"] = {"gpu_type": "A100-80GB", "mig": {"profile": profile, "count": 1}, "cpu": 2, "memory_gib": 8}
    return j


def test_mig_replicas_get_distinct_devices_of_their_profile_and_see_them(tmp_path):
    cfg = mig_config(tmp_path / "c", *(mig_job(n, p, run={"command": SHOW}) for n, p in
                                       (("large", "3g.40gb"), ("small-a", "2g.20gb"), ("small-b", "2g.20gb"))))
    api.apply(cfg, time_limit=5)  # FLEETOPS_SIM_AGENTS=0: this test runs the instance's agent itself
    (iid,) = [i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]
    bus = Bus(backend_for(cfg, None))
    given = {e["job"]: e["gpus"] for e in bus.assignment(iid)["replicas"]}
    assert given["large"] == ["0:0"] and sorted(given["small-a"] + given["small-b"]) == ["0:1", "0:2"], given
    agent = in_process(bus, iid, tmp_path / "w")
    for name, devices in given.items():
        rec = run_until([agent], terminal(bus, name))
        want = ",".join(devices)
        assert rec["phase"] == "Succeeded" and rec["log_tail"] == [f"{want} {want} {want}"], rec  # the sim has no nvidia-smi


def test_a_running_mig_replica_keeps_its_device_when_a_neighbour_leaves(tmp_path):
    d = load(mig_config(tmp_path, mig_job("a", "2g.20gb", run={"command": ["x"]}), mig_job("b", "2g.20gb", run={"command": ["x"]})))
    hosts = {"i-1": (tuple(LAYOUT), 1)}
    first = build_assignments(d, {"a": ["i-1"], "b": ["i-1"]}, {}, {"i-1": "sim"}, 1, {}, hosts)
    assert {e["job"]: e["gpus"] for e in first["i-1"]["replicas"]} == {"a": ["0:1"], "b": ["0:2"]}
    after = build_assignments(d, {"b": ["i-1"]}, {}, {"i-1": "sim"}, 2, first, hosts)  # a finished
    assert [(e["job"], e["gpus"]) for e in after["i-1"]["replicas"]] == [("b", ["0:2"])]  # b is not moved to 0:1 under it
    again = build_assignments(d, {"a": ["i-1"], "b": ["i-1"]}, {}, {"i-1": "sim"}, 3, after, hosts)
    assert {e["job"]: e["gpus"] for e in again["i-1"]["replicas"]} == {"a": ["0:1"], "b": ["0:2"]}


NVIDIA_SMI_L = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 2g.20gb     Device  0: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
  MIG 3g.40gb     Device  1: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 2g.20gb     Device  2: (UUID: MIG-0b1f4a07-5ac1-5b7a-8f5e-4c2b6a9d1e33)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-9e3d8d2b-8a77-5d5b-a0d6-d33d2b2c524d)
"""


def fake_nvidia_smi(tmp_path, monkeypatch, listing: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "listing").write_text(listing)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] && exec cat {bin_dir / 'listing'}\nexit 9\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")


def test_on_a_host_with_nvidia_smi_the_command_sees_its_mig_uuids(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, NVIDIA_SMI_L)
    bus = Bus(backend_for(tmp_path, None))
    mig = {"mig_profile": "2g.20gb", "mig_layout": LAYOUT}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("second-2g", SHOW, gpus=["0:2"], **mig),
                                                         entry("the-3g", SHOW, gpus=["0:0"], mig_profile="3g.40gb", mig_layout=LAYOUT)]})
    agent = in_process(bus, "i-0", tmp_path / "w")
    rec = run_until([agent], terminal(bus, "second-2g"))
    # The layout's second 2g.20gb is the second one nvidia-smi lists on GPU 0, whatever the driver numbered it.
    u = "MIG-0b1f4a07-5ac1-5b7a-8f5e-4c2b6a9d1e33"
    assert rec["log_tail"] == [f"{u} {u} 0:2"], rec
    u = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    assert run_until([agent], terminal(bus, "the-3g"))["log_tail"] == [f"{u} {u} 0:0"]


def test_a_gpu_not_partitioned_as_the_pool_says_is_a_start_error_not_a_run_on_other_devices(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, NVIDIA_SMI_L)
    bus = Bus(backend_for(tmp_path, None))
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("on-gpu-1", SHOW, gpus=["1:1"], mig_profile="2g.20gb", mig_layout=LAYOUT)]})
    rec = run_until([in_process(bus, "i-0", tmp_path / "w")], terminal(bus, "on-gpu-1"))
    assert (rec["phase"], rec["reason"]) == ("Failed", "StartError")
    assert "GPU 1 has 0 MIG device(s) of profile 2g.20gb" in rec["message"] and "partition the GPUs" in rec["message"]
