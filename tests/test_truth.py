"""Every number and reason the tool tells a user is true of the plan it emits (issue 19):
tenant charges in status/, pending reasons, explain's what-ifs, validation, spot ballast."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from reconciler import api
from tests.fleetkit import ROOT
from tests.invariants import tenant_costs


def _example(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(ROOT / "examples" / name, dst, ignore=shutil.ignore_patterns(".reconcile", "status"))
    return dst


def test_status_charges_mig_replicas_what_the_plan_charges_them(tmp_path):
    """ml-platform's MIG inference (product) was charged $0 in status/ ($29.64/h for product
    against $32.52/h the tenant budget counts); every tenant's status cost is now the plan's."""
    cfg = _example(tmp_path, "ml-platform")
    planned = api.plan(cfg, time_limit=10)
    want = tenant_costs(planned.desired, planned.observed, planned.plan)
    api.apply(cfg, saved_plan=planned.plan)
    status = yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"]
    for t, c in want.items():
        assert status["tenants"][t]["hourlyCost"] == pytest.approx(c, abs=0.01), t
    assert status["tenants"]["product"]["hourlyCost"] > 30
    jobs = {p.stem: yaml.safe_load(p.read_text())["status"] for p in (cfg / "status" / "jobs").glob("*.yaml")}
    mig = [j for j, s in jobs.items() if s["tenant"] == "product" and s["instances"]]
    assert sum(jobs[j]["hourlyCost"] for j in mig) == pytest.approx(want["product"], abs=0.01)
