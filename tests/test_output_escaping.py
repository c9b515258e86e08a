"""Lines the CLI prints beside its errors quote text it did not write: an instance id and the replicas an agent's report
lists (any instance's agent may write the bus), a run record's reason and message (`reconcile logs`' headers), a
provider's words in the controller's log. Printed raw, such text rewrote the terminal (an escape sequence, a `\\r`)
or, in a CI log, was a workflow command GitHub's runner acts on (`##[set-output ...]`, `::add-mask::`). Each goes through
the one helper the errors do (cli._said: redacted, controls and workflow commands escaped)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from typer.testing import CliRunner

from reconciler.backend import backend_for
from reconciler.cli import app
from reconciler.runtime.bus import Bus, now_unix
from reconciler.runtime.checkpoints import manifest_prefix
from tests.fleetkit import copy_quickstart

HOSTILE = "i-x\x1b]0;pwned\x07\r##[set-output name=safe;]yes"


def raw(text: str) -> list[str]:
    """What of HOSTILE reached the output as it is: a control character or a workflow command."""
    return [bad for bad in ("\x1b", "\x07", "\r", "##[") if bad in text] + [
        line for line in text.splitlines() if line.lstrip().startswith("::")]


def test_apply_notes_quoting_an_agents_report_are_printed_escaped(tmp_path):
    """A note of `apply` names the instance whose agent still lists a removed job's replica: the instance id is the
    bus key the report was written under."""
    cfg = copy_quickstart(tmp_path)
    store = backend_for(cfg, None)
    store.write_key(f"{manifest_prefix('gone')}/1.json", b"{}")  # a checkpoint of a job the config does not have
    Bus(store).put_agent(HOSTILE, {"heartbeat_at": now_unix(), "state": "Ready", "running": ["gone/0"]})
    res = CliRunner().invoke(app, ["apply", str(cfg), "--auto-approve"])
    assert res.exit_code == 0, res.output
    assert "checkpoints of removed job gone kept" in res.output, res.output
    assert "i-x\\x1b]0;pwned\\x07\\r#\\x23[set-output" in res.output and not raw(res.output), res.output


def test_logs_headers_quoting_a_run_record_are_printed_escaped(tmp_path):
    """`reconcile logs`' headers show the run record's instance, reason and message: an agent's words."""
    Bus(backend_for(tmp_path, None)).put_run("j", 0, {
        "job": "j", "replica": 0, "instance": HOSTILE, "phase": "Failed", "reason": "Error",
        "message": f"exit 1: {HOSTILE}\n::add-mask::x", "terminal": True, "log_tail": []})
    res = CliRunner().invoke(app, ["logs", str(tmp_path), "j"])
    assert "--- j/0: Failed (Error: exit 1: i-x\\x1b]0;pwned" in res.stderr, res.stderr
    assert not raw(res.stderr) and "\\x3a:add-mask::x)" in res.stderr, res.stderr


def test_the_controllers_log_quoting_an_error_is_printed_escaped(tmp_path):
    """The controller logs each error it meets and goes on (it does not exit through the CLI's error path): the state
    directory committed as a link, its target the PR's choice, was logged raw."""
    cfg = copy_quickstart(tmp_path)
    (cfg / ".reconcile").symlink_to(HOSTILE)
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "controller", str(cfg), "--poll", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        out = b""
        deadline = time.monotonic() + 30
        while b"cannot read the state" not in out and time.monotonic() < deadline:
            out += proc.stdout.readline()
    finally:
        proc.terminate()
        out += proc.communicate(timeout=30)[0]
    text = out.decode()
    assert "controller: cannot read the state" in text and "i-x\\x1b]0;pwned" in text, text
    assert not raw(text), text


def test_an_apply_progress_line_naming_a_clouds_instance_id_is_printed_escaped(tmp_path):
    """A delete's target is an instance id read back from the cloud (any text a tag-matching instance has); its
    progress line was printed as it came."""
    import io

    from reconciler import api
    from reconciler.apply import ApplyEvent
    from reconciler.progress import ApplyProgress

    plan = api.plan(copy_quickstart(tmp_path), time_limit=0).plan
    out = io.StringIO()
    with ApplyProgress(plan, out, live=False, color=False) as progress:
        progress(ApplyEvent("finished", "delete", HOSTILE, "spot g5.xlarge in us-east-1b", 0.1))
    assert "deleted i-x\\x1b]0;pwned" in out.getvalue() and not raw(out.getvalue()), out.getvalue()
