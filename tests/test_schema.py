"""`reconcile schema`: one JSON Schema (draft 2020-12) for any single config document, checked by a standard
validator (the jsonschema package), not by our own code: every example validates, typos and wrong kinds do not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from reconciler.cli import app

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    out = CliRunner().invoke(app, ["schema"])
    assert out.exit_code == 0, out.output
    schema = json.loads(out.output)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _as_json(doc):
    """What an editor or check-jsonschema sees: YAML timestamps are strings to a JSON Schema."""
    return json.loads(json.dumps(doc, default=str))


def example_documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(ROOT.glob("examples/**/*.y*ml")):
        rel = path.relative_to(ROOT)
        if any(p.startswith(".") or p == "status" for p in rel.parts):
            continue
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((f"{rel}#{i}", _as_json(doc)))
    return out


def test_every_example_document_validates(validator):
    docs = example_documents()
    kinds = {d["kind"] for _, d in docs}
    assert kinds == {"Topology", "Tenant", "Pool", "Job", "SpotPolicy", "GuardrailPolicy", "PlacementPolicy"}
    bad = {where: [e.message for e in validator.iter_errors(d)] for where, d in docs if not validator.is_valid(d)}
    assert not bad, bad


def _job() -> dict:
    return next(copy.deepcopy(d) for _, d in example_documents() if d["kind"] == "Job" and d["spec"].get("replicas", 1) > 1)


def _errors(validator, doc) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_a_typo_in_a_field_is_rejected(validator):
    doc = _job()
    doc["spec"]["replicsa"] = doc["spec"].pop("replicas")
    errs = _errors(validator, doc)
    assert any("replicsa" in e for e in errs), errs


def test_a_typo_deeper_down_is_rejected(validator):
    doc = _job()
    doc["spec"]["resources"]["gpu_typ"] = "A100"
    assert any("gpu_typ" in e for e in _errors(validator, doc))


@pytest.mark.parametrize("kind", ["Jobs", "job", "Deployment", None])
def test_an_unknown_kind_is_rejected(validator, kind):
    doc = _job()
    doc["kind"] = kind
    assert not validator.is_valid(doc)


def test_a_document_of_one_kind_with_another_kinds_spec_is_rejected(validator):
    doc = _job()
    doc["kind"] = "Pool"
    errs = _errors(validator, doc)
    assert errs and any("spec" in e for e in errs), errs


def test_wrong_api_version_wrong_types_and_missing_fields_are_rejected(validator):
    doc = _job()
    doc["apiVersion"] = "fleetops.io/v2"
    assert not validator.is_valid(doc)
    doc = _job()
    doc["spec"]["replicas"] = "two"
    assert not validator.is_valid(doc)
    doc = _job()
    del doc["metadata"]
    assert not validator.is_valid(doc)
    doc = _job()
    doc["spec"]["priority"] = "urgent"
    assert not validator.is_valid(doc)
    doc = _job()
    doc["metadata"]["name"] = "Not_A_Name"
    assert not validator.is_valid(doc)


def test_validate_suggests_the_field_and_kind_meant(tmp_path):
    """The same typos in `reconcile validate`: a "did you mean", with the path as typed."""
    from tests.fleetkit import copy_quickstart

    cfg = copy_quickstart(tmp_path)
    doc = _job()
    doc["metadata"]["name"] = "typo"
    doc["spec"]["replicsa"] = doc["spec"].pop("replicas")
    other = copy.deepcopy(doc)
    other["metadata"]["name"] = "typo2"
    other["kind"] = "Jbo"
    (cfg / "jobs" / "typo.yaml").write_text(yaml.safe_dump_all([doc, other]))
    out = CliRunner().invoke(app, ["validate", str(cfg)])
    assert out.exit_code == 1
    assert f"{cfg / 'jobs' / 'typo.yaml'}:" in out.output
    assert "spec.replicsa: unknown field (did you mean 'replicas'?)" in out.output
    assert "unknown kind 'Jbo' (did you mean 'Job'?)" in out.output


def test_a_near_tie_suggests_the_field_the_typo_begins(tmp_path):
    """`gpu` is one edit from `cpu` and from `gpus`: the hint names `gpus`, the field it is the start of (it
    said 'cpu', the alphabetical first); `cpus` still gets `cpu`."""
    from tests.fleetkit import job, tenant, topology, write_config

    j = job("j", gpus=1)
    j["spec"]["resources"]["gpu"] = j["spec"]["resources"].pop("gpus")
    k = job("k")
    k["spec"]["resources"]["cpus"] = k["spec"]["resources"].pop("cpu")
    write_config(tmp_path, [topology(), {**tenant("t"), "spec": {"quota": {"gpu": 2}}}, j, k])
    out = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert out.exit_code == 1
    assert "Tenant/t: spec.quota.gpu: unknown field (did you mean 'gpus'?)" in out.output, out.output
    assert "Job/j: spec.resources.gpu: unknown field (did you mean 'gpus'?)" in out.output, out.output
    assert "Job/k: spec.resources.cpus: unknown field (did you mean 'cpu'?)" in out.output, out.output


def test_a_tab_in_indentation_is_named(tmp_path):
    from tests.fleetkit import copy_quickstart

    cfg = copy_quickstart(tmp_path)
    (cfg / "jobs" / "tabbed.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata:\n\tname: x\nspec: {tenant: research}\n")
    out = CliRunner().invoke(app, ["validate", str(cfg)])
    assert out.exit_code == 1
    line = next(x for x in out.output.splitlines() if "tabbed.yaml" in x)
    assert line.startswith(f"{cfg / 'jobs' / 'tabbed.yaml'}:4: invalid YAML:"), line  # no `-: <yaml>:`
    assert "indented with a tab" in line


def _rule_docs() -> list[dict]:
    """The issue-17 kinds and fields, as the README shows them."""
    lic = {"apiVersion": "fleetops.io/v1alpha1", "kind": "License", "metadata": {"name": "matlab"},
           "spec": {"count": 50, "tenant_quotas": {"research": 20}, "cost_per_hour": 1.2}}
    res = {"apiVersion": "fleetops.io/v1alpha1", "kind": "Reservation", "metadata": {"name": "p4d-2026"},
           "spec": {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p4d.24xlarge", "count": 4,
                    "hourly_cost": 19.2, "until": "2027-01-01", "target": {"reservation_id": "cr-0abc1234"}}}
    job = _job()
    job["spec"]["licenses"] = {"matlab": 1}
    job["spec"]["deadline"] = "2026-12-01T00:00:00Z"
    return [lic, res, job]


def test_licenses_reservations_and_deadlines_validate_and_their_typos_do_not(validator):
    for d in _rule_docs():
        assert validator.is_valid(d), _errors(validator, d)
    lic, res, job = _rule_docs()
    lic["spec"]["cuont"] = lic["spec"].pop("count")
    assert any("cuont" in e for e in _errors(validator, lic))
    res["spec"]["count"] = 0
    assert not validator.is_valid(res)
    res = _rule_docs()[1]
    res["spec"]["target"] = {"id": "cr-1"}
    assert not validator.is_valid(res)
    job["spec"]["licenses"] = {"matlab": 0}
    assert not validator.is_valid(job)
    job["spec"]["licenses"] = {"Not A Name": 1}
    assert not validator.is_valid(job)


def test_the_readme_config_example_is_a_config_that_validates(tmp_path, validator):
    """README's "The config repo in 30 seconds" is a whole config repo in one block: a newcomer copies it. Each of its
    documents validates against the schema, and the block as one file passes `reconcile validate`."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The config repo in 30 seconds", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    docs = [d for d in yaml.safe_load_all(block) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Topology", "Tenant", "Pool", "Job", "SpotPolicy", "GuardrailPolicy", "PlacementPolicy"} <= kinds, kinds
    for d in docs:
        assert validator.is_valid(_as_json(d)), _errors(validator, _as_json(d))
    (tmp_path / "fleet.yaml").write_text(block)
    out = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert out.exit_code == 0 and out.output.startswith("ok: fleet quickstart: 1 tenants, 1 pools, 1 jobs"), out.output
