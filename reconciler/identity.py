"""Which fleet this is: a name (the Topology's) and a uid generated on its first apply.

The name alone cannot tell two fleets apart: a renamed Topology started a new fleet and left the old
one's instances running unseen, and two config repos with the same name on one account terminated
each other's instances. So the first apply generates a uid, records it with the name in the state
(and in status/fleet.yaml's metadata, which lives in the config repo and so outlives a lost state
file), and writes it on every instance it launches (fleetops.io/fleet-uid). Then:

* a config whose Topology name is not the recorded one is refused (a rename), with instructions;
* instances with our name but another uid are another fleet's: observe leaves them out, and plan
  and apply refuse until someone decides (rename one Topology, or adopt them with --adopt-fleet);
* instances without a uid (launched before uids existed) are this fleet's, as they always were.

The imperative part (reading status/) is `recorded`; `resolve` is pure."""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml

from reconciler.errors import ReconcileError
from reconciler.state import State


class FleetIdentityError(ReconcileError):
    """The config, the state and the instances disagree on which fleet this is; nothing was changed."""


def new_uid() -> str:
    return uuid.uuid4().hex[:16]


def recorded(config_dir: Path, state: State) -> tuple[str, str]:
    """(name, uid) as the state records them, else as status/fleet.yaml does, else ("", ""). A status/fleet.yaml that
    is there but cannot be read is an error naming it: taken as no identity, the fleet's instances looked like another
    fleet's ("belong to another fleet of that name", advising a rename or --adopt-fleet)."""
    if state.fleet_uid:
        return state.fleet_name, state.fleet_uid
    from reconciler.statusfiles import StatusFiles

    path = Path(config_dir) / "status" / "fleet.yaml"
    with StatusFiles(config_dir) as files:  # as all of status/: never through a link (to /dev/zero), never a fifo
        text = files.read(path)
    if text is None:
        return "", ""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise _unreadable(path, f"not valid YAML{f' (line {mark.line + 1})' if mark else ''}") from None
    if doc is None:
        return "", ""
    if not isinstance(doc, dict):
        raise _unreadable(path, f"it is not a status document (a YAML {_kind(doc)}, not a mapping)")
    meta = doc.get("metadata")
    if meta is None:
        return "", ""
    if not isinstance(meta, dict):
        raise _unreadable(path, f"metadata is a YAML {_kind(meta)}, not a mapping")
    for k in ("name", "uid"):
        if meta.get(k) is not None and not isinstance(meta[k], str):
            raise _unreadable(path, f"metadata.{k} is {meta[k]!r}, not a string")
    return meta.get("name") or "", meta.get("uid") or ""


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


__all__ = ["FleetIdentityError", "new_uid", "recorded", "check_name", "check_foreign"]
