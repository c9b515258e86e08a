"""A provider's `-o KEY=VALUE` options, read one way by every cloud.

One `-o` set reaches every provider of a run, so `<cloud>_<key>` wins over `<key>` (`gcp_endpoint` is GCP's even
when `endpoint` is Azure's); an empty value is no value. A value the option cannot take is a ProviderError naming
the option and the value (exit 1), not a bare ValueError nor a nonsense setting taken silently (a parallelism of 0).
The provider reads most when it is made, before any call; a cache's ttl just before the read it governs."""

from __future__ import annotations

import math
from collections.abc import Mapping

from providers.errors import ProviderError

# `-o live_spot=off` and its spellings: the answers that turn a read off.
OFF = ("off", "false", "0", "no")


class ProviderOptions:
    """The options of one cloud's provider (`cloud`: its name, the prefix of its own keys)."""

    def __init__(self, cloud: str, options: Mapping[str, str]):
        self.cloud = cloud
        self.options = options

    def text(self, key: str) -> str | None:
        """The option's value; `<cloud>_<key>` wins over `<key>`. None: not given (or given empty)."""
        value = self.options.get(f"{self.cloud}_{key}") or self.options.get(key)
        return str(value) if value else None

    def off(self, key: str) -> bool:
        """The option turns something off (`live_spot=off`, `=false`, `=0`, `=no`)."""
        return (self.text(key) or "").lower() in OFF

    def seconds(self, key: str, default: float, *, zero: bool = True) -> float:
        """A duration in seconds: 0 or more (a cache's ttl of 0 reads every time, a retry window of 0 tries once),
        or with `zero=False` more than 0 (an HTTP timeout of 0 would fail every call)."""
        raw = self.text(key)
        if raw is None:
            return default
        value = self._number(raw)
        if not (value > 0 or zero and value == 0):
            least = "0 or more" if zero else "more than 0"
            raise ProviderError(f"{self.cloud}: option {key}={raw!r} must be a number of seconds, {least}")
        return value

    def count(self, key: str, default: int, *, least: int = 1) -> int:
        """A whole number, `least` or more (parallelism: 1 or more; max_retries: 0 or more)."""
        raw = self.text(key)
        if raw is None:
            return default
        value = self._number(raw)
        if not (math.isfinite(value) and value.is_integer() and value >= least):
            raise ProviderError(f"{self.cloud}: option {key}={raw!r} must be a whole number, {least} or more")
        return int(value)

    def _number(self, raw: str) -> float:
        """`raw` as a float; NaN, like a word, is no number (it compares false to every bound)."""
        try:
            return float(raw)
        except ValueError:
            return math.nan


__all__ = ["OFF", "ProviderOptions"]
