"""Deadlines: a Job with `deadline` must start by (deadline - expected_hours) to finish in time.

One definition for the problem (ranking and which jobs may use the on-demand buffer), the solver's
tier, and the conditions the plan, status and the PR comment show. Pure.

- Ranking: within its priority class, deadline work that can still finish in time ranks above work
  without one (a tier of its own, solved before the class's other work), the closer the latest
  start the higher (weights by rank: the closest gets the most). Work that can no longer finish in
  time is flagged DeadlineMissed and ranks as its class does (it would only crowd out work that can).
- Deadline-critical: work that must start within its own expected_hours from now may use
  on-demand capacity the on-demand buffer would otherwise keep idle.
- Conditions: DeadlineMissed when now + the hours it still needs is past the deadline (placed or
  not); DeadlineAtRisk when it could still finish but this plan does not run it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def start_by(deadline: datetime, hours: float) -> datetime:
    """The latest start that still finishes `hours` of work by `deadline`."""
    return _utc(deadline) - timedelta(hours=hours)


def ranks(latest: dict[str, datetime], hours: dict[str, float], now: datetime | None) -> dict[str, tuple[int, bool]]:
    """Demand key -> (deadline rank, deadline-critical) for demands whose latest start is `latest`:
    rank 1..n by latest start, the closest n; none for work that can no longer start in time."""
    live = {k: t for k, t in latest.items() if now is None or t >= now}
    order = sorted(set(live.values()))
    out = {}
    for k, t in live.items():
        critical = now is not None and (t - now).total_seconds() / 3600 <= hours[k] + 1e-9
        out[k] = (len(order) - order.index(t), critical)
    return out


def tier_terms(demands, klass: int, var: dict) -> tuple[list, int] | None:
    """The deadline tier of one class: (weighted terms over `var`, its best value), or None."""
    ds = [d for d in demands if d.klass == klass and d.deadline_rank and not (isinstance(var[d.key], int) and var[d.key] == 0)]
    if not ds:
        return None
    return [(d.deadline_rank * d.job_size, var[d.key]) for d in ds], sum(d.deadline_rank * d.job_size * len(d.jobs) for d in ds)


def conditions(deadlines: dict[str, tuple[datetime, float]], placed: set[str], now: datetime | None) -> dict[str, dict]:
    """Per job with a deadline: its condition in this plan (DeadlineMissed, DeadlineAtRisk or OnTrack)
    and why. `deadlines`: job -> (deadline, hours it still needs: expected, or what is left if it runs)."""
    out = {}
    for job, (deadline, hours) in sorted(deadlines.items()):
        by = start_by(deadline, hours)
        d_txt, by_txt = _utc(deadline).isoformat(), by.isoformat()
        if now is not None and now > by:
            cond = "DeadlineMissed"
            msg = f"cannot finish by {d_txt}: it needs {hours:g} h more and had to start by {by_txt}"
        elif job not in placed:
            cond = "DeadlineAtRisk"
            msg = f"not running in this plan; it must start by {by_txt} to finish its {hours:g} h by {d_txt}"
        else:
            cond = "OnTrack"
            msg = f"runs in this plan: its {hours:g} h finish by {d_txt} if it keeps running"
        out[job] = {"condition": cond, "deadline": d_txt, "start_by": by_txt, "message": msg}
    return out


__all__ = ["conditions", "ranks", "start_by", "tier_terms"]
