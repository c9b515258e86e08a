"""Interruption notices from each cloud's metadata service, served here as the clouds document them:
EC2 IMDSv2 (a PUT token, then spot/instance-action; 404 until a notice), GCE (Metadata-Flavor:
Google; instance/preempted FALSE -> TRUE), Azure Scheduled Events (Metadata: true; a Preempt event)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reconciler.errors import ReconcileError
from reconciler.runtime.metadata import instance_id_from_metadata
from reconciler.runtime.notices import AwsNotice, AzureNotice, FileNotice, GceNotice


class Metadata:
    """One fake link-local metadata server; `notice` switches the interruption on."""

    def __init__(self):
        self.notice = False
        self.rebalance = False
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: str = "") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self):
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, "TOKEN")
                self._send(400)

            def do_GET(self):
                p = self.path
                if p.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN":
                        return self._send(401)  # IMDSv2 only, as the fleet's instances are launched
                    if p == "/latest/meta-data/instance-id":
                        return self._send(200, "i-0abc123")
                    if p == "/latest/meta-data/spot/instance-action" and meta.notice:
                        return self._send(200, json.dumps({"action": "terminate", "time": "2026-11-23T18:02:00Z"}))
                    if p == "/latest/meta-data/events/recommendations/rebalance" and meta.rebalance:
                        return self._send(200, json.dumps({"noticeTime": "2026-11-23T18:00:00Z"}))
                    return self._send(404)
                if p == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    return self._send(200, "TRUE" if meta.notice else "FALSE")
                if p.startswith("/metadata/scheduledevents"):
                    if self.headers.get("Metadata") != "true":
                        return self._send(400)
                    events = [{"EventId": "1", "EventType": "Freeze", "Resources": ["vm-other"]}]
                    if meta.notice:
                        events.append({"EventId": "2", "EventType": "Preempt", "Resources": ["fleet-vm-1"],
                                       "NotBefore": "Mon, 23 Nov 2026 18:02:00 GMT"})
                    return self._send(200, json.dumps({"DocumentIncarnation": 2, "Events": events}))
                self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def md():
    m = Metadata()
    yield m
    m.server.shutdown()


def test_aws_spot_instance_action_and_rebalance(md):
    src = AwsNotice(md.url)
    assert src.check() is None
    md.rebalance = True
    assert src.check() == "AWS rebalance recommendation"
    md.notice = True
    assert src.check() == "AWS spot terminate at 2026-11-23T18:02:00Z"


def test_gce_preempted(md):
    src = GceNotice(md.url)
    assert src.check() is None
    md.notice = True
    assert src.check() == "GCE preemption"


def test_azure_preempt_event_for_this_vm_only(md):
    assert AzureNotice("fleet-vm-1", md.url).check() is None
    md.notice = True
    assert AzureNotice("fleet-vm-1", md.url).check() == "Azure Preempt at Mon, 23 Nov 2026 18:02:00 GMT"
    assert AzureNotice("fleet-vm-2", md.url).check() is None


def test_azure_preempt_event_for_the_vm_the_bootstrap_names_by_its_arm_id(md):
    """The bootstrap passes the agent the VM's ARM id (AzureProvider vm_id); Scheduled Events' `Resources` lists
    VM names ("List of resources this event affects", e.g. ["FrontEnd_IN_0", "BackEnd_IN_0"]: Microsoft's Scheduled
    Events for Linux VMs). A Preempt naming this VM is this VM's notice, whichever spelling of the id is passed."""
    arm = "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/fleet-vm-1"
    assert AzureNotice(arm, md.url).check() is None
    md.notice = True
    assert AzureNotice(arm, md.url).check() == "Azure Preempt at Mon, 23 Nov 2026 18:02:00 GMT"
    assert AzureNotice(arm.replace("fleet-vm-1", "fleet-vm-2"), md.url).check() is None


def test_an_unreachable_metadata_service_is_no_notice_and_no_stall():
    assert AwsNotice("http://127.0.0.1:9").check() is None and GceNotice("http://127.0.0.1:9").check() is None


def test_sim_notice_file(tmp_path):
    src = FileNotice(tmp_path / "notice.json")
    assert src.check() is None
    (tmp_path / "notice.json").write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
    assert src.check() == "spot-interruption notice at now"


def test_instance_id_from_ec2_metadata(md):
    assert instance_id_from_metadata("aws", md.url) == "i-0abc123"
    with pytest.raises(ReconcileError, match="cannot read the instance id"):
        instance_id_from_metadata("aws", "http://127.0.0.1:9")
