"""Which fleet this is: a name (the Topology's) and a uid generated on its first apply.

The name alone cannot tell two fleets apart: a renamed Topology started a new fleet and left the old
one's instances running unseen, and two config repos with the same name on one account terminated
each other's instances. So the first apply generates a uid, records it with the name in the state
(and in status/fleet.yaml's metadata, which lives in the config repo and so outlives a lost state
file), and writes it on every instance it launches (fleetops.io/fleet-uid). Then:

* a config whose Topology name is not the recorded one is refused (a rename), with instructions;
* instances with our name but another uid are another fleet's: observe leaves them out, and plan
  and apply refuse until someone decides (rename one Topology, or adopt them with --adopt-fleet);
* instances without a uid (launched before uids existed) are this fleet's, as they always were;
* a status/fleet.yaml whose uid is not the state's is refused (edited, or the state is another fleet's);
* a uid that only status/fleet.yaml gives (no state) is taken as this fleet's only where status/fleet.yaml says the
  fleet keeps its state (a lost state there): a fork or another checkout with a state of its own is refused while
  instances carry that uid, but with --adopt-fleet, and takes a new uid when none does (check_confirmed).

The imperative part (reading status/) is `recorded`; the checks are pure."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from reconciler.errors import ReconcileError
from reconciler.state import State


class FleetIdentityError(ReconcileError):
    """The config, the state and the instances disagree on which fleet this is; nothing was changed."""


def new_uid() -> str:
    return uuid.uuid4().hex[:16]


STATE_AT = "fleetops.io/state"  # status/fleet.yaml's metadata.annotations key: where the fleet keeps its state


@dataclass(frozen=True)
class Known:
    """The identity a run starts from. `source`: "state" (the state records it), "status" (the state records none, and
    status/fleet.yaml names one) or "" (neither). `state_at`: where status/fleet.yaml says the fleet keeps its state
    ("" when it does not say: written before fleetops recorded it)."""

    name: str = ""
    uid: str = ""
    source: str = ""
    state_at: str = ""


def recorded(config_dir: Path, state: State) -> Known:
    """The identity as the state records it, else as status/fleet.yaml does. A status/fleet.yaml naming another uid
    than the state's is refused (mismatch): one of the two is not this fleet's, and which one is not ours to guess.
    Without a uid in the state, a status/fleet.yaml that is there but cannot be read, or says nothing (empty, no
    metadata), is an error naming it: taken as no identity, the fleet's instances looked like another fleet's."""
    path = Path(config_dir) / "status" / "fleet.yaml"
    if state.fleet_uid:
        try:
            name, uid, _ = _status_identity(path, config_dir) or ("", "", "")
        except FleetIdentityError:  # unreadable: no claim against the state's uid (apply rewrites the file)
            name, uid = "", ""
        if uid and uid != state.fleet_uid:
            raise mismatch(path, name, uid, state.fleet_name, state.fleet_uid)
        return Known(state.fleet_name, state.fleet_uid, "state")
    found = _status_identity(path, config_dir)
    if found is None:
        return Known()
    name, uid, state_at = found
    return Known(name, uid, "status" if uid else "", state_at)


def _status_identity(path: Path, config_dir: Path) -> tuple[str, str, str] | None:
    """(metadata.name, metadata.uid, the state location annotation) of status/fleet.yaml; None if there is none."""
    from reconciler.statusfiles import StatusFiles, parse_yaml

    with StatusFiles(config_dir) as files:  # as all of status/: never through a link (to /dev/zero), never a fifo
        text = files.read(path)
    if text is None:
        return None
    try:
        # libyaml's loader: read on every plan now (to check it against the state), and a large fleet's fleet.yaml is
        # MBs (its failures and agents): 2.6 MB took 1.87 s of CPU with yaml.safe_load, 0.17 s with this
        doc = parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise _unreadable(path, f"not valid YAML{f' (line {mark.line + 1})' if mark else ''}") from None
    if doc is None:  # apply never writes one without metadata: an emptied file (a bad merge, an edit), not "no fleet"
        raise _unreadable(path, "it is empty" if not text.strip() else "it holds no YAML document (comments only)")
    if not isinstance(doc, dict):
        raise _unreadable(path, f"it is not a status document (a YAML {_kind(doc)}, not a mapping)")
    meta = doc.get("metadata")
    if meta is None:
        raise _unreadable(path, "it has no metadata (apply writes metadata.name and metadata.uid)")
    if not isinstance(meta, dict):
        raise _unreadable(path, f"metadata is a YAML {_kind(meta)}, not a mapping")
    for k in ("name", "uid"):
        if meta.get(k) is not None and not isinstance(meta[k], str):
            raise _unreadable(path, f"metadata.{k} is {meta[k]!r}, not a string")
    notes = meta.get("annotations")
    state_at = notes.get(STATE_AT) if isinstance(notes, dict) else None
    return meta.get("name") or "", meta.get("uid") or "", state_at if isinstance(state_at, str) else ""


def mismatch(path: Path, name: str, uid: str, state_name: str, state_uid: str) -> FleetIdentityError:
    return FleetIdentityError(
        f"{path}: metadata.uid is {uid!r}{f' (fleet {name!r})' if name and name != state_name else ''}, but the state "
        f"records fleet {state_name!r} with uid {state_uid!r}; nothing was changed. status/fleet.yaml says which fleet "
        "this is when the state is lost, so the two must agree: a uid there copied from another fleet of the same name "
        "makes this fleet's plans take that fleet's instances as its own, and delete them. If status/fleet.yaml was "
        "edited (a pull request, a merge), restore it from git, or delete it (the next apply writes it from the state). "
        "If the state is not this fleet's (--state or FLEETOPS_STATE naming another fleet's), point it at this fleet's.")


def check_confirmed(fleet: str, known: Known, here: str, where: str, own: int, adopt: bool, path: Path) -> str:
    """The uid to plan with when only status/fleet.yaml names it (known.source == "status"), or raise. `here`: this
    run's state's location (StateBackend.location), `where` the same said for a reader; `own`: instances carrying it.

    status/fleet.yaml outlives a lost state (that is why it holds the uid), but a fork or another checkout of the config
    repo carries it too, with a state of its own: taking the uid there took the other fleet's instances as its own
    and planned deleting them. Nothing in the repo tells the two apart, since a fork copies it all; where the state is
    kept does, so status/fleet.yaml records that (STATE_AT). The same place, its state gone: a lost state, and the uid
    is this fleet's. Elsewhere (or not recorded, by an older fleetops), `own` instances carrying the uid are refused
    but with --adopt-fleet (the user's word that they are this fleet's), and with none the config takes a new uid:
    kept, it would share the other fleet's, which would then take this one's instances as its own."""
    if known.source != "status" or known.state_at == here or adopt:
        return known.uid
    if not own:
        return ""
    recorded_at = f"recorded the fleet's state at {known.state_at}" if known.state_at else \
        "does not say where the fleet keeps its state (written by an older fleetops)"
    raise FleetIdentityError(
        f"{path} says this config is fleet {fleet!r} (uid {known.uid}), and {own} instance(s) carry that uid, but this "
        f"run's state ({where}) records no fleet, and status/fleet.yaml {recorded_at}; nothing was changed. A fork or "
        "another checkout of the config repo (its own state, the same cloud account) would take the other fleet's "
        "instances as its own, and delete what it does not run. If this config is that fleet's own and its state was "
        "lost, run again with --adopt-fleet (read the plan first: it may stop or delete those instances). If it is a "
        "copy of another fleet's config repo, those instances are not its own: rename this Topology, or point --state "
        "(FLEETOPS_STATE) at that fleet's state if it is to manage it.")


def _kind(v) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(v), type(v).__name__)


def _unreadable(path: Path, problem: str) -> FleetIdentityError:
    return FleetIdentityError(
        f"{path}: cannot read the fleet's identity: {problem}. The state records no fleet uid (a first apply, or a lost "
        "state file), so this file says which fleet this is and which instances are its own; nothing was changed. "
        "Restore it from git (status/ is committed with the config), or, if the fleet has no instances yet, delete it "
        "(apply rewrites it).")


def check_name(fleet: str, known_name: str, known_uid: str, adopt: bool) -> str:
    """The uid to observe with: the recorded one, or "" for a fleet taking a new identity. Raises on a rename."""
    if known_name and known_name != fleet:
        if adopt:
            return ""
        raise FleetIdentityError(
            f"this config's Topology is named {fleet!r}, but its state records fleet {known_name!r} (uid {known_uid}); "
            f"a renamed Topology is a new fleet, and {known_name!r}'s instances would keep running unseen. Rename it "
            f"back to {known_name!r}. To replace fleet {known_name!r} by {fleet!r}: apply {known_name!r} with no jobs and "
            f"no pool minimums first (its instances are deleted), then apply {fleet!r} with --adopt-fleet.")
    return known_uid


def check_foreign(fleet: str, uid: str, foreign: tuple[tuple[str, str], ...], adopt: bool, own: int = 0) -> str | None:
    """None if no other fleet shares our name; with --adopt-fleet, the one other uid to adopt. Raises otherwise.
    `own`: the instances observed with our uid. Adopting a uid takes it in place of ours, so while the fleet runs
    instances of its own uid they would become another fleet's, running unseen, and the plan would buy all their
    work again (audit: the refusal offered --adopt-fleet, and adopting flipped the fleet's identity back and forth):
    refused then, and not offered."""
    if not foreign:
        return None
    uids = sorted({u for _, u in foreign})
    if adopt and len(uids) == 1 and not own:
        return uids[0]
    ids = ", ".join(i for i, _ in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
    mine = f"this fleet's uid is {uid}" if uid else "this config has no fleet uid recorded yet (a new repo, or a lost state)"
    if own:
        how = (f" This fleet runs {own} instance(s) of its own (uid {uid}), so --adopt-fleet is refused: it would take the "
               "other uid in place of this one, and this fleet's instances would run on unseen while the plan bought their "
               "work again. If the other instances are this fleet's too (a uid tag edited by hand), put its tag back; else "
               "empty one of the fleets first.")
    else:
        how = (" If they are this fleet's (its state and status/ were lost), run again with --adopt-fleet to adopt them"
               + (" (only one uid can be adopted)" if len(uids) > 1 else "") + ".")
    raise FleetIdentityError(
        f"{len(foreign)} instance(s) tagged fleet {fleet!r} belong to another fleet of that name (uid {', '.join(uids)}; "
        f"{mine}): {ids}. Another config repo with the same Topology name manages them; nothing was changed. Rename "
        "one of the Topologies." + how)


__all__ = ["FleetIdentityError", "Known", "STATE_AT", "new_uid", "recorded", "check_name", "check_confirmed", "check_foreign"]
