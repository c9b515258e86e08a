"""Replacing a file whole or not at all: the state, the local bus's objects and the caches under .reconcile/, and a
refreshed catalog.

Each is written to a temporary file beside it and renamed over it, so a reader (or a concurrent plan) sees the
old file or the new one, never half of one. A write or rename that fails removes its temporary file: left behind,
a cache that could not be replaced (a directory at its name) gained another `.NAME.<pid>.tmp` with every plan."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (creating its directory); raises the OSError if it cannot, leaving no temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # (a directory planted at the temporary name is not ours to remove)
            tmp.unlink()
        raise


__all__ = ["write_atomic"]
