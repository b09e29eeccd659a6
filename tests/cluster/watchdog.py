"""pytest plugin: stop the run once the control plane is gone, instead of timing out test by test.

When a test that uses the ``control_plane`` fixture fails, the API server's ``/readyz`` is
polled for ``SPYRE_CLUSTER_GONE_GRACE`` seconds (30; a test may restart it on purpose). If it
does not answer, the failure says so; later tests that need the control plane fail at setup
at once; after ``SPYRE_FAILURES_WITHOUT_CLUSTER`` such failures (2) the session stops with a
message naming the API server and its logs, as ``--maxfail`` would. Otherwise every remaining
cluster test would wait out its own timeout (up to 25 min each) against a dead API server.

Each test's node id is also written to ``$SPYRE_CURRENT_TEST_FILE`` as it starts (and the
file emptied when the session ends without being interrupted), so ``.ci/run`` can say what
was running when the whole run hit its time budget.

Registered from ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from typing import Any

import pytest

FIXTURE = "control_plane"


class _State:
    cp: Any = None  # the ControlPlane of the first failure that found it gone
    gone_failures = 0
    first: str = ""


_state = _State()


def _limit() -> int:
    return int(os.environ.get("SPYRE_FAILURES_WITHOUT_CLUSTER", "2"))


def _grace() -> float:
    return float(os.environ.get("SPYRE_CLUSTER_GONE_GRACE", "30"))


def _reachable(cp: Any, grace: float) -> bool:
    """Whether the API server answers ``/readyz`` within ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while not cp.apiserver_ready():
        if time.monotonic() >= deadline:
            return False
        time.sleep(1)
    return True


def _readyz(cp: Any) -> str:
    try:
        return f"{cp.server}/readyz"
    # its state file is gone with it (controlplane's ClusterError, a RuntimeError: the
    # report of a failed test must not become pytest's INTERNALERROR)
    except (LookupError, OSError, ValueError, RuntimeError):
        return "the API server's /readyz"


def _control_plane_of(item: pytest.Item) -> Any:
    if FIXTURE not in getattr(item, "fixturenames", ()):
        return None
    return getattr(item, "funcargs", {}).get(FIXTURE) or _state.cp


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Name the running test in ``$SPYRE_CURRENT_TEST_FILE`` (``.ci/run`` prints it when the
    run hits its time budget)."""
    path = os.environ.get("SPYRE_CURRENT_TEST_FILE")
    if path:
        with open(path, "w") as f:
            f.write(f"{nodeid} (started {time.strftime('%H:%M:%S')})\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session that ran to its end names no test any more (``make test`` runs two: the one
    still running is the one ``.ci/run`` should name). An interrupted one keeps its name."""
    path = os.environ.get("SPYRE_CURRENT_TEST_FILE")
    if path and exitstatus != pytest.ExitCode.INTERRUPTED:
        with open(path, "w"):
            pass


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Once the control plane was found gone, a test that needs it fails at once."""
    cp = _control_plane_of(item)
    if _state.gone_failures and cp is not None and not _reachable(cp, min(5, _grace())):
        pytest.fail(f"the control plane is unreachable ({_readyz(cp)}) since "
                    f"{_state.first} failed; logs: {cp.logs}", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    cp = _control_plane_of(item) if report.failed else None
    if cp is None or _reachable(cp, _grace()):
        return
    _state.cp = cp
    _state.gone_failures += 1
    _state.first = _state.first or item.nodeid
    report.sections.append(("control plane", f"{_readyz(cp)} does not answer"))
    if _state.gone_failures >= _limit():
        item.session.shouldstop = (
            f"the control plane is gone ({_readyz(cp)} does not answer since "
            f"{_state.first} failed): stopping after {_state.gone_failures} failures without "
            f"it; logs: {cp.logs}"
        )
