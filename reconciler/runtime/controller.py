"""`reconcile controller DIR`: plan and apply when something happened, not on a schedule.

It wakes every `poll` seconds and plans when the desired state's digest changed, when the node
agents report something the fleet must react to (a job finished or failed for good, an instance
Interrupting or silent), or when `resync` seconds passed (drift: a vanished instance, a price).
An interruption notice is acted on at its first sight. It plans without the lock and applies that
saved plan under the lock (refused if the fleet or the config changed in between: then it plans
again at the next wake-up), so the lock is held only while applying. An apply that fails otherwise
(a guardrail refuses it, a provider error) is tried again after a backoff that doubles from `poll`
up to `resync`, or at once when the config or the agents' reports change: planning every poll for a
refusal that stands cost a core on a large fleet. SIGTERM ends it between steps."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from providers.redact import redact
from reconciler.errors import ConfigError, LockError, ReconcileError, StalePlanError


@dataclass
class Trigger:
    digest: str = ""
    bus: tuple = ()
    at: float = 0.0
    failures: int = 0  # applies that failed in a row since the last one that did not


def retry_after(failures: int, poll: float, resync: float) -> float:
    """Seconds between plans while nothing changes: `resync`, or after failed applies a backoff doubling from `poll`."""
    return resync if failures == 0 else min(resync, poll * 2 ** failures)


def bus_signature(view) -> tuple:
    """What in the agents' reports calls for a new plan: jobs finished (succeeded or failed for good)
    and instances to replace. Heartbeats and progress do not."""
    if view is None:
        return ()
    return (tuple(sorted(view.finished.items())), tuple(sorted(view.unhealthy)))


def gone_lines(plan, deleted: list[str], most: int = 20) -> list[str]:
    """One line per instance the apply deleted, with the plan's reason: an instance gone from under its work is the
    first thing an operator asks about (a controller test saw its job's instance gone and the log could not say why)."""
    why = {d.instance_id: d.reason for d in plan.deletes}
    lines = [f"  deleted {i}: {why.get(i, 'not in the plan')}" for i in deleted[:most]]
    return lines + ([f"  and {len(deleted) - most} more deleted"] if len(deleted) > most else [])


PULL_TIMEOUT = 60.0  # seconds a `git pull` may take before it is given up (a remote that never answers)


class Controller:
    def __init__(self, config_dir: Path, *, provider: str = "sim", state: str | None = None, options: dict | None = None,
                 time_limit: float = 10.0, poll: float = 2.0, resync: float = 60.0, pull: bool = False,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 pull_timeout: float = PULL_TIMEOUT):
        self.config_dir = Path(config_dir)
        self.provider, self.state, self.options = provider, state, options or {}
        self.time_limit, self.poll, self.resync, self.pull = time_limit, poll, resync, pull
        self.pull_timeout = pull_timeout
        self.should_stop: Callable[[], bool] = lambda: False  # run()'s: SIGTERM, asked during a pull or an apply
        self.log, self.clock = log, clock
        self.last = Trigger()
        self.applies = 0
        self.view = None  # the FleetView of the last plan or apply: what /metrics serves (None before the first)
        self._said: dict[str, tuple[str, float]] = {}  # what _say last logged under a key, and when

    def _say(self, key: str, message: str) -> None:
        """Log a standing condition (a config that does not validate, a failing pull) when it is new or changed, and
        again every `resync` seconds while it stands: it was logged at every poll, 30 lines a minute of the same."""
        last = self._said.get(key)
        if last is None or last[0] != message or self.clock() - last[1] >= self.resync:
            self.log(message)
            self._said[key] = (message, self.clock())

    def _why(self) -> tuple[str | None, str, tuple]:
        """(reason to plan or None, the desired digest, the bus signature)."""
        from reconciler.backend import backend_for
        from reconciler.api import load
        from reconciler.runtime.publish import read_view

        desired = load(self.config_dir)
        backend = backend_for(self.config_dir, self.state)
        view = read_view(backend, desired, backend.load().placements, None)
        sig = bus_signature(view)
        if desired.digest != self.last.digest:
            return ("the desired state changed" if self.last.digest else "start"), desired.digest, sig
        if sig != self.last.bus and view is not None:
            new_bad = sorted(set(view.unhealthy) - set(self.last.bus[1] if self.last.bus else ()))
            if new_bad:
                return f"replace {', '.join(new_bad)}: {view.unhealthy[new_bad[0]]}", desired.digest, sig
            new_done = sorted(set(view.finished.items()) - set(self.last.bus[0] if self.last.bus else ()))
            if new_done:
                return "jobs finished: " + ", ".join(f"{j} {p}" for j, p in new_done), desired.digest, sig
            # (what went away, an instance the last apply replaced, calls for nothing: planned again, every
            # replacement was followed by a plan "jobs finished: : no changes")
            self.last.bus = sig
        if self.clock() - self.last.at >= retry_after(self.last.failures, self.poll, self.resync):
            return ("retry after a failed apply" if self.last.failures else "resync"), desired.digest, sig
        return None, desired.digest, sig

    def step(self) -> bool:
        """One wake-up; True when it applied a plan."""
        from reconciler import api
        from reconciler.render import summary_line

        if self.pull:
            self._pull()
            if self.should_stop():
                return False
        try:
            why, digest, sig = self._why()
        except ConfigError as e:
            self._say("config", f"the config does not validate ({len(e.diagnostics)} error(s)); keeping the fleet as it is: {e.diagnostics[0]}")
            return False
        except ReconcileError as e:
            self._say("config", f"cannot read the state: {e}")
            return False
        self._said.pop("config", None)
        if why is None:
            return False
        failures = self.last.failures if why.startswith(("resync", "retry")) else 0  # a change is tried at once, afresh
        try:
            res = api.plan(self.config_dir, provider=self.provider, time_limit=self.time_limit, options=self.options, state=self.state)
        except ReconcileError as e:
            self.last = Trigger(digest, sig, self.clock(), failures + 1)
            self.log(f"{why}: plan failed: {e} (next try in {retry_after(failures + 1, self.poll, self.resync):g}s, "
                     "or when the config or the fleet changes)")
            return False
        self.last = Trigger(digest, sig, self.clock())
        self.view = api.fleet_view(res)
        if not res.plan.has_changes:
            if why not in ("resync", "retry after a failed apply"):
                self.log(f"{why}: plan {res.plan.id}: no changes")
            try:  # the checkpoints of a removed job, once its replicas' stop is reported (an apply does it too)
                for note in api.remove_checkpoints(self.config_dir, self.state):
                    self._say(f"checkpoints {note.split(':')[0]}", note)
            except ReconcileError as e:
                self._say("checkpoints", f"checkpoints of removed jobs not collected: {e}")
            return False
        self.log(f"{why}: plan {res.plan.id}: {summary_line(res.plan)}")
        try:
            done = api.apply(self.config_dir, saved_plan=res.plan, provider=self.provider, time_limit=self.time_limit,
                             options=self.options, state=self.state, should_stop=self.should_stop)
        except (StalePlanError, LockError) as e:
            self.log(f"not applied ({e}); planning again")
            self.last = Trigger()  # plan again at the next wake-up
            return False
        except ReconcileError as e:
            self.last.failures = failures + 1
            wait = retry_after(self.last.failures, self.poll, self.resync)
            self.log(f"apply of plan {res.plan.id} failed: {e} (next try in {wait:g}s, or when the config or the fleet changes)")
            return False
        self.applies += 1
        self.view = done.view or self.view
        r = done.report
        if r.stopped:  # (SIGTERM: as `reconcile apply`, no action started after it; status written, the lock released)
            self.log(f"stopped plan {res.plan.id} (asked to stop: SIGTERM): {r.counts}, "
                     f"{len(r.not_started)} action(s) not started; the next controller carries on")
        else:
            self.log(f"applied plan {res.plan.id}: {r.counts}")
        for line in gone_lines(res.plan, r.deleted):
            self.log(line)
        return True

    def _pull(self) -> None:
        """`git pull --ff-only`, given up after pull_timeout seconds or when a stop is asked for: a remote that never
        answers (a black-holed network, a prompt for a password or a host key) held the controller in it, with no
        plan, no reaction to interruptions, and SIGTERM not heeded. git never prompts here, and what it started
        (ssh, a credential helper) is killed with it: it runs in its own process group.

        Where the repo tracks status/ (examples/gitops: CI's `apply --commit` commits it), the controller's own applies
        rewrite it, and a pull of a commit touching it was refused ("Your local changes ... would be overwritten") at
        every poll from then on: no config change was pulled again. status/ is the reconciler's output, written again
        by the next apply: where only status/ stands in the pull's way, the controller's copy yields to what was
        committed and the pull runs again (nothing outside status/ is touched: a local config edit still stops it)."""
        import os

        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        err = self._git_pull(env)
        if err is not None and "would be overwritten" in err and self._yield_status(env, err):
            err = self._git_pull(env)
        if self._follow_rewritten_upstream(env):
            err = None
        if err:
            self._say("pull", f"git pull failed: {redact(err.strip()[:200])}")
        else:
            self._said.pop("pull", None)

    def _git_pull(self, env: dict) -> str | None:
        """Run the pull (see _pull): None if it succeeded or was given up (logged), else git's error."""
        import os
        import signal
        import subprocess

        proc = subprocess.Popen(["git", "-C", str(self.config_dir), "pull", "--ff-only", "--quiet"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        deadline = time.monotonic() + self.pull_timeout
        why = None
        while True:
            try:
                _, err = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if self.should_stop():
                    why = "git pull stopped: asked to stop"
                elif time.monotonic() >= deadline:
                    why = f"git pull failed: no answer in {self.pull_timeout:g}s; planning from the config as it is"
                if why is not None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.communicate()
                    self.log(why)
                    return None
        return None if proc.returncode == 0 else (err or f"exit {proc.returncode}")

    def _follow_rewritten_upstream(self, env: dict) -> bool:
        """Where the checkout has commits its upstream no longer has, and every one of them was upstream's once (the
        remote-tracking ref's reflog holds a tip they are in), upstream took them back (a force-push: the GitOps
        rollback) and the checkout follows it (`git reset --keep`, which keeps local edits or refuses). `--ff-only`
        kept it on the commit taken back, enforced at every poll ("Already up to date", or "Not possible to
        fast-forward" once upstream moved on). A commit made in the checkout itself was never upstream's: it is kept
        and said. Whether it moved the checkout."""
        import subprocess

        def git(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["git", "-C", str(self.config_dir), *args], capture_output=True, text=True, env=env,
                                  stdin=subprocess.DEVNULL, timeout=30)

        upstream = git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}").stdout.strip()
        ahead = git("rev-list", "@{upstream}..HEAD").stdout.split() if upstream else []
        if not ahead:
            self._said.pop("ahead", None)
            return False
        tips = git("reflog", "show", "--format=%H", f"refs/remotes/{upstream}", "--").stdout.split()
        if not any(git("merge-base", "--is-ancestor", "HEAD", tip).returncode == 0 for tip in dict.fromkeys(tips[:200])):
            self._say("ahead", f"this checkout has {len(ahead)} commit(s) not on {upstream} that were never pulled from it: "
                               f"planning from them, not following {upstream}")
            return False
        reset = git("reset", "-q", "--keep", "@{upstream}")
        if reset.returncode != 0:
            self._say("ahead", f"{upstream} took back {len(ahead)} commit(s) this checkout is on (a force-push), but the "
                               f"checkout cannot follow it: {redact(reset.stderr.strip()[:200])}")
            return False
        now = git("rev-parse", "--short", "HEAD").stdout.strip()
        self.log(f"{upstream} no longer has {len(ahead)} commit(s) this checkout was on (a force-push): following it to {now}")
        self._said.pop("ahead", None)
        return True

    def _yield_status(self, env: dict, err: str) -> bool:
        """Put the tracked status/ files back as committed, and take out the untracked ones the pull would write over,
        where every path git named is under status/; whether it did."""
        import subprocess

        named = [ln.strip() for ln in err.splitlines() if ln.startswith(("\t", " "))]
        prefix = subprocess.run(["git", "-C", str(self.config_dir), "rev-parse", "--show-prefix"], capture_output=True, text=True,
                                env=env, timeout=30).stdout.strip()
        status = f"{prefix}status/"
        if not named or not all(p.startswith(status) for p in named):
            return False
        root = subprocess.run(["git", "-C", str(self.config_dir), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                              env=env, timeout=30).stdout.strip()
        for p in named:
            tracked = subprocess.run(["git", "-C", root, "ls-files", "--error-unmatch", "--", p], capture_output=True, env=env, timeout=30)
            if tracked.returncode == 0:
                subprocess.run(["git", "-C", root, "checkout", "HEAD", "--", p], capture_output=True, env=env, timeout=30)
            else:
                (Path(root) / p).unlink(missing_ok=True)
        self.log(f"status/ as committed upstream replaces this controller's copy of {len(named)} file(s) (the next apply writes it again)")
        return True

    def run(self, should_stop: Callable[[], bool]) -> None:
        self.log(f"watching {self.config_dir} (poll {self.poll:g}s, resync {self.resync:g}s)")
        self.should_stop = should_stop
        while not should_stop():
            self.step()
            limit = time.monotonic() + self.poll
            while time.monotonic() < limit and not should_stop():
                time.sleep(min(0.2, self.poll))
        self.log(f"stopped after {self.applies} apply(s)")
