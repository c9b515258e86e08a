"""The validated config kept by a cached load (reconciler/snapshot.py, issue 20.3): read back only for the same
files, bytes, catalog and program, and only when this machine sealed it; every change to an input loads anew."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest
import yaml

from reconciler import load as load_module
from reconciler import memo, snapshot
from reconciler.errors import ConfigError
from reconciler.load import load
from reconciler.localkey import seal
from tests.fleetkit import QUICKSTART, job, pinned_catalog, pool, tenant, topology, write_config


def _docs():
    return [topology(), tenant("t", gpus=4), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]),
            job("j", gpus=1, gpu_type="A10G", priority="low")]


def _no_validation(monkeypatch):
    """Make a load that parses and validates fail loudly: what still loads was read back from the snapshot."""

    def refuse(doc, diags, **_):
        raise AssertionError("validated: the snapshot was not read")

    monkeypatch.setattr(load_module, "_validate_doc", refuse)


def test_a_second_cached_load_is_read_back_and_equals_a_fresh_load(tmp_path, monkeypatch):
    cfg = shutil.copytree(QUICKSTART, tmp_path / "q", ignore=shutil.ignore_patterns(".reconcile", "status"))
    first = load(cfg, cache=True)
    assert (cfg / snapshot.SNAPSHOT_FILE).is_file()
    fresh = load(cfg)  # a plain load reads and writes no cache
    with monkeypatch.context() as m:
        _no_validation(m)
        again = load(cfg, cache=True)
    assert again == first == fresh and again.digest == fresh.digest
    assert _same(again, fresh)


def _same(a, b) -> bool:
    """Equal field for field and of the same types, with the same fields set (what model_dump(exclude_unset) reads),
    dicts in the same order."""
    from pydantic import BaseModel

    if type(a) is not type(b):
        return False
    if isinstance(a, BaseModel):
        return a.model_fields_set == b.model_fields_set and all(_same(getattr(a, f), getattr(b, f)) for f in type(a).model_fields)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("change", ["edit", "add", "remove", "rename"])
def test_any_change_to_the_files_loads_anew(tmp_path, monkeypatch, change):
    cfg = write_config(tmp_path / "c", _docs())
    load(cfg, cache=True)
    (cfg / "more.yaml").write_text(yaml.safe_dump(job("k", gpus=1, gpu_type="A10G")))
    load(cfg, cache=True)
    if change == "edit":
        f = cfg / "fleet.yaml"
        f.write_text(f.read_text().replace("priority: low", "priority: high", 1))
    elif change == "add":
        (cfg / "extra.yaml").write_text(yaml.safe_dump(job("x", gpus=1, gpu_type="A10G")))
    elif change == "remove":
        os.unlink(cfg / "more.yaml")
    else:  # the same documents under another name: the same state, but a load of other files
        os.rename(cfg / "more.yaml", cfg / "other.yaml")
    want = load(cfg)
    with monkeypatch.context() as m:
        _no_validation(m)
        with pytest.raises(AssertionError, match="snapshot was not read"):
            load(cfg, cache=True)
    got = load(cfg, cache=True)
    assert got == want and got.digest == want.digest
    if change == "edit":
        assert got.jobs["j"].spec.priority == "high"


def test_the_catalog_and_the_program_are_in_the_key(tmp_path, monkeypatch):
    """The checks read the catalog (a pool's instance type must be priced there): a catalog without g5.xlarge
    makes the same files an error, which a snapshot of the last load must not hide; and another program (a model
    or a check changed) loads anew."""
    cfg = write_config(tmp_path / "c", _docs())
    load(cfg, cache=True)

    def drop_g5(raw):
        del raw["clouds"]["aws"]["instance_types"]["g5.xlarge"]

    with pinned_catalog(tmp_path / "catalog.json", drop_g5):
        with pytest.raises(ConfigError, match="g5.xlarge"):
            load(cfg, cache=True)
    load(cfg, cache=True)
    monkeypatch.setattr(memo, "_program", "another program")
    with monkeypatch.context() as m:
        _no_validation(m)
        with pytest.raises(AssertionError, match="snapshot was not read"):
            load(cfg, cache=True)


def test_a_config_with_an_error_keeps_no_snapshot_and_is_not_hidden_by_one(tmp_path):
    cfg = write_config(tmp_path / "c", _docs())
    load(cfg, cache=True)
    (cfg / "bad.yaml").write_text(yaml.safe_dump(job("j", gpus=1, gpu_type="A10G")))  # a duplicate name
    kept = (cfg / snapshot.SNAPSHOT_FILE).read_bytes()
    for _ in range(2):
        with pytest.raises(ConfigError, match="duplicate Job name"):
            load(cfg, cache=True)
    assert (cfg / snapshot.SNAPSHOT_FILE).read_bytes() == kept
    broken = write_config(tmp_path / "b", _docs()[:-1] + [job("j", tenant="nobody")])
    with pytest.raises(ConfigError):
        load(broken, cache=True)
    assert not (broken / snapshot.SNAPSHOT_FILE).exists()


class _Call:
    """Unpickled, it makes the directory `path`: what a forged pickle could do, made visible."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_snapshot_this_machine_did_not_seal_or_that_names_other_code_is_not_read(tmp_path, monkeypatch):
    """The snapshot is a pickle: read only when this machine sealed it, and then only the config's models and
    datetime's types are let through (a sealed pickle naming os.mkdir is refused, not run)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-a"))
    cfg = write_config(tmp_path / "c", _docs())
    want = load(cfg, cache=True)
    path = cfg / snapshot.SNAPSHOT_FILE
    head, _, data = path.read_bytes().partition(b"\n")
    key, tag = head.decode().split(" ")
    other = load(write_config(tmp_path / "o", _docs()[:-1] + [job("j", gpus=1, gpu_type="A10G", priority="high")]))
    forged = pickle.dumps(other, protocol=5)
    calls = pickle.dumps(_Call(str(tmp_path / "ran")), protocol=5)
    sealed_calls = f"{key} {seal(key.encode() + bytes([10]) + calls)}".encode() + b"\n" + calls
    for bad in (head + b"\n" + data[: len(data) // 2],  # torn
                head + b"\n" + forged,  # another state under this key: the seal fails
                f"{key} {tag}".encode(),  # no data
                b"garbage",
                sealed_calls):  # sealed, but names other code
        path.write_bytes(bad)
        assert snapshot.read(cfg, key) is None
        got = load(cfg, cache=True)
        assert got == want and got.jobs["j"].spec.priority == "low"
        assert not (tmp_path / "ran").exists()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-b"))  # another machine: its own key
    assert snapshot.read(cfg, key) is None
