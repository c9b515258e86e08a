"""The integer units exact models count in: the CP-SAT model's rows and the packer's exact passes alike, so a
request the packer holds is one the model counted the same way. GPUs and MIG devices are whole. vCPU and GiB are
counted per row (a capacity, a quota) in thousandths, or in finer units where a request in the row has more decimals
(0.0625 GiB, 1/16: 2000ths; 100 MiB, 25/256 GiB: 32000ths): each request is then a whole number of units, and a sum
of them is within a limit exactly when it is within the limit counted down, so the row admits what the ledger
(quota_ok, has_room: exact floats within EPS) admits and no more. (Counted in thousandths only, a request of 0.0625
GiB counted as 0.063: ten did not fit a quota of exactly 0.625 GiB that greedy and apply's re-check admit them under,
and the plan's bound claimed nine was the most.)"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache

MILLI_SCALED = ("cpu", "memory_gib")
BASE = 1000  # every vCPU and GiB row counts thousandths at least (the rows of such configs are the ones they had)
MOST_COEF = 10**9  # a finer unit never makes a request's coefficient larger than thousandths made load's largest ask's
MIB = 1024  # a GiB amount written as whole MiB (memory_mib / 1024) is exact in 1024ths


@lru_cache(maxsize=65536)
def decimal(amount: float) -> Fraction:
    """The amount a config wrote, exactly: the shortest decimal that reads back as this float where it has at most ten
    decimals (whole MiB have ten: 29.8017578125 GiB), else the nearest of nine, within the ledger's EPS (a free room
    computed as capacity less requests, 0.19999999999999998, is 0.2)."""
    written = Fraction(repr(float(amount)))
    return written if (written * 10**10).denominator == 1 else Fraction(repr(float(round(amount, 9))))


def written_exactly(amount: float) -> bool:
    """A vCPU or GiB amount every row holds exactly (load refuses others: model.Resources, model.Limits): at most six
    decimals, or a whole number of MiB."""
    den = decimal(amount).denominator
    return 10**6 % den == 0 or MIB % den == 0


def scale(dim: str, requests: Iterable[float] = ()) -> int:
    """Integer units per resource unit in a row over `requests`: GPUs and MIG devices are counted, vCPU and GiB in
    thousandths, or in the least finer unit that makes every request whole, so long as the largest request's
    coefficient stays within MOST_COEF (a request it leaves out counts up, as in thousandths: stricter than the ledger
    by under a unit, never more lenient; a request `written_exactly` at most 62.5 units is never left out)."""
    if dim not in MILLI_SCALED:
        return 1
    asked = {r for r in requests if r > 0}
    per, top = BASE, max(asked, default=0.0)
    for den in sorted({decimal(r).denominator for r in asked}):
        if top * math.lcm(per, den) <= MOST_COEF:
            per = math.lcm(per, den)
    return per


def units(request: float, dim: str, per: int | None = None) -> int:
    """A request in a row's integer units (`per` of them a vCPU or GiB: `scale` of the row's requests; thousandths if
    not given), counted up to the next whole unit: never below what the ledger counts, so no row admits what it
    refuses. A request whole in the unit counts as itself (1.1 vCPU, 1100.0000000000002 thousandths in floats, is
    1100)."""
    return _counted(request, scale(dim) if per is None else per, up=True)


def room(limit: float, dim: str, per: int | None = None) -> int:
    """A limit (a quota, an instance's capacity or free room) in a row's integer units, counted down (`units`' other
    side): a sum of requests whole in these units is within the limit exactly when it is within this."""
    return _counted(limit, scale(dim) if per is None else per, up=False)


@lru_cache(maxsize=65536)
def _counted(amount: float, per: int, up: bool) -> int:
    """`amount` in units of 1/per, up or down. (Cached: a model asks for a few request sizes tens of thousands of times,
    and the exact fraction's arithmetic cost 0.1 s of a 1,000-job model's build.)"""
    exact = decimal(amount) * per
    return math.ceil(exact) if up else math.floor(exact)
