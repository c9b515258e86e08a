"""Git plumbing for the config repo: commit status/ back, read another ref's config.

Status commits touch only the status/ directory, never anything else a user may
have staged: they are built on a private index (GIT_INDEX_FILE) with plumbing
commands, so they also work onto a branch that is not checked out."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from reconciler.errors import ReconcileError

BOT = {"GIT_AUTHOR_NAME": "fleetops-reconciler", "GIT_AUTHOR_EMAIL": "fleetops-reconciler@users.noreply.github.com"}


class GitError(ReconcileError):
    """A git command failed."""


def _identity(repo: Path) -> dict:
    """The bot is the author only where neither git config nor the environment names one."""
    if os.environ.get("GIT_AUTHOR_EMAIL") or subprocess.run(
            ["git", "-C", str(repo), "config", "user.email"], capture_output=True).returncode == 0:
        return {}
    return {**BOT, "GIT_COMMITTER_NAME": BOT["GIT_AUTHOR_NAME"], "GIT_COMMITTER_EMAIL": BOT["GIT_AUTHOR_EMAIL"]}


def git(repo: Path, *args: str, env: dict | None = None, input: str | None = None) -> str:
    full_env = {**os.environ, **(env or {})}
    if args and args[0] == "commit-tree":
        full_env.update(_identity(repo))
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=full_env, input=input)
    if res.returncode != 0:
        raise GitError(f"git {' '.join(args[:2])} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout.strip()


def repo_root(path: Path) -> Path:
    try:
        return Path(git(path, "rev-parse", "--show-toplevel"))
    except GitError as e:
        raise GitError(f"{path} is not inside a git repository ({e})") from None


def commit_status(config_dir: Path, message: str, branch: str | None = None) -> str | None:
    """Commit config_dir/status to `branch` (default: the current branch). Returns the new
    commit id, or None when status/ did not change. A separate status branch holds only
    status/, with its own history (like gh-pages), so it never conflicts with config."""
    config_dir = Path(config_dir).resolve()
    root = repo_root(config_dir)
    status_rel = (config_dir / "status").relative_to(root).as_posix()
    target = f"refs/heads/{branch}" if branch else git(root, "symbolic-ref", "HEAD")
    try:
        parent: str | None = git(root, "rev-parse", "--verify", "-q", f"{target}^{{commit}}")
    except GitError:
        parent = None  # a new status branch, or an unborn current branch
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if parent:
            git(root, "read-tree", parent, env=env)
        else:
            git(root, "read-tree", "--empty", env=env)
        git(root, "rm", "-r", "-q", "-f", "--cached", "--ignore-unmatch", "--", status_rel, env=env)
        if (config_dir / "status").exists():
            # metrics.prom is for node_exporter on this host; its timings change every run, so it is not history.
            git(root, "add", "-f", "--", status_rel, f":(exclude){status_rel}/metrics.prom", env=env)
        tree = git(root, "write-tree", env=env)
    if parent and git(root, "rev-parse", f"{parent}^{{tree}}") == tree:
        return None
    args = ["commit-tree", tree, "-F", "-"] + (["-p", parent] if parent else [])
    commit = git(root, *args, input=message)
    git(root, "update-ref", target, commit, *( [parent] if parent else []))
    if not branch:
        # Keep the work tree's index in step for status/ only, so `git status` stays clean there.
        git(root, "reset", "-q", "--", status_rel)
    return commit


def export_config(config_dir: Path, ref: str, dest: Path) -> Path:
    """Write the config directory as it is at `ref` into dest (for `reconcile diff --base`)."""
    config_dir = Path(config_dir).resolve()
    root = repo_root(config_dir)
    rel = config_dir.relative_to(root).as_posix()
    spec = f"{ref}:{rel}" if rel != "." else f"{ref}:"
    try:
        git(root, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
    except GitError:
        raise GitError(f"git ref {ref!r} does not exist in {root} (a branch, tag or commit; `git fetch` first for "
                       "a remote one such as origin/main)") from None
    try:
        git(root, "rev-parse", "--verify", "-q", spec)
    except GitError:
        raise GitError(f"{rel or '.'} does not exist at {ref}") from None
    listing = git(root, "ls-tree", "-r", "-z", "--name-only", ref, "--", rel if rel != "." else ".")
    for name in filter(None, listing.split("\0")):
        inner = Path(name).relative_to(rel) if rel != "." else Path(name)
        out = dest / inner
        out.parent.mkdir(parents=True, exist_ok=True)
        data = subprocess.run(["git", "-C", str(root), "show", f"{ref}:{name}"], capture_output=True, check=True).stdout
        out.write_bytes(data)
    return dest
