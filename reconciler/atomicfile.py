"""Replacing a file whole or not at all: the state, the local bus's objects and the caches under .reconcile/, a
refreshed catalog, `reconcile metrics --out`.

Each is written to a temporary file beside it and renamed over it, so a reader (or a concurrent plan) sees the
old file or the new one, never half of one. The temporary file has an unpredictable name and is created anew
(O_CREAT|O_EXCL|O_NOFOLLOW): a link planted at a name this process would use (`.state.json.<pid>.tmp` was one) is
never written through. A write or rename that fails removes its temporary file: left behind, a cache that could not
be replaced (a directory at its name) gained another temporary file with every plan."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable


COPY_CHUNK = 1 << 20  # bytes copy_atomic moves at a time


def _temporary(path: Path, mode: int) -> tuple[Path, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` (creating its directory); raises the OSError if it cannot, leaving no temporary file."""
    path = Path(path)
    tmp, fd = _temporary(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def copy_atomic(src: BinaryIO, path: Path, tick: Callable[[], None] | None = None, mode: int = 0o644) -> int:
    """Replace `path` with the rest of the open file `src`, COPY_CHUNK bytes at a time (a checkpoint's file of GBs is
    never held whole), calling `tick` after each; returns the bytes copied. As write_atomic: renamed into place only
    once whole (a copy cut by an error or a kill never looks complete), no temporary file left on an error."""
    path = Path(path)
    tmp, fd = _temporary(path, mode)
    buf = bytearray(COPY_CHUNK)
    view, done = memoryview(buf), 0
    try:
        with os.fdopen(fd, "wb") as f:
            while n := src.readinto(buf):
                f.write(view[:n])
                done += n
                if tick is not None:
                    tick()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return done


__all__ = ["copy_atomic", "write_atomic"]
