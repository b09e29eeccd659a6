"""Run ``spyre-engine`` as a child process in tests: start, wait for a probe, always clean up.

Each engine runs in its own process group, so a finalizer can kill vLLM, its engine core and TP
workers by group id and nothing outlives a test session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

# Ports picked outside the kernel's ephemeral range (spyre_engine.ports says why).
from spyre_engine.ports import free_port as free_port  # noqa: E402


def engine_command(*args: str) -> list[str]:
    """``spyre-engine ARGS`` with the current interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "spyre_engine.cli", *args]


def http_status(url: str, timeout: float = 3.0) -> int:
    """HTTP status of GET ``url`` (0 when unreachable)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def kill_tree(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGKILL ``proc`` and the process group of each descendant (vLLM runs its engine core in
    its own), then reap ``proc``; safe to call twice."""
    import psutil

    groups = {proc.pid}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                groups.add(os.getpgid(child.pid))
            with contextlib.suppress(psutil.Error):
                child.kill()
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)


class EngineProcess:
    """A running ``spyre-engine serve`` (or precompile) in its own process group."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port
        #: the metrics port, when the caller passed ``--metrics-port``
        self.metrics_port: int | None = None
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            engine_command(*args),
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        """Base URL of the public port."""
        return f"http://127.0.0.1:{self.port}"

    def probe(self, path: str, timeout: float = 3.0) -> int:
        """HTTP status of GET ``path`` (0 when unreachable)."""
        return http_status(self.url + path, timeout)

    def wait_started(self, timeout: float = 300.0) -> float:
        """Wait until ``/health/startup`` is 200; return the seconds waited (raise with the log)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"engine exited with {self.proc.returncode} before starting:\n{self.log_tail()}"
                )
            if self.probe("/health/startup") == 200:
                return time.monotonic() - t0
            time.sleep(0.25)
        raise TimeoutError(f"engine not started after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the engine's output."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def sigterm(self) -> float:
        """Send SIGTERM to the engine process (not the group, like the kubelet); returns when."""
        self.proc.send_signal(signal.SIGTERM)
        return time.monotonic()

    def wait_exit(self, timeout: float) -> int | None:
        """Exit code, or None if still running after ``timeout``."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def group_alive(self) -> bool:
        """True if any process of the engine's group is still running."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def descendants_alive(self) -> list[int]:
        """PIDs of the engine's descendants (vLLM, engine core, TP workers) still running."""
        import psutil

        with contextlib.suppress(psutil.Error):
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        return []

    @staticmethod
    def still_running(pids: list[int]) -> list[int]:
        """The PIDs of ``pids`` that still run (zombies count as gone)."""
        import psutil

        running = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
        return running

    def kill(self) -> None:
        """Kill the engine and every descendant's process group; safe to call twice."""
        kill_tree(self.proc)
        self._log.close()
