"""A small on-disk cache for what a cloud offers per zone (machine types, accelerators, VM SKUs).

Offerings change on the scale of weeks, and reading them costs API calls (a GCE aggregated list, an Azure resource
SKU list that runs to megabytes), so each run reuses a read younger than `ttl` seconds from
`.reconcile/cache/<name>.json`. A cache file that cannot be read is ignored and rewritten: it only ever saves a call.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from providers.files import loads_json

DEFAULT_TTL_S = 3600.0


def cached(state_dir: Path, name: str, ttl: float, fetch: Callable[[], Any]) -> Any:
    path = Path(state_dir) / "cache" / f"{name}.json"
    if ttl > 0:
        try:
            raw = loads_json(path.read_text())
            if isinstance(raw, dict) and time.time() - float(raw["read_at"]) < ttl:
                return raw["data"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    data = fetch()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"read_at": time.time(), "data": data}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only state dir: no cache, same answer
    return data
