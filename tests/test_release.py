"""Releases and installs: the version comes from git tags, `reconcile --version` says it, the release workflow
builds and checks what it publishes, and the GitOps example's install line resolves to what this project builds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from typer.testing import CliRunner

from reconciler.cli import app

ROOT = Path(__file__).resolve().parent.parent
GITOPS = ROOT / "examples" / "gitops" / ".github"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _install_line() -> str:
    """The pip requirement the example's composite action installs, with the shell variables left in."""
    action = yaml.safe_load((GITOPS / "actions" / "install-fleetops" / "action.yml").read_text())
    script = "\n".join(step["run"] for step in action["runs"]["steps"] if "run" in step)
    found = re.findall(r'pip install "([^"]+)"', script)
    assert len(found) == 1, script
    return found[0]


def test_every_gitops_workflow_installs_through_the_pinned_action():
    for wf in sorted((GITOPS / "workflows").glob("*.yml")):
        text = wf.read_text()
        assert "pip install" not in text, f"{wf.name} installs on its own"
        steps = [s for job in yaml.safe_load(text)["jobs"].values() for s in job["steps"]]
        uses = [s for s in steps if s.get("uses") == "./.github/actions/install-fleetops"]
        assert len(uses) == 1, wf.name
        assert uses[0]["with"] == {"repo": "${{ vars.FLEETOPS_REPO }}", "ref": "${{ vars.FLEETOPS_REF }}"}, wf.name
        runs = [i for i, s in enumerate(steps) if "reconcile " in s.get("run", "")]
        assert runs and steps.index(uses[0]) < min(runs), wf.name


def test_install_line_names_this_project_and_its_extras():
    req = Requirement(_install_line())
    assert req.name == PYPROJECT["project"]["name"]
    assert req.extras and req.extras <= set(PYPROJECT["project"]["optional-dependencies"])
    assert req.url == "git+https://github.com/${FLEETOPS_REPO}@${FLEETOPS_REF}"  # pinned: a ref is required


@pytest.fixture(scope="module")
def tagged_clone(tmp_path_factory) -> Path:
    """This repository as committed, cloned, with a release tag on HEAD."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    repo = tmp_path_factory.mktemp("release") / "fleetops"
    _git(ROOT.parent, "clone", "-q", "--no-hardlinks", str(ROOT), str(repo))
    _git(repo, "tag", "-a", "v9.8.7", "-m", "release 9.8.7")
    return repo


def test_install_line_builds_this_project_at_the_tag(tagged_clone, tmp_path):
    """The action's exact line, with github.com swapped for the tagged clone: pip builds a wheel from it (what
    the release workflow publishes for that tag), named for this project at the tag's version, with the extras
    the workflows ask for and the catalog data inside."""
    line = _install_line().replace("https://github.com/${FLEETOPS_REPO}", f"file://localhost{tagged_clone}")
    line = line.replace("${FLEETOPS_REF}", "v9.8.7")
    out = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), line],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob("*.whl")
    assert wheel.name == "fleetops_reconciler-9.8.7-py3-none-any.whl"
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read("fleetops_reconciler-9.8.7.dist-info/METADATA").decode()
    assert any(n.startswith("providers/data/") and n.endswith(".json") for n in names)
    assert "Name: fleetops-reconciler" in meta and "Version: 9.8.7" in meta
    provided = set(re.findall(r"^Provides-Extra: (\S+)$", meta, re.M))
    assert Requirement(line).extras <= provided, (Requirement(line).extras, provided)


@pytest.mark.slow
def test_untagged_checkout_still_installs_with_a_dev_version(tmp_path):
    """A fresh clone without tags (CI's) gets a development version, not a failure."""
    repo = tmp_path / "untagged"
    _git(ROOT.parent, "clone", "-q", "--no-hardlinks", "--no-tags", str(ROOT), str(repo))
    for tag in _git(repo, "tag").split():
        _git(repo, "tag", "-d", tag)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q",
                        "--report", str(tmp_path / "r.json"), str(repo)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    v = json.loads((tmp_path / "r.json").read_text())["install"][0]["metadata"]["version"]
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?\.dev\d+\+g[0-9a-f]+(\.d\d+)?", v), v


def test_version_flag_prints_the_installed_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0
    assert r.output.strip() == f"reconcile {installed_version('fleetops-reconciler')}"


def test_release_workflow_builds_checks_and_publishes_only_tags():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads a bare `on:` key as true
    assert on["push"]["tags"] == ["v*"]
    build = wf["jobs"]["build"]
    runs = "\n".join(s.get("run", "") for s in build["steps"])
    assert build["steps"][0]["with"]["fetch-depth"] == 0  # the tags, for the version
    assert "python -m build" in runs and "twine check --strict dist/*" in runs
    assert "reconcile --version" in runs
    publish = wf["jobs"]["publish"]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')" and publish["needs"] == "build"
    assert publish["permissions"] == {"id-token": "write"}  # trusted publishing: no stored token
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for s in publish["steps"])
