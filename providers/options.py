"""A provider's `-o KEY=VALUE` options, read one way by every cloud.

One `-o` set reaches every provider of a run, so `<cloud>_<key>` wins over `<key>` (`gcp_endpoint` is GCP's even
when `endpoint` is Azure's); an empty value is no value. Each provider declares the options it takes once, as
`OPTIONS` (name -> Option: its kind and default); a key no provider of the run takes is an error naming the ones they
do (a typo such as `endpont_url` fell through to the real cloud), and so is a value the option cannot take: a
ProviderError naming the option and the value (exit 1), not a bare ValueError nor a nonsense setting taken silently
(a parallelism of 0). The provider checks every value it is given when it is made, before any call."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from providers.errors import ProviderError

# `-o live_spot=off` and its spellings: the answers that turn a read off (and those that leave it on).
OFF = ("off", "false", "0", "no")
ON = ("on", "true", "1", "yes")


@dataclass(frozen=True)
class Option:
    """One option a provider takes. kind: text | url (http:// or https://) | seconds | count | switch (on/off).
    seconds: `zero` says whether 0 is allowed; count: `least` is the smallest whole number allowed."""

    kind: str
    default: float | None = None
    zero: bool = True
    least: int = 1


def text() -> Option:
    return Option("text")


def url() -> Option:
    return Option("url")


def switch() -> Option:
    return Option("switch")


def seconds(default: float, *, zero: bool = True) -> Option:
    return Option("seconds", default, zero=zero)


def count(default: int, *, least: int = 1) -> Option:
    return Option("count", default, least=least)


class ProviderOptions:
    """The options of one cloud's provider (`cloud`: its name, the prefix of its own keys). With `spec` (the
    provider's OPTIONS), every value given for one of them is checked now, and defaults come from it."""

    def __init__(self, cloud: str, options: Mapping[str, str], spec: Mapping[str, Option] | None = None):
        self.cloud = cloud
        self.options = options
        self.spec = spec or {}
        for key, opt in self.spec.items():
            self._check(key, opt)

    def _check(self, key: str, opt: Option) -> None:
        if opt.kind == "seconds":
            self.seconds(key)
        elif opt.kind == "count":
            self.count(key)
        elif opt.kind == "url":
            self.url(key)
        elif opt.kind == "switch":
            self.off(key)

    def text(self, key: str) -> str | None:
        """The option's value; `<cloud>_<key>` wins over `<key>`. None: not given (or given empty)."""
        value = self.options.get(f"{self.cloud}_{key}") or self.options.get(key)
        return str(value) if value else None

    def url(self, key: str) -> str | None:
        """An endpoint: http:// or https:// and a host (`notaurl` reached botocore as "Invalid endpoint", a bug's
        message). None: not given."""
        raw = self.text(key)
        if raw is None:
            return None
        try:
            parts = urlsplit(raw)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
        except ValueError:  # a port that is no number, a bracketed host that is no address
            ok = False
        if not ok:
            raise ProviderError(f"{self.cloud}: option {key}={raw!r} must be an http:// or https:// URL with a host")
        return raw

    def off(self, key: str) -> bool:
        """The option turns something off (`live_spot=off`, `=false`, `=0`, `=no`; on: `on`, `true`, `1`, `yes`)."""
        raw = (self.text(key) or "").lower()
        if raw and raw not in OFF + ON:
            raise ProviderError(f"{self.cloud}: option {key}={raw!r} must be on or off")
        return raw in OFF

    def seconds(self, key: str, default: float | None = None, *, zero: bool | None = None) -> float:
        """A duration in seconds: 0 or more (a cache's ttl of 0 reads every time, a retry window of 0 tries once),
        or with `zero=False` more than 0 (an HTTP timeout of 0 would fail every call). Default and `zero`: the
        spec's, unless given."""
        opt = self.spec.get(key)
        default = default if default is not None else opt.default if opt is not None else None
        zero = zero if zero is not None else opt.zero if opt is not None else True
        raw = self.text(key)
        if raw is None:
            return default  # type: ignore[return-value]
        value = self._number(raw)
        if not (value > 0 or zero and value == 0):
            least = "0 or more" if zero else "more than 0"
            raise ProviderError(f"{self.cloud}: option {key}={raw!r} must be a number of seconds, {least}")
        return value

    def count(self, key: str, default: int | None = None, *, least: int | None = None) -> int:
        """A whole number, `least` or more (parallelism: 1 or more; max_retries: 0 or more). Default and `least`:
        the spec's, unless given."""
        opt = self.spec.get(key)
        default = default if default is not None else int(opt.default) if opt is not None and opt.default is not None else None
        least = least if least is not None else opt.least if opt is not None else 1
        raw = self.text(key)
        if raw is None:
            return default  # type: ignore[return-value]
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


def check_options(options: Mapping[str, str], specs: Mapping[str, Mapping[str, Option] | None]) -> None:
    """Refuse a `-o` key that no provider of the run takes, and a value one of them cannot take. `specs`: each
    provider of the run -> its OPTIONS, or None for a provider that declares none (a plugin: it may read any key,
    so nothing is refused). `<cloud>_<key>` names its cloud's option, also for a cloud not in the run (one `-o` set
    may serve several configs), and is checked against that cloud's options where they are known."""
    if any(spec is None for spec in specs.values()):
        return
    from providers.registry import declared_options  # the built-ins' options, for `<cloud>_<key>` of another cloud

    others: dict[str, Mapping[str, Option]] = {}
    for key in sorted(options):
        cloud, _, bare = key.partition("_")
        if any(key in spec or cloud == name and bare in spec for name, spec in specs.items()):  # type: ignore[operator]
            continue
        spec = declared_options(cloud) if bare and cloud not in specs else None
        if spec is None or bare not in spec:
            raise ProviderError(_unknown(key, specs))
        others[cloud] = spec
    for name, spec in specs.items():
        ProviderOptions(name, options, spec)
    for name, spec in others.items():
        ProviderOptions(name, {k: v for k, v in options.items() if k.startswith(f"{name}_")}, spec)


def _unknown(key: str, specs: Mapping[str, Mapping[str, Option] | None]) -> str:
    takes = "; ".join(f"{name} takes {', '.join(sorted(spec)) if spec else 'none'}" for name, spec in sorted(specs.items()))
    names = {k for spec in specs.values() for k in spec or {}}
    near = difflib.get_close_matches(key, sorted(names), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (f"provider option -o {key}=...: no provider of this run takes {key!r} ({takes}; each also as "
            f"<provider>_<key>){hint}")


__all__ = ["OFF", "ON", "Option", "ProviderOptions", "check_options", "count", "seconds", "switch", "text", "url"]
