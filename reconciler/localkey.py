"""This machine's seal on what load and plan cache inside a config directory.

The config directory is a git checkout: anything in it, .reconcile/cache/ included, may have come
with a pull request. A cache entry that carries only a checksum anyone can compute would be read
as if this program had written it: a forged parse of a jobs file (apply acting on YAML nobody
reviewed), or a forged plan printed as a PR's plan. So entries are sealed with an HMAC under a key
kept outside the checkout, in the user's cache directory (0600), and an entry this machine did not
seal is not read. A fresh CI machine has no key yet: it reads no cache, writes one for its own next
run, and plans as without a cache. No key can be made (a read-only home): nothing is cached."""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from providers.files import read_regular

_cached: tuple[Path, bytes] | None = None  # (where it was read, the key): read once a process
MAX_CACHE_BYTES = 1 << 30  # a bound on what a cache entry read takes: a 10k-job plan's memo is tens of MB


def read_cache(path: Path) -> bytes:
    """A cache entry's bytes, read as providers.files reads (a fifo at its name hung every plan); OSError when it is no
    regular file or larger than MAX_CACHE_BYTES, which each cache reads as a miss."""
    raw = read_regular(path, MAX_CACHE_BYTES)
    if len(raw) > MAX_CACHE_BYTES:
        raise OSError(errno.EFBIG, "larger than a cache entry", str(path))
    return raw


def key_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetops" / "cache-seal.key"


def _load() -> bytes | None:
    """The key, made once (32 random bytes, readable by this user alone); None if it cannot be read or made."""
    global _cached
    path = key_path()
    if _cached is not None and _cached[0] == path:
        return _cached[1]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    except FileExistsError:  # made before, or by a concurrent run: read it
        pass
    except OSError:
        return None
    try:
        data = read_regular(path, 32)
        st = os.stat(path)
    except OSError:
        return None
    if len(data) != 32:
        return None  # torn by a concurrent first write, or not a key this program made: seal nothing
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        # Another user's file (XDG_CACHE_HOME=/tmp/x: one made /tmp/x/fleetops/cache-seal.key first), or one others may
        # read or write: they know the key, and an entry sealed with it is read as ours (a pickled parse of the config,
        # a plan). Seal nothing: plan and apply run as without a cache.
        return None
    _cached = (path, data)
    return data


def seal(data: bytes) -> str | None:
    """The HMAC-SHA256 of data under this machine's key, or None (no key: do not cache)."""
    key = _load()
    return None if key is None else hmac.new(key, data, hashlib.sha256).hexdigest()


def sealed(data: bytes, tag: object) -> bool:
    """Whether `tag` is this machine's seal on data."""
    mine = seal(data)
    return mine is not None and isinstance(tag, str) and hmac.compare_digest(mine, tag)


__all__ = ["key_path", "seal", "sealed"]
