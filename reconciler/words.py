"""How small values read in what users see, shared by the plan's rendering and explain: one
spelling, so `plan` and `explain` print a replica's GPUs alike."""

from __future__ import annotations

import os
from typing import TextIO


def gpu_span(g) -> str:
    """GPU indices as a user reads them: consecutive ones as a range ("0-3"), others listed ("0,2,5")."""
    g = sorted(g)
    return f"{g[0]}-{g[-1]}" if len(g) > 1 and g[-1] - g[0] == len(g) - 1 else ",".join(map(str, g))


def amount(n: float, unit: str) -> str:
    """"1 GPU", "2 GPUs", "1 vCPU", "1 more instance": a count and its unit, singular for exactly one (a cloud quota's
    reason said "(1 GPUs)", a room "for 1 more instances"). `unit` is the plural ("GPUs", "idle on-demand GPUs"); one
    already singular or uncountable ("vCPU", "GiB memory") reads alike for any count."""
    return f"{n:g} {unit.removesuffix('s') if n == 1 and unit.endswith('s') else unit}"


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set to anything (https://no-color.org). Here, not in
    reconciler.progress: that one imports rich, which a plan read back from the memo does not (0.02 s of CPU)."""
    return bool(stream.isatty()) and not os.environ.get("NO_COLOR")


__all__ = ["amount", "gpu_span", "use_color"]
