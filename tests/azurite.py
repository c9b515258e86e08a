"""Azurite (Microsoft's Azure Storage emulator, npm package `azurite`) for the azblob backend's tests.

CI starts from a fresh machine with Python but no Azurite: the first test session installs the pinned
version with npm into a cache directory (a file lock keeps pytest-xdist's workers from installing it
twice; about 15 s once per machine), later sessions reuse it. Where Node.js or npm is absent the tests
skip with that reason; where npm is present but the install fails, they fail (a broken install must not
read as a pass)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

VERSION = "3.37.0"
# Azurite's documented development account (https://learn.microsoft.com/azure/storage/common/storage-use-azurite):
# a well-known public key, not a secret.
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fleetops-tests" / f"azurite-{VERSION}"


def azurite_blob() -> str:
    """The path of `azurite-blob`: on PATH, in the cache, or installed into the cache now."""
    found = shutil.which("azurite-blob")
    if found:
        return found
    cache = _cache()
    exe = cache / "node_modules" / ".bin" / "azurite-blob"
    if exe.exists():
        return str(exe)
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("the azblob backend's tests need Azurite, which needs Node.js and npm: neither `azurite-blob` nor "
                    "`node`/`npm` is on PATH (install Node.js, or `npm install -g azurite`)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker may be installing it right now
        if not exe.exists():
            res = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(cache), f"azurite@{VERSION}"],
                                 capture_output=True, text=True, timeout=600)
            if res.returncode != 0 or not exe.exists():
                pytest.fail(f"npm install azurite@{VERSION} into {cache} failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
    return str(exe)


class Azurite:
    """azurite-blob in memory on a free port of 127.0.0.1."""

    def __init__(self):
        self.workdir = tempfile.mkdtemp(prefix="azurite-")
        self.proc = subprocess.Popen(
            [azurite_blob(), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence", "--silent",
             "--disableTelemetry", "--skipApiVersionCheck"],  # the SDK may speak a newer API version than this Azurite
            cwd=self.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen, deadline = [], time.monotonic() + 120  # generous: node starts slowly on a loaded machine
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            m = re.search(r"listens on (http://127\.0\.0\.1:\d+)", line)
            if m:
                self.endpoint = f"{m[1]}/{ACCOUNT}"
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain: a full pipe would stall it
                return
        self.stop()
        raise RuntimeError(f"Azurite did not start: {''.join(seen)[-2000:]}")

    @property
    def connection_string(self) -> str:
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={self.endpoint};"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
