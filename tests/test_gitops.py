"""The config repo as a git repo: PR -> diff/plan markdown -> merge -> apply --commit ->
spot interruption -> scheduled run heals and commits status."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from providers.sim import SimCloud
from reconciler.cli import app
from reconciler.state import state_dir
from tests.fleetkit import QUICKSTART, ROOT

runner = CliRunner()
NEW_JOB = """apiVersion: fleetops.io/v1alpha1
kind: Job
metadata: {name: rl-rollouts}
spec:
  tenant: research
  replicas: 1
  resources: {gpus: 4, gpu_type: A10G, cpu: 40, memory_gib: 160}
"""


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for k, v in {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
                 "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.com"}.items():
        monkeypatch.setenv(k, v)
    r = tmp_path / "fleet-config"  # the ready config repo of examples/gitops, as its own git repo
    shutil.copytree(ROOT / "examples" / "gitops", r, ignore=shutil.ignore_patterns(".reconcile", "status"))
    assert (r / ".github" / "workflows" / "reconcile.yml").exists() and ".reconcile/" in (r / ".gitignore").read_text()
    git(r, "init", "-q", "-b", "main")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "initial fleet")
    return r


def changed_files(repo, rev="HEAD"):
    return git(repo, "show", "--name-only", "--format=", rev).splitlines()


def test_pull_request_to_healing_run(repo):
    # Day 0: the fleet is applied from main and status is committed.
    out = cli("apply", repo, "--auto-approve", "--commit")
    assert out.exit_code == 0, out.output
    assert "status committed" in out.output
    assert git(repo, "log", "-1", "--format=%s").startswith("fleetops: apply ")
    assert all(f.startswith("status/") for f in changed_files(repo))
    assert git(repo, "status", "--porcelain") == ""

    # A pull request adds a job.
    git(repo, "checkout", "-q", "-b", "add-rl")
    (repo / "jobs" / "rl.yaml").write_text(NEW_JOB)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "add rl-rollouts")
    d = cli("diff", repo, "--base", "main", "--detailed-exitcode")
    assert d.exit_code == 2, d.output
    assert "+ Job/rl-rollouts" in d.output
    assert "| rl-rollouts | absent | reserved on 1x g5.12xlarge" in d.output  # (no run: a reservation, nothing runs)
    assert "aws-a10g g5.12xlarge" in d.output  # one more 4-GPU A10G instance
    md = cli("plan", repo, "--format", "markdown", "--detailed-exitcode")
    assert md.exit_code == 2 and "**1 to create, 0 to delete; jobs: 1 placed" in md.output
    # The base branch alone would change nothing: the PR's diff is exactly its own change.
    assert cli("diff", repo, "--base", "HEAD", "--detailed-exitcode").exit_code == 0

    # Merge, then the apply-on-merge job commits status.
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "add-rl", "-m", "Merge add-rl")
    out = cli("apply", repo, "--auto-approve", "--commit")
    assert out.exit_code == 0, out.output
    assert yaml.safe_load((repo / "status/jobs/rl-rollouts.yaml").read_text())["status"]["phase"] == "Reserved"  # no run
    assert git(repo, "show", "HEAD:status/jobs/rl-rollouts.yaml")  # committed, not just written

    # A spot instance is reclaimed; the scheduled run detects drift, heals and commits.
    spot = next(i for i in SimCloud(state_dir(repo)).instances() if i["market"] == "spot" and i["state"] == "running")
    cli("sim", "interrupt", spot["id"], "--dir", repo)
    assert cli("plan", repo, "--detailed-exitcode").exit_code == 2
    heal = cli("apply", repo, "--auto-approve", "--commit")
    assert heal.exit_code == 0, heal.output
    assert cli("plan", repo, "--detailed-exitcode").exit_code == 0
    log = git(repo, "log", "--format=%s").splitlines()
    assert sum(s.startswith("fleetops: apply ") for s in log) == 3
    assert "1 created" in log[0]
    fleet = yaml.safe_load(git(repo, "show", "HEAD:status/fleet.yaml"))["status"]
    assert fleet["jobs"] == {"running": 0, "starting": 0, "unknown": 0, "reserved": 11, "pending": 0, "succeeded": 0, "failed": 0}  # none has run
    assert spot["id"] not in git(repo, "show", "HEAD:status/fleet.yaml") + "".join(
        git(repo, "show", f"HEAD:status/pools/{p}") for p in git(repo, "ls-tree", "--name-only", "HEAD", "status/pools/").replace("status/pools/", "").split())
    # A run that changes nothing commits nothing.
    again = cli("apply", repo, "--auto-approve", "--commit")
    assert again.exit_code == 0 and "nothing to commit" in again.output


def test_commit_never_takes_anything_but_status(repo):
    (repo / "tenants.yaml").write_text((repo / "tenants.yaml").read_text() + "\n# a staged edit\n")
    git(repo, "add", "tenants.yaml")
    (repo / "notes.txt").write_text("untracked\n")
    assert cli("apply", repo, "--auto-approve", "--commit").exit_code == 0
    assert all(f.startswith("status/") for f in changed_files(repo))
    porcelain = git(repo, "status", "--porcelain")
    assert "M  tenants.yaml" in porcelain and "?? notes.txt" in porcelain  # still staged / untracked


def test_status_branch_leaves_main_alone(repo):
    main_before = git(repo, "rev-parse", "main")
    out = cli("apply", repo, "--auto-approve", "--commit", "--status-branch", "fleet-status")
    assert out.exit_code == 0, out.output
    assert git(repo, "rev-parse", "main") == main_before
    assert git(repo, "status", "--porcelain") == "?? status/"  # written, but not committed to main
    # The status branch holds status/ only, with its own history (like gh-pages).
    files = git(repo, "ls-tree", "-r", "--name-only", "fleet-status").splitlines()
    assert "status/fleet.yaml" in files and all(f.startswith("status/") for f in files)
    spot = next(i for i in SimCloud(state_dir(repo)).instances() if i["market"] == "spot")
    cli("sim", "interrupt", spot["id"], "--dir", repo)
    second = cli("apply", repo, "--auto-approve", "--commit", "--status-branch", "fleet-status")
    assert second.exit_code == 0, second.output
    assert git(repo, "rev-list", "--count", "fleet-status") == "2"
    assert git(repo, "rev-parse", "main") == main_before


def test_a_status_branch_without_commit_is_a_usage_error_before_any_change(repo):
    """`--status-branch` without `--commit` was ignored: the fleet was applied, status/ left uncommitted, and nothing
    said the branch was not used. A usage error now (exit 1), before any provider call."""
    out = cli("apply", repo, "--auto-approve", "--status-branch", "fleet-status")
    assert out.exit_code == 1 and "--status-branch" in out.output and "--commit" in out.output, out.output
    assert _live(repo) == [] and not (repo / "status").exists()
    assert "fleet-status" not in git(repo, "branch", "--format=%(refname)")


def _live(cfg) -> list[str]:
    if not (state_dir(cfg) / "sim").exists():
        return []
    return [i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]


@pytest.mark.parametrize("branch", ["bad..name", "--orphan=x", "-x", "@{-1}", ""])
def test_an_invalid_status_branch_is_refused_before_any_change(repo, branch):
    """Audit: `--status-branch bad..name` created every instance and only then failed in git; `--orphan=x` was even
    taken as a literal branch. Checked before any provider call now: exit 1, the name in the message, nothing made."""
    git(repo, "checkout", "-q", "-b", "other")
    git(repo, "checkout", "-q", "main")  # (so @{-1} would name `other`)
    branches = git(repo, "branch", "--format=%(refname)")
    out = cli("apply", repo, "--auto-approve", "--commit", f"--status-branch={branch}")
    assert out.exit_code == 1 and f"--status-branch {branch!r} is not a valid git branch name" in out.output, out.output
    assert "nothing was changed" in out.output and "unexpected" not in out.output
    assert _live(repo) == [] and not (repo / "status").exists()
    assert git(repo, "branch", "--format=%(refname)") == branches


def test_commit_outside_a_git_work_tree_or_on_a_detached_head_is_refused_before_any_change(tmp_path, repo):
    cfg = tmp_path / "cfg"
    shutil.copytree(QUICKSTART, cfg, ignore=shutil.ignore_patterns(".reconcile", "status"))
    out = cli("apply", cfg, "--auto-approve", "--commit")
    assert out.exit_code == 1 and f"{cfg.resolve()} is not inside a git repository" in out.output, out.output
    assert _live(cfg) == [] and not (cfg / "status").exists()
    git(repo, "checkout", "-q", "--detach")
    out = cli("apply", repo, "--auto-approve", "--commit")
    assert out.exit_code == 1 and "is not on a branch (a detached HEAD)" in out.output, out.output
    assert _live(repo) == [] and not (repo / "status").exists()
    # --status-branch needs no current branch: the fleet is applied and status committed there.
    out = cli("apply", repo, "--auto-approve", "--commit", "--status-branch", "fleet-status")
    assert out.exit_code == 0 and "status committed" in out.output, out.output
    assert len(_live(repo)) > 0 and "status/fleet.yaml" in git(repo, "ls-tree", "-r", "--name-only", "fleet-status")


def test_bot_identity_only_when_none_is_configured(repo, monkeypatch):
    for k in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(repo.parent))  # no global git config
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    assert cli("apply", repo, "--auto-approve", "--commit").exit_code == 0
    assert git(repo, "log", "-1", "--format=%an <%ae>") == "fleetops-reconciler <fleetops-reconciler@users.noreply.github.com>"
    git(repo, "config", "user.name", "ci-bot")
    git(repo, "config", "user.email", "ci@example.com")
    cli("sim", "interrupt", SimCloud(state_dir(repo)).instances()[0]["id"], "--dir", repo)
    assert cli("apply", repo, "--auto-approve", "--commit").exit_code == 0
    assert git(repo, "log", "-1", "--format=%an <%ae>") == "ci-bot <ci@example.com>"


def test_diff_outside_git_is_a_clear_error(tmp_path):
    cfg = tmp_path / "cfg"
    shutil.copytree(QUICKSTART, cfg, ignore=shutil.ignore_patterns(".reconcile", "status"))
    out = cli("diff", cfg, "--base", "main")
    assert out.exit_code == 1 and "not inside a git repository" in out.output


def test_example_workflows_use_real_commands_and_options():
    """Every `reconcile ...` line in the example workflows parses with the real CLI."""
    import re
    import shlex

    import click
    import typer

    from tests.fleetkit import ROOT

    root = ROOT / "examples" / "gitops"
    assert cli("validate", root).exit_code == 0
    group = typer.main.get_command(app)
    seen = set()
    for wf in sorted((root / ".github" / "workflows").glob("*.yml")):
        doc = yaml.safe_load(wf.read_text())
        assert doc["jobs"] and (True in doc or "on" in doc)  # 'on' parses as True in YAML 1.1
        for job in doc["jobs"].values():
            for step in job["steps"]:
                for line in step.get("run", "").splitlines():
                    m = re.search(r"\breconcile (\w+)(.*?)(?:>|$)", line)
                    if not m:
                        continue
                    name, rest = m.group(1), m.group(2)
                    cmd = group.get_command(click.Context(group), name)
                    assert cmd is not None, f"{wf.name}: unknown command {name}"
                    args = shlex.split(rest)
                    cmd.make_context(name, args, resilient_parsing=False)  # raises on unknown options
                    seen.add(name)
    assert {"validate", "diff", "plan", "apply"} <= seen


def test_a_pull_request_giving_a_reservation_a_run_shows_in_the_diff(repo):
    """A placed job without `run` is a reservation; a PR giving it one starts it on merge. The diff says so (reserved
    -> running on the same instance), where it said "running on" both times and so listed nothing."""
    (repo / "jobs" / "rl.yaml").write_text(NEW_JOB)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "add rl-rollouts")
    assert cli("apply", repo, "--auto-approve").exit_code == 0
    git(repo, "checkout", "-q", "-b", "run-rl")
    (repo / "jobs" / "rl.yaml").write_text(NEW_JOB + "  run: {command: [python3, -c, pass]}\n")
    git(repo, "commit", "-q", "-am", "run rl-rollouts")
    d = cli("diff", repo, "--base", "main", "--detailed-exitcode")
    assert d.exit_code == 2, d.output
    assert "| rl-rollouts | reserved on 1x g5.12xlarge" in d.output and "| running on 1x g5.12xlarge" in d.output, d.output


def test_a_pull_request_diff_lists_every_document_it_changes_and_every_job_it_restarts(repo):
    """A PR that resizes a running job and adds a PlacementPolicy and a License. The plan restarts the job ("1 moved":
    resources changed, it restarts); the diff listed no outcome for it (running on the same type before and after) and
    counted 1 document changed: PlacementPolicy, License and Reservation documents were not compared."""
    assert cli("apply", repo, "--auto-approve").exit_code == 0
    git(repo, "checkout", "-q", "-b", "resize")
    jobs = repo / "jobs" / "platform.yaml"
    jobs.write_text(jobs.read_text().replace("resources: {cpu: 14, memory_gib: 48}", "resources: {cpu: 12, memory_gib: 48}"))
    (repo / "policies.yaml").write_text((repo / "policies.yaml").read_text() + """---
apiVersion: fleetops.io/v1alpha1
kind: PlacementPolicy
metadata: {name: default}
spec: {consolidation: WhenEmpty}
---
apiVersion: fleetops.io/v1alpha1
kind: License
metadata: {name: matlab}
spec: {count: 2}
""")
    git(repo, "commit", "-q", "-am", "resize feature-etl, placement policy, a license")
    plan = cli("plan", repo, "--format", "json")
    assert plan.exit_code == 0, plan.output
    moved = [j for j in __import__("json").loads(plan.output)["jobs"] if j["action"] == "move"]
    assert [j["job"] for j in moved] == ["feature-etl"], moved  # (the plan restarts it)
    d = cli("diff", repo, "--base", "main", "--detailed-exitcode")
    assert d.exit_code == 2, d.output
    assert "**3 document(s) changed;" in d.output, d.output
    for doc in ("~ Job/feature-etl", "~ PlacementPolicy", "+ License/matlab"):
        assert doc in d.output, d.output
    row = next((ln for ln in d.output.splitlines() if ln.startswith("| feature-etl |")), None)
    assert row is not None and row.endswith("; move (restarts) |"), d.output


def test_a_diff_of_a_large_pull_request_truncates_its_document_list_like_every_other_section(repo):
    """A PR that adds 100 jobs: the diff's document list (a ```diff block) printed every document, where README says
    sections over 60 rows are truncated with a marker; a PR renaming the 1,000 jobs of bench.generate's 1k fleet gave a
    46,349-character diff of 2,072 lines, most of a comment GitHub caps at 65,536 before the full plan is added to it."""
    git(repo, "checkout", "-q", "-b", "bulk")
    (repo / "jobs" / "bulk.yaml").write_text("---\n".join(
        f"apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {{name: bulk-{i:03d}}}\n"
        "spec: {tenant: research, resources: {cpu: 1, memory_gib: 1}}\n" for i in range(100)))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "100 small jobs")
    d = cli("diff", repo, "--base", "main")
    assert d.exit_code == 0, d.output
    assert "**100 document(s) changed;" in d.output, d.output
    block = d.output.split("```diff\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[:2] == ["+ Job/bulk-000", "+ Job/bulk-001"] and len(block) == 60, len(block)  # before: 100
    assert "_... 40 more document(s) truncated; see `reconcile diff --format json`_" in d.output, d.output
    j = cli("diff", repo, "--base", "main", "--format", "json")
    assert len(__import__("json").loads(j.output)["documents"]) == 100  # the JSON lists them all


def test_a_diff_whose_base_does_not_validate_names_the_base_in_its_error(repo):
    """A broken main (bad YAML merged) and a PR that fixes it: the PR's diff failed with `jobs/product.yaml:30: invalid
    YAML`, a file valid in the PR, never saying the error was the base's. It names it as git does: REF:PATH."""
    good = (repo / "jobs" / "product.yaml").read_text()
    (repo / "jobs" / "product.yaml").write_text(good + "  oops: [\n")
    git(repo, "commit", "-q", "-am", "break main")
    git(repo, "checkout", "-q", "-b", "fix")
    (repo / "jobs" / "product.yaml").write_text(good)
    git(repo, "commit", "-q", "-am", "fix it")
    out = cli("diff", repo, "--base", "main")
    assert out.exit_code == 1, out.output
    assert "main:jobs/product.yaml:" in out.output, out.output


def test_a_diff_reads_the_base_as_a_checkout_has_it_with_its_links_and_submodules(repo):
    """Audit: the base was exported with `git show REF:PATH` of every entry, so a symlinked file became a file holding
    its target's path (`main:jobs/product.yaml:1` not a document: an error the working tree does not have), and a
    submodule in the config repo (a gitlink: vendored charts, say) made every diff an "unexpected CalledProcessError ...
    a bug". A link is a link, as in the checkout, and a submodule an empty directory, as in a checkout without them."""
    (repo / ".shared").mkdir()
    (repo / "jobs" / "product.yaml").rename(repo / ".shared" / "product.yaml")
    (repo / "jobs" / "product.yaml").symlink_to("../.shared/product.yaml")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "product's jobs by a link")
    d = cli("diff", repo, "--base", "main", "--detailed-exitcode")
    assert d.exit_code == 0, d.output  # the base is the working tree: no change
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendor")
    git(repo, "commit", "-q", "-m", "vendor a submodule")
    d = cli("diff", repo, "--base", "main", "--detailed-exitcode")
    assert d.exit_code == 0, d.output


@pytest.mark.parametrize("workflow", ["apply.yml", "reconcile.yml"])
def test_the_workflows_status_push_survives_a_merge_that_landed_during_the_apply(tmp_path, monkeypatch, workflow):
    """The example workflows pushed status with a plain `git push origin HEAD:main`: a PR merged while the apply ran
    (minutes, on a large fleet) made that push non-fast-forward and the step failed, the status commit lost. The step
    (run here as the workflow runs it, bash, against real repositories) rebases the status commit onto main and
    pushes, keeping the merged change."""
    from tests.fleetkit import ROOT

    for k, v in {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
                 "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.com"}.items():
        monkeypatch.setenv(k, v)
    doc = yaml.safe_load((ROOT / "examples" / "gitops" / ".github" / "workflows" / workflow).read_text())
    step = next(s for j in doc["jobs"].values() for s in j["steps"] if s.get("name") == "Push status")
    remote, runner_copy, dev = tmp_path / "remote.git", tmp_path / "runner", tmp_path / "dev"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    subprocess.run(["git", "clone", "-q", str(remote), str(dev)], check=True, capture_output=True)
    (dev / "jobs").mkdir()
    (dev / "jobs" / "a.yaml").write_text("a: 1\n")
    git(dev, "add", "-A")
    git(dev, "commit", "-q", "-m", "a")
    git(dev, "push", "-q", "origin", "HEAD:main")
    subprocess.run(["git", "clone", "-q", str(remote), str(runner_copy)], check=True, capture_output=True)
    # The runner's apply commits status/ while a PR merges upstream.
    (runner_copy / "status").mkdir()
    (runner_copy / "status" / "fleet.yaml").write_text("applied: 1\n")
    git(runner_copy, "add", "status")
    git(runner_copy, "commit", "-q", "-m", "status")
    (dev / "jobs" / "b.yaml").write_text("b: 1\n")
    git(dev, "add", "-A")
    git(dev, "commit", "-q", "-m", "merge b")
    git(dev, "push", "-q", "origin", "HEAD:main")

    out = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=runner_copy, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    files = git(remote, "ls-tree", "-r", "--name-only", "main").split()
    assert {"jobs/a.yaml", "jobs/b.yaml", "status/fleet.yaml"} <= set(files), files
    assert git(remote, "log", "-1", "--format=%s", "main") == "status"


def test_a_diff_with_nothing_applied_lists_as_changes_only_what_the_change_does(tmp_path, monkeypatch):
    """examples/ml-platform, nothing applied, and a PR adding one 1-GPU job: the diff listed 7 job outcomes at the same
    $/h, 6 of them jobs the PR did not touch that the two plans only start elsewhere (3 in another zone of their pool, 3
    sharing another instance): neither plan is applied, nothing runs, equal-cost choices fell either way. Only the new
    job's outcome changes; the others are listed apart, as where each plan would start them, in markdown and JSON."""
    import json

    for k, v in {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
                 "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.com"}.items():
        monkeypatch.setenv(k, v)
    r = tmp_path / "ml"
    shutil.copytree(ROOT / "examples" / "ml-platform", r, ignore=shutil.ignore_patterns(".reconcile", "status"))
    git(r, "init", "-q", "-b", "main")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "fleet")
    with open(r / "jobs" / "research.yaml", "a") as f:
        f.write("---\napiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: sweep-9}\nspec:\n  tenant: research\n"
                "  priority: low\n  resources: {gpus: 1, gpu_type: A100, cpu: 10, memory_gib: 80}\n")
    doc = json.loads(cli("diff", r, "--base", "main", "--format", "json", "--time-limit", 5).output)
    assert [(j["job"], j["base"]) for j in doc["jobs"]] == [("sweep-9", "absent")], doc["jobs"]
    for j in doc["placed_elsewhere"]:  # (each started by both plans, in the same state: only where differs)
        assert j["base"] != j["head"] and j["base"].split(" on ")[0] == j["head"].split(" on ")[0], j
    md = cli("diff", r, "--base", "main", "--time-limit", 5).output
    assert "1 job outcome(s) change" in md, md
    rows = [ln.split(" | ")[0] for ln in md.split("<details>")[0].splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows == ["| job", "| sweep-9"], md


def test_a_base_ref_holding_a_backtick_stays_one_code_span_in_the_diff_heading(repo):
    """The heading put --base in backticks as given: a ref with a backtick (git allows one) closed the code span and
    left the rest of the PR comment's heading as markdown."""
    git(repo, "branch", "we`ird")
    d = cli("diff", repo, "--base", "we`ird")
    assert d.exit_code == 0, d.output
    assert d.stdout.splitlines()[0] == "### fleetops: what this change does (against ``we`ird``)", d.stdout


def test_a_markdown_code_span_holds_any_text():
    from reconciler.render import md_code

    assert md_code("main") == "`main`"
    assert md_code("a``b") == "```a``b```"
    assert md_code("`x") == "`` `x ``"  # (CommonMark strips one space each side when both are there)
    assert md_code("a\nb") == "`a\\nb`"  # (a newline ended the heading)
