"""Reading a file a person or a pull request may have put something else at the name of: a fifo, a device, a
directory. One rule for the config's YAML, the pinned price catalog and the reconciler's state; one for what a link in
the config may point into; one JSON reader for the files we write (a duplicate key refused); and one rule for who beside
a file's owner could have rewritten it."""

from __future__ import annotations

import errno
import grp
import json
import os
import pwd
import stat
from pathlib import Path


# Directories directly under the config dir that are not config: status/ is the reconciler's own output, node_modules/
# what `npm install` leaves beside a package.json at the repo root. Only there: a directory of either name deeper down
# (teams/status/) is config like any other (skipped, its jobs vanished and the plan deleted their instances). Hidden
# files and directories (.reconcile, .git, .github) are skipped at every depth.
SKIP_DIRS = {"status", "node_modules"}
# What a link to a path of the config refused by not_a_link_target points into, as its error says.
NOT_CONFIG = "git's and the reconciler's own files, a hidden file, status/"


def not_a_link_target(rel: Path) -> bool:
    """Whether a link to this path under the config directory is refused, as one out of the directory is: into git's
    or the reconciler's own files (the checkout's .git/config holds CI's token, and YAML's errors quote words of what
    they read), to a hidden file (.env, .netrc) or into status/ or node_modules/. A hidden directory's config stays a
    link's target (`jobs -> .shared/jobs`: the walk skips .shared, so its jobs are read once, through the link). One
    rule for the config's YAML (reconciler.load) and its pinned price catalog (providers.catalog.catalog_for)."""
    return (rel.name.startswith(".") or any(part in (".git", ".reconcile") for part in rel.parts)
            or (rel.parts[:1] != () and rel.parts[0] in SKIP_DIRS))


class NotRegularFile(OSError):
    """A fifo, socket or device where a file was expected: refused, never waited on (a fifo) or read for ever (/dev/zero)."""


def read_regular(path: str | Path, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of the regular file at `path` (more than `limit`: the file is larger, for the caller to
    refuse). Opened non-blocking and checked on the open descriptor: a directory raises IsADirectoryError, a fifo,
    socket or device NotRegularFile, and a missing or unreadable file its OSError, each with a strerror to show."""
    return read_regular_fd(os.open(path, os.O_RDONLY | os.O_NONBLOCK), limit, path)


def read_regular_fd(fd: int, limit: int, path: str | Path) -> bytes:
    """read_regular of a descriptor the caller opened (O_NONBLOCK; relative to a directory's, O_NOFOLLOW: status/),
    closed here; `path` names it in the errors."""
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file (a fifo, socket or device)", str(path))
        # Read as large as the file is (one byte more, to see it grew), then by MiB up to the limit: read(limit + 1)
        # allocates its whole buffer first, 256 MiB for each small bus object read under the bus's cap.
        want, parts, got = limit + 1, [], 0
        step = min(want, os.fstat(fd).st_size + 1)
        while got < want and (chunk := f.read(min(step, want - got))):
            parts.append(chunk)
            got += len(chunk)
            step = 1 << 20
        return b"".join(parts)


def loads_json(text: str | bytes):
    """json.loads of a file we wrote, with every way its text can fail to be JSON a ValueError (a UnicodeDecodeError
    is one): also a nest deeper than the decoder recurses (`[[[[...`: a RecursionError), a string holding half of a
    UTF-16 surrogate pair (`"\\ud800"`: JSON reads it, but it is no text: printing or saving it failed later) and a key
    twice in one object (JSON's last one won silently, while a person reading the file sees the first: a saved plan's
    digest covers the parsed body, so an edit that added a second `"fleet"` passed it)."""
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("nested too deep to be read") from None
    if (b"\\u" if isinstance(text, bytes) else "\\u") in text:  # (only an escape can make a surrogate)
        try:
            json.dumps(raw, ensure_ascii=False).encode()
        except UnicodeEncodeError as e:
            raise ValueError(f"a string holds \\u{ord(e.object[e.start]):04x}, half of a UTF-16 surrogate pair") from None
    return raw


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) < len(pairs):  # (the check costs a length compare per object; the search only when one is repeated)
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {json.dumps(key)[:60]} appears twice in one object (which one counts is a guess)")
            seen.add(key)
    return out


def others_may_write(path: str | Path) -> str | None:
    """Who beside the owner (and root) could rewrite the file or directory at `path`, or replace it in its directory:
    None if nobody; else what lets them, with the chmod that stops it. Writable by all ("o+w"), or by a group other than
    the owner's own private group (a umask of 002 makes files group-writable on distributions that give each user a
    group of their own: that is no one else); the directory holding it likewise, but for a sticky one (/tmp), where
    none may replace another's file. Ownership is not checked: a CI job running as root on a checkout another user
    owns is the usual case, not an attack."""
    path = Path(path)
    for p, holder in ((path, False), (path.parent, True)):
        st = os.stat(p)
        if holder and st.st_mode & stat.S_ISVTX:
            continue
        who = ("anyone" if st.st_mode & stat.S_IWOTH else
               f"the group {_group_name(st.st_gid)}" if st.st_mode & stat.S_IWGRP and not _private_group(st) else None)
        if who:
            bits = "o-w" if who == "anyone" else "g-w"
            what = f"its directory {p}" if holder else str(p)
            return f"{what} is writable by {who} (`chmod {bits} {p}`)"
    return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _private_group(st: os.stat_result) -> bool:
    """Whether the group of the file is its owner's own: named as the owner, with no other member listed."""
    try:
        owner, group = pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return group.gr_name == owner and set(group.gr_mem) <= {owner}


__all__ = ["NotRegularFile", "loads_json", "others_may_write", "read_regular", "read_regular_fd"]
