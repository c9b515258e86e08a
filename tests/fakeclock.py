"""The time the cloud fakes (tests/arm_fake.py, tests/gce_fake.py) run their operations by.

Real clouds finish a long-running operation when its work is done, whether anyone polls it or not: a VM is Creating
(Azure) or PROVISIONING (GCE) for a while, then running. The fakes do the same by this clock: an operation ends
`latency` seconds after it starts. It follows time.monotonic(); a test may freeze() it (nothing then progresses until
it advance()s) or advance() it past an operation's end at once, so tests stay fast and deterministic.
"""

from __future__ import annotations

import threading
import time


class FakeClock:
    def __init__(self) -> None:
        self._offset = 0.0
        self._frozen_at: float | None = None
        self._changed = threading.Condition()

    def now(self) -> float:
        with self._changed:
            return self._frozen_at if self._frozen_at is not None else time.monotonic() + self._offset

    def freeze(self) -> None:
        """Stop time: operations in flight stay in flight until advance() or thaw()."""
        with self._changed:
            if self._frozen_at is None:
                self._frozen_at = time.monotonic() + self._offset

    def thaw(self) -> None:
        """Let time run again from where it stood."""
        with self._changed:
            if self._frozen_at is not None:
                self._offset = self._frozen_at - time.monotonic()
                self._frozen_at = None
            self._changed.notify_all()

    def advance(self, seconds: float) -> None:
        """Move time on by `seconds` at once (frozen or not)."""
        with self._changed:
            if self._frozen_at is not None:
                self._frozen_at += seconds
            else:
                self._offset += seconds
            self._changed.notify_all()

    def sleep_until(self, when: float, *, at_most: float) -> None:
        """Block (in real time, at most `at_most` seconds) until this clock reaches `when`; woken by advance()."""
        deadline = time.monotonic() + at_most
        with self._changed:
            while True:
                now = self._frozen_at if self._frozen_at is not None else time.monotonic() + self._offset
                left_real = deadline - time.monotonic()
                if now >= when or left_real <= 0:
                    return
                wait = left_real if self._frozen_at is not None else min(left_real, when - now)
                self._changed.wait(wait)
