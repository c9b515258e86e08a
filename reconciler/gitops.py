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
    """The root of the git work tree holding `path`; an error naming `path` outside one (no repository, a bare
    one, or inside .git)."""
    try:
        return Path(git(path, "rev-parse", "--show-toplevel"))
    except GitError as e:
        raise GitError(f"{path} is not inside a git repository's work tree ({e})") from None


def check_commit(config_dir: Path, branch: str | None = None) -> Path:
    """What `apply --commit [--status-branch B]` needs, checked before the apply changes anything (it used to
    create every instance, then fail): config_dir inside a git work tree, and B a valid branch name (never one
    starting with '-', which git could read as an option: `--orphan=x` was taken as a literal branch), or,
    without B, a current branch to commit to (not a detached HEAD). Returns the work tree's root."""
    root = repo_root(Path(config_dir).resolve())
    if branch is not None:
        why = ("it starts with '-', which git would read as an option" if branch.startswith("-")
               else "it is empty" if not branch else None)
        if why is None:
            try:  # (the name cannot start with '-' here, so git reads it as a name, not an option)
                if git(root, "check-ref-format", "--branch", branch) != branch:
                    why = "git reads it as another branch (such as @{-1}, the previous one)"
                else:
                    git(root, "check-ref-format", f"refs/heads/{branch}")  # as commit_status names it
            except GitError:
                why = "git refuses it: no '..', spaces, '~^:?*[\\', '@{', a trailing '.lock' or '/'"
        if why is not None:
            raise GitError(f"--status-branch {branch!r} is not a valid git branch name ({why}); nothing was changed. "
                           "Name a branch such as fleet-status (`git check-ref-format --branch NAME` checks a name)")
    else:
        try:
            git(root, "symbolic-ref", "-q", "HEAD")
        except GitError:
            raise GitError(f"--commit: HEAD of {root} is not on a branch (a detached HEAD), so there is no current branch "
                           "to commit status to; nothing was changed. Check out a branch, or name one with "
                           "--status-branch") from None
    return root


def commit_status(config_dir: Path, message: str, branch: str | None = None) -> str | None:
    """Commit config_dir/status to `branch` (default: the current branch). Returns the new
    commit id, or None when status/ did not change. A separate status branch holds only
    status/, with its own history (like gh-pages), so it never conflicts with config.
    `apply --commit` calls check_commit before applying; it is checked here again all the same."""
    config_dir = Path(config_dir).resolve()
    root = check_commit(config_dir, branch)
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
        if ref.startswith("-"):  # (never handed to git, which could read it as an option: `git show --output=FILE`)
            raise GitError(ref)
        git(root, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
    except GitError:
        raise GitError(f"git ref {ref!r} does not exist in {root} (a branch, tag or commit; `git fetch` first for "
                       "a remote one such as origin/main)") from None
    try:
        git(root, "rev-parse", "--verify", "-q", spec)
    except GitError:
        raise GitError(f"{rel or '.'} does not exist at {ref}") from None
    listing = git(root, "ls-tree", "-r", "-z", ref, "--", rel if rel != "." else ".")
    for entry in filter(None, listing.split("\0")):
        meta, name = entry.split("\t", 1)
        mode, kind, obj = meta.split(" ")
        inner = Path(name).relative_to(rel) if rel != "." else Path(name)
        out = dest / inner
        out.parent.mkdir(parents=True, exist_ok=True)
        # As a checkout has it: a submodule (a gitlink) an empty directory, a link a link (load judges where it leads),
        # each file its blob. (`git show REF:PATH` of a gitlink failed: an "unexpected CalledProcessError", a bug.)
        if kind == "commit":
            out.mkdir(exist_ok=True)
            continue
        data = subprocess.run(["git", "-C", str(root), "cat-file", "blob", obj], capture_output=True, check=True).stdout
        if mode == "120000":
            out.symlink_to(os.fsdecode(data))
        else:
            out.write_bytes(data)
    return dest
