"""Shared pytest configuration: the control-plane fixtures and the --update-golden flag."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.cluster.fixtures", "tests.cluster.watchdog"]


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
