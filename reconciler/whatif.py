"""What `reconcile explain` proved by planning again with one change: a line people read and, for
`--format json`, its parts (the change, whether the job then runs, the $/h and the other jobs it costs)."""

from __future__ import annotations


class WhatIf(str):
    """A str (the human line, as explain has always printed it, so `"..." in e.would_change` still holds) that
    also carries its parts. `outcome`: "runs", "still pending" or "refused" (the changed config was refused)."""

    change: str
    outcome: str
    fleet_cost_delta: float | None
    evicts: tuple[str, ...]
    moves: tuple[str, ...]
    reason: str

    def __new__(cls, text: str = "", *, change: str = "", outcome: str = "", fleet_cost_delta: float | None = None,
                evicts: tuple[str, ...] = (), moves: tuple[str, ...] = (), reason: str = "") -> WhatIf:
        self = super().__new__(cls, text)
        self.change, self.outcome, self.fleet_cost_delta = change, outcome, fleet_cost_delta
        self.evicts, self.moves, self.reason = tuple(evicts), tuple(moves), reason
        return self

    def as_dict(self) -> dict:
        out: dict = {"change": self.change, "outcome": self.outcome}
        if self.fleet_cost_delta is not None:
            out["fleet_cost_delta_per_hour"] = round(float(self.fleet_cost_delta), 4)
        if self.outcome == "runs":
            out["evicts"], out["moves"] = list(self.evicts), list(self.moves)
        if self.reason:
            out["reason"] = self.reason
        out["text"] = str(self)
        return out


def as_dict(entry: str) -> dict:
    """An entry of would_change/tried as JSON: its parts, or just its text if it carries none."""
    return entry.as_dict() if isinstance(entry, WhatIf) else {"text": str(entry)}


__all__ = ["WhatIf", "as_dict"]
