"""How an agent starts and stops a replica: `process` (a local subprocess: the sim and bare-metal
hosts) or `docker` (a container with the replica's GPUs, on cloud instances)."""

from __future__ import annotations

import os
import shutil
import signal as signals
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class StartError(Exception):
    """The replica could not be started at all (no such command, no docker): retrying cannot help."""


@dataclass(frozen=True)
class Launch:
    """One attempt of one replica, as the agent asks a runtime to start it."""

    name: str  # fleetops-<job>-<replica>-<attempt>: unique on the host
    command: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    image: str | None = None
    gpus: tuple[str, ...] = ()  # the plan's GPU indices (or MIG device ids) on this instance
    checkpoint_dir: str | None = None  # where the command sees its checkpoints
    checkpoint_host_dir: Path | None = None  # where they live on the host (the same for `process`)
    workdir: Path | None = None
    extra: dict = field(default_factory=dict)


class Handle(Protocol):
    pid: int


class Runtime(Protocol):
    name: str

    def start(self, launch: Launch) -> Handle: ...

    def poll(self, handle: Handle) -> int | None:
        """The exit code once the replica has ended, else None."""
        ...

    def signal(self, handle: Handle, sig: int) -> None: ...

    def kill(self, handle: Handle) -> None: ...


def _log(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "ab", buffering=0)


class ProcessRuntime:
    """The command as a local process in its own session (so signals reach its whole tree)."""

    name = "process"

    def start(self, launch: Launch) -> subprocess.Popen:
        exe = launch.command[0]
        if shutil.which(exe, path=launch.env.get("PATH", os.environ.get("PATH"))) is None and not (os.sep in exe and os.access(exe, os.X_OK)):
            raise StartError(f"command {exe!r} not found (PATH={launch.env.get('PATH', os.environ.get('PATH', ''))})")
        if launch.checkpoint_host_dir is not None:
            launch.checkpoint_host_dir.mkdir(parents=True, exist_ok=True)
        with _log(launch.log_path) as log:
            try:
                return subprocess.Popen(list(launch.command), env={**os.environ, **launch.env}, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=launch.workdir, start_new_session=True)
            except OSError as e:  # not executable, a bad interpreter line
                raise StartError(f"cannot start {exe!r}: {e.strerror}") from None

    def poll(self, handle: subprocess.Popen) -> int | None:
        return handle.poll()

    def signal(self, handle: subprocess.Popen, sig: int) -> None:
        if handle.poll() is None:
            try:
                os.killpg(handle.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, handle: subprocess.Popen) -> None:
        self.signal(handle, signals.SIGKILL)
        try:
            handle.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
            pass


def docker_gpus(gpus: tuple[str, ...]) -> str:
    """`--gpus` value for these devices: docker wants the quotes when there is a comma."""
    return f'"device={",".join(gpus)}"'


def docker_command(launch: Launch) -> list[str]:
    """The `docker run` of one replica: host networking (a gang's replicas meet on the instances'
    addresses), the plan's GPUs only, the checkpoint directory mounted from the host."""
    if not launch.image:
        raise StartError("the docker runtime needs run.image")
    cmd = ["docker", "run", "--rm", "--name", launch.name, "--network", "host", "--ipc", "host"]
    if launch.gpus:
        cmd += ["--gpus", docker_gpus(launch.gpus)]
    if launch.checkpoint_dir and launch.checkpoint_host_dir is not None:
        cmd += ["--volume", f"{launch.checkpoint_host_dir}:{launch.checkpoint_dir}"]
    for k, v in sorted(launch.env.items()):
        cmd += ["--env", f"{k}={v}"]
    return cmd + [launch.image, *launch.command]


@dataclass
class DockerHandle:
    pid: int
    name: str
    proc: subprocess.Popen


class DockerRuntime:
    """`docker run` in the foreground, its output into the replica's log; signals via `docker kill`."""

    name = "docker"

    def __init__(self, docker: str = "docker"):
        self.docker = docker

    def start(self, launch: Launch) -> DockerHandle:
        if shutil.which(self.docker) is None:
            raise StartError("docker is not installed on this instance (use a GPU image with the NVIDIA container toolkit)")
        cmd = docker_command(launch)
        cmd[0] = self.docker
        if launch.checkpoint_host_dir is not None:
            launch.checkpoint_host_dir.mkdir(parents=True, exist_ok=True)
        with _log(launch.log_path) as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return DockerHandle(proc.pid, launch.name, proc)

    def poll(self, handle: DockerHandle) -> int | None:
        return handle.proc.poll()

    def signal(self, handle: DockerHandle, sig: int) -> None:
        if handle.proc.poll() is None:
            subprocess.run([self.docker, "kill", "--signal", signals.Signals(sig).name, handle.name], capture_output=True, timeout=30)

    def kill(self, handle: DockerHandle) -> None:
        if handle.proc.poll() is None:
            subprocess.run([self.docker, "kill", handle.name], capture_output=True, timeout=30)
            try:
                handle.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover
                handle.proc.kill()


RUNTIMES = {"process": ProcessRuntime, "docker": DockerRuntime}
