"""Processes a cluster add-on starts beside the control plane (metrics.py, keda.py): one
process group each, recorded as ``<dir>/<name>.pid``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


class PidFiles:
    """The pidfiles under one directory."""

    def __init__(self, directory: Path):
        self.dir = directory

    def record(self, name: str, pid: int) -> None:
        (self.dir / f"{name}.pid").write_text(str(pid))

    def pid(self, name: str) -> int | None:
        """The recorded pid while that process runs."""
        try:
            pid = int((self.dir / f"{name}.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if _running(pid) else None

    def stop(self, names: Iterable[str], grace: float = 10) -> None:
        """SIGTERM each process group, SIGKILL what is left after ``grace`` seconds."""
        for name in names:
            pid = self.pid(name)
            if pid:
                _kill_group(pid, signal.SIGTERM)
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and self.pid(name):
                    time.sleep(0.2)
                if self.pid(name):
                    _kill_group(pid, signal.SIGKILL)
            (self.dir / f"{name}.pid").unlink(missing_ok=True)


def stop_leftovers(directory: Path) -> None:
    """SIGKILL every recorded process group (a cluster being torn down; no API calls)."""
    if not directory.is_dir():
        return
    for f in directory.glob("*.pid"):
        try:
            _kill_group(int(f.read_text()), signal.SIGKILL)
        except ValueError:
            pass
        f.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs. The stacks start their processes with Popen and keep no handle, so
    one that exited stays a zombie of this process until reaped, and ``kill(pid, 0)`` still
    finds it: reap it here when it is our child, and count any other zombie as gone."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # it had exited: now reaped
    except ChildProcessError:
        pass  # not our child (started by an earlier session, or already reaped)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass
