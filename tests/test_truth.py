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


# ---------------------------------------------------------------- 4. validation matches planning


def _refusing_configs():
    from tests.fleetkit import doc, job, pool, tenant, topology

    base = [topology(), tenant("t"), job("j", cpu=2, mem=4)]
    cpu = pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=4)
    excluded = pool("warm", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], lo=1, hi=2)
    yield "allowed_clouds", base + [cpu, excluded, doc("GuardrailPolicy", "g", {"allowed_clouds": ["aws"]})], "allowed_clouds"
    warm = pool("warm", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=3, hi=4)
    yield "budget", base + [warm, doc("GuardrailPolicy", "g", {"max_hourly_budget": 0.2})], "max_hourly_budget"
    spot = pool("warm", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], market="spot", lo=1, hi=2)
    yield "spot price", base + [cpu, spot, doc("SpotPolicy", "s", {"max_price_fraction": 0.01})], "max_price_fraction"


@pytest.mark.parametrize("case", list(_refusing_configs()), ids=lambda c: c[0])
def test_validate_reports_first_what_plan_refuses_for_config_reasons(tmp_path, case):
    """A pool whose min_instances can never be bought made every plan fail with a message that
    never named the rule (e.g. allowed_clouds), while `reconcile validate` said ok."""
    from typer.testing import CliRunner

    from reconciler.cli import app
    from reconciler.errors import ReconcileError
    from tests.fleetkit import write_config

    name, docs, rule = case
    cfg = write_config(tmp_path / name, docs)
    out = CliRunner().invoke(app, ["validate", str(cfg)])
    assert out.exit_code == 1, out.output
    assert rule in out.output and "fleet.yaml:" in out.output and "min_instances" in out.output + rule, out.output
    with pytest.raises(ReconcileError):
        api.plan(cfg, time_limit=2)  # planning refuses it too: validate is not stricter than plan
