"""Reliability: broken input never crashes or reaches a provider; secrets never leak;
killed applies never duplicate or leak instances."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from providers.sim import SimCloud
from reconciler import api
from reconciler.cli import app
from reconciler.errors import ConfigError
from reconciler.load import load
from reconciler.state import state_dir
from tests.fleetkit import QUICKSTART, copy_quickstart

runner = CliRunner()
DOCS = [d for f in sorted(QUICKSTART.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
BAD_VALUES = [None, -1, -0.5, 10**15, "", "x" * 300, [], {}, True, "8", [1, 2], {"a": 1}, 1e308, float("nan")]


def _paths(node, prefix=()):
    """Every path to a value in a document."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    for p in path[:-1]:
        doc = doc[p]
    if value is _DELETE:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


_DELETE = object()


@st.composite
def broken_configs(draw):
    docs = copy.deepcopy(DOCS)
    i = draw(st.integers(0, len(docs) - 1))
    kind = draw(st.sampled_from(["value", "delete", "extra", "duplicate", "reference", "text"]))
    paths = [p for p in _paths(docs[i]) if p]
    path = draw(st.sampled_from(paths))
    text_cut = None
    if kind == "value":
        _set(docs[i], path, draw(st.sampled_from(BAD_VALUES)))
    elif kind == "delete":
        _set(docs[i], path, _DELETE)
    elif kind == "extra":
        target = docs[i]
        for p in path[:-1]:
            target = target[p]
        if isinstance(target, dict):
            target[draw(st.sampled_from(["colour", "gpuz", "Replicas"]))] = 1
        else:
            _set(docs[i], path, {"unexpected": True})
    elif kind == "duplicate":
        docs.append(copy.deepcopy(docs[i]))
    elif kind == "reference":
        if docs[i]["kind"] == "Job":
            docs[i]["spec"][draw(st.sampled_from(["tenant", "pools"]))] = draw(st.sampled_from(["ghost", ["ghost"]]))
        else:
            docs[i]["metadata"]["name"] = draw(st.sampled_from(["Bad_Name", "-x", "a" * 80]))
    else:
        text_cut = draw(st.integers(1, 400))
    return docs, i, text_cut


def _write(dirpath: Path, docs, cut):
    dirpath.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)
    if cut is not None:
        # Corrupt the text: cut it mid-way and splice in a stray indentation/flow error.
        text = text[:cut] + "\n  - : [\n" + text[cut:]
    (dirpath / "fleet.yaml").write_text(text)


TRIED = {"generated": 0}


# (new configs every run: 300 -> 150 in CI on 2026-12-03, 8.1 s of CPU; the slow tier draws 1,500 below)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=broken_configs())
def test_broken_configs_fail_cleanly(tmp_path_factory, case):
    _assert_fails_cleanly(tmp_path_factory, case)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=broken_configs())
def test_broken_configs_fail_cleanly_many_more(tmp_path_factory, case):
    _assert_fails_cleanly(tmp_path_factory, case)


def _assert_fails_cleanly(tmp_path_factory, case) -> None:
    """A broken config loads, or fails with diagnostics naming fleet.yaml, a line and a field; never writes state."""
    docs, _, cut = case
    d = tmp_path_factory.mktemp("cfg")
    _write(d, docs, cut)
    TRIED["generated"] += 1
    try:
        load(d)
    except ConfigError as e:
        assert e.diagnostics
        for diag in e.diagnostics:
            assert diag.file in ("fleet.yaml", "<config>") and diag.line >= 0 and diag.field and diag.message
    # Some mutations are harmless (e.g. deleting an optional field): loading may succeed.
    assert not (d / ".reconcile").exists()


def test_bad_config_reaches_no_provider_and_exits_1(tmp_path):
    cfg = copy_quickstart(tmp_path)
    (cfg / "pools.yaml").write_text((cfg / "pools.yaml").read_text().replace("max_instances: 3", "max_instances: -3"))
    for args in (["plan", cfg], ["apply", cfg, "--auto-approve"], ["validate", cfg]):
        out = runner.invoke(app, [str(a) for a in args])
        assert out.exit_code == 1
        assert "pools.yaml:10: Pool/aws-a100: spec.max_instances: Input should be greater than or equal to 0" in out.output
    assert not state_dir(cfg).exists()  # no provider was ever constructed



def test_a_bad_config_is_reported_on_stdout_in_the_format_asked_for(tmp_path):
    """`plan --format json` or `--format markdown` on a config that does not validate printed nothing on stdout (the
    errors went to stderr only): a PR's plan comment, built from stdout, was empty, and a JSON consumer had nothing to
    parse. stdout carries the errors in the format asked for; stderr and the exit code are as before."""
    import json

    cfg = copy_quickstart(tmp_path)
    (cfg / "pools.yaml").write_text((cfg / "pools.yaml").read_text().replace("max_instances: 3", "max_instances: -3"))
    where = "pools.yaml:10: Pool/aws-a100: spec.max_instances: Input should be greater than or equal to 0"
    out = runner.invoke(app, ["plan", str(cfg), "--format", "json"])
    assert out.exit_code == 1 and where in out.stderr, out.stderr
    doc = json.loads(out.stdout)
    diag = doc["error"]["diagnostics"][0]
    assert doc["error"]["type"] == "ConfigError" and diag["file"] == str(cfg / "pools.yaml") and diag["line"] == 10, doc
    assert (diag["kind"], diag["name"], diag["field"]) == ("Pool", "aws-a100", "spec.max_instances"), doc
    out = runner.invoke(app, ["plan", str(cfg), "--format", "markdown"])
    assert out.exit_code == 1 and "does not validate" in out.stdout and where in out.stdout, out.stdout
    out = runner.invoke(app, ["plan", str(cfg)])
    assert out.exit_code == 1 and out.stdout == "" and where in out.stderr  # (human: stderr alone, as before)
    assert not state_dir(cfg).exists()


def test_a_json_config_error_names_files_alike_in_its_message_and_its_diagnostics(tmp_path):
    """`plan --format json` named the file as DIR/path in `diagnostics[].file` (and on stderr) but as a path inside the
    config dir in `message` (`pools.yaml:10: ...`): one document, two names for one file. Both now name it as stderr does."""
    import json

    cfg = copy_quickstart(tmp_path)
    (cfg / "pools.yaml").write_text((cfg / "pools.yaml").read_text().replace("max_instances: 3", "max_instances: -3"))
    out = runner.invoke(app, ["plan", str(cfg), "--format", "json"])
    err = json.loads(out.stdout)["error"]
    where = f"{cfg / 'pools.yaml'}:10: Pool/aws-a100: spec.max_instances:"
    assert out.exit_code == 1 and where in out.stderr, out.stderr
    assert err["diagnostics"][0]["file"] == str(cfg / "pools.yaml"), err
    assert err["message"].startswith("1 error in desired state:\n") and where in err["message"], err["message"]


SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-9f8e7d",
    "AWS_SESSION_TOKEN": "planted-session-token-1a2b3c",
    "AZURE_CLIENT_SECRET": "planted-azure-secret-4d5e6f",
    "GOOGLE_APPLICATION_CREDENTIALS_JSON": "planted-gcp-key-7a8b9c",
    "GITHUB_TOKEN": "planted-github-token-0z9y",
}


def test_secrets_never_appear_in_plans_status_or_errors(tmp_path, monkeypatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    cfg = copy_quickstart(tmp_path)
    outputs = []
    for args in (["plan", cfg], ["plan", cfg, "--format", "json", "--out", tmp_path / "p.json"], ["plan", cfg, "--format", "markdown"],
                 ["apply", cfg, "--auto-approve"], ["status", cfg], ["status", cfg, "--format", "json"],
                 ["plan", cfg, "--provider", "nope"], ["unlock", "x", "--dir", cfg], ["apply", cfg, "--plan", tmp_path / "p.json"]):
        res = runner.invoke(app, [str(a) for a in args])
        outputs.append(res.output)
    SimCloud(state_dir(cfg)).exhaust("us-east-1a")
    (cfg / "jobs" / "platform.yaml").write_text((cfg / "jobs" / "platform.yaml").read_text().replace("cpu: 14", "cpu: 15"))
    outputs.append(runner.invoke(app, ["apply", str(cfg), "--auto-approve"]).output)  # a partial failure
    files = [p.read_text(errors="replace") for p in cfg.rglob("*") if p.is_file()] + [(tmp_path / "p.json").read_text()]
    blob = "\n".join(outputs + files)
    assert "Applied plan" in blob and "InsufficientCapacity" in blob  # the runs did happen
    for name, value in SECRETS.items():
        assert value not in blob, f"{name} leaked"


def _kill_after_creates(cfg: Path, n: int) -> int:
    """Start an apply on a slow sim cloud, SIGKILL it once n instances exist; return how many exist."""
    SimCloud(state_dir(cfg)).set_fault(latency_ms=60)
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "apply", str(cfg), "--auto-approve"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if len([i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]) >= n:
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    SimCloud(state_dir(cfg)).set_fault(latency_ms=0)
    return len([i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"])


def _assert_converged_without_leaks(cfg: Path) -> None:
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve"]).exit_code == 0
    res = api.plan(cfg)
    assert not res.plan.has_changes
    live = [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]
    keys = [i["tags"]["fleetops.io/create-key"] for i in live]
    assert len(keys) == len(set(keys)), "duplicate instance"
    hosting = {i for j in res.plan.jobs for i in j.instances}
    mins = {n for n, p in res.desired.pools.items() if p.spec.min_instances}
    leaked = [i["id"] for i in live if i["id"] not in hosting and i["tags"]["fleetops.io/pool"] not in mins]
    assert not leaked, f"leaked {leaked}"
    st = yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"]
    assert st["instances"] == len(live) and st["jobs"]["pending"] == 0


@pytest.mark.parametrize("kill_at", [1, 5, 9])
def test_sigkill_mid_apply_then_rerun(tmp_path, kill_at):
    cfg = copy_quickstart(tmp_path)
    _kill_after_creates(cfg, kill_at)
    _assert_converged_without_leaks(cfg)


@pytest.mark.slow
def test_sigkill_at_twenty_points_including_heal(tmp_path):
    """20 kill points: during the first build-out and during a heal after interruptions."""
    points = 0
    for k in range(1, 11):
        cfg = copy_quickstart(tmp_path / f"build{k}")
        _kill_after_creates(cfg, k)
        _assert_converged_without_leaks(cfg)
        points += 1
    base = copy_quickstart(tmp_path / "heal")
    _assert_converged_without_leaks(base)
    for k in range(10):
        cfg = tmp_path / f"heal{k}"
        shutil.copytree(base, cfg)
        live = [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]
        for inst in live[: 1 + k % 4]:
            SimCloud(state_dir(cfg)).interrupt(inst["id"])
        _kill_after_creates(cfg, len(live) - (1 + k % 4) + 1)
        _assert_converged_without_leaks(cfg)
        points += 1
    assert points == 20


@pytest.mark.parametrize("args", [["explain", "{cfg}", "nosuchjob"], ["explain", "{cfg}", "train-llama"], ["status", "{cfg}"],
                                  ["plan", "{cfg}"]])
def test_every_command_taking_format_json_answers_an_error_as_the_json_error_document(tmp_path, args):
    """`status --format json` and `explain --format json` printed nothing on stdout on an error (plan and diff printed
    the JSON error document): a CI script parsing stdout had nothing to read."""
    import json

    cfg = copy_quickstart(tmp_path)
    if "nosuchjob" not in args:
        (cfg / "pools.yaml").write_text((cfg / "pools.yaml").read_text().replace("max_instances: 3", "max_instances: -3"))
        (cfg / "status").mkdir(exist_ok=True)
        (cfg / "status" / "fleet.yaml").write_text("a: &x [1]\nb: *x\n")
    out = runner.invoke(app, [a.format(cfg=cfg) for a in args] + ["--format", "json"])
    assert out.exit_code == 1, out.output
    err = json.loads(out.stdout)["error"]
    assert err["type"] and err["message"] and out.stderr, (err, out.stderr)
