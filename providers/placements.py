"""Job placements recorded on the instance itself, as tags.

Why: the reconciler's state file is not the only place that knows what runs where.
An operator reading `aws ec2 describe-instances` (or the console) sees which job
replicas an instance hosts, and when the state is lost or stale (a fresh CI runner,
a deleted state file, a crash between a create and the state write) observe
recovers the placements from the instances instead of treating hosted replicas as
unplaced, which would move them or buy duplicate capacity.

Format (logical tags; a provider maps the keys onto its cloud's rules):

    fleetops.io/placements         train/0@0-3,train/1@4-7,etl/0
    fleetops.io/placements-2       serve/3@0+2            (only when the list is long)
    fleetops.io/placements-serial  12

An entry is `job/replica`, plus `@gpus` when the replica holds GPUs (ascending runs
as `a-b`, joined by `+`). Job names are `[a-z0-9.-]`, so `, / @ +` never clash with
them. A value holds at most 256 characters (EC2's and Azure's limit); a longer list
is split at entry boundaries over `-2`, `-3`, ... up to MAX_TAGS tags, and every
value but the last ends in `,...` (so a reader stops at the last chunk even if a
stale higher chunk survived an interrupted rewrite). An instance that hosts nothing
carries an empty `fleetops.io/placements`: "known empty" differs from "not recorded".

The serial is the state serial the apply that wrote the tags saved (or was about
to save): it says whether the tags or the state file is newer (reconciler/placements.py).

More than MAX_TAGS values' worth of replicas on one instance (about 5,000 characters:
some 150 replicas with 30-character job names) is not written in part: the value
becomes `!overflow N`, and observe takes that instance's placements from the state alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

TAG_PLACEMENTS = "fleetops.io/placements"  # which job replicas the instance hosts (first chunk)
TAG_PLACEMENTS_SERIAL = "fleetops.io/placements-serial"  # the state serial the placements were written at
TAG_VALUE_MAX = 256  # EC2 and Azure tag values
MAX_TAGS = 20  # chunks: with the serial and the ownership tags, 25 of EC2's 50 tags per resource
CONTINUED = ",..."  # a chunk that goes on in the next tag ends with this
OVERFLOW = "!overflow"  # job names never start with '!'
SERIAL_MAX = 2**63 - 1  # a 64-bit counter, one more each apply: the state's serial and the tags' are below it
MAX_GPU_INDEX = 1023  # far above any instance's GPUs (which observe checks each index against)


class PlacementTagError(ValueError):
    """Placement tags that cannot be read (edited by hand, or written by something else)."""


@dataclass(frozen=True, order=True)
class Placement:
    """One job replica on an instance, with the GPU indices it holds there."""

    job: str
    replica: int
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class PlacementRecord:
    """What an instance hosts, as of state serial `serial`. `complete` is False for an
    overflowed record: the instance hosts replicas its tags could not hold."""

    serial: int
    placements: tuple[Placement, ...] = ()
    complete: bool = True

    @classmethod
    def of(cls, serial: int, placements) -> "PlacementRecord":
        return cls(serial, tuple(sorted(placements)))


def chunk_key(n: int) -> str:
    """The key of chunk n (1-based): fleetops.io/placements, fleetops.io/placements-2, ..."""
    return TAG_PLACEMENTS if n == 1 else f"{TAG_PLACEMENTS}-{n}"


def is_placement_key(key: str) -> bool:
    return key == TAG_PLACEMENTS or key.startswith(TAG_PLACEMENTS + "-")


def _gpus_text(gpus: tuple[int, ...]) -> str:
    runs: list[list[int]] = []
    for g in gpus:
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    return "+".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _entry(p: Placement) -> str:
    return f"{p.job}/{p.replica}" + (f"@{_gpus_text(p.gpus)}" if p.gpus else "")


def placement_tags(record: PlacementRecord) -> dict[str, str]:
    """The tags that record `record` (keys in the logical fleetops.io/ form)."""
    chunks: list[str] = [""]
    for e in (_entry(p) for p in record.placements):
        room = TAG_VALUE_MAX - len(CONTINUED)  # leave room to mark the chunk as continued
        sep = "," if chunks[-1] else ""
        if len(chunks[-1]) + len(sep) + len(e) <= room:
            chunks[-1] += sep + e
        else:
            chunks.append(e)
    if len(chunks) > MAX_TAGS or not record.complete:
        chunks = [f"{OVERFLOW} {len(record.placements)}"]
    out = {chunk_key(n): c + (CONTINUED if n < len(chunks) else "") for n, c in enumerate(chunks, 1)}
    out[TAG_PLACEMENTS_SERIAL] = str(record.serial)
    return out


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # (str.isdigit() alone takes '²', which int() refuses)


def _parse_gpus(text: str) -> tuple[int, ...]:
    """The GPU indices of an entry, as _gpus_text writes them: runs of distinct indices. Anything else (a run
    backwards, an index twice, one past MAX_GPU_INDEX: `0-99999999999` would be a list of 10^11) is refused."""
    out: list[int] = []
    for run in text.split("+"):
        lo, _, hi = run.partition("-")
        if not _digits(lo) or (hi and not _digits(hi)):
            raise PlacementTagError(f"bad GPU indices {text!r}")
        a, b = int(lo), int(hi or lo)
        if b > MAX_GPU_INDEX or b < a:
            raise PlacementTagError(f"bad GPU indices {text!r}: not runs of GPUs 0..{MAX_GPU_INDEX}")
        out.extend(range(a, b + 1))
    if len(set(out)) != len(out):
        raise PlacementTagError(f"bad GPU indices {text!r}: a GPU twice")
    return tuple(out)


def _parse_entry(e: str) -> Placement:
    head, at, gpus = e.partition("@")
    job, _, replica = head.rpartition("/")
    if not job or not _digits(replica) or (at and not gpus):
        raise PlacementTagError(f"bad placement entry {e!r}")
    return Placement(job, int(replica), _parse_gpus(gpus) if at else ())


def read_placements(tags: Mapping[str, str]) -> PlacementRecord | None:
    """The record in an instance's tags; None if it carries none. Raises PlacementTagError
    for tags that are there but cannot be read."""
    if TAG_PLACEMENTS not in tags and TAG_PLACEMENTS_SERIAL not in tags:
        return None
    serial = tags.get(TAG_PLACEMENTS_SERIAL, "")
    if not _digits(serial) or TAG_PLACEMENTS not in tags:
        raise PlacementTagError(f"{TAG_PLACEMENTS} and a numeric {TAG_PLACEMENTS_SERIAL} go together (serial {serial!r})")
    if len(serial) > 19 or int(serial) > SERIAL_MAX:  # (the length first: int() of thousands of digits is refused)
        raise PlacementTagError(f"{TAG_PLACEMENTS_SERIAL} is out of range ({len(serial)} digits; an apply's serial is below 2**63)")
    value = tags[TAG_PLACEMENTS]
    if value.startswith(OVERFLOW):
        return PlacementRecord(int(serial), (), complete=False)
    text, n = "", 1
    while value.endswith(CONTINUED):
        text += value[: -len(CONTINUED)] + ","
        n += 1
        if chunk_key(n) not in tags:
            raise PlacementTagError(f"{chunk_key(n - 1)} says it continues, but there is no {chunk_key(n)}")
        value = tags[chunk_key(n)]
    text += value
    return PlacementRecord.of(int(serial), (_parse_entry(e) for e in text.split(",") if e))


__all__ = ["Placement", "PlacementRecord", "PlacementTagError", "placement_tags", "read_placements", "is_placement_key",
           "TAG_PLACEMENTS", "TAG_PLACEMENTS_SERIAL", "MAX_TAGS", "TAG_VALUE_MAX", "SERIAL_MAX"]
