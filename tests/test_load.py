"""Loading and validating the desired state: every error at once, with file, line and field."""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from reconciler.cli import app
from reconciler.errors import ConfigError, Diagnostic
from reconciler.load import load
from tests.fleetkit import QUICKSTART, job, pool, tenant, topology, write_config


def errors_of(path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load(path)
    return [str(d) for d in e.value.diagnostics]


def test_quickstart_loads():
    d = load(QUICKSTART)
    assert d.fleet == "quickstart"
    assert len(d.jobs) == 10 and len(d.tenants) == 3 and len(d.pools) == 6
    assert d.jobs["llm-pretrain"].spec.replicas == 2
    assert d.spot_policy.max_spot_fraction == 0.5


def test_digest_changes_with_content_not_with_file_layout(tmp_path):
    docs = [topology(), tenant("t", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]), job("j", gpus=1, gpu_type="A10G")]
    a = load(write_config(tmp_path / "a", docs)).digest
    split = tmp_path / "b"
    split.mkdir()
    for i, d in enumerate(docs):
        (split / f"{i}.yaml").write_text(yaml.safe_dump(d))
    assert load(split).digest == a
    docs[-1]["spec"]["resources"]["gpus"] = 2
    docs[-1]["spec"]["resources"]["cpu"] = 2
    assert load(write_config(tmp_path / "c", docs)).digest != a


def test_every_error_reported_with_file_line_and_field(tmp_path):
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    (tmp_path / "jobs.yaml").write_text(
        "apiVersion: fleetops.io/v1alpha1\n"
        "kind: Job\n"
        "metadata: {name: train}\n"
        "spec:\n"
        "  tenant: nobody\n"                      # line 5: unknown tenant
        "  resources:\n"
        "    gpus: \"8\"\n"                       # line 7: a string is not an int
        "    gpu_type: A100\n"
        "  colour: blue\n"                        # line 9: unknown field
        "---\n"
        "apiVersion: fleetops.io/v1alpha1\n"
        "kind: Job\n"
        "metadata: {name: infer}\n"
        "spec:\n"
        "  tenant: nobody\n"                      # line 15
        "  resources: {gpus: 1, gpu_type: Z9000}\n"  # line 16: nothing offers it
        "  pools: [ghost]\n"                      # line 17: unknown pool
    )
    errs = errors_of(tmp_path)
    assert "jobs.yaml:7: Job/train: spec.resources.gpus: Input should be a valid integer" in errs
    assert "jobs.yaml:9: Job/train: spec.colour: unknown field" in errs
    assert "jobs.yaml:15: Job/infer: spec.tenant: unknown tenant 'nobody'" in errs
    assert "jobs.yaml:17: Job/infer: spec.pools.0: unknown pool 'ghost'" in errs
    assert any(e.startswith("jobs.yaml:16: Job/infer: spec.resources.gpu_type: no pool offers gpu_type 'Z9000'") for e in errs)


def test_bad_yaml_names_the_line(tmp_path):
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology()))
    (tmp_path / "broken.yaml").write_text("kind: Tenant\nmetadata:\n  name: [unclosed\n")
    errs = errors_of(tmp_path)
    assert any(e.startswith("broken.yaml:") and "invalid YAML" in e for e in errs), errs


def test_duplicate_names_and_keys(tmp_path):
    write_config(tmp_path, [topology(), tenant("a"), tenant("a")])
    (tmp_path / "dup.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Tenant\nkind: Tenant\nmetadata: {name: b}\nspec: {}\n")
    errs = errors_of(tmp_path)
    assert any("metadata.name: duplicate Tenant name (first defined at fleet.yaml" in e for e in errs), errs
    assert any(e.startswith("dup.yaml:3:") and "duplicate key 'kind'" in e for e in errs), errs


@pytest.mark.parametrize(
    "spec_patch,field,fragment",
    [
        ({"replicas": 0}, "spec.replicas", "greater than or equal to 1"),
        ({"resources": {"gpus": -1, "gpu_type": "A100"}}, "spec.resources.gpus", "greater than or equal to 0"),
        ({"resources": {"gpus": 10**12, "gpu_type": "A100"}}, "spec.resources.gpus", "less than or equal"),
        ({"resources": {"gpus": 1}}, "spec.resources", "gpu_type is required"),
        ({"spot": "sometimes"}, "spec.spot", "Input should be"),
        ({"priority": "urgent"}, "spec.priority", "Input should be"),
        ({"data": {"location": "mars/olympus"}}, "spec.data.location", "unknown topology node"),
        ({"regions": ["atlantis"]}, "spec.regions.0", "unknown region"),
    ],
)
def test_job_field_errors(tmp_path, spec_patch, field, fragment):
    j = job("j", gpus=1, gpu_type="A100")
    j["spec"].update(spec_patch)
    write_config(tmp_path, [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"]), j])
    errs = errors_of(tmp_path)
    assert any(f"Job/j: {field}: " in e and fragment in e for e in errs), errs


def test_topology_links_name_nodes_the_topology_defines(tmp_path):
    links = [{"from": "aws/us-east-1", "to": "gcp", "latency_ms": 5, "egress_per_gb": 0.02},
             {"from": "moon", "to": "aws/us-east-1/us-east-1z", "latency_ms": 1, "egress_per_gb": 0.0}]
    write_config(tmp_path, [topology(links=links), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"])])
    errs = [e.split(": ", 1)[1] for e in errors_of(tmp_path)]
    assert errs == ["Topology/test: spec.links.1.from: unknown topology node 'moon'",
                    "Topology/test: spec.links.1.to: unknown topology node 'aws/us-east-1/us-east-1z'"]


def test_a_zone_under_two_regions_of_one_cloud_is_refused(tmp_path):
    # Gangs keep to a (cloud, zone): one zone name in two regions would let a `gang: zone` job span both.
    (tmp_path / "topology.yaml").write_text(
        "apiVersion: fleetops.io/v1alpha1\n"
        "kind: Topology\n"
        "metadata: {name: test}\n"
        "spec:\n"
        "  clouds:\n"
        "    aws:\n"
        "      regions:\n"
        "        us-east-1: {zones: [us-east-1a, us-east-1b]}\n"   # line 8
        "        us-west-2:\n"
        "          zones:\n"
        "            - us-west-2a\n"
        "            - us-east-1a\n"                            # line 12: us-east-1's zone again
        "    gcp:\n"
        "      regions:\n"
        "        us-central1: {zones: [us-east-1a]}\n"          # another cloud's zone of that name is its own
    )
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(tenant("t")))
    res = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 1, res.output
    errs = [line.removeprefix(f"{tmp_path}/") for line in res.output.splitlines() if ": Topology/" in line]
    assert errs == ["topology.yaml:12: Topology/test: spec.clouds.aws.regions.us-west-2.zones.1: "
                    "zone 'us-east-1a' is already a zone of aws/us-east-1 (line 8): a zone belongs to one region"], res.output


def test_pool_errors(tmp_path):
    from tests.fleetkit import TOPOLOGY

    write_config(tmp_path, [
        topology(clouds={**TOPOLOGY, "gcp": {**TOPOLOGY["gcp"], "europe-west4": ["europe-west4-a"]},
                         "azure": {**TOPOLOGY["azure"], "westeurope": ["westeurope-1"]}}), tenant("t"),
        pool("a", "aws", "us-east-1", ["us-east-1z"], ["p4d.24xlarge"]),
        pool("b", "aws", "eu-north-9", ["x"], ["p4d.24xlarge"]),
        pool("c", "gcp", "europe-west4", ["europe-west4-a"], ["a3-highgpu-8g", "warp-drive.1x"]),  # a3 (H100): zones b and c only
        pool("d", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], lo=5, hi=2),
        pool("e", "azure", "westeurope", ["westeurope-1"], ["Standard_NC40ads_H100_v5"]),  # the public source prices eastus only
    ])
    errs = errors_of(tmp_path)
    assert any("Pool/a: spec.zones.0: zone 'us-east-1z' is not in aws/us-east-1" in e for e in errs), errs
    assert any("Pool/b: spec.region: region aws/eu-north-9 is not in the Topology" in e for e in errs), errs
    assert any("Pool/c: spec.instance_types.0: a3-highgpu-8g is not offered in europe-west4-a "
               "(in europe-west4 only in europe-west4-b, europe-west4-c)" in e for e in errs), errs
    # Not "not offered": the size exists in westeurope, the shipped catalog just has no public price there.
    assert any("Pool/e: spec.instance_types.0: Standard_NC40ads_H100_v5 has no price in westeurope in the price catalog "
               "(priced only in eastus); `reconcile catalog update --cloud azure --region azure/westeurope` writes catalog.json" in e
               for e in errs), errs
    assert any("Pool/c: spec.instance_types.1: unknown gcp instance type 'warp-drive.1x'" in e for e in errs), errs
    assert any("Pool/d: spec: " in e and "min_instances (5) exceeds max_instances (2)" in e for e in errs), errs


def test_missing_topology_and_unknown_kind(tmp_path):
    write_config(tmp_path, [tenant("t"), {"apiVersion": "fleetops.io/v1alpha1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}])
    errs = errors_of(tmp_path)
    assert any("a Topology document is required" in e for e in errs)
    assert any("kind: unknown kind 'Widget'" in e for e in errs)


def test_yaml_bomb_is_refused_quickly(tmp_path):
    write_config(tmp_path, [topology()])
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i-1}"] * 10) + "]")
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    errs = errors_of(tmp_path)
    assert any(e.startswith("bomb.yaml:1:") and "alias expansion" in e for e in errs), errs


def test_non_utf8_and_symlink_outside(tmp_path):
    cfg = tmp_path / "cfg"
    write_config(cfg, [topology()])
    (cfg / "latin1.yaml").write_bytes(b"kind: Tenant\nmetadata: {name: caf\xe9}\n")
    secret = tmp_path / "outside.yaml"
    secret.write_text("kind: Tenant\n")
    (cfg / "link.yaml").symlink_to(secret)
    errs = errors_of(cfg)
    assert any(e.startswith("latin1.yaml:2:") and "not valid UTF-8" in e for e in errs), errs
    assert any(e.startswith("link.yaml:1:") and "symlink points outside" in e for e in errs), errs


@pytest.mark.parametrize("target", [".git/config", ".env", "status/fleet.yaml", ".reconcile", ".git"])
def test_a_symlink_into_what_is_not_config_is_refused(tmp_path, target):
    """A pull request's `jobs/x.yaml -> ../.git/config` stayed inside the config directory, so it was read as config:
    the checkout's .git/config holds the CI token (actions/checkout's `extraheader`), and YAML's errors quote words of
    what they read (`found undefined alias 's3cr3t'`). Git's and the reconciler's own files, a hidden file and
    status/ are not read through a link: refused, naming the link (a hidden directory of config, `jobs ->
    .shared/jobs`, still is: tests/test_safety.py)."""
    write_config(tmp_path, [topology(), tenant("t")])
    for f in (".git/config", ".env", "status/fleet.yaml", ".reconcile/state.yaml"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("token: *s3cr3t\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.yaml").symlink_to(tmp_path / target)
    errs = errors_of(tmp_path)
    assert errs == [f"jobs/x.yaml:1: symlink points into {target}, which is not config (git's and the reconciler's own "
                    "files, a hidden file, status/): make it a file of the config"], errs
    assert not any("s3cr3t" in e for e in errs)


def test_a_control_character_names_its_line_in_one_line(tmp_path):
    """YAML refuses a control character with a reader error that has no mark: it was reported on line 1, in two lines
    (`  in "<unicode string>", position 31`), and the second left the PR comment's indented code block as markdown."""
    write_config(tmp_path, [topology()])
    (tmp_path / "b.yaml").write_bytes(b"kind: Tenant\nmetadata: {name: a\x1b]0;x}\n")
    assert errors_of(tmp_path) == ["b.yaml:2: invalid YAML: the control character U+001B is not allowed in YAML: remove it, "
                                   "or write it as an escape (\\x1b) in a double-quoted string"]
    res = CliRunner().invoke(app, ["plan", str(tmp_path), "--format", "markdown"])
    body = res.stdout.split("\n\n", 1)[1]
    assert res.exit_code == 1 and all(line.startswith("    ") for line in body.splitlines()), res.stdout


def test_a_config_cannot_write_a_ci_workflow_command_into_the_log(tmp_path, monkeypatch):
    """GitHub's runner reads `##[command]data` anywhere in a line of a step's output, and `::command::data` at a line's
    start, and acts on it (set-output, add-mask, stop-commands, error annotations). A PR's file named
    `::error title=Approved::x.yaml`, or `kind: '##[set-output name=safe;]yes'`, put one into the plan job's log through
    the error naming it. Such text is printed with the `#` or `:` that would make it a command escaped."""
    write_config(tmp_path, [topology()])
    (tmp_path / "::error title=Approved::x.yaml").write_text("kind: '##[set-output name=safe;]yes'\n")
    monkeypatch.chdir(tmp_path)  # (`reconcile validate .`: each error's line starts with the file's name)
    res = CliRunner().invoke(app, ["validate", "."])
    assert res.exit_code == 1 and "x.yaml:1" in res.output, res.output
    for line in res.output.splitlines():
        assert "##[" not in line and not line.lstrip().startswith("::"), line
    assert "#\\x23[set-output name=safe;]yes" in res.output  # (what the file says, still readable)


def test_a_diagnostic_is_one_line_whatever_its_message_holds():
    assert str(Diagnostic("a.yaml", 3, "Job", "j", "spec", "x\ny\x1b")) == "a.yaml:3: Job/j: spec: x\\ny\\x1b"


def test_status_and_hidden_dirs_are_not_config(tmp_path):
    write_config(tmp_path, [topology(), tenant("t")])
    for d in ("status/jobs", "node_modules/pkg", ".reconcile", ".github/workflows", "teams/.drafts"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "x.yaml").write_text("this: is not a document\n")
    assert load(tmp_path).fleet == "test"


@pytest.mark.parametrize("name", ["status", "node_modules"])
def test_a_nested_dir_named_like_a_skipped_one_is_config(tmp_path, name):
    """Audit: `status` and `node_modules` were skipped at every depth: `mkdir teams/status && mv jobs/product.yaml
    teams/status/` validated "ok" with 7 jobs instead of 10, and the plan deleted their instances. Only the config
    dir's own status/ and node_modules/ are skipped; deeper down they are config like any directory."""
    cfg = tmp_path / "q"
    shutil.copytree(QUICKSTART, cfg)
    (cfg / "teams" / name).mkdir(parents=True)
    (cfg / "jobs" / "product.yaml").rename(cfg / "teams" / name / "product.yaml")
    res = CliRunner().invoke(app, ["validate", str(cfg)])
    assert res.exit_code == 0 and "10 jobs" in res.output, res.output
    (cfg / "teams" / name / "junk.yaml").write_text("this: is not a document\n")  # read, so an error naming it
    assert any(e.startswith(f"teams/{name}/junk.yaml:1:") for e in errors_of(cfg)), errors_of(cfg)


@pytest.mark.parametrize("text", ["", "# TODO: jobs\n", "---\n", "# cut\n---\n---\n"])
def test_a_file_with_no_document_is_an_error_not_an_empty_file(tmp_path, text):
    """Audit: a jobs file cut to nothing (or to a comment) read as no jobs: the plan stopped the five jobs it held and
    deleted their six instances, "0 evicted". A refusal naming the file beats that guess."""
    cfg = tmp_path / "q"
    shutil.copytree(QUICKSTART, cfg)
    (cfg / "jobs" / "research.yaml").write_text(text)
    assert errors_of(cfg) == ["jobs/research.yaml:1: holds no document (empty, or only comments): its jobs would "
                              "stop and what they run on be deleted. Delete the file to remove what it held, or restore "
                              "its documents"]


def test_a_yaml_file_is_read_whatever_the_case_of_its_extension(tmp_path):
    """Audit: jobs/research.YAML was skipped: "ok ... 5 jobs", and the plan deleted the six instances its jobs ran on."""
    cfg = tmp_path / "q"
    shutil.copytree(QUICKSTART, cfg)
    (cfg / "jobs" / "research.yaml").rename(cfg / "jobs" / "research.YAML")
    (cfg / "jobs" / "platform.yaml").rename(cfg / "jobs" / "platform.Yml")
    product = cfg / "jobs" / "product.yaml"
    product.write_text(product.read_text() + "\n---\n")  # a trailing `---` is an empty document, not "got NoneType"
    assert load(cfg).jobs.keys() == load(QUICKSTART).jobs.keys()


def test_cli_validate_exit_codes(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(QUICKSTART)])
    assert ok.exit_code == 0 and "10 jobs" in ok.output
    write_config(tmp_path, [topology(), job("j", tenant="ghost")])
    bad = runner.invoke(app, ["validate", str(tmp_path)])
    assert bad.exit_code == 1
    assert "fleet.yaml:" in bad.output and "Job/j: spec.tenant: unknown tenant 'ghost'" in bad.output


def test_schema_covers_every_kind():
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0
    import json
    schema = json.loads(res.output)  # one schema for any document, discriminated on kind (tests/test_schema.py)
    kinds = {"Tenant", "Pool", "Job", "SpotPolicy", "GuardrailPolicy", "PlacementPolicy", "Topology", "License", "Reservation"}
    assert set(schema["properties"]["kind"]["enum"]) == kinds
    assert {b["if"]["properties"]["kind"]["const"] for b in schema["allOf"]} == kinds
    assert "resources" in json.dumps(schema["$defs"]["JobSpec"])


def test_loading_leaves_no_parse_tree_for_the_cyclic_collector(tmp_path):
    """A big config's YAML nodes are freed as it is read: none wait for the cyclic collector
    (at 5k jobs they were 377k objects it traced again and again: 0.5 s of the load)."""
    import subprocess
    import sys

    from bench.generate import generate

    generate(tmp_path, 300, seed=3)
    # Measured in a fresh interpreter: in the test worker, threads an earlier test left (servers, agents) make
    # garbage of their own while the collector is off (a full run once counted over 500 here; alone it is ~70).
    probe = ("import gc, sys\nfrom reconciler.load import load\ngc.collect()\ngc.disable()\n"
             "d = load(sys.argv[1])\nleft = gc.collect()\nprint(len(d.jobs), left)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    jobs, left = map(int, out.stdout.split())
    assert jobs == 300
    assert left < 500, f"{left} objects were garbage only the cyclic collector could free"


def test_planning_leaves_the_callers_collector_settings_as_they_were(tmp_path):
    import gc

    from reconciler import api
    from tests.fleetkit import copy_quickstart

    before = gc.get_threshold()
    api.plan(copy_quickstart(tmp_path), time_limit=5)
    assert gc.get_threshold() == before


def cached_errors_of(path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load(path, cache=True)
    return [str(d) for d in e.value.diagnostics]


def _cache_entries(config) -> list:
    d = config / ".reconcile" / "cache" / "parse"
    return sorted(d.glob("*.json")) if d.is_dir() else []


def test_parse_cache_gives_the_same_state_and_the_same_errors(tmp_path):
    """A plain load writes nothing; with cache=True (plan and apply) the second load of a file reads its parsed documents from .reconcile/cache/parse (keyed by
    the bytes' SHA-256): the same DesiredState, and an error in another file still names the
    cached file's line (a duplicate name's first definition)."""
    docs = [topology(), tenant("t", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]), job("j", gpus=1, gpu_type="A10G")]
    cfg = write_config(tmp_path / "c", docs)
    load(cfg)
    assert not (cfg / ".reconcile").exists()
    first = load(cfg, cache=True)
    assert len(_cache_entries(cfg)) == 1
    again = load(cfg, cache=True)
    assert again == first and again.digest == first.digest
    (cfg / "more.yaml").write_text(yaml.safe_dump(job("j", gpus=1, gpu_type="A10G")))
    errs = cached_errors_of(cfg)  # fleet.yaml from the cache
    line = (cfg / "fleet.yaml").read_text().splitlines().index("  name: j") + 1  # the first definition's name
    assert errs == [f"more.yaml:4: Job/j: metadata.name: duplicate Job name (first defined at fleet.yaml:{line})"]
    shutil.rmtree(cfg / ".reconcile")
    assert cached_errors_of(cfg) == errs and cached_errors_of(cfg) == errs  # parsed anew; a load with errors writes no entry


def test_a_cached_file_names_the_same_lines_as_a_fresh_parse(tmp_path):
    """The parse cache keeps a document's lines without their paths (in the order the parser records them) and
    makes the paths again when an error needs a line: an error in a cached file, caused by an edit to another
    file, names the same nested line as when both are parsed anew (spec.tenant below a mapping, a list and a
    nested list, in the second and third documents of the file)."""
    from reconciler.snapshot import SNAPSHOT_FILE

    docs = [topology(), tenant("t", gpus=4), tenant("u", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"])]
    cfg = write_config(tmp_path / "c", docs)
    jobs = [job("a", gpus=1, gpu_type="A10G")]
    for name, owner in (("b", "u"), ("c", "u")):
        j = job(name, gpus=1, gpu_type="A10G", tenant=owner)
        j["metadata"]["labels"] = {"team": "x", "tags": "y"}
        j["spec"] = {"regions": ["us-east-1", "us-west-2"], "resources": j["spec"]["resources"], "tenant": owner,
                     "clouds": ["aws"]}
        jobs.append(j)
    (cfg / "jobs.yaml").write_text(yaml.safe_dump_all(jobs, sort_keys=False))
    load(cfg, cache=True)
    write_config(cfg, docs[:2] + docs[3:])  # tenant u is gone: jobs b and c name an unknown tenant
    (cfg / SNAPSHOT_FILE).unlink(missing_ok=True)
    cached = cached_errors_of(cfg)  # jobs.yaml from the cache
    with pytest.raises(ConfigError) as fresh:
        load(cfg)
    lines = (cfg / "jobs.yaml").read_text().splitlines()
    at = [n + 1 for n, text in enumerate(lines) if text.strip() == "tenant: u"]
    assert len(at) == 2 and [f"jobs.yaml:{n}:" in e for e, n in zip(cached, at)] == [True, True]
    assert cached == [str(d) for d in fresh.value.diagnostics]


def test_a_corrupt_parse_cache_is_ignored(tmp_path):
    """A torn, garbled or edited cache entry is never trusted: the file is parsed again and the
    entry rewritten. (The validated config kept above the parse cache, reconciler/snapshot.py, is removed before
    each load, so the parse cache is read.)"""
    from reconciler.snapshot import SNAPSHOT_FILE

    docs = [topology(), tenant("t", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]), job("j", gpus=1, gpu_type="A10G")]
    cfg = write_config(tmp_path / "c", docs)
    want = load(cfg, cache=True)
    [entry] = _cache_entries(cfg)
    good = entry.read_bytes()
    edited = good.replace(b'"gpus": 1', b'"gpus": 3')
    assert edited != good
    for bad in (good[: len(good) // 2], b"\x00garbage", b"", edited, good.split(b"\n")[0] + b"\n[]"):
        entry.write_bytes(bad)
        (cfg / SNAPSHOT_FILE).unlink()
        got = load(cfg, cache=True)
        assert got == want and got.jobs["j"].spec.resources.gpus == 1
        assert entry.read_bytes() == good


def test_a_parse_cache_entry_that_came_with_the_checkout_is_not_read(tmp_path, monkeypatch):
    """The config directory is a git checkout: a pull request can add files under .reconcile/cache/. An entry
    for fleet.yaml's exact bytes whose body says gpus: 8 where the file says 1, with a checksum anyone computes,
    used to be read as the file (apply would act on YAML nobody reviewed); an entry sealed on another machine
    (another key) is not read either. Only this machine's seal (reconciler/localkey.py) is trusted."""
    import hashlib
    import json

    from reconciler.snapshot import SNAPSHOT_FILE

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-a"))
    docs = [topology(), tenant("t", gpus=16), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]), job("j", gpus=1, gpu_type="A10G")]
    cfg = write_config(tmp_path / "c", docs)
    want = load(cfg, cache=True)
    [entry] = _cache_entries(cfg)
    head, _, text = entry.read_bytes().partition(b"\n")
    key = json.loads(head)["key"]
    forged = text.replace(b'"gpus": 1', b'"gpus": 8')
    assert forged != text
    for fake in ({"key": key, "sum": hashlib.sha256(forged).hexdigest()},  # the checksum format trusted before
                 {"key": key, "seal": hashlib.sha256(key.encode() + b"\n" + forged).hexdigest()}):
        entry.write_bytes(json.dumps(fake).encode() + b"\n" + forged)
        (cfg / SNAPSHOT_FILE).unlink()  # the validated config kept above the parse cache (reconciler/snapshot.py)
        got = load(cfg, cache=True)
        assert got == want and got.jobs["j"].spec.resources.gpus == 1
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-b"))  # another machine: its own key
    entry.write_bytes(head + b"\n" + forged.replace(b'"gpus": 8', b'"gpus": 1'))  # machine A's sound entry
    load(cfg, cache=True)
    assert json.loads(entry.read_bytes().partition(b"\n")[0])["seal"] != json.loads(head)["seal"]  # not read: parsed, resealed
    assert (tmp_path / "home-a" / "fleetops" / "cache-seal.key").stat().st_mode & 0o077 == 0  # the key is the user's alone


@pytest.mark.parametrize("case", ["another user's", "readable by others", "a fifo"])
def test_a_seal_key_others_could_know_seals_nothing(tmp_path, monkeypatch, case):
    """s35: the key was read from wherever XDG_CACHE_HOME said, whoever had made it: with XDG_CACHE_HOME=/tmp/x another
    user of the host who made /tmp/x/fleetops/cache-seal.key first knew the key, and a cache entry (a pickled parse of
    the config, a plan) sealed with it was read as this machine's own. A key not this user's alone seals nothing (no
    cache is read or written); a fifo at its name hung every plan."""
    from reconciler import localkey

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "shared"))
    monkeypatch.setattr(localkey, "_cached", None)
    key = localkey.key_path()
    key.parent.mkdir(parents=True)
    if case == "a fifo":
        os.mkfifo(key, 0o600)
    else:
        key.write_bytes(b"k" * 32)
        key.chmod(0o600 if case == "another user's" else 0o644)
        if case == "another user's":
            if os.geteuid() != 0:
                pytest.skip("giving a file to another user takes root")
            os.chown(key, 65534, -1)
    assert localkey.seal(b"data") is None
    assert localkey.sealed(b"data", hmac.new(b"k" * 32, b"data", hashlib.sha256).hexdigest()) is False


def test_values_json_cannot_hold_are_not_cached(tmp_path):
    """A file with a YAML timestamp (JSON would give back a string) is parsed on every load, with
    the same result; a config that does not load leaves no cache (nor any .reconcile/) behind."""
    docs = [topology(), tenant("t", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]), job("j", gpus=1, gpu_type="A10G")]
    cfg = write_config(tmp_path / "c", docs)
    dated = job("k", gpus=1, gpu_type="A10G")
    (cfg / "dated.yaml").write_text(yaml.safe_dump(dated).replace("spec:\n", "spec:\n  submitted: 2026-01-02T03:04:05Z\n", 1))
    first = load(cfg, cache=True)
    assert first.jobs["k"].spec.submitted is not None
    assert len(_cache_entries(cfg)) == 1 and load(cfg, cache=True) == first  # fleet.yaml's entry only
    broken = write_config(tmp_path / "b", docs[:-1] + [job("j", gpus=1, gpu_type="A10G", tenant="nobody")])
    cached_errors_of(broken)
    assert not (broken / ".reconcile").exists()


def test_validate_imports_no_solver():
    """`reconcile validate` reads and checks files only: it imports neither the solver (ortools,
    which pulls pandas and numpy) nor networkx (issue 20.3: import nothing a command does not use)."""
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from reconciler.cli import app; "
            f"r = CliRunner().invoke(app, ['validate', {str(QUICKSTART)!r}]); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('ortools', 'networkx', 'pandas', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "fleetops.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def test_pool_minimums_over_the_budget_are_refused_at_load(tmp_path):
    """Two a2-highgpu-1g minimums at catalog prices cost more than a $1/h budget: every plan would be refused, so load
    says so on max_hourly_budget; a budget they fit loads (ledger.budget_ok, as the planner counts it)."""
    def docs(budget):
        return [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], lo=2, hi=4),
                _doc("GuardrailPolicy", "g", {"max_hourly_budget": budget})]
    errs = errors_of(write_config(tmp_path / "over", docs(1)))
    assert any("spec.max_hourly_budget" in e and "min_instances cost at least" in e for e in errs), errs
    load(write_config(tmp_path / "fits", docs(1000)))


def test_spot_only_minimums_no_on_demand_pool_can_balance_are_refused_at_load(tmp_path):
    """Two spot A100 GPUs as minimums, one on-demand A100 at most: spot is 67% of the fleet at best, over
    max_spot_fraction 0.5 (ledger.spot_share_ok in ledger.spot_units, GPUs here); 0.7 allows it."""
    def docs(fraction):
        return [topology(), tenant("t"), pool("s", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="spot", lo=2, hi=4),
                pool("o", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=1),
                _doc("SpotPolicy", "sp", {"max_spot_fraction": fraction})]
    errs = errors_of(write_config(tmp_path / "over", docs(0.5)))
    assert any("spec.max_spot_fraction" in e and "2 GPUs on spot" in e for e in errs), errs
    load(write_config(tmp_path / "fits", docs(0.7)))



def test_spot_only_minimums_spot_diversity_cannot_spread_are_refused_at_load(tmp_path):
    """A spot-only A100 pool with min_instances 1 and max_instances 1 puts spot in the fleet, and min_zones 2 asks for it
    in two zones: no fleet keeps both (the h7 hunt, 2026-12-03: the model was infeasible, greedy's plan left the pool
    empty, noted as "could not complete greedy's answer within its work limit", and apply --plan let it pass: the
    minimum was not met before). Load names min_zones; a second instance at max, or one zone asked, loads."""
    def docs(hi, zones):
        return [topology(), tenant("t"), pool("s", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g"],
                                              market="spot", lo=1, hi=hi),
                _doc("SpotPolicy", "sp", {"min_zones": zones})]
    errs = errors_of(write_config(tmp_path / "over", docs(1, 2)))
    assert any("spec.min_zones" in e and "can span at most 1 zones" in e and "under min_zones 2" in e for e in errs), errs
    load(write_config(tmp_path / "room", docs(2, 2)))
    load(write_config(tmp_path / "one", docs(1, 1)))



def test_a_pool_minimum_of_one_is_no_half_spot_instance_at_load(tmp_path):
    """One A100-80GB as a minimum (`either`) under max_spot_fraction 0.5: alone it is all spot or on-demand. Counted
    fractionally (half of each, $2.06/h) it fit a $3.35/h budget and loaded (a random fleet of the h7 hunt; the plan
    left the pool empty); in whole instances it costs $3.67/h on-demand: load names the budget. $3.70/h loads."""
    def docs(budget):
        return [topology(), tenant("t"), pool("az", "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"], market="either", lo=1, hi=2),
                _doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5}), _doc("GuardrailPolicy", "g", {"max_hourly_budget": budget})]
    errs = errors_of(write_config(tmp_path / "over", docs(3.35)))
    assert any("spec.max_hourly_budget" in e and "at least $3.67/h" in e for e in errs), errs
    load(write_config(tmp_path / "fits", docs(3.7)))



def test_spot_only_minimums_no_on_demand_pool_can_buffer_are_refused_at_load(tmp_path):
    """A spot-only A10G pool at min_instances 1 under a 25% on-demand buffer, beside only a CPU pool (which counts 0 in
    a GPU fleet): no on-demand GPU can stand idle beside the spot one (the h7 hunt, reduced from a random fleet: the plan
    left the pool empty). Load names on_demand_buffer_percent; an on-demand A10G pool beside it loads."""
    def docs(*more):
        return [topology(), tenant("t"), pool("s", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"], market="spot", lo=1, hi=1),
                pool("c", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=1),
                _doc("SpotPolicy", "sp", {"on_demand_buffer_percent": 25}), *more]
    errs = errors_of(write_config(tmp_path / "over", docs()))
    assert any("spec.on_demand_buffer_percent" in e and "holds 0 GPUs" in e for e in errs), errs
    load(write_config(tmp_path / "fits", docs(pool("o", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"], hi=1))))



def test_spot_only_minimums_whose_diverse_spot_no_share_holds_are_refused_at_load(tmp_path):
    """A spot-only MIG pool at min_instances 1 (one zone) under min_zones 2 needs a second spot zone: only a spot p4d,
    whose pool's minimum and maximum are 2, so 9 of 17 GPUs are spot, over max_spot_fraction 0.5 (the h7 hunt: the plan
    left the MIG pool empty). Load names min_zones; a share of 0.6 loads."""
    def docs(fraction):
        mig = pool("az-mig", "azure", "eastus", ["eastus-1"], ["Standard_NC24ads_A100_v4"], market="spot", lo=1, hi=1)
        mig["spec"]["mig"] = ["4g.40gb", "3g.40gb"]
        return [topology(), tenant("t"), mig, pool("p4d", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"],
                                                     market="either", lo=2, hi=2),
                _doc("SpotPolicy", "sp", {"min_zones": 2, "max_spot_fraction": fraction})]
    errs = errors_of(write_config(tmp_path / "over", docs(0.5)))
    assert any("spec.min_zones" in e and "at least 2 spot instances" in e for e in errs), errs
    load(write_config(tmp_path / "fits", docs(0.6)))


def _the_long_way(text: str) -> list:
    """(line, value, lines in _paths' order) of every document, composed into YAML nodes and converted."""
    from reconciler.load import _compose_all, _Converter

    conv, out = _Converter("f.yaml"), []
    for node in _compose_all(text):
        lines: dict = {}
        out.append((node.start_mark.line + 1, conv.convert(node, (), lines, []), list(lines.values())))
    return out


def _typed(docs: list) -> list:
    from reconciler.load import _leaves

    return [(line, [(type(x), x) for x in _leaves(body)], lines) for line, body, lines in docs]


USUAL = """# a comment
apiVersion: fleetops/v1
kind: Job
metadata: {name: "a", labels: {team: 'x', n: "1"}}
spec:
  resources: {gpus: 2, cpu: 8.5, memory_gib: 1e3, tiny: .5, flag: yes, other: False, none: ~, empty: null}
  regions: [us-east-1,
    us-west-2]
  nested:
    - - 1
      - -0x1F
      - {deep: [[], {}, ""]}
    - >
      folded
      text
  quoted: "line\\nbreak"
  octal: 0o17
  big: 123456789012345678901234567890
---
just: a second document
...
--- [1, 2.0, true, "3"]
"""


@pytest.mark.parametrize("text", [USUAL, "a: 1", "- x\n- y", "plain scalar", "", "---\n", "a:\nb: 2\n"])
def test_the_usual_document_is_read_from_the_parsers_events_as_the_long_way_reads_it(text):
    """`_plain_docs` builds values and line lists from libyaml's events without YAML nodes or paths: the same
    values, of the same types, and the same lines in the same order as composing and converting the nodes."""
    from reconciler.load import _plain_docs

    assert _typed(_plain_docs(text)) == _typed(_the_long_way(text))


@pytest.mark.parametrize("text", [
    "base: &b {x: 1}\nuse: *b\n",  # an anchor and an alias
    "base: &b {x: 1}\nuse:\n  <<: *b\n  y: 2\n",  # a merge key
    "a: 1\na: 2\n",  # a duplicate key
    "1: one\n",  # a key that is not a string
    "on: push\n",  # (YAML 1.1: the key is True)
    "? [a, b]\n: c\n",  # a key that is a collection
    "when: 2026-01-02T03:04:05Z\n",  # a timestamp
    "x: !!str 1\n",  # an explicit tag
    "a: [1, 2\n",  # invalid YAML
    "a:" + " [" * 70 + " ]" * 70 + "\n",  # nested more than MAX_DEPTH
])
def test_an_unusual_document_is_read_the_long_way(tmp_path, text):
    """What `_plain_docs` does not read as the composer would (anchors, merge keys, duplicate or non-string keys,
    timestamps, tags, errors, limits) it refuses, and the file is parsed the long way: the same documents and the
    same diagnostics as before it existed."""
    from reconciler.load import _parse_bytes, _plain_docs, _Unusual

    with pytest.raises((_Unusual, yaml.YAMLError)):
        _plain_docs(text)
    diags: list = []
    docs = _parse_bytes("f.yaml", text.encode(), diags)
    assert not any(d.plain for d in docs)
    if not diags:
        assert _typed([(d.line, d.body, list(d.lines.values())) for d in docs]) == _typed(_the_long_way(text))
    else:
        assert diags and all(d.file == "f.yaml" for d in diags)


def test_a_plainly_read_file_names_the_lines_a_composed_one_does(tmp_path):
    """An error in a document read from the events names the line the node-by-node reading named."""
    from reconciler import load as L

    docs = [topology(), tenant("t", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"])]
    cfg = write_config(tmp_path / "c", docs)
    bad = job("j", gpus=1, gpu_type="A10G")
    bad["spec"]["resources"]["gpus"] = "many"
    bad["spec"]["regions"] = ["us-east-1", {"not": "a region"}]
    (cfg / "jobs.yaml").write_text(yaml.safe_dump_all([job("ok", gpus=1, gpu_type="A10G"), bad], sort_keys=False))
    plain = errors_of(cfg)
    assert any("jobs.yaml:" in e and "resources.gpus" in e for e in plain)
    long_way = L._plain_docs
    try:
        L._plain_docs = lambda text: (_ for _ in ()).throw(L._Unusual())
        assert errors_of(cfg) == plain
    finally:
        L._plain_docs = long_way


# -- what validate says about a bad copy of the quickstart: true, complete, in the user's words ---------------------


def _quickstart(tmp_path) -> Path:
    from tests.fleetkit import copy_quickstart

    return copy_quickstart(tmp_path)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_jobs_own_pools_are_named_when_they_lack_its_gpu_type(tmp_path):
    """Before: 'no pool offers gpu_type 'A100' as whole GPUs (its pools are MIG-partitioned)' for a job limited to
    the A10G pool (no pool is MIG-partitioned: the check looked at every pool of the fleet), and the same for a job
    whose only pool is misspelt, on top of the unknown pool."""
    cfg = _quickstart(tmp_path)
    research = cfg / "jobs" / "research.yaml"
    _edit(research, "metadata: {name: finetune-b}\nspec:\n", "metadata: {name: finetune-b}\nspec:\n  pools: [aws-a10g]\n")
    _edit(research, "metadata: {name: sweep-lr}\nspec:\n", "metadata: {name: sweep-lr}\nspec:\n  pools: [aws-a1000]\n")
    errs = errors_of(cfg)
    assert not any("MIG" in e for e in errs), errs
    assert [e for e in errs if "finetune-b" in e] == [
        "jobs/research.yaml:30: Job/finetune-b: spec.resources.gpu_type: none of its pools offers gpu_type 'A100': "
        "its pools (aws-a10g) offer A10G; A100 is offered by pools aws-a100, gcp-a100"]
    assert [e for e in errs if "sweep-lr" in e] == ["jobs/research.yaml:39: Job/sweep-lr: spec.pools.0: unknown pool 'aws-a1000' (did you mean 'aws-a100'?)"]


def test_a_job_whose_pools_offer_its_gpu_type_only_partitioned_is_told_so(tmp_path):
    mig = pool("mig", "gcp", "us-central1", ["us-central1-a"], ["a2-ultragpu-8g"])
    mig["spec"]["mig"] = ["1g.10gb"] * 7
    whole = pool("whole", "aws", "us-east-1", ["us-east-1a"], ["p4de.24xlarge"])
    docs = [topology(), tenant("t"), mig, whole, job("j", gpus=1, gpu_type="A100-80GB", pools=["mig"])]
    errs = [e.split(": ", 1)[1] for e in errors_of(write_config(tmp_path / "pinned", docs))]
    assert errs == ["Job/j: spec.resources.gpu_type: none of its pools offers gpu_type 'A100-80GB' as whole GPUs: "
                    "pool mig partitions it with MIG (ask for resources.mig instead); A100-80GB is offered by pool whole"]
    docs[-1]["spec"].pop("pools")
    errs = [e.split(": ", 1)[1] for e in errors_of(write_config(tmp_path / "any", [d for d in docs if d is not whole]))]
    assert errs == ["Job/j: spec.resources.gpu_type: no pool offers gpu_type 'A100-80GB' as whole GPUs: "
                    "pool mig partitions it with MIG (ask for resources.mig instead)"]


def test_a_document_that_fails_validation_still_counts_for_duplicates_and_references(tmp_path):
    """Before: a Pool with min_instances > max_instances hid that its name was defined twice (reported only once the
    first was fixed), and a Tenant with a bad field made every job of it 'unknown tenant'."""
    cfg = _quickstart(tmp_path)
    _edit(cfg / "pools.yaml", "  max_instances: 3\n", "  min_instances: 5\n  max_instances: 3\n")
    (cfg / "jobs" / "extra.yaml").write_text(
        "apiVersion: fleetops.io/v1alpha1\nkind: Pool\nmetadata: {name: aws-a100}\n"
        "spec: {cloud: aws, region: us-east-1, zones: [us-east-1a], instance_types: [p4d.24xlarge]}\n")
    _edit(cfg / "tenants.yaml", "weight: 2", "weight: -2")
    errs = errors_of(cfg)
    assert errs == [
        "pools.yaml:3: Pool/aws-a100: metadata.name: duplicate Pool name (first defined at jobs/extra.yaml:3)",
        "pools.yaml:5: Pool/aws-a100: spec: Value error, min_instances (5) exceeds max_instances (3)",
        "tenants.yaml:5: Tenant/research: spec.weight: Input should be greater than 0",
    ], errs


def test_a_duplicate_name_points_at_the_first_definitions_name(tmp_path):
    """Before: 'first defined at extra.yaml:1' whatever line the first document's name was on."""
    cfg = _quickstart(tmp_path)
    (cfg / "jobs" / "extra.yaml").write_text(
        "# research, as the platform team sees it\n\napiVersion: fleetops.io/v1alpha1\nkind: Tenant\n"
        "metadata:\n  labels: {team: platform}\n  name: research\nspec: {}\n")
    assert errors_of(cfg) == ["tenants.yaml:3: Tenant/research: metadata.name: duplicate Tenant name (first defined at jobs/extra.yaml:7)"]


def test_field_paths_are_the_users_not_pydantics(tmp_path):
    """Before: `spec.priority.constrained-int` (a union's branch tag) and `spec.1` for a key written `true`."""
    cfg = _quickstart(tmp_path)
    research = cfg / "jobs" / "research.yaml"
    _edit(research, "  priority: high\n", "  priority: -3\n")
    _edit(research, "metadata: {name: finetune-a}\nspec:\n", "metadata: {name: finetune-a}\nspec:\n  true: 1\n")
    _edit(research, 'env: {LR: "3e-4"}', 'env: {LR: "3e-4", Yes: x}')
    errs = errors_of(cfg)
    assert not any("constrained" in e or "literal" in e or "[key]" in e for e in errs), errs
    assert [e for e in errs if "llm-pretrain" in e] == [
        "jobs/research.yaml:6: Job/llm-pretrain: spec.priority: Input should be greater than or equal to 0; "
        "or Input should be 'low', 'normal', 'high' or 'critical'"]
    assert "jobs/research.yaml:18: Job/finetune-a: spec.true: Keys should be strings" in errs, errs
    assert any(e.startswith("jobs/research.yaml:43: Job/sweep-lr: spec.run.env.Yes: the key: Input should be a valid string")
               for e in errs), errs


def test_a_yaml_boolean_where_a_string_belongs_gets_a_hint(tmp_path):
    """`spot: no` is the boolean false in YAML 1.1: say so, and what the field takes; a string field is told to quote it."""
    cfg = _quickstart(tmp_path)
    research = cfg / "jobs" / "research.yaml"
    _edit(research, "  spot: never ", "  spot: no ")
    _edit(research, "{name: ablation-attn}\nspec:\n  tenant: research", "{name: ablation-attn}\nspec:\n  tenant: Off")
    errs = errors_of(cfg)
    assert "jobs/research.yaml:9: Job/llm-pretrain: spec.spot: Input should be 'eligible', 'preferred', 'required' or 'never' " \
           "(YAML reads `no` as a boolean; 'no' is not one of these either)" in errs, errs
    assert any(e.startswith("jobs/research.yaml:50: Job/ablation-attn: spec.tenant: Input should be a valid string "
                            "(YAML reads `Off` as a boolean; quote it: 'Off')") for e in errs), errs



def test_a_number_date_or_null_where_a_string_belongs_says_to_quote_it(tmp_path):
    """`command: [train.py, 100]` and `env: {SEED: 1}` are a Pod's strings; YAML reads the bare 100, 1, 2026-01-01 and
    an empty value as a number, a date and null, and the error said only "Input should be a valid string"."""
    cfg = _quickstart(tmp_path)
    research = cfg / "jobs" / "research.yaml"
    _edit(research, 'env: {LR: "3e-4"}', 'env: {LR: "3e-4", SEED: 1, DAY: 2026-01-01, EMPTY: }')
    errs = errors_of(cfg)
    sweep = [e.split(": ", 2)[2] for e in errs if "sweep-lr" in e]
    assert sorted(sweep) == ["spec.run.env.DAY: Input should be a valid string (YAML reads `2026-01-01` as a date; quote it: '2026-01-01')",
                             "spec.run.env.EMPTY: Input should be a valid string (YAML reads an empty value, `~` or `null` as null: "
                             "write '' for an empty string)",
                             "spec.run.env.SEED: Input should be a valid string (YAML reads `1` as a number; quote it: '1')"], errs

# -- the config audit of 2026-12-01: hostile and odd YAML, each an error naming file, line and field ------------------

_JOB_HEAD = ("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  tenant: t\n"
             "  resources: {cpu: 1, memory_gib: 1}\n")


def _with_job(tmp_path, body: str) -> Path:
    cfg = write_config(tmp_path / "c", [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"])])
    (cfg / "jobs.yaml").write_text(_JOB_HEAD + body)
    return cfg


@pytest.mark.parametrize("value,fragment", [
    ("2026-02-30", "YAML reads `2026-02-30` as a timestamp, and it is not one: day is out of range for month"),
    ("2026-13-01T00:00:00", "YAML reads `2026-13-01T00:00:00` as a timestamp, and it is not one: month must be in 1..12"),
    ("2026-01-01 25:00:00", "hour must be in 0..23"),
    ("!!int abc", "YAML reads `abc` as an int, and it is not one"),
    ("9" * 5000, "YAML reads `" + "9" * 80 + "... (5,000 characters)` as an int of 5,000 digits, larger than any field takes: "
                 "write the number you mean"),
    ("!!bool maybe", "YAML reads `maybe` as a bool, and it is not one"),
    ("!!timestamp soon", "YAML reads `soon` as a timestamp, and it is not one"),
    ("!!float ''", "YAML reads `` as a float, and it is not one"),
])
def test_a_scalar_its_yaml_type_cannot_hold_is_an_error_on_its_line(tmp_path, value, fragment):
    """Audit: `deadline: 2026-02-30` (a timestamp to YAML, and no date) raised ValueError through load: `Error: unexpected
    ValueError: day is out of range for month. This is a bug in reconcile`, no file, line or field, from validate, plan
    and apply alike, and `reconcile controller` exited on it (a config error keeps it watching)."""
    errs = errors_of(_with_job(tmp_path, f"  deadline: {value}\n"))
    assert len(errs) == 1 and errs[0].startswith("jobs.yaml:7: spec.deadline: ") and fragment in errs[0], errs


def test_the_controller_keeps_watching_when_a_date_is_no_date(tmp_path):
    from reconciler.runtime.controller import Controller

    cfg = _with_job(tmp_path, "  deadline: 2026-02-30T00:00:00\n")
    logged: list[str] = []
    assert Controller(cfg, log=logged.append).step() is False
    assert any("the config does not validate" in m and "day is out of range" in m for m in logged), logged


@pytest.mark.parametrize("text,fragment", [
    ("  expected_hours: 1:30\n", "spec.expected_hours: YAML 1.1 reads `1:30` as a base-60 number (90), not a time"),
    ("  replicas: 1:30\n", "spec.replicas: YAML 1.1 reads `1:30` as a base-60 number (90)"),
    ("  priority: 010\n", "spec.priority: YAML 1.1 reads `010` as an octal number (8): write it without the leading 0"),
])
def test_a_yaml_1_1_base_60_or_octal_number_is_refused_not_misread(tmp_path, text, fragment):
    """Audit: `expected_hours: 1:30` loaded as 90 hours and `cpu: 010` as 8 CPUs (YAML 1.1's base-60 and octal integers,
    also under `%YAML 1.2`), with no word. Refused with what YAML made of it; hex (0x10) says what it is and stands."""
    cfg = _with_job(tmp_path, text)
    errs = errors_of(cfg)
    assert any(e.startswith("jobs.yaml:") and fragment in e for e in errs), errs
    (cfg / "jobs.yaml").write_text(_JOB_HEAD.replace("cpu: 1,", "cpu: 0x2,") + "  expected_hours: 1.5\n")
    assert load(cfg).jobs["j"].spec.resources.cpu == 2


@pytest.mark.parametrize("text,tag", [
    ("  run: !!python/object/new:os.system {command: [x]}\n", "!!python/object/new:os.system"),
    ("  pools: !!python/tuple [p]\n", "!!python/tuple"),
    ("  regions: !!set {us-east-1}\n", "!!set"),
    ("  run: !custom {command: [x]}\n", "!custom"),
])
def test_a_tag_on_a_mapping_or_sequence_is_refused_not_ignored(tmp_path, text, tag):
    """Audit: a tag on a collection was dropped without a word (`spec: !!python/object/new:os.system` validated "ok"; no
    object was made, but a reviewer reads it as code); a tag on a scalar was already an error."""
    errs = errors_of(_with_job(tmp_path, text))
    assert any(e.startswith("jobs.yaml:7: spec.") and f"the tag {tag} is not read here" in e for e in errs), errs


def test_merge_keys_are_yamls_merge_not_duplicates(tmp_path):
    """Audit: `<<: *defaults` then a key of the defaults (the merge key's one use) was refused as "duplicate key", and of
    merged mappings PyYAML 6.0.4 let the last listed win for `policy` but the first for `p` (by string identity)."""
    cfg = _with_job(tmp_path, "  run: {command: [x]}\n"
                              "  checkpoint: &ck {dir: /ckpt, grace_seconds: 5}\n"
                              "  restart: {<<: [{policy: Never, backoff_limit: 1}, {policy: OnFailure, backoff_limit: 9}], backoff_limit: 2}\n"
                              "---\n" + _JOB_HEAD.replace("name: j}", "name: k}") +
                              "  run: &run {command: [x], env: {A: a}}\n"
                              "  checkpoint: {<<: {dir: /a, grace_seconds: 5}, dir: /b}\n")
    d = load(cfg)
    assert d.jobs["j"].spec.restart.policy == "Never" and d.jobs["j"].spec.restart.backoff_limit == 2
    assert d.jobs["k"].spec.checkpoint.dir == "/b" and d.jobs["k"].spec.checkpoint.grace_seconds == 5
    (cfg / "jobs.yaml").write_text(_JOB_HEAD + "  run: {command: [x]}\n  checkpoint: {<<: {dir: /a}, dir: /b, dir: /c}\n")
    assert errors_of(cfg) == ["jobs.yaml:8: spec.checkpoint.dir: duplicate key 'dir'"]


def test_aliases_of_one_long_string_are_refused_by_the_text_they_expand_to(tmp_path):
    """Audit: MAX_NODES counted nodes, not text: 5,000 aliases of one 3 MB label (a 3 MB file) validated on and on, the
    digest's JSON of it 15 GB (MemoryError under a 6 GB limit; on this 24 GB machine, the OOM killer)."""
    from reconciler import load as L

    big = "x" * (64 * 1024)
    n = L.MAX_TEXT // len(big) + 2
    cfg = write_config(tmp_path / "c", [topology(), tenant("t")])
    (cfg / "t2.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Tenant\nmetadata:\n  name: t2\n  labels:\n"
                                 f"    k0: &big {big}\n" + "".join(f"    k{i}: *big\n" for i in range(1, n)) + "spec: {}\n")
    errs = errors_of(cfg)
    assert len(errs) == 1 and "MiB of text after alias expansion: refusing" in errs[0], errs


def test_a_huge_name_is_shown_cut_and_its_controls_escaped(tmp_path):
    """Audit: a 2 MB metadata.name was printed whole in each of its document's errors (20,000 bad pool names: 40 GB,
    MemoryError), and a name's `\\r` or escape sequence rewrote the terminal's line (`...\\rok: fleet ...`)."""
    cfg = _with_job(tmp_path, "  pools: [" + ", ".join(["X"] * 50) + "]\n")
    text = (cfg / "jobs.yaml").read_text().replace("{name: j}", "{name: " + "x" * 1_000_000 + "}")
    (cfg / "jobs.yaml").write_text(text)
    errs = errors_of(cfg)
    assert len(errs) == 51 and all(len(e) < 400 for e in errs) and "... (1,000,000 characters)" in errs[0], errs[:2]
    (cfg / "jobs.yaml").write_text(_JOB_HEAD.replace("{name: j}", '{name: "j\\rok: fleet\\e[8m"}'))
    assert any("Job/j\\rok: fleet\\x1b[8m: metadata.name" in e for e in errors_of(cfg)), errors_of(cfg)


def test_a_file_name_is_shown_with_its_controls_escaped(tmp_path):
    """Audit: a file's name was printed as it is, so one a pull request adds, with a newline and an escape sequence in
    it, forged a diagnostic line of its own in validate's output, and in plan's markdown (the PR comment) its text after
    the newline left the indented block and was rendered as markdown (a heading saying the plan was approved)."""
    cfg = tmp_path / "cfg"
    shutil.copytree(QUICKSTART, cfg)
    name = "x\x1b[8m\n# Plan approved\nok.yaml"
    (cfg / name).write_text("kind: Bogus\n")
    shown = "x\\x1b[8m\\n# Plan approved\\nok.yaml"
    assert [e for e in errors_of(cfg) if "Bogus" in e] == [f"{shown}:1: Bogus/?: kind: unknown kind 'Bogus' (expected one of "
                                                            "GuardrailPolicy, Job, License, PlacementPolicy, Pool, Reservation, "
                                                            "SpotPolicy, Tenant, Topology)"]
    res = CliRunner().invoke(app, ["plan", str(cfg), "--format", "markdown"])
    assert res.exit_code == 1
    body = res.stdout.split("\n\n", 1)[1]
    assert body.count("\n") == 1 and body.startswith(f"    {cfg}/{shown}:1: Bogus/?") and "\x1b" not in res.output, res.stdout
    (cfg / name).unlink()
    (cfg / "gone.yaml").symlink_to("nowhere\n# Plan approved")  # where a link leads is shown so too
    assert errors_of(cfg) == ["gone.yaml:1: a dangling symlink (nowhere\\n# Plan approved): fix or remove it"]


def test_many_errors_in_one_document_take_linear_time(tmp_path):
    """Audit: each pydantic error scanned every error found before it: 50,000 bad pool names took 71 s to validate and
    199,000 (a 400 kB file) ~20 minutes. Now ~2 s for the 50,000."""
    import time

    cfg = _with_job(tmp_path, "  pools: [" + ",".join(["X"] * 50_000) + "]\n")
    start = time.process_time()
    errs = errors_of(cfg)
    assert len(errs) == 50_000 and time.process_time() - start < 30


def test_a_zone_or_instance_type_listed_twice_is_refused(tmp_path):
    """Audit: a Pool with `zones: [us-east-1a, us-east-1a]` (or a type twice) validated, and its offers were counted twice:
    CP-SAT could not complete greedy's answer for one CPU job, and the plan was greedy's, "raise --time-limit"."""
    p = pool("p", "aws", "us-east-1", ["us-east-1a", "us-east-1a"], ["m6i.4xlarge", "c6i.8xlarge", "m6i.4xlarge"])
    topo = topology(clouds={"aws": {"us-east-1": ["us-east-1a", "us-east-1b", "us-east-1a"]}})
    errs = errors_of(write_config(tmp_path / "c", [topo, tenant("t"), p]))
    assert any("Pool/p: spec.zones.1: 'us-east-1a' is listed twice (also at index 0)" in e for e in errs), errs
    assert any("Pool/p: spec.instance_types.2: 'm6i.4xlarge' is listed twice (also at index 0)" in e for e in errs), errs
    assert any("Topology/test: spec.clouds.aws.regions.us-east-1.zones.2: zone 'us-east-1a' is listed twice" in e for e in errs), errs


@pytest.mark.parametrize("run,fragment", [
    ({"image": "--privileged", "command": ["ubuntu", "sh"]}, "spec.run.image: String should match pattern"),
    ({"image": "--volume=/:/host", "command": ["sh"]}, "spec.run.image: String should match pattern"),
])
def test_an_image_docker_would_read_as_its_own_option_is_refused(tmp_path, run, fragment):
    """Audit: run.image was any string, and the docker runtime passes it to `docker run` before the command: an image
    `--privileged` ran the job privileged (the command's first word taken as the image), `--volume=/:/host` mounted
    the host's root into the container."""
    errs = errors_of(write_config(tmp_path / "c", [topology(), tenant("t"), job("j", run=run)]))
    assert any(fragment in e for e in errs), errs


def test_a_nul_in_a_command_or_its_environment_is_refused(tmp_path):
    """Audit: `command: [train, "a\\0b"]` or an env value with a NUL validated and applied, and the node agent died
    starting it ("unexpected ValueError: embedded null byte"): no process's arguments or environment can hold one, and
    every other job on that instance was left Starting for ever."""
    j = job("j", run={"command": ["python3", "a\0b"], "env": {"OK": "fine", "X": "\0"}})
    errs = errors_of(write_config(tmp_path / "c", [topology(), tenant("t"), j]))
    nul = "Value error, holds a NUL character (\\0), which no process's arguments or environment can hold"
    assert [e.split(": ", 2)[2] for e in errs] == [f"spec.run.command.1: {nul}", f"spec.run.env.X: {nul}"], errs


@pytest.mark.parametrize("directory,fragment", [
    ("/x/../../../../../../etc", "must not contain `..`"),
    ("ckpt", "must be an absolute path"),
    ("/ckpt:ro", "must not contain `:`"),
])
def test_a_checkpoint_dir_that_leaves_its_root_is_refused(tmp_path, directory, fragment):
    """Audit: the agent makes a job's checkpoint dir as --checkpoint-root/JOB/DIR and the docker runtime mounts it at DIR:
    `dir: /x/../../../../../../etc` was the host's /etc (on the sim, a job wrote outside .reconcile/sim/volumes)."""
    j = job("j", run={"command": ["x"]}, checkpoint={"dir": directory})
    errs = errors_of(write_config(tmp_path / "c", [topology(), tenant("t"), j]))
    assert any("spec.checkpoint.dir: Value error, " + fragment in e for e in errs), errs


def test_a_resource_below_the_models_unit_or_a_year_it_cannot_count_from_is_a_config_error(tmp_path):
    """Audit: `cpu: 1.0e-20` validated and then crashed plan inside the solver (a 1.6e21 bound: "a bug in reconcile"),
    and `submitted: 0001-01-01` with a deadline near it overflowed the planner's date arithmetic. Each is refused
    where it is written; a plan of the quick start's own values is unchanged."""
    from reconciler import api

    cfg = _with_job(tmp_path, "")
    (cfg / "jobs.yaml").write_text(_JOB_HEAD.replace("cpu: 1, memory_gib: 1", "cpu: 1.0e-20, memory_gib: 1.0e-20")
                                   + "  submitted: 0001-01-01T00:00:00\n  deadline: 0001-01-01T00:00:01\n  expected_hours: 100000\n")
    errs = errors_of(cfg)
    for field in ("spec.resources.cpu", "spec.resources.memory_gib", "spec.submitted", "spec.deadline"):
        assert any(e.startswith("jobs.yaml:") and f": {field}: " in e for e in errs), (field, errs)
    (cfg / "jobs.yaml").write_text(_JOB_HEAD.replace("cpu: 1, memory_gib: 1", "cpu: 0.001, memory_gib: 0.001"))
    assert api.plan(cfg, time_limit=5).plan.jobs[0].action == "place"


@pytest.mark.parametrize("text,field", [("  pools: []\n", "spec.pools"), ("  regions: []\n", "spec.regions"), ("  clouds: []\n", "spec.clouds")])
def test_an_empty_allowlist_is_refused_not_read_as_allowing_nothing(tmp_path, text, field):
    """Audit: `pools: []` validated and the job waited for ever with a reason about sizes ("no pool offers ..."); a
    GuardrailPolicy's `allowed_clouds: []` left every job pending. An allowlist names something, or is left out."""
    cfg = _with_job(tmp_path, text)
    errs = errors_of(cfg)
    assert any(e.startswith(f"jobs.yaml:7: Job/j: {field}: ") and "an empty list allows nothing" in e for e in errs), errs
    (cfg / "jobs.yaml").write_text(_JOB_HEAD + "---\napiVersion: fleetops.io/v1alpha1\nkind: GuardrailPolicy\nmetadata: {name: g}\n"
                                   "spec:\n  allowed_clouds: []\n")
    errs = errors_of(cfg)
    assert any("GuardrailPolicy/g: spec.allowed_clouds: " in e and "an empty list allows nothing" in e for e in errs), errs


def test_an_unknown_tenant_or_pool_gets_a_suggestion(tmp_path):
    """Audit: a misspelt field or kind got "did you mean", a misspelt tenant or pool name did not."""
    cfg = _quickstart(tmp_path)
    research = cfg / "jobs" / "research.yaml"
    _edit(research, "  tenant: research", "  tenant: reserch")
    _edit(research, "  spot: never ", "  pools: [aws-cpuu]\n  spot: never ")
    errs = errors_of(cfg)
    assert any("spec.tenant: unknown tenant 'reserch' (did you mean 'research'?)" in e for e in errs), errs
    assert any("unknown pool 'aws-cpuu' (did you mean 'aws-cpu'?)" in e for e in errs), errs


@pytest.mark.parametrize("value", [".nan", ".NaN"])
def test_a_nan_number_is_said_to_be_no_number(tmp_path, value):
    """A NaN budget was refused as 'Input should be less than or equal to 1000000000', as if it were too large."""
    write_config(tmp_path, [topology()])
    (tmp_path / "policy.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: GuardrailPolicy\nmetadata: {name: g}\n"
                                          f"spec:\n  max_hourly_budget: {value}\n")
    errs = errors_of(tmp_path)
    assert any("spec.max_hourly_budget: is not a number (NaN)" in e for e in errs), errs
    assert not any("less than or equal" in e for e in errs), errs
