"""Fixtures for every unit test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_openshift_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unit tests have no API server: ``spyre-operator run`` with ``--pod-user auto`` (its
    default) hears "not OpenShift" instead of failing to ask. tests/unit/test_podsecurity.py
    covers the probe's answers and failure; the integration tests' operators ask for real."""
    monkeypatch.setattr("spyre_operator.kube.podsecurity.scc_api_served", lambda: False)
    yield
