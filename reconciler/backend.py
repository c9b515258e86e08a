"""Where the reconciler keeps its state and its apply lock: `local` or `s3`.

Teams whose runs come from many CI runners share one S3 backend: the state is
one object, and the lock is a second object created with a conditional write
(If-None-Match: *), so two runners can never both believe they hold it. The
lock names its holder and expires; its holder renews it while it works (LeasedLock,
every write conditional on the version it last wrote) and stops if it cannot. An
expired lock is taken over; a live, empty or garbled one is broken with
`reconcile unlock ID`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Iterator, Protocol
from urllib.parse import urlparse

from reconciler.errors import LockError, ReconcileError
from reconciler.redact import redact
from reconciler.state import (ApplyLock, State, break_lock, describe_holder, load_state, lock_holder, save_state, state_from_json,
                              state_to_json, utcnow)

LOCK_TTL = timedelta(minutes=30)


class StateBackend(Protocol):
    def load(self) -> State: ...

    def save(self, state: State) -> None: ...

    def lock(self) -> contextlib.AbstractContextManager[str]:
        """Hold the apply lock for a block; yields the lock id; raises LockError naming the holder."""
        ...

    def unlock(self, lock_id: str) -> None: ...

    def check_lock(self) -> None:
        """Raise LockError if the lock this backend holds was lost (broken, taken over, not renewed):
        called before every provider call of an apply, so a lost lock stops it there."""
        ...

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
            self._held = held
            try:
                yield held.id
            finally:
                self._held = None

    def unlock(self, lock_id: str) -> None:
        break_lock(self.config_dir, lock_id)

    def check_lock(self) -> None:
        held = getattr(self, "_held", None)
        if held is not None and not held.still_held():
            raise LockError(f"the lock {held.path} was broken while this apply ran (`reconcile unlock`?): "
                            "stopped before the next provider call; run plan again")

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


class LeaseStore(Protocol):
    """What a remote backend provides for its lock: one object, written only conditionally. The lock's
    logic (expiry, takeover, renewal, unlock) is LeasedLock's, the same for every store."""

    lock_url: str  # for messages: s3://bucket/prefix/lock.json

    def lock_read(self) -> tuple[bytes, str] | None:
        """The lock object's bytes and version token (S3: ETag), or None if there is none."""
        ...

    def lock_create(self, body: bytes) -> str | None:
        """Create the lock object only if none exists (S3: If-None-Match: *): its token, or None."""
        ...

    def lock_replace(self, body: bytes, token: str) -> str | None:
        """Overwrite it only if it is still at `token` (S3: If-Match): the new token, or None."""
        ...

    def lock_delete(self, token: str) -> bool:
        """Delete it only if it is still at `token` (S3: If-Match); False if it is not."""
        ...


class LeasedLock:
    """An expiring lock in a LeaseStore, renewed by a heartbeat while held.

    The heartbeat rewrites the lock every `ttl / 3` with a later expiry, conditional on the token it
    last wrote. If the lock was broken or taken over (the condition fails), or could not be renewed
    before it expired, the lease is lost and check() raises: the apply stops before its next provider
    call. (Before, the 30-minute lock was never renewed: a second runner started while a long apply
    still ran and 13 instances were bought for 10.)"""

    def __init__(self, store: LeaseStore, ttl: timedelta, renew_every: float | None = None):
        self.store, self.ttl = store, ttl
        self.renew_every = renew_every if renew_every is not None else max(ttl.total_seconds() / 3, 1.0)
        self.lost: str | None = None
        self._stop = threading.Event()
        self._token_lock = threading.Lock()

    def _body(self, lock_id: str, since: str) -> bytes:
        now = utcnow()
        return json.dumps({"id": lock_id, "host": socket.gethostname(), "pid": os.getpid(), "since": since,
                           "expires": (now + self.ttl).isoformat(), "run": os.environ.get("GITHUB_RUN_ID", "")}).encode()

    def _refuse(self, h: dict) -> LockError:
        return LockError(f"another apply holds the lock {self.store.lock_url}: {describe_holder(h)}; "
                         f"if no apply is running, run `reconcile unlock {h['id']}`")

    @contextlib.contextmanager
    def hold(self) -> Iterator[str]:
        lock_id, since = uuid.uuid4().hex[:12], utcnow().isoformat()
        for _ in range(3):
            token = self.store.lock_create(self._body(lock_id, since))
            if token is not None:
                break
            current = self.store.lock_read()
            if current is None:
                continue  # released between our write and our read: try again
            h = lock_holder(current[0])
            expires = _when(h.get("expires"))
            if "garbled" in h or expires is None or expires >= utcnow():
                raise self._refuse(h)
            # Expired: its holder is gone (or stopped: it renews while alive). Replaced only if it is
            # still the lock we read, so of two runners taking it over exactly one wins.
            token = self.store.lock_replace(self._body(lock_id, since), current[1])
            if token is not None:
                break
        else:
            raise LockError(f"could not take the lock {self.store.lock_url} after 3 tries")
        self.lost = None
        self._stop.clear()
        self._token = token
        beat = threading.Thread(target=self._heartbeat, args=(lock_id, since), name="lock-heartbeat", daemon=True)
        beat.start()
        try:
            yield lock_id
        finally:
            self._stop.set()
            beat.join()
            if self.lost is None:
                with contextlib.suppress(ReconcileError):
                    self.store.lock_delete(self._token)  # only if still ours: a broken lock's new holder keeps it

    def _heartbeat(self, lock_id: str, since: str) -> None:
        deadline = utcnow() + self.ttl
        while not self._stop.wait(self.renew_every):
            body = self._body(lock_id, since)
            try:
                token = self.store.lock_replace(body, self._token)
            except ReconcileError as e:  # the store is unreachable: try again, until the lease runs out
                if utcnow() >= deadline - timedelta(seconds=self.renew_every):
                    self.lost = f"it could not be renewed before it expired ({e})"
                    return
                continue
            if token is None:
                self.lost = "it was broken or taken over by another runner"
                return
            self._token = token
            deadline = _when(json.loads(body)["expires"]) or deadline

    def check(self) -> None:
        if self.lost is not None:
            raise LockError(f"lost the lock {self.store.lock_url}: {self.lost}; this apply stopped before its next "
                            "provider call (what it did so far is in the cloud); run plan again")

    def unlock(self, lock_id: str) -> None:
        # A live holder renews its lease every ttl/3, so the object can change between our read and our
        # conditional delete while the holder stays the same: read again and retry. Only a change of
        # holder (or a store that keeps changing) is a refusal.
        for _ in range(5):
            current = self.store.lock_read()
            if current is None:
                raise LockError("no lock is held")
            h = lock_holder(current[0])
            if h["id"] != lock_id:
                raise LockError(f"the lock is held by {h['id']}, not {lock_id}; refusing to break it")
            if self.store.lock_delete(current[1]):
                return
        raise LockError(f"the lock {self.store.lock_url} changed while it was being broken; look again")


def _when(text) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None


class S3Backend:
    """s3://bucket/prefix: `prefix/state.json` and `prefix/lock.json`.

    The endpoint comes from the standard AWS configuration (AWS_ENDPOINT_URL_S3 or
    AWS_ENDPOINT_URL for S3-compatible stores and tests); credentials from the AWS chain."""

    def __init__(self, url: str, ttl: timedelta | None = None):
        u = urlparse(url)
        if u.scheme != "s3" or not u.netloc:
            raise ReconcileError(f"state backend {url!r} is not s3://bucket/prefix")
        self.url = url
        self.bucket = u.netloc
        prefix = u.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.state_key = f"{prefix}/state.json" if prefix else "state.json"
        self.lock_key = f"{prefix}/lock.json" if prefix else "lock.json"
        self.ttl = ttl if ttl is not None else LOCK_TTL
        try:
            import boto3  # lazy: only teams using the s3 backend need it
            from botocore.config import Config
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ReconcileError("the s3 state backend needs boto3: pip install 'fleetops-reconciler[aws]'") from e
        self.s3 = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 5}))
        self.lease = LeasedLock(self, self.ttl)

    def _error(self, e: Exception, what: str, key: str | None = None) -> ReconcileError:
        code = getattr(e, "response", {}).get("Error", {}).get("Code") or redact(str(e)) or type(e).__name__
        return ReconcileError(f"s3 state backend: {what} s3://{self.bucket}/{key or self.state_key}: {code}. Nothing was "
                              "changed by this step; check the endpoint, the bucket and the credentials, then run again.")

    def load(self) -> State:
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=self.state_key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return State()
        except Exception as e:  # botocore ClientError and connection errors
            raise self._error(e, "cannot read") from None
        return state_from_json(body, f"s3://{self.bucket}/{self.state_key}")

    def save(self, state: State) -> None:
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.state_key, Body=state_to_json(state).encode(), ContentType="application/json")
        except Exception as e:
            raise self._error(e, "cannot write") from None

    # -- the lock: LeasedLock over these four conditional operations ------------------------------
    @property
    def lock_url(self) -> str:
        return f"s3://{self.bucket}/{self.lock_key}"

    @staticmethod
    def _precondition_failed(e: Exception) -> bool:
        r = getattr(e, "response", None) or {}
        return r.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey") or \
            r.get("ResponseMetadata", {}).get("HTTPStatusCode") in (404, 409, 412)

    def _conditional(self, what: str, call: Callable[[], dict]) -> dict | None:
        """The response of a conditional lock call; None if its condition failed."""
        from botocore.exceptions import ClientError

        try:
            return call()
        except ClientError as e:
            if self._precondition_failed(e):
                return None
            raise self._error(e, what, self.lock_key) from None
        except Exception as e:  # connection errors
            raise self._error(e, what, self.lock_key) from None

    def lock_read(self) -> tuple[bytes, str] | None:
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=self.lock_key)
            return obj["Body"].read(), obj["ETag"]
        except self.s3.exceptions.NoSuchKey:
            return None
        except Exception as e:
            raise self._error(e, "cannot read the lock", self.lock_key) from None

    def lock_create(self, body: bytes) -> str | None:
        r = self._conditional("cannot lock", lambda: self.s3.put_object(Bucket=self.bucket, Key=self.lock_key, Body=body, IfNoneMatch="*"))
        return r["ETag"] if r is not None else None

    def lock_replace(self, body: bytes, token: str) -> str | None:
        r = self._conditional("cannot renew the lock", lambda: self.s3.put_object(Bucket=self.bucket, Key=self.lock_key, Body=body, IfMatch=token))
        return r["ETag"] if r is not None else None

    def lock_delete(self, token: str) -> bool:
        return self._conditional("cannot unlock", lambda: self.s3.delete_object(Bucket=self.bucket, Key=self.lock_key, IfMatch=token)) is not None

    def holder(self) -> tuple[dict, str] | None:
        current = self.lock_read()
        return (lock_holder(current[0]), current[1]) if current is not None else None

    @contextlib.contextmanager
    def lock(self) -> Iterator[str]:
        with self.lease.hold() as lock_id:
            yield lock_id

    def unlock(self, lock_id: str) -> None:
        self.lease.unlock(lock_id)

    def check_lock(self) -> None:
        self.lease.check()

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
