"""`reconcile report`: one self-contained HTML page, opened in a real browser (Debian's chromium, driven by
Playwright) with the network off: it renders every plot, logs no console error, and the plots carry the
numbers the apply wrote to status/."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from reconciler.cli import app
from tests.fleetkit import copy_example

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLOTS = ("gpus-per-pool", "cost-per-tenant", "instances-per-zone", "pending-by-reason", "gpu-map")


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """examples/ml-platform applied on the sim (MIG, gangs, three tenants), its report and its status."""
    cfg = copy_example(tmp_path_factory.mktemp("report"), "ml-platform")
    (cfg / "jobs" / "too-big.yaml").write_text(yaml.safe_dump({  # more than research's quota: pending on it
        "apiVersion": "fleetops.io/v1alpha1", "kind": "Job", "metadata": {"name": "too-big"},
        "spec": {"tenant": "research", "replicas": 40, "resources": {"gpus": 8, "gpu_type": "A100", "cpu": 90, "memory_gib": 1000}}}))
    assert cli("apply", cfg, "--auto-approve").exit_code == 0
    out = cfg.parent / "report.html"
    r = cli("report", cfg, "--out", out)
    assert r.exit_code == 0, r.output
    return cfg, out


def test_report_is_one_file_that_loads_nothing(fleet):
    _, out = fleet
    page = out.read_text()
    assert page.count("<script") >= 5
    assert not re.search(r"<script[^>]+src=", page), "a script loaded from elsewhere"
    assert not re.search(r"<link[^>]+href=", page), "a stylesheet loaded from elsewhere"


def test_report_summary_counts_a_job_without_run_reserved_as_status_does(fleet):
    """ml-platform's jobs have no `run`: placed, nothing started. The summary said "N jobs running"."""
    cfg, out = fleet
    counts = yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"]["jobs"]
    summary = re.search(r'<p id="summary">([^<]*)</p>', out.read_text()).group(1)
    assert counts["running"] == 0 and counts["reserved"] >= 10, counts
    assert f"0 jobs running, {counts['reserved']} reserved, {counts['pending']} not running;" in summary, summary


def _browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium (apt-get install chromium)")
        pytest.skip("chromium is not installed here (apt-get install chromium); CI installs it and runs this test")
    from playwright.sync_api import sync_playwright

    return sync_playwright()


def test_report_renders_offline_in_chromium_with_the_plans_numbers(fleet):
    cfg, out = fleet
    status = yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"]
    jobs = {p.stem: yaml.safe_load(p.read_text())["status"] for p in (cfg / "status" / "jobs").glob("*.yaml")}
    with _browser() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(offline=True)
            requests, problems = [], []
            context.route(re.compile(r"^(?!file:).*"), lambda route: (requests.append(route.request.url), route.abort()))
            page = context.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(out.as_uri(), wait_until="load", timeout=120_000)
            for plot in PLOTS:  # plotly has drawn each: an SVG with its marks
                page.wait_for_selector(f"#plot-{plot} svg.main-svg", timeout=120_000)
            texts = {p: page.inner_text(f"#{p}") + " " + page.eval_on_selector(f"#plot-{p}", "e => e.textContent") for p in PLOTS}
            data = {p: page.evaluate(f"document.getElementById('plot-{p}').data") for p in PLOTS}
        finally:
            browser.close()
    assert not problems, problems
    assert not requests, requests

    # $/h per tenant: the bars carry the status's charges (the ledger's, computed apart from the report).
    bars = data["cost-per-tenant"][0]
    for tenant, c in status["tenants"].items():
        i = bars["x"].index(tenant)
        assert bars["y"][i] == pytest.approx(c["hourlyCost"], abs=0.01)
        assert f"${c['hourlyCost']:,.2f}" in texts["cost-per-tenant"]
    # Instances: as many as status counts; GPUs allocated + idle = all GPUs of each pool.
    assert sum(sum(t["y"]) for t in data["instances-per-zone"]) == status["instances"]
    alloc, idle = data["gpus-per-pool"]
    assert alloc["name"] == "allocated" and idle["name"] == "idle"
    # The GPU map: each replica sits on the GPU indices the plan gives it (a plan right after the apply keeps all).
    kept = json.loads(cli("plan", cfg, "--format", "json").output)
    gmap = data["gpu-map"][0]
    rows = {row.split(" ")[0]: ts for row, ts in zip(gmap["y"], gmap["text"])}
    checked = 0
    for j in kept["jobs"]:
        for r, (iid, gpus) in enumerate(zip(j["instances"], j["gpus"])):
            for g in gpus:
                assert f"{j['job']}/{r}" in rows[iid][g].split("+"), (j["job"], r, iid, g, rows[iid])
                checked += 1
    assert checked >= 20
    assert sum(t not in ("idle", "", "MIG") for ts in rows.values() for t in ts) == checked
    # Pending jobs: the bars add up to the jobs status reports pending.
    pending = data["pending-by-reason"][0]
    assert sum(pending["y"]) == status["jobs"]["pending"] >= 1
    assert "quota" in pending["x"] and jobs["too-big"]["conditions"][0]["message"].startswith("quota")
