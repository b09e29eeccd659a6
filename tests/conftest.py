"""Shared pytest configuration: the control-plane fixtures and the --update-golden flag."""

from __future__ import annotations

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
