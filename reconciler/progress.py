"""Apply progress for people: a live display on a terminal, one line per finished action otherwise.

A CI log gets plain lines (`[3/12] created +3 -> i-0ab (spot g5.xlarge in us-east-1b) in 0.15s`), a terminal the
same lines above a live bar (rich). Fed by reconciler.apply's ApplyEvent callback; prints, decides nothing."""

from __future__ import annotations

import signal
import sys
import threading
from typing import ClassVar, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from reconciler.apply import ApplyEvent
from reconciler.errors import printable
from reconciler.plan import Plan
from reconciler.words import use_color

_DONE = {"create": "created", "delete": "deleted", "tag": "recorded placements on"}


def console_for(stream: TextIO, color: bool) -> Console:
    return Console(file=stream, force_terminal=color, color_system="standard" if color else None,
                   no_color=not color, highlight=False, soft_wrap=True)


class ApplyProgress:
    """Call it with each ApplyEvent. `live`: a rich progress bar below the lines (a terminal only)."""

    def __init__(self, plan: Plan, stream: TextIO | None = None, *, live: bool | None = None, color: bool | None = None):
        stream = stream or sys.stdout
        self.total = len(plan.creates) + len(plan.deletes)
        self.done = 0
        self.color = use_color(stream) if color is None else color
        self.console = console_for(stream, self.color)
        self.live = bool(stream.isatty()) if live is None else live
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> ApplyProgress:
        if self.live and self.total:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
            self._task = self._bar.add_task("applying", total=self.total)
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, e: ApplyEvent) -> None:
        counted = e.action in ("create", "delete")
        if e.phase == "started":
            if self._bar is not None:
                self._bar.update(self._task, description=printable(f"{e.action} {e.target} ({e.what})"))
            return
        if e.phase == "skipped":
            return
        if counted:
            self.done += 1
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)
        step = f"[{self.done}/{self.total}] " if counted else "  "
        subject = f"{e.target} -> {e.instance_id}" if e.action == "create" and e.instance_id else e.target
        what = f" ({e.what})" if e.what and e.action != "tag" else ""
        if e.phase == "failed":
            style = "red"
            line = f"{step}FAILED {e.action} {subject}{what} after {e.elapsed_s:.2f}s (the error is listed at the end)"
        else:
            style = {"create": "green", "delete": "red"}.get(e.action, "dim")
            line = f"{step}{_DONE[e.action]} {subject}{what} in {e.elapsed_s:.2f}s"
        # (an instance id is the cloud's, a delete's target read back from it: escaped as errors are, errors.printable)
        self.console.print(printable(line), style=style if self.color else None, markup=False)


class StopOnInterrupt:
    """Ctrl-C (SIGINT) or SIGTERM during an apply: the first one asks the apply to start no new action (the ones in
    flight finish and are recorded, the lock is released); a second one, or one before any action started,
    interrupts at once. SIGTERM is what CI runners (a cancelled GitLab job, a Kubernetes pod or systemd unit stopped)
    send: it killed the apply mid-action, leaving the lock and no state of what it had made (the next plan found it by
    the instances' tags); Terraform stops gracefully on either signal the same way."""

    _NAMES: ClassVar[dict[int, str]] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.applying = False  # set once actions are about to start
        self.requested = threading.Event()
        self.signum = signal.SIGINT  # the signal that stopped it (the last one received)
        self._previous: dict[int, object] = {}

    @property
    def how(self) -> str:
        """What stopped it, as people name it ("Ctrl-C", "SIGTERM")."""
        return self._NAMES.get(self.signum, f"signal {int(self.signum)}")

    @property
    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a process it ended (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + int(self.signum)

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in self._NAMES:
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def __call__(self) -> bool:
        return self.requested.is_set()

    def _handler(self, signum, frame) -> None:
        self.signum = signum
        if not self.applying or self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()
        print(f"\nStopping ({self.how}): no new action starts; the ones in flight finish and are recorded "
              "(Ctrl-C again to abort at once)", file=self.stream, flush=True)


__all__ = ["ApplyProgress", "StopOnInterrupt", "console_for", "use_color"]
