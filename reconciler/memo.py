"""The plan memo: `reconcile plan` reads back the plan it made for the same inputs instead of solving again.

Planning is deterministic: the same inputs give the same plan, byte for byte (tests/test_determinism.py). So the
last plan is kept in .reconcile/cache/plan-memo.json under the SHA-256 of every input that can change it
(`memo_key`), and a plan whose inputs hash the same is that plan. The inputs:

- the program: every file of the reconciler, providers and policies packages, and the versions of Python and of
  the libraries that shape a plan or its text (ortools, protobuf, pydantic, PyYAML, networkx, rich);
- the desired state (its digest: every document as validated, defaults included) and the price catalog file the
  config pins, or the shipped one;
- the observed fleet, whole: instances with their tags and launch times, offerings with their (live) prices and
  availability, placements, cool-offs (read at the clock), account quotas, notes; of what the node agents
  reported, what planning reads (`runtime.publish.planning_reads`: the jobs that finished, the instances to
  replace), not heartbeats or log tails, so a fleet whose agents are alive is read back too;
- the options: provider, time limit, gap, LP bound, --allow-destroy, --adopt-fleet;
- the clock, as the plan reads it (`clock_inputs`): aged priorities, the Reservations in force, deadline ranks
  and conditions (a running job with a deadline: its hours left, so the memo misses while one runs), and the
  running jobs whose start is not known (they count as started now: then the time itself). Running jobs are
  otherwise ranked by when they are expected to end (start + expected_hours, keyed as observed and desired),
  which the clock does not move: an unchanged young fleet is read back too (before, the key held each running
  job's hours left, which change every second, and the memo served only fleets past their expected hours).

An entry is used only when its key, fleet and digests check out and this machine sealed it (reconciler/localkey.py:
the memo lives in the config checkout, and a plan anyone could checksum could be committed with a pull request and
printed as its plan); anything else (torn, foreign, another version's) is ignored and replaced. The plan's fleet,
digests and whether it changes anything are kept beside it under the seal, so a hit whose render is kept prints and
exits without parsing the plan (Hit.plan parses it when asked). A plan the wall-clock safety cap cut short (greedy's, on a busy machine) is not
kept: the next run may do better. Only `reconcile plan` reads the memo: apply always plans again (or re-checks a
saved plan against the fleet as it is). Beside it, plan-memo-render.json keeps the plan as last printed for the
same key (one format), since rich takes 0.2 s to render 5,000 jobs; a plan solved and kept also keeps it, rendered
as the memo will give the plan back (reconciler/cli.py), so the first re-plan of the same inputs prints it too.

Nothing else in planning reads the clock (grep'd: problem, solve, plan, explain, ledger, pack, greedy, policies):
the cool-offs and the agents' reports are read at the clock by observe and are keyed as observed (the reports as planning reads them)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import marshal
import sys
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from providers.files import loads_json
from reconciler.atomicfile import write_atomic
from reconciler.deadlines import conditions, ranks, start_by
from reconciler.localkey import read_cache, seal, sealed
from reconciler.model import DesiredState

if TYPE_CHECKING:
    from reconciler.observe import Observed
    from reconciler.plan import Plan

MEMO_FILE = Path(".reconcile") / "cache" / "plan-memo.json"
RENDER_FILE = MEMO_FILE.with_name("plan-memo-render.json")  # the memo plan as last printed (one format)
_PACKAGES = ("reconciler", "providers", "policies")
_LIBRARIES = ("ortools", "pydantic", "pydantic-core", "PyYAML", "networkx", "protobuf", "rich")
_program: str | None = None


class Unkeyable(Exception):
    """An input the key cannot hash exactly: the plan is made (and not kept) as without the memo."""


def program_digest() -> str:
    """The code that plans: every file of our packages (not __pycache__) and the libraries' versions."""
    global _program
    if _program is None:
        from importlib.metadata import PackageNotFoundError, version

        h = hashlib.sha256(sys.version.encode())
        for name in _LIBRARIES:
            try:
                h.update(f"\0{name}={version(name)}".encode())
            except PackageNotFoundError:
                h.update(f"\0{name}=absent".encode())
        here = Path(__file__).resolve().parent.parent
        for pkg in _PACKAGES:
            for path in sorted((here / pkg).rglob("*")):
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                h.update(b"\0" + str(path.relative_to(here)).encode() + b"\0" + path.read_bytes())
        _program = h.hexdigest()
    return _program


_ATOMS = frozenset({str, int, float, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...]] = {}


def _plain(x):
    """x as nested tuples of str, int, float, bool and None, whose repr is exact (a float's repr reads back as
    that float): dataclasses field by field, mappings in their order, sets sorted, times as ISO text; anything
    else is refused (Unkeyable), so nothing is hashed in a lossy or address-bearing form. A fast path for the
    11k instances of a big fleet: 0.3 s -> 0.08 s of CPU for the whole key."""
    t = type(x)
    if t in _ATOMS:
        return x
    names = _FIELDS.get(t)
    if names is None and dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(x))
    if names is not None:
        return (t.__name__,) + tuple(v if type(v) in _ATOMS else _plain(v) for v in (getattr(x, n) for n in names))
    if isinstance(x, (list, tuple)):
        return ("[",) + tuple(v if type(v) in _ATOMS else _plain(v) for v in x)
    if isinstance(x, dict) or hasattr(x, "items"):  # a dict, or a read-only mapping (an instance's tags)
        items = tuple(x.items())
        if all(type(k) in _ATOMS and type(v) in _ATOMS for k, v in items):
            return ("{",) + items
        return ("{",) + tuple((_plain(k), _plain(v)) for k, v in items)
    if isinstance(x, (set, frozenset)):
        return ("set",) + tuple(sorted((_plain(v) for v in x), key=repr))
    if isinstance(x, (datetime, date)):
        return ("time", x.isoformat())
    if isinstance(x, (str, int, float)):  # a str or int enum
        return (t.__name__, repr(x))
    raise Unkeyable(f"cannot key {t.__name__}")


def _feed(h, x) -> None:
    """Hash x as _plain(x), streamed: a dataclass field by field and a list or tuple item by item, each leaf as
    marshal (format 2: no back-references, so equal values give equal bytes; floats as their 8 bytes) of its
    _plain. Every record is self-delimiting and a structure's record is a tuple whose first item starts with NUL
    (no type name or _plain tag does), so the stream is an exact encoding of x. Building the 11k instances of a
    big fleet into one 6 MB tuple and repr'ing it took 0.17-0.18 s of CPU; streamed, 0.07."""
    t = type(x)
    names = _FIELDS.get(t)
    if names is None and dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(x))
    if names is not None:
        h.update(marshal.dumps(("\0dataclass", t.__name__, len(names)), 2))
        for n in names:
            _feed(h, getattr(x, n))
    elif t is tuple or t is list:
        h.update(marshal.dumps(("\0[", len(x)), 2))
        for v in x:
            h.update(marshal.dumps(v if type(v) in _ATOMS else _plain(v), 2))
    else:
        h.update(marshal.dumps(_plain(x), 2))


def running_starts(desired: DesiredState, observed: "Observed") -> dict[str, datetime | None]:
    """Running job -> when it started, as build_problem reads it (None: no instance of it says)."""
    from reconciler.problem import parse_time
    from reconciler.problem.build import started

    launched = {i.id: parse_time(i.launched_at) for i in observed.instances}
    return {name: started(iids, launched) for name, iids in observed.placements.items() if name in desired.jobs and iids}


def running_hours_left(desired: DesiredState, observed: "Observed", now: datetime,
                       starts: dict[str, datetime | None] | None = None) -> dict[str, float]:
    """Running job -> expected hours left at `now`, as build_problem computes Problem.job_remaining
    (problem.build.hours_left; tests/test_memo.py pins the two equal). `starts`: running_starts, if known."""
    from reconciler.problem.build import hours_left

    starts = running_starts(desired, observed) if starts is None else starts
    return {n: hours_left(s, desired.jobs[n].spec.expected_hours, now) for n, s in starts.items()}


def clock_inputs(desired: DesiredState, observed: "Observed", now: datetime) -> dict:
    """What a plan reads of the clock, computed with the planner's own functions where it has them: two
    moments with the same clock inputs (and the same everything else) give the same plan."""
    from reconciler.problem import active_reservations, effective_priority

    aging = desired.placement.aging
    starts = running_starts(desired, observed)  # once: it parses every instance's launch time
    left = running_hours_left(desired, observed, now, starts)
    unknown = [n for n, s in starts.items() if s is None]
    with_deadline = {n: j for n, j in desired.jobs.items() if j.spec.deadline is not None}
    latest = {n: start_by(j.spec.deadline, j.spec.expected_hours) for n, j in with_deadline.items()}
    return {
        "aged": {n: effective_priority(j, bool(observed.placements.get(n)), now, aging, observed.aged.get(n))
                 for n, j in desired.jobs.items() if j.spec.submitted is not None or n in observed.aged},
        "reservations": sorted(active_reservations(desired, now)),
        "deadline_ranks": {n: list(v) for n, v in ranks(latest, {n: j.spec.expected_hours for n, j in with_deadline.items()}, now).items()},
        "deadline_conditions": conditions({n: (j.spec.deadline, left.get(n, j.spec.expected_hours)) for n, j in with_deadline.items()},
                                          set(), now),
        # Running jobs are ranked by when they are expected to end (start + expected_hours: keyed as observed and
        # desired), which the clock does not move; a job whose start is not known counts as started now.
        "started_now": sorted(unknown),
        **({"now": now.isoformat()} if unknown else {}),
    }


def memo_key(config_dir: Path, desired: DesiredState, observed: "Observed", now: datetime, options: dict) -> str:
    """SHA-256 over every input of the plan (the module docstring lists them). Raises Unkeyable."""
    from providers.catalog import catalog_for, read_catalog_file, shipped_catalog_text
    from reconciler.runtime.publish import planning_reads

    pinned = catalog_for(config_dir)
    catalog = read_catalog_file(pinned) if pinned is not None else shipped_catalog_text().encode()
    body = (
        ("program", program_digest()),
        ("catalog", hashlib.sha256(catalog).hexdigest()),
        ("desired", desired.digest),
        # The agents' reports only as planning reads them (heartbeats and log tails move every second).
        ("observed", dataclasses.replace(observed, runtime=None)),
        ("runtime", planning_reads(observed.runtime)),
        ("clock", clock_inputs(desired, observed, now)),
        ("options", dict(sorted(options.items()))),
    )
    h = hashlib.sha256()
    for name, value in body:
        h.update(marshal.dumps(name, 2))
        _feed(h, value)
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Hit:
    """The memo's plan for a key: what `reconcile plan` needs to print it (the render kept beside it) and to exit
    (whether it changes anything), with the plan itself parsed only when asked (5,000 jobs: 0.06 s of CPU)."""

    text: bytes  # the plan's JSON, as Plan.to_json wrote it
    seconds: float  # what making it took
    has_changes: bool  # Plan.has_changes, kept beside it

    @functools.cached_property
    def plan(self) -> "Plan":
        from reconciler.plan import Plan

        return Plan.from_json(self.text.decode())


def _head(key: str, seconds: float, plan_of: dict) -> bytes:
    """What the seal covers besides the plan's text: the key, and what read checks and returns without the plan."""
    return json.dumps({"key": key, "seconds": seconds, **plan_of}, sort_keys=True).encode()


def read(config_dir: Path, key: str, desired: DesiredState, observed: "Observed") -> Hit | None:
    """The memo's plan, if the memo holds a sound entry for exactly this key, made against this desired state and
    fleet (its digests, kept beside it under the seal)."""
    try:
        head, _, text = read_cache(Path(config_dir) / MEMO_FILE).partition(b"\n")
        entry = loads_json(head)
        tag = entry.pop("seal")
        if set(entry) != {"key", "seconds", *_PLAN_OF} or entry["key"] != key \
                or not sealed(_head(key, entry["seconds"], {k: entry[k] for k in _PLAN_OF}) + b"\n" + text, tag):
            return None  # torn, edited, or not written by this machine (reconciler/localkey.py)
        hit = Hit(text, float(entry["seconds"]), entry["has_changes"] is True)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # absent, unreadable, torn, edited or not this shape
        return None
    if (entry["fleet"], entry["desired_digest"], entry["observed_digest"]) != (desired.fleet, desired.digest, observed.digest):
        return None
    return hit


_PLAN_OF = ("fleet", "desired_digest", "observed_digest", "has_changes")


def keep(config_dir: Path, key: str, plan: "Plan", seconds: float, time_limit: float) -> bool:
    """Store `plan` as the memo's one entry (atomically; best effort). A plan cut short by the wall-clock
    cap is not kept (its status is GREEDY_FALLBACK with a time limit: whether the cap hits depends on the load)."""
    if plan.solver.status == "GREEDY_FALLBACK" and time_limit > 0:
        return False
    text = plan.to_json().encode()
    seconds = round(seconds, 3)
    plan_of = {"fleet": plan.fleet, "desired_digest": plan.desired_digest, "observed_digest": plan.observed_digest,
               "has_changes": plan.has_changes}
    tag = seal(_head(key, seconds, plan_of) + b"\n" + text)
    if tag is None:
        return False  # no key to seal it with: not kept
    head = json.dumps({"key": key, "seal": tag, "seconds": seconds, **plan_of}).encode()
    return _write(Path(config_dir) / MEMO_FILE, head + b"\n" + text)


def _write(path: Path, data: bytes) -> bool:
    """Replace `path` with `data` atomically (best effort: a read-only directory just keeps no memo)."""
    try:
        write_atomic(path, data)  # whole or not at all, also beside a concurrent plan
    except OSError:
        return False
    return True


def read_render(config_dir: Path, key: str, variant: str) -> str | None:
    """How the memo's plan was printed last in `variant` (format, colour, --out path), if that was for this key.
    Rendering a 5,000-job plan with rich takes 0.2 s of CPU; the text is a function of the plan and those alone."""
    try:
        entry = loads_json(read_cache(Path(config_dir) / RENDER_FILE))
        text = entry["text"]
        if set(entry) != {"key", "variant", "text", "seal"} or (entry["key"], entry["variant"]) != (key, variant) \
                or not sealed(_render_body(key, variant, text), entry["seal"]):
            return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return text


def keep_render(config_dir: Path, key: str, variant: str, text: str) -> bool:
    tag = seal(_render_body(key, variant, text))
    if tag is None:
        return False
    entry = {"key": key, "variant": variant, "text": text, "seal": tag}
    return _write(Path(config_dir) / RENDER_FILE, json.dumps(entry).encode())


def _render_body(key: str, variant: str, text: str) -> bytes:
    return json.dumps([key, variant, text]).encode()


__all__ = ["MEMO_FILE", "RENDER_FILE", "Hit", "Unkeyable", "clock_inputs", "keep", "keep_render", "memo_key", "read", "read_render",
           "running_hours_left"]
