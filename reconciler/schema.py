"""One JSON Schema (draft 2020-12) for any single config document, made from the pydantic models.

Editors (yaml-language-server) and checkers (check-jsonschema) validate one document at a time, so the schema
is one object discriminated on `kind` (an if/then per kind, each a `$ref` to that kind's model), with
`additionalProperties: false` wherever the models forbid extra fields: a `replicsa` typo is an error there as it
is in `reconcile validate`. Rules that span documents (references, quotas against pools) stay with validate."""

from __future__ import annotations

import functools
import os
import re
from typing import Annotated, Any, Union, get_args

from pydantic import Field, TypeAdapter

from reconciler.model import KINDS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "https://fleetops.io/schemas/v1alpha1/document.json"
API_VERSIONS = get_args(next(iter(KINDS.values())).model_fields["apiVersion"].annotation)  # ("fleetops.io/v1alpha1",)


@functools.cache
def document_schema() -> dict[str, Any]:
    """The schema `reconcile schema` prints."""
    kinds = list(KINDS.values())
    union = Annotated[Union[tuple(kinds)], Field(discriminator="kind")]  # type: ignore[valid-type]
    generated = TypeAdapter(union).json_schema(by_alias=True, mode="validation")
    defs = generated["$defs"]
    _close_patterned(defs)
    return {
        "$schema": DRAFT,
        "$id": SCHEMA_ID,
        "title": "fleetops config document",
        "description": "One YAML document of a fleetops config repo (apiVersion fleetops.io/v1alpha1).",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"enum": list(API_VERSIONS)},
            "kind": {"enum": sorted(KINDS)},
        },
        "allOf": [
            {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]}, "then": {"$ref": f"#/$defs/{cls.__name__}"}}
            for kind, cls in sorted(KINDS.items())
        ],
        "$defs": defs,
    }


def _close_patterned(node: Any) -> None:
    """A dict keyed by names (`clouds`, `regions`) comes out as patternProperties alone, which lets any other
    key through; the models refuse a key that is not a name, so the schema does too."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for v in node.values():
            _close_patterned(v)
    elif isinstance(node, list):
        for v in node:
            _close_patterned(v)


def _resolve(node: dict, defs: dict) -> list[dict]:
    """The object schemas a node may be: $ref followed, anyOf/oneOf branches flattened."""
    if "$ref" in node:
        return _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    out = []
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        out += _resolve(branch, defs)
    return out or [node]


def known_fields(kind: str, loc: tuple) -> list[str]:
    """The field names a document of `kind` allows at `loc` (("spec",) -> JobSpec's fields), or [] if unknown."""
    if kind not in KINDS:
        return []
    schema = document_schema()
    defs = schema["$defs"]
    nodes = _resolve({"$ref": f"#/$defs/{KINDS[kind].__name__}"}, defs)
    for key in loc:
        nxt: list[dict] = []
        for n in nodes:
            if isinstance(key, int) and isinstance(n.get("items"), dict):
                nxt += _resolve(n["items"], defs)
            elif not isinstance(key, int) and key in n.get("properties", {}):
                nxt += _resolve(n["properties"][key], defs)
            elif not isinstance(key, int) and any(re.search(p, key) for p in n.get("patternProperties", {})):
                nxt += [r for p, sub in n["patternProperties"].items() if re.search(p, key) for r in _resolve(sub, defs)]
            elif isinstance(n.get("additionalProperties"), dict):
                nxt += _resolve(n["additionalProperties"], defs)
        nodes = nxt
    return sorted({f for n in nodes for f in n.get("properties", {})})


def _edits(a: str, b: str) -> int:
    """Edit distance counting a swap of two neighbours as one edit (optimal string alignment)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """" (did you mean 'replicas'?)" when a choice is a typo away from `word` (at most a third of its letters
    changed, as git and cargo suggest), else "": `replicsa` and `Jbo` get one, `colour` is not `clouds`.
    Of choices as near, the one sharing the longest prefix with `word` is meant (a typo is likelier at the
    end: `gpu` is `gpus`, not `cpu`; `cpus` is `cpu`, not `gpus`), then the alphabetical first."""
    word = str(word)
    low = word.lower()
    best = min(((_edits(low, c.lower()), -len(os.path.commonprefix([low, c.lower()])), c) for c in choices), default=None)
    return f" (did you mean {best[2]!r}?)" if best and best[0] <= max(1, len(word) // 3) and best[0] < len(word) else ""


__all__ = ["DRAFT", "SCHEMA_ID", "did_you_mean", "document_schema", "known_fields"]
