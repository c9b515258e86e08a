"""The files of status/ in the config dir, read and written without ever following a link out of it (and without
the planner: identity.py reads status/fleet.yaml on a plan the memo answers)."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import yaml

from providers.files import NotRegularFile, read_regular_fd
from reconciler.errors import ReconcileError

# libyaml's parser where PyYAML has it: status of a 2,000-job fleet read its 2,045 files in 7 s of CPU with the pure
# Python one (apply reads them too, to keep each condition's lastTransitionTime)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str):
    """A status file's text as YAML (libyaml's safe loader where PyYAML has it): what apply (keeping each condition's
    time) and `reconcile status` both read. Raises yaml.YAMLError; aliases are for the caller to refuse (has_alias)."""
    return yaml.load(text, Loader=_LOADER)


MAX_STATUS_BYTES = 64 << 20  # far above any fleet's (a 10k-job fleet.yaml is a few MB): a bound on what is read
METRICS_FILE = "metrics.prom"  # status/metrics.prom: the apply's metrics for node_exporter (reconciler/metrics.py)
_TEMP_IN_THE_WAY = "is in the way of the temporary file apply writes there (it is not a file apply can remove)"


class StatusFiles:
    """status/ in the config dir, each path component opened relative to its parent's descriptor
    with O_NOFOLLOW: a symlink anywhere under status/ (status/ itself, status/jobs, a job's file)
    is refused, never followed, so status is never read, written or deleted outside the config dir.
    (Before: status/jobs/X.yaml linked to a file outside the repo was overwritten by apply.)"""

    def __init__(self, config_dir: Path):
        self.config_dir = Path(config_dir)
        self._dirs: dict[tuple[str, ...], int] = {}

    def __enter__(self) -> "StatusFiles":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def _refuse(self, parts: tuple[str, ...], e: OSError | None, what: str = "") -> ReconcileError:
        rel = "/".join(parts)
        where = self.config_dir / rel
        if os.path.islink(where):
            what = f"is a symlink (to {os.readlink(where)}); status is never written through a link, which could lead out of the config directory"
        elif not what:
            what = "is not a directory" if e is not None and e.errno == 20 else f"cannot be used: {e.strerror if e else 'unknown'}"
        return ReconcileError(f"{where}: {rel} {what}. Remove or move it away: status/ holds only what "
                              "`reconcile apply` writes, and the next apply writes it again.")

    def _dir(self, parts: tuple[str, ...], create: bool) -> int | None:
        if parts in self._dirs:
            return self._dirs[parts]
        if not parts:
            fd = os.open(self.config_dir, os.O_RDONLY | os.O_DIRECTORY)
        else:
            parent = self._dir(parts[:-1], create)
            if parent is None:
                return None
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                try:
                    fd = os.open(parts[-1], flags, dir_fd=parent)
                except FileNotFoundError:
                    if not create:
                        return None
                    os.mkdir(parts[-1], 0o755, dir_fd=parent)
                    fd = os.open(parts[-1], flags, dir_fd=parent)
            except OSError as e:
                raise self._refuse(parts, e) from None
        self._dirs[parts] = fd
        return fd

    def _parts(self, path: Path) -> tuple[str, ...]:
        return path.relative_to(self.config_dir).parts

    def read(self, path: Path) -> str | None:
        """The text of a status file, None if it does not exist."""
        parts = self._parts(path)
        d = self._dir(parts[:-1], create=False)
        if d is None:
            return None
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=d)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._refuse(parts, e) from None
        try:
            raw = read_regular_fd(fd, MAX_STATUS_BYTES, self.config_dir / Path(*parts))
        except (IsADirectoryError, NotRegularFile):
            raise self._refuse(parts, None, "is not a regular file") from None
        except OSError as e:
            raise self._refuse(parts, e) from None
        if len(raw) > MAX_STATUS_BYTES:  # (a link to /dev/zero is refused above; a huge file was read whole)
            raise self._refuse(parts, None, f"is larger than {MAX_STATUS_BYTES >> 20} MiB, more than apply writes")
        return raw.decode("utf-8", errors="replace")

    def write(self, path: Path, text: str) -> None:
        """Replace a status file (atomically) unless it already says `text`: written to `.NAME.tmp`, created anew
        (O_EXCL|O_NOFOLLOW: a link planted at that name is removed, never written through), then renamed over NAME
        (which replaces a link there, never follows it). The temporary file is removed when any step fails."""
        parts = self._parts(path)
        if self.read(path) == text:
            return
        d = self._dir(parts[:-1], create=True)
        tmp = f".{parts[-1]}.tmp"
        tmp_parts = (*parts[:-1], tmp)
        try:
            os.unlink(tmp, dir_fd=d)  # a leftover of a killed run, or a link: the entry itself, never its target
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self._refuse(tmp_parts, e, _TEMP_IN_THE_WAY) from None
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=d)
        except OSError as e:
            raise self._refuse(tmp_parts, e) from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, parts[-1], src_dir_fd=d, dst_dir_fd=d)
        except OSError as e:
            try:
                os.unlink(tmp, dir_fd=d)
            except OSError:
                pass
            raise self._refuse(parts, e) from None

    def names(self, directory: Path) -> list[str]:
        """The *.yaml entries of a status directory (none if it does not exist)."""
        d = self._dir(self._parts(directory), create=False)
        return sorted(n for n in os.listdir(d) if n.endswith(".yaml") and not n.startswith(".")) if d is not None else []

    def remove(self, path: Path) -> None:
        parts = self._parts(path)
        d = self._dir(parts[:-1], create=False)
        if d is not None:
            os.unlink(parts[-1], dir_fd=d)  # a link itself, never what it points to

    def check(self) -> None:
        """Refuse, before an apply changes anything, a status/ that could not be written safely: a link, directory
        or other non-file at a name apply writes (status/, jobs/, pools/, *.yaml, fleet.yaml, metrics.prom), or a
        directory where it puts a temporary file (`.NAME.tmp`)."""
        for sub in ((), ("jobs",), ("pools",)):
            directory = self.config_dir / "status" / Path(*sub)
            for name in self.names(directory) + (["fleet.yaml", METRICS_FILE] if not sub else []):
                self.read(directory / name)
            d = self._dir(("status", *sub), create=False)
            for name in os.listdir(d) if d is not None else ():
                if name.startswith(".") and name.endswith(".tmp"):
                    st = os.stat(name, dir_fd=d, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        raise self._refuse(("status", *sub, name), None, _TEMP_IN_THE_WAY)

    def document(self, path: Path) -> dict:
        """A status file's YAML as a mapping; {} if it is absent, not YAML or not a mapping
        (write_status then writes it whole again)."""
        try:
            doc = parse_yaml(self.read(path) or "")
        except yaml.YAMLError:
            return {}
        return doc if isinstance(doc, dict) and not has_alias(doc) else {}


def has_non_finite(doc) -> bool:
    """Whether a parsed status file (without aliases: has_alias first) holds .nan or .inf. Apply writes none; `status`
    showed "$nan/h", and `status --format json` printed NaN, which is no JSON."""
    todo = [doc]
    while todo:
        v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, (dict, list)):
            todo.extend(v.values() if isinstance(v, dict) else v)
    return False


def has_alias(doc) -> bool:
    """Whether a parsed status file holds a YAML alias: one collection, or string, reached twice (the parser makes each
    other value anew; Python shares strings of one character). Apply writes none, and expanded by whatever reads the
    file whole (JSON, a render), nine levels of nine aliases are 387M values, one naming itself never ends, and a
    megabyte's string named 300,000 times is 300 GB."""
    seen: set[int] = set()
    todo = [doc]
    while todo:
        v = todo.pop()
        if isinstance(v, (dict, list)) or (isinstance(v, str) and len(v) > 1):
            if id(v) in seen:
                return True
            seen.add(id(v))
            if not isinstance(v, str):
                todo.extend(v.values() if isinstance(v, dict) else v)
    return False
