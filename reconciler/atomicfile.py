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


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` (creating its directory); raises the OSError if it cannot, leaving no temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


__all__ = ["write_atomic"]
