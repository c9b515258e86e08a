"""Reading a file a person or a pull request may have put something else at the name of: a fifo, a device, a
directory. One rule for the config's YAML, the pinned price catalog and the reconciler's state."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path


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
        return f.read(limit + 1)


def loads_json(text: str | bytes):
    """json.loads of a file we wrote, with every way its text can fail to be JSON a ValueError (a UnicodeDecodeError
    is one): also a nest deeper than the decoder recurses (`[[[[...`: a RecursionError) and a string holding half of a
    UTF-16 surrogate pair (`"\\ud800"`: JSON reads it, but it is no text: printing or saving it failed later)."""
    try:
        raw = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deep to be read") from None
    if (b"\\u" if isinstance(text, bytes) else "\\u") in text:  # (only an escape can make a surrogate)
        try:
            json.dumps(raw, ensure_ascii=False).encode()
        except UnicodeEncodeError as e:
            raise ValueError(f"a string holds \\u{ord(e.object[e.start]):04x}, half of a UTF-16 surrogate pair") from None
    return raw


__all__ = ["NotRegularFile", "loads_json", "read_regular", "read_regular_fd"]
