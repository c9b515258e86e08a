"""The integer units exact models count in: the CP-SAT model's rows and the packer's exact passes alike, so a
request the packer holds is one the model counted the same way (GPUs and MIG devices whole; vCPU and GiB in
thousandths, requests counted up and room down: never more than an instance or a quota has)."""

from __future__ import annotations

import math

MILLI_SCALED = ("cpu", "memory_gib")


def scale(dim: str) -> int:
    """Integer units per resource unit: GPUs and MIG devices are counted, vCPU and GiB in thousandths."""
    return 1000 if dim in MILLI_SCALED else 1


def units(request: float, dim: str) -> int:
    """A request in the model's integer units, counted up to the next whole unit: never below what the ledger counts
    (quota_ok, has_room: exact floats), so no row admits what they refuse. (Rounded to the nearest, 0.0625 GiB counted
    0.062: ten fit a 0.62 GiB quota in the model, the ledger refused the tenth.) Within 1e-6 of a unit it is that unit:
    a written thousandth (1.1 vCPU, 1100.0000000000002 in floats) counts as itself."""
    return math.ceil(request * scale(dim) - 1e-6)


def room(limit: float, dim: str) -> int:
    """A limit (a quota, an instance's capacity) in the model's integer units, counted down (`units`' other side)."""
    return math.floor(limit * scale(dim) + 1e-6)
