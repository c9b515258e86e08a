"""Load a config directory into a validated DesiredState, reporting every error at once.

Each YAML node keeps its line number so that a pydantic error on
`spec.resources.gpus` is reported as `jobs.yaml:14: Job/train: spec.resources.gpus: ...`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from providers.catalog import catalog_bytes, load_catalog, mig_layout_error
from providers.files import NOT_CONFIG, SKIP_DIRS, NotRegularFile, loads_json, not_a_link_target, read_regular
from reconciler import snapshot
from reconciler.atomicfile import write_atomic
from reconciler.localkey import read_cache, seal, sealed
from reconciler.errors import ConfigError, Diagnostic, printable, shown as _shown
from reconciler.ledger import budget_ok, buffer_ok, micro, spot_share_ok, spot_units
from reconciler.schema import did_you_mean, known_fields
from reconciler.model import (
    KINDS,
    DesiredState,
    GuardrailPolicy,
    GuardrailPolicySpec,
    PlacementPolicySpec,
    SpotPolicy,
    SpotPolicySpec,
    Topology,
    region_matches,
)
from reconciler.topology import topology_nodes

MAX_FILE_BYTES = 4 * 1024 * 1024  # checked on the open file before a byte is parsed
MAX_NODES = 200_000  # per file, counted while composing and again after alias expansion ("billion laughs")
# Text per file after alias expansion: MAX_NODES alone let a 3 MB file of 5,000 aliases to one 3 MB string through
# (5,000 nodes), and the digest's JSON of it took 15 GB. A file without aliases has at most MAX_FILE_BYTES of text.
MAX_TEXT = 4 * MAX_FILE_BYTES
# Digits of an int (`0x` and `_` included): a field's largest bound has 10 or so; Python converts at most 4,300.
MAX_INT_DIGITS = 1000
MAX_DEPTH = 64  # nesting per document, checked while composing (a real config nests about 8 deep)
# libyaml's parser when PyYAML has it (about 5x faster at 1,000 jobs than the pure-Python one); line
# marks are the same. Its events are composed into nodes by _compose_all below, not by libyaml's own
# composer: that one recurses in C, so `a: [[[[...` 25,000 deep crashed the process (SIGSEGV), and it
# built all 2M nodes of a 3.9 MB file of `[1,1,1,...` (713 MB, 25 s) before any count could refuse it.
_EVENTS = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class _Parsed:
    file: str
    line: int
    body: Any
    lines: dict[tuple, int] = field(default_factory=dict)
    pending: list | None = None  # lines as the parse cache holds them (_paths' order), made a dict when first asked
    plain: bool = False  # made by _plain_docs: string keys and JSON's own scalars only (JSON gives it back as it is)

    def line_of(self, loc: tuple) -> int:
        """The line of the deepest node on `loc` that exists in the source."""
        if self.pending is not None:
            paths = list(_paths(self.body))
            self.lines = dict(zip(paths, self.pending)) if len(paths) == len(self.pending) else {}
            self.pending = None
        for n in range(len(loc), -1, -1):
            if loc[:n] in self.lines:
                return self.lines[loc[:n]]
        return self.line


_STR_TAG = "tag:yaml.org,2002:str"


def _paths(body: Any):
    """The path of every node of a parsed document in the order _Converter.convert records their lines
    (pre-order; a mapping's keys in order, a sequence's items in order): the parse cache keeps the lines
    alone, in this order, and a cached document's paths are made again only when an error needs a line."""
    stack = [((), body)]
    while stack:
        path, v = stack.pop()
        yield path
        if isinstance(v, dict):
            stack.extend(reversed([(path + (k,), x) for k, x in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([(path + (i,), x) for i, x in enumerate(v)]))


_MAP_TAG, _SEQ_TAG = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_MERGE_TAG, _VALUE_TAG = "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
# YAML 1.1 numbers nobody means: `1:30` is 90 (base 60) and `010` is 8 (octal), silently (`expected_hours: 1:30` was 90
# hours, `cpu: 010` 8 CPUs, also under `%YAML 1.2`). Hex (0x1F), binary (0b101) and `1_000` say what they are.
_MISREAD_NUMBER = re.compile(r"[-+]?(0[0-9_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)")
_FAILED = object()  # a scalar its tag's constructor refused (reported)


def _misread_number(tag: str, text: str) -> str | None:
    """What to say of a plain scalar YAML 1.1 reads as a number other than the one written (None: nothing)."""
    if tag not in _NUMBER_TAGS or not _MISREAD_NUMBER.fullmatch(text):
        return None
    if ":" in text:
        return f"YAML 1.1 reads `{text}` as a base-60 number ({_base60(text):g}), not a time: write the number you mean, or quote it"
    return f"YAML 1.1 reads `{text}` as an octal number ({int(text.replace('_', ''), 8)}): write it without the leading 0, or quote it"


def _base60(text: str) -> float:
    sign = -1 if text.startswith("-") else 1
    value = 0.0
    for part in text.lstrip("+-").replace("_", "").split(":"):
        value = value * 60 + float(part)
    return sign * value


class _Converter:
    """Turns a composed YAML node tree into Python values, recording each node's line."""

    def __init__(self, file: str):
        self.file = file
        self.count = 0
        self.text = 0  # characters of scalar text, aliases expanded
        self.scalars = yaml.SafeLoader("")
        self.flat: dict[int, tuple[list, list]] = {}  # id(mapping node) -> pairs(node), within one document

    def convert(self, node: yaml.Node, path: tuple, lines: dict, diags: list[Diagnostic]) -> Any:
        if not path:
            self.flat = {}  # (anchors are a document's own: the last document's nodes are gone, and their ids reused)
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooBig(node.start_mark.line + 1, f"more than {MAX_NODES:,} YAML nodes after alias expansion: refusing")
        lines.setdefault(path, node.start_mark.line + 1)
        where = ".".join(map(str, path)) or "<document>"
        if isinstance(node, yaml.MappingNode):
            if node.tag != _MAP_TAG:
                diags.append(Diagnostic(self.file, node.start_mark.line + 1, "", "", where, _tag_refused(node.tag, "a mapping")))
            own, merged = self.pairs(node, diags)
            out: dict = {}
            for k_node, v_node, is_own in _sides(own, merged):
                key = self._scalar(k_node, path, diags) if isinstance(k_node, yaml.ScalarNode) else None
                if key is _FAILED:
                    continue
                if not isinstance(key, (str, int, float, bool)):
                    diags.append(Diagnostic(self.file, k_node.start_mark.line + 1, "", "", where, "mapping keys must be plain scalars"))
                    continue
                if key in out:
                    if is_own:
                        diags.append(Diagnostic(self.file, k_node.start_mark.line + 1, "", "", ".".join(map(str, path + (key,))), f"duplicate key {key!r}"))
                    continue  # (a merged key the mapping has, or an earlier merge gave, is YAML's merge: theirs stands)
                out[key] = self.convert(v_node, path + (key,), lines, diags)
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                diags.append(Diagnostic(self.file, node.start_mark.line + 1, "", "", where, _tag_refused(node.tag, "a sequence")))
            return [self.convert(v, path + (i,), lines, diags) for i, v in enumerate(node.value)]
        self.text += len(node.value)
        if self.text > MAX_TEXT:
            raise _TooBig(node.start_mark.line + 1, f"more than {MAX_TEXT // 1024 // 1024} MiB of text after alias expansion: refusing")
        problem = _misread_number(node.tag, node.value) if not node.style else None  # (plain: None, or "" from libyaml)
        if problem:
            diags.append(Diagnostic(self.file, node.start_mark.line + 1, "", "", where, problem))
        value = self._scalar(node, path, diags)
        return None if value is _FAILED else value

    def pairs(self, node: yaml.MappingNode, diags: list[Diagnostic] | None = None, _within: tuple = ()) -> tuple[list, list]:
        """A mapping's own (key node, value node) pairs, and the pairs its `<<` merge keys bring, in precedence order: YAML's
        merge, where the mapping's own key overrides a merged one and of merged mappings the one listed first wins (each
        flattened the same way first). Not PyYAML's flatten_mapping: it rewrites the node in place (an alias of it then
        had its merged keys as its own: `<<: *defaults` and `replicas: 3` was refused as "duplicate key"), and 6.0.4 picks
        among merged keys by the identity of their strings (`<<: [{p: a}, {p: b}]` gave a, with `policy` as the key b)."""
        for k, _ in node.value:
            if k.tag == _MERGE_TAG or k.tag == _VALUE_TAG:
                break
        else:
            return node.value, []  # (the usual mapping: no merge key)
        known = self.flat.get(id(node))
        if known is not None:
            return known
        own, merged, seen = [], [], set()
        for k, v in node.value:
            if k.tag == _VALUE_TAG:
                k.tag = _STR_TAG  # (`=`, the YAML 1.1 value key, as flatten_mapping read it: a string)
            if k.tag != _MERGE_TAG:
                own.append((k, v))
                continue
            sources = v.value if isinstance(v, yaml.SequenceNode) else [v]
            for src in sources:
                if not isinstance(src, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                            f"`<<` merges a mapping or a list of mappings, not {src.id}", src.start_mark)
                if id(src) in _within or src is node or len(_within) > MAX_DEPTH:
                    raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                            "`<<` merges a mapping into itself", src.start_mark)
                if src.tag != _MAP_TAG and diags is not None:
                    diags.append(Diagnostic(self.file, src.start_mark.line + 1, "", "", "<<", _tag_refused(src.tag, "a mapping")))
                src_own, src_merged = self.pairs(src, diags, _within + (id(node),))
                for pair in src_own + src_merged:  # (the first of a key stands: the rest are left here, not in convert,
                    mark = (pair[0].tag, pair[0].value) if isinstance(pair[0], yaml.ScalarNode) else id(pair[0])
                    if mark not in seen:          # so that `<<: [*b, *b, ...]` nine levels deep is not 9^9 pairs)
                        seen.add(mark)
                        merged.append(pair)
        self.flat[id(node)] = (own, merged)  # (each mapping flattened once, however many aliases name it)
        return own, merged

    def _scalar(self, node: yaml.ScalarNode, path: tuple = (), diags: list[Diagnostic] | None = None) -> Any:
        """The scalar's value, or _FAILED (and a diagnostic, given `diags`) when its tag's constructor refuses its text:
        `deadline: 2026-02-30` is a timestamp to YAML and no date, which raised ValueError through load ("a bug in
        reconcile", no file or line; the controller stopped)."""
        if node.tag == _STR_TAG:
            # What SafeConstructor.construct_yaml_str returns for a scalar node. 86% of a generated
            # 10k-job config's 250k scalars are strings: the constructor's dispatch for each was
            # ~0.2 s of a 1.7 s first (uncached) load.
            return node.value
        if node.tag == _NUMBER_TAGS[0] and len(node.value) > MAX_INT_DIGITS:
            # (Python's own refusal read "Exceeds the limit (4300 digits) for integer string conversion ... use
            # sys.set_int_max_str_digits() to increase the limit": advice to the program, not to the config's author)
            if diags is not None:
                diags.append(Diagnostic(self.file, node.start_mark.line + 1, "", "", ".".join(map(str, path)) or "<document>",
                                        f"YAML reads `{_shown(node.value)}` as an int of {len(node.value):,} digits, larger "
                                        "than any field takes: write the number you mean"))
            return _FAILED
        try:
            value = self.scalars.construct_object(node)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as e:
            if diags is None:
                return _FAILED
            what = node.tag.rsplit(":", 1)[-1] if node.tag.startswith("tag:yaml.org,2002:") else node.tag
            what = f"an {what}" if what[:1] in ("a", "e", "i", "o", "u") else f"a {what}"
            why = f": {e}" if isinstance(e, (ValueError, OverflowError)) and str(e) else ""
            diags.append(Diagnostic(self.file, node.start_mark.line + 1, "", "", ".".join(map(str, path)) or "<document>",
                                    f"YAML reads `{_shown(node.value)}` as {what}, and it is not one{why}: fix it, or quote it if it is text"))
            return _FAILED
        finally:
            # The loader memoizes every node it constructs: cleared, so 5k jobs' nodes and their two
            # marks each are freed now, not left for the cyclic collector to trace over and over.
            self.scalars.constructed_objects.clear()
        return value


def _sides(own: list, merged: list):
    """(key node, value node, is the mapping's own) of a mapping's own pairs, then of those it merges."""
    for k, v in own:
        yield k, v, True
    for k, v in merged:
        yield k, v, False


def _tag_refused(tag: str, what: str) -> str:
    shown = "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag
    return f"the tag {shown} is not read here (it was ignored, the value taken as {what}): remove it"


class _TooBig(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


def _compose_all(text: str):
    """The documents of `text` as yaml nodes (what yaml.compose_all makes), composed without
    recursion from the parser's events, refusing more than MAX_DEPTH nesting or MAX_NODES nodes
    as soon as the parser reaches them."""
    events = _EVENTS(text)
    resolve = events.resolve
    seq, mapping = yaml.SequenceNode, yaml.MappingNode
    seq_start, map_start, scalar, alias = yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.ScalarEvent, yaml.AliasEvent
    ends = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    get_event, new_scalar = events.get_event, yaml.ScalarNode
    # A plain scalar's tag is a function of its text and style alone (SafeLoader has no path resolvers): a 10k-job
    # config's 250k scalars are 10k distinct ones, and resolving each (regexes by first character) was ~6% of a load.
    tags: dict[tuple, str] = {}
    nodes = 0
    try:
        get_event()  # StreamStart
        while not events.check_event(yaml.StreamEndEvent):
            get_event()  # DocumentStart
            anchors: dict[str, yaml.Node] = {}
            stack: list[list] = []  # [open collection, its pending mapping key]
            root = None
            while True:
                ev = get_event()
                cls = ev.__class__
                if cls is yaml.DocumentEndEvent:
                    break
                if cls in ends:
                    stack.pop()[0].end_mark = ev.end_mark
                    continue
                if cls is alias:
                    if ev.anchor not in anchors:
                        raise yaml.composer.ComposerError(None, None, f"found undefined alias {ev.anchor!r}", ev.start_mark)
                    node = anchors[ev.anchor]
                else:
                    nodes += 1
                    if nodes > MAX_NODES:
                        raise _TooBig(ev.start_mark.line + 1, f"more than {MAX_NODES:,} YAML nodes: refusing")
                    tag = ev.tag
                    if cls is scalar:
                        if tag is None or tag == "!":
                            tag = tags.get(memo := (ev.value, ev.implicit))
                            if tag is None:
                                tag = tags[memo] = resolve(new_scalar, ev.value, ev.implicit)
                        node = new_scalar(tag, ev.value, ev.start_mark, ev.end_mark, ev.style)
                    else:
                        if len(stack) >= MAX_DEPTH:
                            raise _TooBig(ev.start_mark.line + 1, f"YAML nested more than {MAX_DEPTH} deep: refusing")
                        kind = seq if cls is seq_start else mapping
                        if tag is None or tag == "!":
                            tag = resolve(kind, None, ev.implicit)
                        node = kind(tag, [], ev.start_mark, None, flow_style=ev.flow_style)
                    if ev.anchor is not None:
                        anchors[ev.anchor] = node
                if not stack:
                    root = node
                else:
                    top = stack[-1]
                    if top[0].__class__ is seq:
                        top[0].value.append(node)
                    elif top[1] is None:
                        top[1] = node
                    else:
                        top[0].value.append((top[1], node))
                        top[1] = None
                if cls is seq_start or cls is map_start:
                    stack.append([node, None])
            yield root
    finally:
        events.dispose()


class _Unusual(Exception):
    """A document `_plain_docs` leaves to the composer and the converter."""


_NO_KEY = object()
_PLAIN_VALUES = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"}


def _plain_docs(text: str) -> list[tuple[int, Any, list[int]]]:
    """The documents of `text` as (line, value, the line of each node in _paths' order), built from the
    parser's events without YAML nodes or paths, the same values and lines as _compose_all and
    _Converter.convert give, for the usual document: no anchor, alias, explicit tag, merge key, duplicate
    key or key that is not a string, within MAX_NODES and MAX_DEPTH. Raises on anything else (an error
    too): the caller parses that file the long way, which handles or reports it. (10k jobs: 250k nodes;
    composing them and converting the nodes took ~0.35 s of CPU of a 1.0 s first load.)"""
    events = _EVENTS(text)
    resolve, get_event, construct = events.resolve, events.get_event, yaml.SafeLoader("")
    seq_start, map_start, scalar = yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.ScalarEvent
    ends = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    tags: dict[tuple, str] = {}  # (text, implicit) -> tag, as in _compose_all
    plain: dict[tuple[str, str], Any] = {}  # (tag, text) -> an int, float, bool or None, constructed once
    docs = []
    nodes = 0
    try:
        get_event()  # StreamStart
        while not events.check_event(yaml.StreamEndEvent):
            get_event()  # DocumentStart
            lines: list[int] = []
            stack: list[list] = []  # [open collection, its pending mapping key (_NO_KEY: none)]
            first = None
            while True:
                ev = get_event()
                cls = ev.__class__
                if cls is yaml.DocumentEndEvent:
                    break
                if cls in ends:
                    stack.pop()
                    continue
                nodes += 1
                if nodes > MAX_NODES or ev.anchor is not None or ev.tag not in (None, "!"):
                    raise _Unusual  # (an alias event has an anchor)
                line = ev.start_mark.line + 1
                if cls is scalar:
                    tag = tags.get(memo := (ev.value, ev.implicit))
                    if tag is None:
                        tag = tags[memo] = resolve(yaml.ScalarNode, ev.value, ev.implicit)
                    if tag == _STR_TAG:
                        value = ev.value
                    elif tag in _PLAIN_VALUES:
                        value = plain.get(pk := (tag, ev.value), _NO_KEY)
                        if value is _NO_KEY:
                            if _misread_number(tag, ev.value):
                                raise _Unusual  # `1:30`, `010`: the converter reports it
                            value = plain[pk] = construct.construct_object(yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark, ev.style))
                            construct.constructed_objects.clear()
                    else:
                        raise _Unusual  # a timestamp, binary, a merge key...: the converter's way
                elif cls is seq_start or cls is map_start:
                    if len(stack) >= MAX_DEPTH:
                        raise _Unusual
                    value = [] if cls is seq_start else {}
                else:
                    raise _Unusual
                if not stack:
                    first = line
                    body = value
                    lines.append(line)
                else:
                    top = stack[-1]
                    into = top[0]
                    if into.__class__ is list:
                        into.append(value)
                        lines.append(line)
                    elif top[1] is _NO_KEY:
                        if value.__class__ is not str or value in into:
                            raise _Unusual  # a key that is a collection, not a string, or a duplicate
                        top[1] = value
                        continue
                    else:
                        into[top[1]] = value
                        top[1] = _NO_KEY
                        lines.append(line)
                if cls is not scalar:
                    stack.append([value, _NO_KEY])
            if first is None:
                raise _Unusual
            docs.append((first, body, lines))
    finally:
        events.dispose()
    return docs


def _config_files(root: Path, diags: list[Diagnostic]) -> list[Path]:
    """YAML files under root, skipping hidden files and directories and, directly under root only, SKIP_DIRS. Symlinks (to files or directories)
    are followed when they stay inside root, and every directory is read once (a link to one read
    already, an ancestor say, adds nothing). A link that leaves root, dangles or loops, and a directory
    that cannot be listed are errors, never skipped: the jobs in them would vanish from the desired
    state, and apply would delete the instances running them."""
    real_root = root.resolve()
    out: list[Path] = []

    def refuse(rel: Path, message: str) -> None:
        diags.append(Diagnostic(str(rel), 1, "", "", "<file>", message))

    read_dirs = {real_root}
    todo = [(root, Path(), real_root)]
    linked: list[tuple[Path, Path, Path]] = []  # linked directories, read after every real one
    while todo or linked:
        if not todo:
            link = linked.pop(0)
            if link[2] not in read_dirs:
                read_dirs.add(link[2])
                todo.append(link)
            continue
        directory, rel_dir, real_dir = todo.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as e:
            refuse(rel_dir, f"cannot list this directory: {e.strerror}")
            continue
        for entry in entries:
            if entry.name.startswith(".") or (entry.name in SKIP_DIRS and rel_dir == Path()):
                continue
            path, rel = directory / entry.name, rel_dir / entry.name
            is_yaml = entry.name.lower().endswith((".yaml", ".yml"))  # (jobs in a .YAML file are jobs: skipped, their instances went)
            real = real_dir / entry.name
            if entry.is_symlink():
                try:
                    real = path.resolve(strict=True)
                except (OSError, RuntimeError) as e:
                    problem = "a symlink loop" if "loop" in str(e).lower() else "a dangling symlink"
                    refuse(rel, f"{problem} ({_shown(os.readlink(path), 4096)}): fix or remove it")
                    continue
                if not real.is_relative_to(real_root):
                    if is_yaml or real.is_dir():
                        refuse(rel, f"symlink points outside the config directory ({_shown(str(real), 4096)})")
                    continue
                if not_a_link_target(inside := real.relative_to(real_root)):
                    if is_yaml or real.is_dir():
                        refuse(rel, f"symlink points into {_shown(inside.as_posix(), 4096)}, which is not config "
                                    f"({NOT_CONFIG}): make it a file of the config")
                    continue
            try:
                is_dir = stat.S_ISDIR(os.stat(path).st_mode)
            except OSError as e:
                refuse(rel, f"cannot read: {e.strerror}")
                continue
            if is_dir:
                if entry.is_symlink():
                    linked.append((path, rel, real))
                elif real not in read_dirs:
                    read_dirs.add(real)
                    todo.append((path, rel, real))
            elif is_yaml:
                out.append(path)  # a fifo or device is refused by _read_config, not waited on
    return sorted(out)


def _read_config(path: Path, rel: str, diags: list[Diagnostic]) -> bytes | None:
    """The bytes of a regular file of at most MAX_FILE_BYTES, or None and a diagnostic (a fifo or a device is
    refused, never waited on: providers.files.read_regular)."""
    try:
        raw = read_regular(path, MAX_FILE_BYTES)
    except NotRegularFile:
        diags.append(Diagnostic(rel, 1, "", "", "<file>", "not a regular file (a fifo, socket or device): remove it or rename it off .yaml"))
        return None
    except OSError as e:
        diags.append(Diagnostic(rel, 1, "", "", "<file>", f"cannot read: {e.strerror}"))
        return None
    if len(raw) > MAX_FILE_BYTES:
        diags.append(Diagnostic(rel, 1, "", "", "<file>", f"file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB: refusing to parse it"))
        return None
    return raw


def _parse_file(rel: str, raw: bytes, diags: list[Diagnostic], cache: "_ParseCache | None" = None) -> list[_Parsed]:
    if cache is None:
        return _parse_bytes(rel, raw, diags)
    key = cache.key(raw)
    docs = cache.get(key, rel)
    if docs is None:
        before = len(diags)
        docs = _parse_bytes(rel, raw, diags)
        if len(diags) == before:  # a file with errors is parsed again next time, and reported again
            cache.put(key, docs)
    cache.used.add(key)
    return docs


def _parse_bytes(rel: str, raw: bytes, diags: list[Diagnostic]) -> list[_Parsed]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        diags.append(Diagnostic(rel, line, "", "", "<file>", f"not valid UTF-8 (byte {e.start})"))
        return []
    try:
        plain = _plain_docs(text)
    except Exception:  # noqa: BLE001 -- anything unusual or wrong is parsed again the long way, which reports it
        plain = None
    if plain is not None:
        return [_Parsed(rel, line, body, pending=lines, plain=True) for line, body, lines in plain]
    docs = []
    conv = _Converter(rel)
    try:
        for node in _compose_all(text):
            if node is None:
                continue
            lines: dict[tuple, int] = {}
            body = conv.convert(node, (), lines, diags)
            docs.append(_Parsed(rel, node.start_mark.line + 1, body, lines))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        if "maximum nesting depth" in (e.problem or ""):
            # libyaml >= the one in PyYAML 6.0.4 wheels scans a flow collection ahead and stops at its own
            # limit (1,000 deep) before the composer sees depth MAX_DEPTH: the same refusal, in our words.
            diags.append(Diagnostic(rel, line, "", "", "<yaml>", f"YAML nested more than {MAX_DEPTH} deep: refusing"))
        else:
            diags.append(Diagnostic(rel, line, "", "", "<yaml>", f"invalid YAML: {e.problem or e.context}{_tab_hint(text, e)}"))
    except yaml.reader.ReaderError as e:
        # A control character (the text is decoded already): the error has no mark, and printed itself on two lines
        # ending `in "<unicode string>", position 31`. Its position is the character's index (libyaml gives its code).
        code = e.character if isinstance(e.character, int) else ord(e.character)
        diags.append(Diagnostic(rel, text.count("\n", 0, e.position) + 1, "", "", "<yaml>",
                                f"invalid YAML: the control character U+{code:04X} is not allowed in YAML: remove it, or "
                                f"write it as an escape ({printable(chr(code))}) in a double-quoted string"))
    except yaml.YAMLError as e:
        diags.append(Diagnostic(rel, 1, "", "", "<yaml>", f"invalid YAML: {e}"))
    except _TooBig as e:
        diags.append(Diagnostic(rel, e.line, "", "", "<yaml>", e.message))
    except RecursionError:  # a recursive alias (`&a [*a]`) expanded by the converter
        diags.append(Diagnostic(rel, 1, "", "", "<yaml>", "YAML nested too deeply (a recursive alias?)"))
    return docs


def _tab_hint(text: str, e: yaml.MarkedYAMLError) -> str:
    """PyYAML's error for a tab in indentation ("found character '\\t' that cannot start any token", or a
    mapping error a line later) never says "tab": say it when a line near the error is indented with one."""
    marks = [m.line for m in (e.problem_mark, e.context_mark) if m is not None]
    lines = text.splitlines()
    for n in sorted({x for m in marks for x in (m - 1, m, m + 1) if 0 <= x < len(lines)}):
        indent = lines[n][: len(lines[n]) - len(lines[n].lstrip(" \t"))]
        if "\t" in indent:
            return f" (line {n + 1} is indented with a tab: YAML indents with spaces only)"
    return ""


def _validate_doc(doc: _Parsed, diags: list[Diagnostic], source: bytes | None = None) -> Any | None:
    """The document as its kind's model, or None and a diagnostic per problem. `source`: the file's bytes, read
    again only for an error's words (a key that is not a string, a YAML boolean), which the parse does not keep."""
    body = doc.body
    if not isinstance(body, dict):
        diags.append(Diagnostic(doc.file, doc.line, "", "", "<document>", f"expected a mapping with apiVersion/kind/metadata/spec, got {type(body).__name__}"))
        return None
    kind = body.get("kind")
    meta = body.get("metadata")
    name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
    if not isinstance(kind, str) or kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        hint = did_you_mean(kind, sorted(KINDS)) if isinstance(kind, str) else ""
        diags.append(Diagnostic(doc.file, doc.line_of(("kind",)), str(kind or ""), name, "kind", f"unknown kind {kind!r}{hint} (expected one of {known})"))
        return None
    try:
        return KINDS[kind].model_validate(body)
    except ValidationError as e:
        source_nodes = _SourceNodes(source, doc)
        found: list[list] = []  # [path, is a union's branch, messages]: a union's branches at one path are one diagnostic
        branches: dict[tuple, list] = {}  # path -> its entry in found, for a union's branches
        for err in e.errors():
            path, branch = _user_path(body, tuple(err["loc"]), err["type"])
            msg = err["msg"]
            if isinstance(err.get("input"), float) and math.isnan(err["input"]):  # (pydantic: "should be <= 1000000000")
                msg = "is not a number (NaN)"
            if err["type"] == "extra_forbidden":
                msg = "unknown field" + (did_you_mean(str(path[-1]), known_fields(kind, path[:-1])) if path else "")
            is_key = err["loc"][-1:] == ("[key]",)
            if is_key:
                msg = f"the key: {msg}"
            if isinstance(err.get("input"), bool) and err["type"] in ("string_type", "literal_error"):
                msg += _bool_hint(source_nodes.text(path, key=is_key), str(err.get("ctx", {}).get("expected", "")) if err["type"] == "literal_error" else None)
            elif err["type"] == "string_type" and (err.get("input") is None or isinstance(err.get("input"), (int, float, date))):
                msg += _unquoted_hint(source_nodes.text(path, key=is_key), err["input"])
            # (a dict, not a scan of `found`: 200,000 errors in a list of bad names took ~20 minutes, quadratic)
            same = branches.get(path) if branch else None
            if same is None:
                found.append(same := [path, branch, [msg]])
                if branch:
                    branches[path] = same
            elif msg not in same[2]:
                same[2].append(msg)
        for path, _, msgs in found:
            shown = ".".join(source_nodes.key_text(path[:n + 1]) for n in range(len(path)))
            diags.append(Diagnostic(doc.file, doc.line_of(path), kind, name, shown or "<document>", "; or ".join(msgs)))
        return None


def _user_path(body: Any, loc: tuple, err_type: str) -> tuple[tuple, bool]:
    """The path in the document that pydantic's `loc` points at, and whether tags were left out of it. Pydantic adds a
    union branch's tag (`constrained-int`, `literal['low',...]`, `date`), a dict key's `[key]`, and gives a key `true` as
    1 and `3.5` as '3.5': the path keeps the document's own keys and indices (and a missing field's name), nothing else."""
    path: list = []
    tagged = False
    node = body
    for n, part in enumerate(loc):
        # The key as parsed: True, not pydantic's 1; 3.5, not its '3.5'.
        key = next((k for k in node if k == part or (not isinstance(k, str) and str(k) == part)), None) if isinstance(node, dict) else None
        if key is not None:
            path.append(key)
            node = node[key]
        elif isinstance(node, list) and type(part) is int and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(node, dict) and err_type == "missing" and n == len(loc) - 1:
            path.append(part)
        elif part != "[key]":
            tagged = True
    return tuple(path), tagged


def _bool_hint(word: str | None, expected: str | None) -> str:
    """What to say of a YAML 1.1 boolean (`no`, `on`, ...) given where a string belongs; `expected`: a literal's
    allowed values as pydantic lists them (None: any string)."""
    if word is None:
        return " (YAML reads an unquoted yes/no/on/off/true/false as a boolean: quote it)"
    if expected is not None and f"'{word}'" not in expected:
        return f" (YAML reads `{word}` as a boolean; '{word}' is not one of these either)"
    return f" (YAML reads `{word}` as a boolean; quote it: '{word}')"


def _unquoted_hint(word: str | None, value) -> str:
    """What to say of a number or date YAML read where a string belongs (`command: [train.py, 10]`, `env: {SEED: 1}`,
    `env: {DAY: 2026-01-01}`, `env: {EMPTY: }`): as a Pod's command and env, these are strings; the fix is the quotes."""
    if value is None:
        return " (YAML reads an empty value, `~` or `null` as null: write '' for an empty string)"
    what = "a date" if isinstance(value, date) else "a number"
    if word is None:
        return f" (YAML reads it as {what}: quote it)"
    return f" (YAML reads `{word}` as {what}; quote it: '{word}')"


class _SourceNodes:
    """A document's YAML nodes, composed again from its file's bytes when an error asks what a scalar's text was."""

    def __init__(self, source: bytes | None, doc: _Parsed):
        self.source, self.doc = source, doc
        self.root: yaml.Node | None = None
        self.read = False

    def _root(self) -> yaml.Node | None:
        if not self.read and self.source is not None:
            self.read = True
            try:
                for node in _compose_all(self.source.decode("utf-8")):
                    if node is not None and node.start_mark.line + 1 == self.doc.line:
                        self.root = node
                        break
            except (UnicodeDecodeError, yaml.YAMLError, _TooBig, RecursionError):
                self.root = None
        return self.root

    def _walk(self, path: tuple) -> tuple[yaml.Node | None, yaml.Node | None]:
        """The key node and value node at `path` (None, None: not found)."""
        node, key_node, conv = self._root(), None, _Converter(self.doc.file)
        for part in path:
            if isinstance(node, yaml.MappingNode):
                try:
                    own, merged = conv.pairs(node)
                except yaml.YAMLError:
                    return None, None
                mine = [(k, v) for k, v in own if isinstance(k, yaml.ScalarNode) and conv._scalar(k) == part]
                theirs = [(k, v) for k, v in merged if isinstance(k, yaml.ScalarNode) and conv._scalar(k) == part]
                if not mine and not theirs:
                    return None, None
                key_node, node = mine[0] if mine else theirs[0]  # (as convert reads them: the first of its own, else the first merged)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                key_node, node = None, node.value[part]
            else:
                return None, None
        return key_node, node

    def text(self, path: tuple, key: bool = False) -> str | None:
        """The text of the scalar (or, `key`, of the mapping key) at `path` as the file has it."""
        key_node, node = self._walk(path)
        node = key_node if key else node
        return node.value if isinstance(node, yaml.ScalarNode) else None

    def key_text(self, path: tuple) -> str:
        """The last part of `path` as the user wrote it: a key that is not a string (`true`, `3`) from the file."""
        part = path[-1]
        if isinstance(part, str) or isinstance(self._body_at(path[:-1]), list):
            return str(part)
        written = self.text(path, key=True)
        return written if written is not None else str(part).lower() if isinstance(part, bool) else str(part)

    def _body_at(self, path: tuple) -> Any:
        node = self.doc.body
        for part in path:
            node = node[part]
        return node


def load(root: str | Path, cache: bool = False) -> DesiredState:
    """Parse and validate every document under `root`. Raises ConfigError listing all problems.
    `cache`: read and keep parsed files in root/.reconcile/cache/parse/ (plan and apply do; a
    plain load writes nothing)."""
    root = Path(root)
    if not root.is_dir():
        what = "is a file, not a directory: give the directory that holds it" if root.exists() else "does not exist"
        raise ConfigError([Diagnostic(str(root), 0, "", "", "<dir>", f"config directory {what}")])
    diags: list[Diagnostic] = []
    files = _config_files(root, diags)
    if not files and not diags:
        diags.append(Diagnostic(str(root), 0, "", "", "<dir>", "no .yaml files found"))
    raws = [(rel, _read_config(f, rel, diags)) for f in files for rel in (str(f.relative_to(root)),)]
    kept = _snapshot_key(raws) if cache and not diags else None
    if kept is not None:
        state = snapshot.read(root, kept)
        if state is not None:
            return state
    parse_cache = _ParseCache(root / ".reconcile" / "cache" / "parse") if cache else None
    parsed: list[_Parsed] = []
    for rel, raw in raws:
        if raw is None:
            continue
        before = len(diags)
        docs = [d for d in _parse_file(rel, raw, diags, parse_cache) if d.body is not None]  # (a `---` with nothing after)
        if not docs and len(diags) == before:
            # A zero-byte or comment-only file is far more often one cut short (a bad merge, a full disk, an editor's
            # crash) than one meant to say nothing: read as nothing, its jobs stopped and apply deleted their instances.
            diags.append(Diagnostic(rel, 1, "", "", "<file>", "holds no document (empty, or only comments): its jobs would "
                                    "stop and what they run on be deleted. Delete the file to remove what it held, or "
                                    "restore its documents"))
        parsed += docs
    source = dict(raws)
    checked = [(doc, _validate_doc(doc, diags, source=source[doc.file])) for doc in parsed]
    state = _assemble(checked, diags)
    if diags or state is None:
        raise ConfigError(diags)
    if parse_cache is not None:
        parse_cache.flush()
    if kept is not None:
        snapshot.keep(root, kept, state)
    return state


def _snapshot_key(raws: list[tuple[str, bytes | None]]) -> str | None:
    """The key of reconciler/snapshot.py's kept DesiredState for these files (None: the catalog cannot be read)."""
    try:
        catalog = catalog_bytes()
    except OSError:
        return None  # load reports it (or plans with what it could read): nothing is kept or read
    return snapshot.key([(rel, raw) for rel, raw in raws if raw is not None], catalog, _CACHE_FORMAT)


# The parse cache's format: a change to it, to the parser above or to PyYAML reads no old entry.
_CACHE_FORMAT = "1:" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16] + f":{yaml.__version__}:{_EVENTS.__name__}"


class _ParseCache:
    """Parsed YAML documents (values and their line numbers, as plain JSON) of files that parsed
    without an error, one entry per file content (SHA-256 of the bytes, the parser's code and
    PyYAML's version), under .reconcile/cache/parse/. Parsing is most of a load: 5,000 jobs took
    5.3 s of 6.5 s under cProfile; validation still runs on every load. An entry is used only
    when it is whole JSON whose key and shape check out and that this machine sealed
    (reconciler/localkey.py: an entry that came with the checkout is not trusted, since a forged
    one would make load read YAML nobody reviewed); anything else is parsed again (and
    rewritten). Writing is best effort: a read-only directory just has no cache."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.used: set[str] = set()
        self.pending: list[tuple[str, list[_Parsed]]] = []
        self.wrote = False

    @staticmethod
    def key(raw: bytes) -> str:
        return hashlib.sha256(_CACHE_FORMAT.encode() + b"\0" + raw).hexdigest()

    def get(self, key: str, rel: str) -> list[_Parsed] | None:
        try:
            head, _, text = read_cache(self.dir / f"{key}.json").partition(b"\n")
            entry = loads_json(head)
            if set(entry) != {"key", "seal"} or entry["key"] != key or not sealed(key.encode() + b"\n" + text, entry["seal"]):
                return None  # torn, edited, or not written by this machine (reconciler/localkey.py)
            return [_Parsed(rel, line, body, pending=lines) for line, body, lines in json.loads(text)]
        except (OSError, ValueError, TypeError):  # absent, unreadable, torn or not this shape
            return None

    def put(self, key: str, docs: list[_Parsed]) -> None:
        """Remember docs for `flush`: nothing is written for a config that does not load, so a
        broken config leaves no .reconcile/ behind."""
        self.pending.append((key, docs))

    def flush(self) -> None:
        """After a load without errors: write the entries parsed anew, then drop the entries this
        load did not use (older versions of the files), so the cache holds about one config."""
        for key, docs in self.pending:
            self._write(key, docs)
        if self.wrote:
            self._prune()

    def _write(self, key: str, docs: list[_Parsed]) -> None:
        # The lines in the order convert recorded them, which is _paths' order (a file that parsed with a
        # diagnostic, a duplicate key say, is never kept). As [path, line] pairs, writing and checking them was
        # ~0.3 s of CPU of a 1.6 s first load of 10k jobs (250k nodes).
        plain = [[d.line, d.body, d.pending if d.pending is not None else list(d.lines.values())] for d in docs]
        try:
            text = json.dumps(plain, allow_nan=False)
        except (TypeError, ValueError):  # dates, binary, non-string keys, NaN: not plain JSON, not cached
            return
        # JSON must give back the same values (an int key turned into a string, say): checked unless every document
        # is _plain_docs' (string keys, JSON's own scalars), where the check was 0.14 s of CPU of a 10k-job first load.
        if not all(d.plain for d in docs) and not _round_trips(plain, text, docs):
            return
        tag = seal(key.encode() + b"\n" + text.encode())
        if tag is None:
            return  # no key to seal it with: not cached
        head = json.dumps({"key": key, "seal": tag})
        try:
            write_atomic(self.dir / f"{key}.json", (head + "\n" + text).encode())  # whole or not at all, also with a concurrent plan
            self.wrote = True
        except OSError:
            pass

    def _prune(self) -> None:
        try:
            for entry in os.scandir(self.dir):
                if entry.name.endswith(".json") and entry.name[:-5] not in self.used:
                    os.unlink(entry.path)
        except OSError:
            pass


def _round_trips(plain: list, text: str, docs: list[_Parsed]) -> bool:
    """Does `text` (plain as JSON) read back as the same values of the same types?"""
    back = json.loads(text)
    return back == plain and [[type(x) for x in _leaves(d[1])] for d in back] == [[type(x) for x in _leaves(d.body)] for d in docs]


def _leaves(value: Any):
    """Every key and value of a parsed document, depth first (their types must survive JSON)."""
    stack = [value]
    while stack:
        v = stack.pop()
        yield v
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _assemble(checked: list[tuple[_Parsed, Any | None]], diags: list[Diagnostic]) -> DesiredState | None:
    """The DesiredState of every document and its validated object (None: it failed validation, reported). One that
    failed still has its kind and name: a duplicate of it is reported with its own errors, not once they are fixed,
    and what names it is not told it is unknown."""
    by_kind: dict[str, dict[str, tuple[_Parsed, Any]]] = {k: {} for k in KINDS}
    invalid: dict[str, set[str]] = {k: set() for k in KINDS}
    first: dict[tuple[str, str], _Parsed] = {}
    for doc, obj in checked:
        ident = (obj.kind, obj.name) if obj is not None else _identity(doc.body)
        if ident is None:
            continue
        kind, name = ident
        if ident in first:
            at = first[ident]
            diags.append(Diagnostic(doc.file, doc.line_of(("metadata", "name")), kind, name, "metadata.name",
                                    f"duplicate {kind} name (first defined at {at.file}:{at.line_of(('metadata', 'name'))})"))
        else:
            first[ident] = doc
        if obj is None:
            invalid[kind].add(name)
        elif name not in by_kind[kind]:
            by_kind[kind][name] = (doc, obj)
    validated = [(doc, obj) for doc, obj in checked if obj is not None]

    def single(kind: str, required: bool):
        docs = list(by_kind[kind].values())
        for doc, obj in docs[1:]:
            diags.append(Diagnostic(doc.file, doc.line, kind, obj.name, "kind", f"only one {kind} per fleet is allowed (another is {docs[0][1].name} at {docs[0][0].file}:{docs[0][0].line})"))
        if required and not docs and not invalid[kind]:
            diags.append(Diagnostic("<config>", 0, kind, "-", "kind", f"a {kind} document is required"))
        return docs[0][1] if docs else None

    topology: Topology | None = single("Topology", required=True)
    spot: SpotPolicy | None = single("SpotPolicy", required=False)
    guard: GuardrailPolicy | None = single("GuardrailPolicy", required=False)
    placement = single("PlacementPolicy", required=False)
    tenants = {n: o for n, (_, o) in by_kind["Tenant"].items()}
    pools = {n: o for n, (_, o) in by_kind["Pool"].items()}
    jobs = {n: o for n, (_, o) in by_kind["Job"].items()}
    if topology is not None:
        fleet = _Fleet(by_kind, topology, guard, spot, diags, invalid=invalid)
        for check in _CHECKS:
            check(fleet)
    if topology is None:
        return None
    digest = hashlib.sha256(
        json.dumps([_digest_body(o) for _, o in sorted(validated, key=lambda x: (x[1].kind, x[1].name))], sort_keys=True).encode()
    ).hexdigest()
    return DesiredState(
        topology=topology, tenants=tenants, pools=pools, jobs=jobs,
        licenses={n: o for n, (_, o) in by_kind["License"].items()},
        reservations={n: o for n, (_, o) in by_kind["Reservation"].items()},
        spot_policy=spot.spec if spot else SpotPolicySpec(),
        guardrails=guard.spec if guard else GuardrailPolicySpec(),
        placement=placement.spec if placement else PlacementPolicySpec(),
        digest=digest,
    )


def _identity(body: Any) -> tuple[str, str] | None:
    """A document's kind and metadata.name as written, when it has both (also one that fails validation)."""
    if not isinstance(body, dict):
        return None
    kind, meta = body.get("kind"), body.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return (kind, name) if isinstance(kind, str) and kind in KINDS and isinstance(name, str) else None


def _digest_body(obj: Any) -> dict:
    """A document as the digest hashes it. A Job's `licenses` is left out while empty, and a GuardrailPolicy's
    `allow_negotiated_prices` while false, so a config that uses neither has the digest (and so the plan id) it had
    before the field existed."""
    body = obj.model_dump(mode="json", by_alias=True)
    if obj.kind == "Job" and not body["spec"].get("licenses"):
        body["spec"].pop("licenses", None)
    if obj.kind == "GuardrailPolicy" and not body["spec"].get("allow_negotiated_prices"):
        body["spec"].pop("allow_negotiated_prices", None)
    return body


@dataclass
class _PoolGPUs:
    """What a pool can offer a job, to catch jobs nothing can run."""

    nvlink: dict[str, int] = field(default_factory=dict)  # GPU model -> largest NVLink domain of its types (GPUs)
    mig: set[str] | None = None  # the MIG profiles of a MIG pool


@dataclass
class _Fleet:
    """What the cross-document checks read: the documents by kind, the single policies, the names the
    Topology defines; and where they report (`err`). Each check in _CHECKS takes one."""

    by_kind: dict[str, dict[str, tuple[_Parsed, Any]]]
    topology: Topology
    guard: GuardrailPolicy | None
    spot: SpotPolicy | None
    diags: list[Diagnostic]
    catalog: Any = field(default_factory=load_catalog)
    pool_gpus: dict[str, _PoolGPUs] = field(default_factory=dict)  # filled by _check_pools, read by _check_job_resources
    invalid: dict[str, set[str]] = field(default_factory=dict)  # kind -> names of documents that failed validation

    def __post_init__(self) -> None:
        spec = self.topology.spec
        self.nodes = topology_nodes(spec)
        self.regions = {(c, r) for c, ct in spec.clouds.items() for r in ct.regions}
        self.region_names = {r for _, r in self.regions} | {f"{c}/{r}" for c, r in self.regions}
        self.clouds = set(spec.clouds)

    def err(self, doc: _Parsed, obj: Any, loc: tuple, msg: str) -> None:
        self.diags.append(Diagnostic(doc.file, doc.line_of(loc), obj.kind, obj.name, ".".join(map(str, loc)), msg))

    def defined(self, kind: str, name: str) -> bool:
        """Is there a document of that kind and name (a valid one, or one whose own errors are reported)?"""
        return name in self.by_kind[kind] or name in self.invalid.get(kind, ())

    def tenant_known(self, name: str) -> bool:
        return self.defined("Tenant", name)

    def unknown(self, kind: str, name: str) -> str:
        """"unknown tenant 'reserch' (did you mean 'research'?)", against every document of that kind."""
        names = sorted({*self.by_kind[kind], *self.invalid.get(kind, ())})
        return f"unknown {kind.lower()} {name!r}{did_you_mean(name, names)}"


def _check_links(f: _Fleet) -> None:
    """Topology links join nodes the Topology defines."""
    doc = next(iter(f.by_kind["Topology"].values()))[0]
    for i, link in enumerate(f.topology.spec.links):
        for end, loc in ((link.source, "from"), (link.target, "to")):
            if end not in f.nodes:
                f.err(doc, f.topology, ("spec", "links", i, loc), f"unknown topology node {end!r}")


def _check_zones(f: _Fleet) -> None:
    """A zone belongs to one region: a zone name listed under two regions of one cloud is refused (gangs keep
    to a (cloud, zone), so such a zone would let a `gang: zone` job span both regions)."""
    doc = next(iter(f.by_kind["Topology"].values()))[0]
    for c, ct in f.topology.spec.clouds.items():
        first: dict[str, tuple[str, int]] = {}  # zone -> (region, index) where first listed
        for r, rt in ct.regions.items():
            for i, z in enumerate(rt.zones):
                if z not in first:
                    first[z] = (r, i)
                elif first[z][0] == r:
                    f.err(doc, f.topology, ("spec", "clouds", c, "regions", r, "zones", i), f"zone {z!r} is listed twice (also at index {first[z][1]})")
                elif first[z][0] != r:
                    r0, i0 = first[z]
                    at = doc.line_of(("spec", "clouds", c, "regions", r0, "zones", i0))
                    f.err(doc, f.topology, ("spec", "clouds", c, "regions", r, "zones", i),
                          f"zone {z!r} is already a zone of {c}/{r0} (line {at}): a zone belongs to one region")


def _check_pools(f: _Fleet) -> None:
    """A pool's region and zones are the Topology's and its allowed region, its types exist there, its MIG
    layout fits them, its cloud section is its cloud's. Records what each pool offers (f.pool_gpus)."""
    for name, (doc, pool) in f.by_kind["Pool"].items():
        s = pool.spec
        gpus = f.pool_gpus[name] = _PoolGPUs(mig=set(s.mig) if s.mig else None)
        if (s.cloud, s.region) not in f.regions:
            f.err(doc, pool, ("spec", "region"), f"region {s.cloud}/{s.region} is not in the Topology")
            continue
        known_zones = f.topology.spec.clouds[s.cloud].regions[s.region].zones
        for field_name, values in (("zones", s.zones), ("instance_types", s.instance_types)):
            # (a zone or type listed twice was offered twice: CP-SAT could not complete greedy's answer on a one-job
            # fleet, and the plan fell back to greedy's with "raise --time-limit")
            for i, v in enumerate(values):
                if v in values[:i]:
                    f.err(doc, pool, ("spec", field_name, i), f"{v!r} is listed twice (also at index {values.index(v)})")
        for i, z in enumerate(s.zones):
            if z not in known_zones:
                f.err(doc, pool, ("spec", "zones", i), f"zone {z!r} is not in {s.cloud}/{s.region} (known: {', '.join(known_zones)})")
        for i, t in enumerate(s.instance_types):
            _check_pool_type(f, doc, pool, i, t, gpus)
        if f.guard is not None and not region_matches(f.guard.spec.allowed_regions, s.cloud, s.region):
            f.err(doc, pool, ("spec", "region"), f"region {s.cloud}/{s.region} is not in GuardrailPolicy/{f.guard.name} allowed_regions")
        for section in ("aws", "gcp", "azure"):
            if getattr(s, section) is not None and section != s.cloud:
                f.err(doc, pool, ("spec", section), f"a {section} section on a {s.cloud} pool")


def _check_pool_type(f: _Fleet, doc: _Parsed, pool: Any, i: int, t: str, gpus: _PoolGPUs) -> None:
    """One of a pool's instance_types: known to the catalog (a plugin's cloud is not checked), offered in
    its region and zones, and partitionable into its MIG layout; its GPUs counted into `gpus`."""
    s = pool.spec
    shape = f.catalog.shape(s.cloud, t)
    if shape is None:
        if s.cloud in f.catalog.regions:
            f.err(doc, pool, ("spec", "instance_types", i), f"unknown {s.cloud} instance type {t!r}")
        return
    if shape.regions is not None and s.region not in shape.regions:
        # The catalog prices a type where its public source does: a region it lacks may still offer the type
        # (Azure westeurope has no public per-region file), so say what is known and how to price it.
        f.err(doc, pool, ("spec", "instance_types", i),
              f"{t} has no price in {s.region} in the price catalog (priced only in {', '.join(shape.regions)}); "
              f"`reconcile catalog update --cloud {s.cloud} --region {s.cloud}/{s.region}` writes catalog.json with "
              f"its public prices there, which plans of this directory then use")
        return
    price = shape.prices.get(s.region)
    if price is not None and s.zones and not any(price.offered_in(z) for z in s.zones):
        f.err(doc, pool, ("spec", "instance_types", i),
              f"{t} is not offered in {', '.join(s.zones)} (in {s.region} only in {', '.join(price.zones or ())})")
        return
    if shape.gpu_type:
        gpus.nvlink[shape.gpu_type] = max(gpus.nvlink.get(shape.gpu_type, 0), min(shape.nvlink_domain, shape.gpus))
    if s.mig:
        problem = mig_layout_error(f.catalog.gpu_models.get(shape.gpu_type or ""), list(s.mig)) if shape.gpus else "it has no GPUs"
        if problem:
            f.err(doc, pool, ("spec", "mig"), f"cannot partition {t}: {problem}")


def _check_guardrails(f: _Fleet) -> None:
    """The GuardrailPolicy names regions and clouds of the Topology and tenants that exist."""
    if f.guard is None:
        return
    guard = f.guard
    gdoc = f.by_kind["GuardrailPolicy"][guard.name][0]
    for i, r in enumerate(guard.spec.allowed_regions or []):
        if r not in f.region_names:
            f.err(gdoc, guard, ("spec", "allowed_regions", i), f"unknown region {r!r}")
    for i, c in enumerate(guard.spec.allowed_clouds or []):
        if c not in f.clouds:
            f.err(gdoc, guard, ("spec", "allowed_clouds", i), f"unknown cloud {c!r} (the Topology has {', '.join(sorted(f.clouds))})")
    for t in guard.spec.tenant_hourly_budgets:
        if not f.tenant_known(t):
            f.err(gdoc, guard, ("spec", "tenant_hourly_budgets", t), f.unknown("Tenant", t))


def _check_spot_policies(f: _Fleet) -> None:
    """A SpotPolicy's per-tenant fractions name tenants that exist."""
    for sdoc, spot in f.by_kind["SpotPolicy"].values():
        for t in spot.spec.tenant_max_spot_fraction:
            if not f.tenant_known(t):
                f.err(sdoc, spot, ("spec", "tenant_max_spot_fraction", t), f.unknown("Tenant", t))


def _check_jobs(f: _Fleet) -> None:
    """A job's tenant, pools, regions, clouds and data location exist."""
    for doc, job in f.by_kind["Job"].values():
        s = job.spec
        if not f.tenant_known(s.tenant):
            f.err(doc, job, ("spec", "tenant"), f.unknown("Tenant", s.tenant))
        for i, p in enumerate(s.pools or []):
            if not f.defined("Pool", p):
                f.err(doc, job, ("spec", "pools", i), f.unknown("Pool", p))
        for i, r in enumerate(s.regions or []):
            if r not in f.region_names:
                f.err(doc, job, ("spec", "regions", i), f"unknown region {r!r}")
        for i, c in enumerate(s.clouds or []):
            if c not in f.clouds:
                f.err(doc, job, ("spec", "clouds", i), f"unknown cloud {c!r} (the Topology has {', '.join(sorted(f.clouds))})")
        if s.data is not None and s.data.location not in f.nodes:
            f.err(doc, job, ("spec", "data", "location"), f"unknown topology node {s.data.location!r} (use cloud, cloud/region or cloud/region/zone)")


def _check_job_resources(f: _Fleet) -> None:
    """Some pool the job may use offers its gpu_type: as whole GPUs (enough in one NVLink domain if it asks
    for NVLink) or partitioned into its MIG profile. Reads f.pool_gpus (_check_pools runs first). The answer
    depends only on the job's pools and resources, so it is worked out once per distinct pair: 5,000 jobs
    have a few dozen (0.19 s -> 0.01 s of a 5,000-job load, which looked at every pool for every job)."""
    offered = sorted({t for g in f.pool_gpus.values() for t in g.nvlink})
    pools = f.by_kind["Pool"]
    # A cloud the shipped catalog does not know (a plugin's) can only be checked at plan time; a pool that failed
    # validation (its errors reported) offers what it offers once it is fixed.
    unchecked = {p for p, (_, pool) in pools.items() if pool.spec.cloud not in f.catalog.regions} | f.invalid.get("Pool", set())
    verdicts: dict[tuple, tuple[tuple, str] | None] = {}
    for doc, job in f.by_kind["Job"].values():
        s = job.spec
        r = s.resources
        if not r.gpu_type:
            continue
        key = (tuple(s.pools) if s.pools is not None else None, r.gpu_type, r.mig.profile if r.mig else None, r.nvlink, r.gpus)
        if key not in verdicts:
            verdicts[key] = _resource_verdict(f, s.pools, r, offered, unchecked)
        if verdicts[key] is not None:
            where, message = verdicts[key]
            f.err(doc, job, where, message)


def _resource_verdict(f: _Fleet, job_pools: list[str] | None, r, offered: list[str], unchecked: set[str]) -> tuple[tuple, str] | None:
    """The field and message of what no pool the job may use (`job_pools`, None: any) offers of its resources `r`
    (None: one does, or it cannot be told: a pool it names is unknown, reported on its own, or unchecked)."""
    gt = r.gpu_type
    candidates = (list(f.pool_gpus) + sorted(f.invalid.get("Pool", ()))) if job_pools is None else job_pools
    if any(p in unchecked for p in candidates):
        return None
    unknown = any(p not in f.pool_gpus for p in candidates)
    gpus = {p: f.pool_gpus[p] for p in candidates if p in f.pool_gpus}
    whole = [p for p, g in gpus.items() if gt in g.nvlink and g.mig is None]
    if r.mig is not None:
        model = f.catalog.gpu_models.get(gt)
        if model is None or r.mig.profile not in model.mig_profiles:
            have = ", ".join(model.mig_profiles) if model and model.mig_profiles else "none"
            return ("spec", "resources", "mig", "profile"), f"{gt} has no MIG profile {r.mig.profile!r} (it has: {have})"
        if not unknown and not any(gt in g.nvlink and r.mig.profile in (g.mig or ()) for g in gpus.values()):
            return ("spec", "resources", "mig"), f"no pool partitions {gt} into {r.mig.profile} (set Pool spec.mig)"
    elif gt not in offered:
        return ("spec", "resources", "gpu_type"), f"no pool offers gpu_type {gt!r} (pools offer: {', '.join(offered) or 'none'})"
    elif unknown:
        return None
    elif not whole:
        return ("spec", "resources", "gpu_type"), _no_whole_gpus(f, gt, job_pools, gpus)
    elif r.nvlink and not any(gpus[p].nvlink.get(gt, 0) >= r.gpus for p in whole):
        best = max(gpus[p].nvlink.get(gt, 0) for p in whole)
        return ("spec", "resources", "nvlink"), f"no pool has {r.gpus} {gt} GPUs in one NVLink domain (largest: {best})"
    return None


def _no_whole_gpus(f: _Fleet, gt: str, job_pools: list[str] | None, gpus: dict[str, _PoolGPUs]) -> str:
    """Why no pool the job may use gives it whole `gt` GPUs, which some pool of the fleet offers: the pools it may
    use partition them with MIG, or (pools it names) offer other GPUs; and which other pools offer them whole."""
    def named(pools: list[str]) -> str:
        return f"pool{'s' if len(pools) > 1 else ''} {', '.join(pools)}"

    partitioned = [p for p, g in gpus.items() if gt in g.nvlink]  # (none of them offers it whole)
    why = f"{named(partitioned)} partition{'' if len(partitioned) > 1 else 's'} it with MIG (ask for resources.mig instead)"
    if job_pools is None:
        return f"no pool offers gpu_type {gt!r} as whole GPUs: {why}"
    if not partitioned:
        own = sorted({t for g in gpus.values() for t in g.nvlink})
        why = f"its pools ({', '.join(job_pools)}) offer {', '.join(own) or 'no GPUs'}"
    others = sorted(p for p, g in f.pool_gpus.items() if p not in gpus and gt in g.nvlink and g.mig is None)
    elsewhere = f"; {gt} is offered by {named(others)}" if others else ""
    return f"none of its pools offers gpu_type {gt!r}{' as whole GPUs' if partitioned else ''}: {why}{elsewhere}"


def _check_licenses(f: _Fleet) -> None:
    """A License's tenant quotas name tenants that exist."""
    for _, (doc, lic) in sorted(f.by_kind["License"].items()):
        for t in lic.spec.tenant_quotas:
            if not f.tenant_known(t):
                f.err(doc, lic, ("spec", "tenant_quotas", t), f.unknown("Tenant", t))


def _check_job_rules(f: _Fleet) -> None:
    """The licenses a job holds exist; its deadline is after its submission."""
    licenses = f.by_kind["License"]
    for _, (doc, job) in sorted(f.by_kind["Job"].items()):
        for name in job.spec.licenses:
            if not f.defined("License", name):
                known = ", ".join(sorted(licenses)) or "none"
                f.err(doc, job, ("spec", "licenses", name), f"unknown License {name!r}{did_you_mean(name, sorted(licenses))} (defined: {known})")
        if job.spec.deadline is not None and job.spec.submitted is not None and _utc(job.spec.deadline) <= _utc(job.spec.submitted):
            f.err(doc, job, ("spec", "deadline"), f"deadline {job.spec.deadline.isoformat()} is not after submitted {job.spec.submitted.isoformat()}")


_GCE_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"  # GCE resource names (RFC 1035 labels)
_GCE_RESERVATION = re.compile(rf"^(?:projects/[a-z][-a-z0-9.:]{{4,61}}[a-z0-9]/reservations/)?{_GCE_NAME}$")
_AZURE_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,78}[A-Za-z0-9_])?"  # Azure compute resource names: 1-80
_AZURE_GROUP = re.compile(rf"^(?:/?subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/capacityReservationGroups/)?{_AZURE_NAME}$",
                          re.IGNORECASE)


def reservation_target_problem(cloud: str, rid: str) -> str | None:
    """Why the cloud would refuse a Reservation's target as a launch names it, or None: an AWS capacity reservation
    `cr-...`; the value of GCE's reservationAffinity (a reservation name, or projects/P/reservations/NAME for one
    shared from another project); an Azure capacity reservation group's name or ARM id. Unchecked, a target the cloud
    refuses was priced at $0 reserved in the plan and failed only at apply."""
    if cloud == "aws" and not rid.startswith("cr-"):
        return f"an AWS capacity reservation id starts with 'cr-' (got {rid!r})"
    if cloud == "gcp" and not _GCE_RESERVATION.match(rid):
        return (f"a GCE reservation is named by its name (lowercase letters, digits, '-', at most 63, a letter first) or "
                f"projects/PROJECT/reservations/NAME (got {rid!r})")
    if cloud == "azure" and not _AZURE_GROUP.match(rid):
        return (f"an Azure target is a capacity reservation group's name (1-80 letters, digits, '.', '_', '-') or its id "
                f"/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/capacityReservationGroups/NAME (got {rid!r})")
    return None


def _check_reservations(f: _Fleet) -> None:
    """Where a reservation's capacity is: a known type, an AWS id's form, and one pool that can hold it."""
    pools = [p for _, (_, p) in sorted(f.by_kind["Pool"].items())]
    for _, (doc, res) in sorted(f.by_kind["Reservation"].items()):
        s = res.spec
        if s.cloud in f.catalog.regions and f.catalog.shape(s.cloud, s.instance_type) is None:
            f.err(doc, res, ("spec", "instance_type"), f"unknown {s.cloud} instance type {s.instance_type!r}")
        if s.target is not None and (wrong := reservation_target_problem(s.cloud, s.target.reservation_id)):
            f.err(doc, res, ("spec", "target", "reservation_id"), wrong)
        matches = reservation_pools(s, pools)
        if s.pool is not None:
            if not f.defined("Pool", s.pool):
                f.err(doc, res, ("spec", "pool"), f.unknown("Pool", s.pool))
            elif s.pool not in [p.name for p in matches] and s.pool in f.by_kind["Pool"]:
                f.err(doc, res, ("spec", "pool"), f"pool {s.pool} cannot hold it: it needs cloud {s.cloud}, region {s.region}, zone {s.zone} "
                                                  f"among its zones, {s.instance_type} among its instance_types and on-demand among its markets")
        elif len(matches) > 1 or (not matches and not f.invalid.get("Pool")):
            what = f"pools {', '.join(p.name for p in matches)} all match" if matches else "no pool matches"
            f.err(doc, res, ("spec", "zone" if not matches else "pool"),
                  f"{what} ({s.cloud}/{s.zone} {s.instance_type}, on-demand): set spec.pool to the pool its instances belong to"
                  + ("" if matches else " or add a pool with that zone and type"))


def reservation_pools(spec, pools: list) -> list:
    """The pools a reservation's instances could belong to: its cloud, region and zone, its type, on-demand."""
    return [p for p in pools if p.spec.cloud == spec.cloud and p.spec.region == spec.region and spec.zone in p.spec.zones
            and spec.instance_type in p.spec.instance_types and "on-demand" in p.spec.markets()]


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _check_plannable(f: _Fleet) -> None:
    """What planning would refuse the whole fleet for, reported here first: a pool whose
    min_instances it can never buy (its cloud excluded by allowed_clouds; spot-only with no
    spot offer under max_price_fraction; no type offered in its zones), and pool minimums
    that cost more than max_hourly_budget at catalog prices."""
    by_kind, guard, spot, diags, catalog = f.by_kind, f.guard, f.spot, f.diags, f.catalog
    g = guard.spec if guard is not None else GuardrailPolicySpec()
    frac = spot.spec.max_price_fraction if spot is not None else SpotPolicySpec().max_price_fraction
    floor, spend = 0.0, 0  # USD/h of every pool's minimum, at its cheapest offer (and as the budget counts it: micro)
    on_demand_spend: float = 0  # micro-USD/h of every pool's minimum on-demand (inf: a spot-only pool's)
    for _, (doc, pool) in sorted(by_kind["Pool"].items()):
        s = pool.spec
        if s.cloud not in catalog.regions or s.min_instances == 0:
            continue  # a plugin's cloud is priced at plan time
        where = (doc.file, doc.line_of(("spec", "min_instances")), pool.kind, pool.name, "spec.min_instances")
        if g.allowed_clouds is not None and s.cloud not in g.allowed_clouds:
            gname = f"GuardrailPolicy/{guard.name}" if guard is not None else "the GuardrailPolicy"
            diags.append(Diagnostic(*where, f"min_instances is {s.min_instances} but cloud {s.cloud} is not in {gname} allowed_clouds "
                                            "(the pool can buy nothing, so every plan would be refused)"))
            continue
        prices = []
        for z in s.zones:
            for t in s.instance_types:
                o = catalog.offering(s.cloud, s.region, z, t)
                if o is None:
                    continue
                for m in s.markets():
                    if m == "on-demand":
                        prices.append(o.on_demand_price)
                    elif o.spot_price is not None and o.spot_price <= frac * o.on_demand_price + 1e-9:
                        prices.append(o.spot_price)
        if not prices:
            diags.append(Diagnostic(*where, f"min_instances is {s.min_instances} but no {'/'.join(s.markets())} offer of its types exists in its zones"
                                            + (f" under the SpotPolicy's max_price_fraction {frac:g}" if "spot" in s.markets() else "")))
            continue
        floor += s.min_instances * min(prices)
        spend += s.min_instances * micro(min(prices))
        od = [o.on_demand_price for z in s.zones for t in s.instance_types if (o := catalog.offering(s.cloud, s.region, z, t)) is not None]
        on_demand_spend += s.min_instances * micro(min(od)) if od and "on-demand" in s.markets() else math.inf
    if not budget_ok(spend, g.max_hourly_budget) and guard is not None:
        gdoc = by_kind["GuardrailPolicy"][guard.name][0]
        diags.append(Diagnostic(gdoc.file, gdoc.line_of(("spec", "max_hourly_budget")), guard.kind, guard.name, "spec.max_hourly_budget",
                                f"the pools' min_instances cost at least ${floor:,.2f}/h at catalog prices, over max_hourly_budget "
                                f"${g.max_hourly_budget:,.2f}/h (every plan would be refused)"))
    # (minimums the budget holds on-demand keep every spot rule: the bound below, a small integer program, is asked only
    # where spot must help; validate imports no solver otherwise)
    elif guard is not None and g.max_hourly_budget is not None and not budget_ok(on_demand_spend, g.max_hourly_budget) \
            and not f.invalid.get("Pool") and spot is not None \
            and (spot.spec.max_spot_fraction < 1 or spot.spec.on_demand_buffer_percent > 0 or _spread(spot.spec) > 1):
        least = _minimums_least_cost(by_kind, g, spot.spec, catalog)
        if least is not None and math.isfinite(least) and not budget_ok(micro(least), g.max_hourly_budget):
            gdoc = by_kind["GuardrailPolicy"][guard.name][0]
            rules = [f"max_spot_fraction {spot.spec.max_spot_fraction:g}"] * (spot.spec.max_spot_fraction < 1) + \
                [f"on_demand_buffer_percent {spot.spec.on_demand_buffer_percent:g}"] * (spot.spec.on_demand_buffer_percent > 0) + \
                [f"min_zones {spot.spec.min_zones} and min_instance_types {spot.spec.min_instance_types}"] * (_spread(spot.spec) > 1)
            diags.append(Diagnostic(gdoc.file, gdoc.line_of(("spec", "max_hourly_budget")), guard.kind, guard.name, "spec.max_hourly_budget",
                                    f"the pools' min_instances cost ${floor:,.2f}/h at their cheapest offers, spot among them; under "
                                    f"SpotPolicy/{spot.name} {', '.join(rules)} they cost at least ${least:,.2f}/h at catalog prices, "
                                    f"over max_hourly_budget ${g.max_hourly_budget:,.2f}/h (every plan would break one of these rules)"))
    if spot is not None and (spot.spec.max_spot_fraction < 1 or spot.spec.on_demand_buffer_percent > 0) \
            and not f.invalid.get("Pool"):  # (an invalid pool's room is unknown)
        _check_spot_minimums(by_kind, g, spot, catalog, diags)
    if spot is not None and _spread(spot.spec) > 1 and not f.invalid.get("Pool"):
        _check_spot_diversity_minimums(by_kind, g, spot, catalog, diags)


def _check_spot_diversity_minimums(by_kind: dict, g: GuardrailPolicySpec, spot: SpotPolicy, catalog, diags: list[Diagnostic]) -> None:
    """Spot-only pool minimums (so spot runs) where spot can never span min_zones zones or min_instance_types types: the
    spot offers (under max_price_fraction, in allowed clouds and regions) have fewer, or the pools that buy spot hold
    fewer instances at max_instances (the h7 hunt: a spot-only pool at max 1 under min_zones 2; the plan left it empty,
    tests/test_load.py)."""
    pools = [p for _, (_, p) in sorted(by_kind["Pool"].items())]
    if any(p.spec.cloud not in catalog.regions for p in pools):
        return  # (a plugin's cloud is priced at plan time)
    pools = [p for p in pools if (g.allowed_clouds is None or p.spec.cloud in g.allowed_clouds)
             and region_matches(g.allowed_regions, p.spec.cloud, p.spec.region)]
    forced = [p.name for p in pools if p.spec.min_instances > 0 and p.spec.markets() == ("spot",)]
    if not forced:
        return
    sp = spot.spec
    zones, types, most = set(), set(), 0
    for p in pools:
        s = p.spec
        offers = [(z, t) for z in s.zones for t in s.instance_types if "spot" in s.markets()
                  and (o := catalog.offering(s.cloud, s.region, z, t)) is not None and o.spot_price is not None
                  and o.spot_price <= sp.max_price_fraction * o.on_demand_price + 1e-9]
        zones |= {(s.cloud, z) for z, _ in offers}
        types |= {(s.cloud, t) for _, t in offers}
        most += s.max_instances if offers else 0
    field, need, have, what = max((("min_zones", sp.min_zones, min(len(zones), most), "zones"),
                                   ("min_instance_types", sp.min_instance_types, min(len(types), most), "instance types")),
                                  key=lambda c: c[1] - c[2])
    sdoc = by_kind["SpotPolicy"][spot.name][0]
    if have < need:
        diags.append(Diagnostic(sdoc.file, sdoc.line_of(("spec", field)), spot.kind, spot.name, f"spec.{field}",
                                f"spot-only pools {', '.join(forced)} have min_instances, so spot runs, but it can span at most "
                                f"{have} {what} (the spot offers under max_price_fraction {sp.max_price_fraction:g} in "
                                f"{len(zones)} zones and {len(types)} instance types, {most} instances at the pools' "
                                f"max_instances), under {field} {need} (every plan would break one of them)"))
    elif (sp.max_spot_fraction < 1 or sp.on_demand_buffer_percent > 0) and _least_cost(by_kind, g, sp, catalog, _spread(sp)) == math.inf:
        # (as many spot instances as diversity asks, beside the minimums, past the share or the buffer every on-demand
        # pool at max_instances holds: a spot-only MIG pool at min 1 and two p4d minimums, min_zones 2, share 0.5)
        diags.append(Diagnostic(sdoc.file, sdoc.line_of(("spec", field)), spot.kind, spot.name, f"spec.{field}",
                                f"spot-only pools {', '.join(forced)} have min_instances, so spot runs, and {field} {need} asks "
                                f"for at least {_spread(sp)} spot instances; no fleet within the pools' min_instances and "
                                f"max_instances holds them under max_spot_fraction {sp.max_spot_fraction:g} and "
                                f"on_demand_buffer_percent {sp.on_demand_buffer_percent:g} (every plan would break one of them)"))


def _minimums_least_cost(by_kind: dict, g: GuardrailPolicySpec, sp: SpotPolicySpec, catalog) -> float | None:
    """A lower bound on what a fleet costs per hour that meets every pool's min_instances within max_instances, under
    the spot share and the on-demand buffer (every instance of such a fleet idle at most), at catalog prices and with
    reserved capacity at $0 (fleet127: a minimum the budget holds only on spot, where spot alone breaks the share). Spot
    diversity splits it in two: no spot, or at least max(min_zones, min_instance_types) spot instances (fleet128).
    None: no bound (a pool of a plugin's cloud, priced at plan time; a search that did not finish)."""
    spread = _spread(sp)
    bounds = [_least_cost(by_kind, g, sp, catalog, spot_at_least) for spot_at_least in ((None, spread) if spread > 1 else (0,))]
    return None if any(b is None for b in bounds) else min(bounds)


def _spread(sp: SpotPolicySpec) -> int:
    """The fewest spot instances spot diversity takes once any spot runs."""
    return max(sp.min_zones, sp.min_instance_types)


def _least_cost(by_kind: dict, g: GuardrailPolicySpec, sp: SpotPolicySpec, catalog, spot_at_least: int | None) -> float | None:
    """_minimums_least_cost with at least `spot_at_least` spot instances (None: no spot), solved in whole instances
    (counted fractionally, one A100 pool's minimum of 1 read as half spot, half on-demand, under the budget: a random
    fleet of the h7 hunt); math.inf where no such fleet exists, None where the search did not finish."""
    from reconciler.cpsat import cp_model
    from reconciler.solve.fleet_rules import buffer_row_of, spot_share_row

    pools = [p for _, (_, p) in sorted(by_kind["Pool"].items())]
    if any(p.spec.cloud not in catalog.regions for p in pools):
        return None
    pools = [p for p in pools if (g.allowed_clouds is None or p.spec.cloud in g.allowed_clouds)
             and region_matches(g.allowed_regions, p.spec.cloud, p.spec.region)]
    shapes = [sh for p in pools for t in p.spec.instance_types if (sh := catalog.shape(p.spec.cloud, t)) is not None]
    _, prim = spot_units(shapes)
    m = cp_model.CpModel()
    cost, spot, every, per_pool, reserved = [], [], [], {}, {}
    for p in pools:
        s = p.spec
        for z in s.zones:
            for t in s.instance_types:
                o, sh = catalog.offering(s.cloud, s.region, z, t), catalog.shape(s.cloud, t)
                if o is None or sh is None:
                    continue
                for market in s.markets():
                    if market == "spot" and (o.spot_price is None or o.spot_price > sp.max_price_fraction * o.on_demand_price + 1e-9):
                        continue
                    x = m.new_int_var(0, s.max_instances, "")
                    per_pool.setdefault(p.name, []).append(x)
                    cost.append((micro(o.spot_price if market == "spot" else o.on_demand_price), x))
                    (spot if market == "spot" else every).append((round(prim(sh)), x))
    for _, (_, r) in sorted(by_kind["Reservation"].items()):
        s = r.spec
        sh = catalog.shape(s.cloud, s.instance_type)
        for p in reservation_pools(s, pools) if sh is not None else ():
            x = m.new_int_var(0, s.count, "")
            per_pool.setdefault(p.name, []).append(x)
            reserved.setdefault(r.name, []).append(x)
            every.append((round(prim(sh)), x))
    for p in pools:
        xs = per_pool.get(p.name, [])
        m.add(sum(xs) >= p.spec.min_instances)
        m.add(sum(xs) <= p.spec.max_instances)
    for name, xs in reserved.items():
        m.add(sum(xs) <= by_kind["Reservation"][name][1].spec.count)
    m.add(spot_share_row(spot, spot + every, sp.max_spot_fraction))  # (the solver's rows: one definition)
    if sp.on_demand_buffer_percent > 0:
        m.add(buffer_row_of(every, spot, sp.on_demand_buffer_percent))
    spot_count = sum(x for _, x in spot)
    if spot_at_least is None:
        m.add(spot_count <= 0)
    else:
        m.add(spot_count >= spot_at_least)
    m.minimize(sum(c * x for c, x in cost))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = 1.0
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        return math.inf
    return solver.objective_value / 1_000_000 if status == cp_model.OPTIMAL else None


def _check_spot_minimums(by_kind: dict, g: GuardrailPolicySpec, spot: SpotPolicy, catalog, diags: list[Diagnostic]) -> None:
    """Spot-only pool minimums that even every on-demand pool at max_instances cannot balance
    under max_spot_fraction, or hold the on-demand buffer beside (counted as the solver counts: GPUs in a GPU fleet,
    else vCPU)."""
    pools = [p for _, (_, p) in sorted(by_kind["Pool"].items()) if p.spec.cloud in catalog.regions
             and (g.allowed_clouds is None or p.spec.cloud in g.allowed_clouds) and region_matches(g.allowed_regions, p.spec.cloud, p.spec.region)]
    shapes = {p.name: [sh for t in p.spec.instance_types if (sh := catalog.shape(p.spec.cloud, t)) is not None] for p in pools}
    dim, prim = spot_units([sh for v in shapes.values() for sh in v])
    unit = "GPUs" if dim == "gpus" else "vCPU"
    on_spot = sum(p.spec.min_instances * min((prim(sh) for sh in shapes[p.name]), default=0) for p in pools if p.spec.markets() == ("spot",))
    on_demand = sum(p.spec.max_instances * max((prim(sh) for sh in shapes[p.name]), default=0) for p in pools if "on-demand" in p.spec.markets())
    f, pct = spot.spec.max_spot_fraction, spot.spec.on_demand_buffer_percent
    sdoc = by_kind["SpotPolicy"][spot.name][0]
    if on_spot > 0 and not spot_share_ok(on_spot, on_spot + on_demand, f):
        diags.append(Diagnostic(sdoc.file, sdoc.line_of(("spec", "max_spot_fraction")), spot.kind, spot.name, "spec.max_spot_fraction",
                                f"spot-only pools' min_instances put at least {on_spot:g} {unit} on spot; with every on-demand pool at "
                                f"max_instances ({on_demand:g} {unit}) spot is {on_spot / (on_spot + on_demand):.0%} of the fleet, over "
                                f"max_spot_fraction {f:g} (every plan would be refused)"))
    # (the buffer likewise: a spot-only A10G pool at min_instances 1 beside no on-demand GPU pool under a 25% buffer;
    # the plan left the pool empty, the h7 hunt)
    if on_spot > 0 and not buffer_ok(on_demand, on_spot, pct):
        diags.append(Diagnostic(sdoc.file, sdoc.line_of(("spec", "on_demand_buffer_percent")), spot.kind, spot.name,
                                "spec.on_demand_buffer_percent",
                                f"spot-only pools' min_instances put at least {on_spot:g} {unit} on spot, so {pct:g}% of it must stand "
                                f"idle on-demand, but every on-demand pool at max_instances holds {on_demand:g} {unit} (every plan "
                                "would break one of them)"))



# The checks across documents, one per kind of document (Job: its references, its resources against what the
# pools offer, its rules), in the order they were written in: ConfigError sorts diagnostics by file, line and
# field, and no two checks report the same field of one document. _check_pools fills what _check_job_resources reads.
_CHECKS: tuple[Callable[[_Fleet], None], ...] = (
    _check_links, _check_zones, _check_pools, _check_guardrails, _check_spot_policies, _check_jobs, _check_job_resources,
    _check_plannable, _check_licenses, _check_job_rules, _check_reservations,
)


__all__ = ["load"]
