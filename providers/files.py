"""Reading a file a person or a pull request may have put something else at the name of: a fifo, a device, a
directory. One rule for the config's YAML, the pinned price catalog and the reconciler's state."""

from __future__ import annotations

import errno
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


__all__ = ["NotRegularFile", "read_regular", "read_regular_fd"]
