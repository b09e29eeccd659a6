"""tests/cluster/procs.py: the pidfiles of the add-on processes (KEDA, Prometheus) the cluster
tests start beside the control plane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cluster.controlplane import wait_until
from tests.cluster.procs import PidFiles


def _state(pid: int) -> str:
    """The process state letter from /proc (``Z``: exited, not yet reaped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_exited_child_nobody_reaped_is_not_running(tmp_path: Path) -> None:
    """The stacks start their processes with Popen and keep no handle: one that exits stays a
    zombie of the test process, which ``kill(pid, 0)`` still finds. Counted as running, each
    of KEDA's five processes made ``stop`` wait out its full grace (50 s per teardown)."""
    files = PidFiles(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    files.record("short", proc.pid)
    wait_until(lambda: _state(proc.pid) == "Z", 30, "the child exited, unreaped", interval=0.05)
    assert files.pid("short") is None


def test_a_running_child_is_running_and_stop_ends_it(tmp_path: Path) -> None:
    files = PidFiles(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=True)  # fmt: skip
    files.record("long", proc.pid)
    assert files.pid("long") == proc.pid
    files.stop(["long"], grace=30)
    assert files.pid("long") is None
    assert proc.poll() is not None  # reaped: it is gone from the process table
    assert not (tmp_path / "long.pid").exists()
