"""Shared pytest configuration: the control-plane fixtures and the --update-golden flag."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

pytest_plugins = ["tests.cluster.fixtures", "tests.cluster.watchdog", "tests.cluster.prebuilt"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files under tests/golden/data instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def pytest_configure(config: pytest.Config) -> None:
    # Here, not in pyproject.toml: that file is an input of both images' hashes.
    config.addinivalue_line(
        "markers", "node: in a module that needs the real node (set at collection by "
        "tests/integration/conftest.py): make test's cluster session, not its kwok one")
    config.addinivalue_line(
        "markers", "platforms: the release's operator image on every architecture (qemu "
        "builds): make test-platforms, once per change of its inputs; skipped in make test")


#: vLLM's ZeroMQ sockets (``ipc://$VLLM_RPC_BASE_PATH/<uuid>``, by default the system's temp
#: directory) of the engines a session starts on this machine: in a directory of the session's
#: own, removed at its end. A vLLM killed by a test leaves its sockets behind (~70 per run
#: stayed in /tmp before).
_VLLM_RPC = "VLLM_RPC_BASE_PATH"
_OWN_RPC_DIR: str | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _OWN_RPC_DIR
    if _VLLM_RPC not in os.environ:
        _OWN_RPC_DIR = os.environ[_VLLM_RPC] = tempfile.mkdtemp(prefix="spyre-vllm-rpc-")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _OWN_RPC_DIR is not None:
        shutil.rmtree(_OWN_RPC_DIR, ignore_errors=True)
