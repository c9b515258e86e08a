"""The plan file: its format version, its JSON, the digest that refuses an edited body, and the
names a plan gives (its id, which keys its creates; a gang's placement group).

Kept apart from the plan's types so a saved plan's shape is read in one place: `reconcile plan
--out` writes it, `reconcile apply PLAN` reads it back (and plancheck.py checks every action).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields, is_dataclass

from providers.files import loads_json
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.site import SITE_FIELDS, Site

PLAN_FORMAT = 2
# A bound on what `apply --plan` reads, checked before a byte is parsed: a 50k-job cold plan is 26 MiB (bench.generate
# --jobs 50000, greedy: 28,533 creates, 39,099 placed), so ten times that is far above any fleet's, and /dev/zero or a
# file grown by mistake is refused rather than read until memory runs out.
MAX_PLAN_BYTES = 256 << 20


def encode(plan) -> str:
    """The plan as JSON, byte for byte the same for the same (desired, observed), ending in its body digest."""
    from reconciler.plan.quality import claimed_gap

    raw = _json_ready(plan)
    del raw["solver"]["seconds"]  # the wall clock: the same (desired, observed) gives the same JSON, byte for byte
    raw["solver"]["gap"] = claimed_gap(plan.solver, plan.cost_after)  # (null where the plan claims none, not 1.0)
    if not raw["rules"]:
        del raw["rules"]
    if not raw["removed"]:  # (only where a running job left the config: other plans are as before, byte for byte)
        del raw["removed"]
    if not raw["restarted"]:  # (only where a running job's run changed: other plans are as before, byte for byte)
        del raw["restarted"]
    if not raw["solver"]["backfilled"]:  # (only where backfill placed work: a plan without is as before, byte for byte)
        del raw["solver"]["backfilled"]
    if not raw["solver"]["narrowed"]:  # (only where the solver's model left choices out: solve.model)
        del raw["solver"]["narrowed"]
    if not raw["solver"]["held"]:  # (only where a search again held running jobs: api._lawful)
        del raw["solver"]["held"]
    if not raw["solver"]["greedy_parts"]:  # (only where some independent parts fell back to greedy best-fit: solve.parts)
        del raw["solver"]["greedy_parts"]
    raw["creates"] = [flat_site(c) for c in raw["creates"]]
    raw["deletes"] = [flat_site(d) for d in raw["deletes"]]
    for c in raw["creates"]:  # (only where set: a plan without reservations is as before)
        if c["reservation"] is None:
            del c["reservation"]
    for j in raw["jobs"]:  # a job whose replicas hold no whole GPU (CPU, MIG slices) shows `gpus: []` rather than `[[]]`
        if not any(j["gpus"]):
            j["gpus"] = []
    # `raw` is what reading the file back gives, digest and all: JSON's own types, string keys only (_json_ready
    # refuses others); it went through json.loads(json.dumps()) before, 0.25 s of CPU for a 10k-job plan, the same bytes.
    return json.dumps({**raw, "body_digest": body_digest(raw)}, indent=2, sort_keys=False)


def read_body(text: str) -> dict:
    """A saved plan's body, checked: this version's format, and every field as `reconcile plan` wrote it."""
    try:
        raw = loads_json(text)  # (JSON's own errors as they are; a nest too deep, a key twice: not a plan)
    except json.JSONDecodeError:
        raise
    except ValueError as e:
        raise ValueError(f"not a plan: {e}") from None
    if not isinstance(raw, dict):
        kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(raw), "null")
        raise TypeError(f"not a plan: a JSON {kind}, not an object")
    if raw.get("format") != PLAN_FORMAT:
        raise ValueError(f"plan format {raw.get('format')} is not {PLAN_FORMAT}; make the plan again with this version")
    if raw.pop("body_digest", None) != body_digest(raw):
        raise ValueError("the plan's body does not match its body_digest: it was edited after `reconcile plan` wrote "
                         "it (or made by an older version); make the plan again")
    _check_shape(raw)
    return raw


# The type of every field a saved plan's actions are read from, as `reconcile plan` writes it. The digest is a checksum
# anyone can recompute, so a body with a GPU index 0.0 or an instance id 1 got past it, and apply launched an instance
# before it failed on them ("unexpected PlacementTagError", nothing recorded: audit). Checked before anything is done.
_STR, _NUM, _INT, _OPT_STR, _OPT_NUM = "a string", "a number", "an integer", "a string or null", "a number or null"
_SITE = {f: _STR for f in SITE_FIELDS}
_SHAPES = {
    "creates": {"ref": _STR, "key": _STR, **_SITE, "price": _NUM, "max_price": _OPT_NUM, "placement_group": _OPT_STR,
                "reservation": _OPT_STR, "price_source": _STR},
    "deletes": {"instance_id": _STR, **_SITE, "price": _NUM, "reason": _STR},
    "jobs": {"job": _STR, "tenant": _STR, "action": _STR, "instances": [_STR], "previous": [_STR], "reason": _STR,
             "gpus": [[_INT]]},
    "removed": {"job": _STR, "previous": [_STR]},
    "restarted": {"job": _STR, "instances": [_STR], "change": _STR},
}
# The fields read as they are (shown with the plan, not acted on), typed so that showing them cannot fail.
_BOOL, _DICT = "true or false", "an object"
_SOLVER = {"status": _STR, "optimal": _BOOL, "gap": _OPT_NUM, "tiers": [_DICT], "scope": [_INT], "repairs": _INT, "note": _STR,
           "work": _NUM, "unpacked": _INT, "backfilled": _INT, "narrowed": _INT,
           "greedy_parts": _INT, "held": _INT}
_SOLVER_NEEDS = ("status", "optimal", "gap")  # (gap: null where no gap is claimed; a number in files written before)
_TIER = {"name": _STR, "value": _OPT_NUM, "bound": _OPT_NUM, "status": _STR, "proven": _BOOL}
_CONSOLIDATION = {"moved_replicas": _INT, "instances_removed": [_STR], "saving_per_hour": _OPT_NUM, "move_cost": _NUM, "room_jobs": _INT}
_BALLAST = {"instances": [_STR], "idle": _NUM, "unit": _STR, "cost_per_hour": _NUM, "rule": _STR, "spot_share": _NUM,
            "spot_share_without": _NUM}
_JOB_ACTIONS = ("keep", "place", "move", "evict", "pending")
RUN_CHANGES = ("restarts", "starts", "stops")  # RestartedJob.change


# Every field a plan file holds (the Plan's fields: tests/test_saved_plans.py checks they agree).
PLAN_FIELDS = ("id", "fleet", "desired_digest", "observed_digest", "creates", "deletes", "jobs", "cost_before", "cost_after",
               "solver", "violations", "format", "kept", "consolidation", "notes", "ballast", "rules", "removed", "restarted")


def _check_shape(raw: dict) -> None:
    unknown = sorted(set(raw) - set(PLAN_FIELDS))
    if unknown:  # (read past, as the fields inside an action are not)
        raise TypeError(f"unknown field {unknown[0][:40]!r} (no fleetops writes it in a plan of format {PLAN_FORMAT})")
    for name in ("id", "fleet", "desired_digest", "observed_digest"):
        _expect(raw.get(name), _STR, name)
    if not is_plan_id(raw["id"]):
        raise TypeError(f"id: {json.dumps(raw['id'])[:40]} is not a plan id ({PLAN_ID_LEN} hex digits, as `reconcile plan` makes them)")
    for name in ("cost_before", "cost_after"):
        _expect(raw.get(name), _NUM, name)
    for name, fields_ in _SHAPES.items():
        items = raw.get(name, [])
        if not isinstance(items, list):
            raise TypeError(f"{name}: expected a list, got {type(items).__name__}")
        for n, item in enumerate(items):
            if not isinstance(item, dict):
                raise TypeError(f"{name}[{n}]: expected an object, got {type(item).__name__}")
            unknown = sorted(set(item) - set(fields_))
            if unknown:
                raise TypeError(f"{name}[{n}]: unknown field {unknown[0]!r}")
            for f, kind in fields_.items():
                if f in item:
                    _expect(item[f], kind, f"{name}[{n}].{f}")
            if name == "restarted" and item.get("change", "restarts") not in RUN_CHANGES:
                raise TypeError(f"restarted[{n}].change: {item.get('change')!r} is not one of {', '.join(RUN_CHANGES)}")
            if name == "jobs" and item.get("action") not in _JOB_ACTIONS:
                raise TypeError(f"jobs[{n}].action: {item.get('action')!r} is not one of {', '.join(_JOB_ACTIONS)}")
    for name in ("solver", "kept"):
        if not isinstance(raw.get(name), dict):
            raise TypeError(f"{name}: expected an object")
    _check_object(raw["solver"], _SOLVER, "solver", _SOLVER_NEEDS)
    if len(raw["solver"].get("scope", (0, 0))) != 2:
        raise TypeError("solver.scope: expected [solved, frozen]")
    for n, tier in enumerate(raw["solver"].get("tiers", ())):
        _check_object(tier, _TIER, f"solver.tiers[{n}]", ("name",))
    for name, fields_ in (("consolidation", _CONSOLIDATION), ("ballast", _BALLAST)):
        if raw.get(name) is not None:
            _check_object(raw[name], fields_, name, tuple(f for f in fields_ if f != "room_jobs"))  # (room_jobs: since audit33)
    for name in ("notes", "violations"):
        _expect(raw.get(name, []), [_STR], name)
    if not isinstance(raw.get("rules", {}), dict):
        raise TypeError("rules: expected an object")


def _check_object(value, fields_: dict, where: str, needs: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{where}: expected an object, got {json.dumps(value)[:40]}")
    unknown = sorted(set(value) - set(fields_))
    if unknown:
        raise TypeError(f"{where}: unknown field {unknown[0]!r}")
    missing = [f for f in needs if f not in value]
    if missing:
        raise TypeError(f"{where}: {missing[0]} is missing")
    for f, kind in fields_.items():
        if f in value:
            _expect(value[f], kind, f"{where}.{f}")


def _expect(value, kind, where: str) -> None:
    if isinstance(kind, list):
        if not isinstance(value, list):
            raise TypeError(f"{where}: expected a list, got {type(value).__name__}")
        for n, v in enumerate(value):
            _expect(v, kind[0], f"{where}[{n}]")
        return
    ok = {_STR: lambda v: isinstance(v, str), _OPT_STR: lambda v: v is None or isinstance(v, str),
          _INT: lambda v: type(v) is int, _BOOL: lambda v: type(v) is bool, _DICT: lambda v: isinstance(v, dict),
          _NUM: lambda v: type(v) in (int, float), _OPT_NUM: lambda v: v is None or type(v) in (int, float)}[kind]
    if not ok(value):
        raise TypeError(f"{where}: expected {kind}, got {json.dumps(value)[:40]}")


def flat_site(action: dict) -> dict:
    """An action's JSON with its site's fields in the site's place: the plan file keeps the shape it had
    before actions carried a Site (saved plans, PR comments and body digests are unchanged)."""
    out = {}
    for k, v in action.items():
        if k == "site":
            out.update(v)
        else:
            out[k] = v
    return out


def nest_site(raw: dict) -> dict:
    """The inverse of flat_site: a saved action's fields with its seven site fields as one Site."""
    rest = {k: v for k, v in raw.items() if k not in SITE_FIELDS}
    return {**rest, "site": Site.from_json(raw)}


_SCALARS = (str, int, float, bool, type(None))
_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}  # dataclass -> (field, "float" | "floats" | "") per field


def _json_ready(obj):
    """asdict, with a float field always a float (`cost_before: 0.0`, not `0` beside `72.21`). A scalar is
    taken as it is where it stands and a dataclass's fields are read once per class (a 10k-job plan's 15k
    dataclasses and 150k values: 0.11 -> 0.04 s of CPU); anything else (a subclass of list, dict...) as before."""
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t is list or t is tuple:
        return [x if type(x) in _SCALARS else _json_ready(x) for x in obj]
    if t is dict:
        _string_keys(obj)
        return {k: v if type(v) in _SCALARS else _json_ready(v) for k, v in obj.items()}
    if is_dataclass(obj):
        shape = _FIELDS.get(t)
        if shape is None:
            shape = _FIELDS[t] = tuple((f.name, "float" if f.type in ("float", "float | None") else
                                        "floats" if f.type == "dict[str, float]" else "") for f in fields(obj))
        out = {}
        for name, kind in shape:
            v = getattr(obj, name)
            if type(v) not in _SCALARS:
                v = _json_ready(v)
            if kind == "float" and type(v) is int:
                v = float(v)
            elif kind == "floats":
                v = {k: float(x) for k, x in v.items()}
            out[name] = v
        return out
    if isinstance(obj, (list, tuple)):
        return [_json_ready(x) for x in obj]
    if isinstance(obj, dict):
        _string_keys(obj)
        return {k: _json_ready(v) for k, v in obj.items()}
    return obj


def _string_keys(obj: dict) -> None:
    if not all(type(k) is str for k in obj):  # (JSON would turn 1 into "1" and sort it otherwise: see encode)
        raise TypeError(f"internal: a plan's mapping has a key that is not a string: {sorted(map(repr, obj))[:3]}")


def body_digest(body: dict) -> str:
    """What a saved plan's every field hashes to, so an edited body is refused even with its old digests. A
    checksum, not a signature: apply also checks every action of a saved plan on its own (plancheck.py)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def placement_group_name(fleet: str, job: str, zone: str) -> str:
    """The cluster placement group of a placement-group gang in one zone: `<fleet>-<job>-<hash of the pair>-<zone>`.
    A group lives in one zone (with one name per gang, a gang whose allowlist moved it failed every create in the
    new zone). Names are dash-joined, so `<fleet>-<job>` alone was ambiguous (fleet `team` job `a-train` and fleet
    `team-a` job `train` shared `team-a-train`); the pair's hash (a `/` cannot occur in either name) tells them apart."""
    return f"{fleet}-{job}-{hashlib.sha256(f'{fleet}/{job}'.encode()).hexdigest()[:8]}-{zone}"


PLAN_ID_LEN = 12


def plan_id(desired: DesiredState, observed: Observed, actions: str = "") -> str:
    return hashlib.sha256(f"{desired.fleet}|{desired.digest}|{observed.digest}|{actions}".encode()).hexdigest()[:PLAN_ID_LEN]


def is_plan_id(text: str) -> bool:
    """What plan_id makes: a saved plan's id keys its creates (`<id>-0001`: an AWS ClientToken, at most 64 characters)
    and goes into tags and status/, so a file's id that is not one (spaces, quotes, a newline, 5,000 characters) is refused."""
    return isinstance(text, str) and len(text) == PLAN_ID_LEN and all(c in "0123456789abcdef" for c in text)
