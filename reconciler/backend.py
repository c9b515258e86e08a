"""Where the reconciler keeps its state and its apply lock: `local` or `s3`.

Teams whose runs come from many CI runners share one S3 backend: the state is
one object, and the lock is a second object created with a conditional write
(If-None-Match: *), so two runners can never both believe they hold it. The
lock names its holder and expires; an expired or dead lock can be broken with
`reconcile unlock ID`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Iterator, Protocol
from urllib.parse import urlparse

from reconciler.errors import LockError, ReconcileError
from reconciler.state import ApplyLock, State, break_lock, load_state, save_state, state_from_json, state_to_json, utcnow

LOCK_TTL = timedelta(minutes=30)


class StateBackend(Protocol):
    def load(self) -> State: ...

    def save(self, state: State) -> None: ...

    def lock(self) -> contextlib.AbstractContextManager[str]:
        """Hold the apply lock for a block; yields the lock id; raises LockError naming the holder."""
        ...

    def unlock(self, lock_id: str) -> None: ...

    def describe(self) -> str: ...

    # The bus (reconciler/runtime/bus.py): small objects under the state's prefix, written by
    # apply (assignments/) and by node agents (runs/, agents/).
    def read_key(self, key: str) -> bytes | None: ...

    def write_key(self, key: str, body: bytes) -> None: ...

    def delete_key(self, key: str) -> None: ...

    def list_keys(self, prefix: str) -> list[str]: ...


def check_key(key: str) -> str:
    """A bus key is a relative path of plain names: never absolute, never `..`."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in key:
        raise ReconcileError(f"invalid bus key {key!r}")
    return key


class LocalBackend:
    """.reconcile/state.json and .reconcile/apply.lock beside the config."""

    def __init__(self, config_dir: Path):
        self.config_dir = Path(config_dir)

    def load(self) -> State:
        return load_state(self.config_dir)

    def save(self, state: State) -> None:
        save_state(self.config_dir, state)

    @contextlib.contextmanager
    def lock(self) -> Iterator[str]:
        with ApplyLock(self.config_dir) as held:
            yield held.id

    def unlock(self, lock_id: str) -> None:
        break_lock(self.config_dir, lock_id)

    def describe(self) -> str:
        return f"local ({self.config_dir / '.reconcile'})"

    def _path(self, key: str) -> Path:
        return self.config_dir / ".reconcile" / check_key(key)

    def read_key(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ReconcileError(f"local bus: cannot read {self._path(key)}: {e.strerror}") from None

    def write_key(self, key: str, body: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(body)
            os.replace(tmp, path)  # readers see the old object or the new one, never half of one
        except OSError as e:
            raise ReconcileError(f"local bus: cannot write {path}: {e.strerror}") from None

    def delete_key(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        root = self.config_dir / ".reconcile"
        base = root / check_key(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith("."))


class S3Backend:
    """s3://bucket/prefix: `prefix/state.json` and `prefix/lock.json`.

    The endpoint comes from the standard AWS configuration (AWS_ENDPOINT_URL_S3 or
    AWS_ENDPOINT_URL for S3-compatible stores and tests); credentials from the AWS chain."""

    def __init__(self, url: str, ttl: timedelta = LOCK_TTL):
        u = urlparse(url)
        if u.scheme != "s3" or not u.netloc:
            raise ReconcileError(f"state backend {url!r} is not s3://bucket/prefix")
        self.url = url
        self.bucket = u.netloc
        prefix = u.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.state_key = f"{prefix}/state.json" if prefix else "state.json"
        self.lock_key = f"{prefix}/lock.json" if prefix else "lock.json"
        self.ttl = ttl
        try:
            import boto3  # lazy: only teams using the s3 backend need it
            from botocore.config import Config
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ReconcileError("the s3 state backend needs boto3: pip install 'fleetops-reconciler[aws]'") from e
        self.s3 = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 5}))

    def _error(self, e: Exception, what: str) -> ReconcileError:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
        return ReconcileError(f"s3 state backend: {what} s3://{self.bucket}/{self.state_key}: {code}")

    def load(self) -> State:
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=self.state_key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return State()
        except Exception as e:  # botocore ClientError and connection errors
            raise self._error(e, "cannot read") from None
        return state_from_json(body.decode())

    def save(self, state: State) -> None:
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.state_key, Body=state_to_json(state).encode(), ContentType="application/json")
        except Exception as e:
            raise self._error(e, "cannot write") from None

    def holder(self) -> tuple[dict, str] | None:
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=self.lock_key)
        except self.s3.exceptions.NoSuchKey:
            return None
        return json.loads(obj["Body"].read()), obj["ETag"]

    def _try_create(self, body: dict) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.lock_key, Body=json.dumps(body).encode(), IfNoneMatch="*")
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") or \
                    e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
                return False
            raise self._error(e, "cannot lock") from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[str]:
        now = utcnow()
        lock_id = uuid.uuid4().hex[:12]
        body = {"id": lock_id, "host": socket.gethostname(), "pid": os.getpid(), "since": now.isoformat(),
                "expires": (now + self.ttl).isoformat(), "run": os.environ.get("GITHUB_RUN_ID", "")}
        for _ in range(3):
            if self._try_create(body):
                break
            h = self.holder()
            if h is None:
                continue  # released between our write and our read: try again
            info = h[0]
            if datetime.fromisoformat(info["expires"]) < now:
                # Expired: its holder is gone. (Two runners breaking the same expired lock at
                # once is the one race left; S3 DeleteObject has no If-Match on every store.)
                self.s3.delete_object(Bucket=self.bucket, Key=self.lock_key)
                continue
            who = f"{info.get('id')} (pid {info.get('pid')} on {info.get('host')} since {info.get('since')}, expires {info.get('expires')})"
            raise LockError(f"another apply holds the lock s3://{self.bucket}/{self.lock_key}: {who}; "
                            f"if it is dead, run `reconcile unlock {info.get('id')}`")
        else:
            raise LockError(f"could not take the lock s3://{self.bucket}/{self.lock_key} after 3 tries")
        try:
            yield lock_id
        finally:
            if self._holds(lock_id):
                self.s3.delete_object(Bucket=self.bucket, Key=self.lock_key)

    def _holds(self, lock_id: str) -> bool:
        h = self.holder()
        return h is not None and h[0].get("id") == lock_id

    def unlock(self, lock_id: str) -> None:
        h = self.holder()
        if h is None:
            raise LockError("no lock is held")
        if h[0].get("id") != lock_id:
            raise LockError(f"the lock is held by {h[0].get('id')}, not {lock_id}; refusing to break it")
        self.s3.delete_object(Bucket=self.bucket, Key=self.lock_key)

    def describe(self) -> str:
        return f"s3 ({self.url})"

    def _bus_error(self, e: Exception, what: str, key: str) -> ReconcileError:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
        return ReconcileError(f"s3 bus: {what} s3://{self.bucket}/{self.prefix}{key}: {code}")

    def read_key(self, key: str) -> bytes | None:
        check_key(key)
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        except Exception as e:
            raise self._bus_error(e, "cannot read", key) from None

    def write_key(self, key: str, body: bytes) -> None:
        check_key(key)
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body, ContentType="application/json")
        except Exception as e:
            raise self._bus_error(e, "cannot write", key) from None

    def delete_key(self, key: str) -> None:
        check_key(key)
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        except Exception as e:
            raise self._bus_error(e, "cannot delete", key) from None

    def list_keys(self, prefix: str) -> list[str]:
        out = []
        base = self.prefix + check_key(prefix.rstrip("/")) + "/"
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
            for page in pages:
                out.extend(o["Key"][len(self.prefix):] for o in page.get("Contents", []))
        except Exception as e:
            raise self._bus_error(e, "cannot list", prefix) from None
        return sorted(out)


def backend_for(config_dir: Path, url: str | None = None) -> StateBackend:
    """`url` None or 'local' -> LocalBackend; 's3://bucket/prefix' -> S3Backend."""
    if not url or url == "local":
        return LocalBackend(config_dir)
    if url.startswith("s3://"):
        return S3Backend(url)
    raise ReconcileError(f"unknown state backend {url!r}: use 'local' or s3://bucket/prefix")
