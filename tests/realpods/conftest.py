"""Fixtures shared by the real-pod modules that need no engine image."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.node import RealNode
from tests.contract.realpods import ChartOperator
from tests.integration.conftest import Kube
from tests.realpods import support


@pytest.fixture
def kube(control_plane: ControlPlane, real_node: RealNode, namespace: str) -> Iterator[Kube]:
    """The test's namespace, made to behave as OpenShift's restricted-v2 SCC (support.
    ensure_namespace), with its own operator (the chart-installed one, watching only it, the
    platform assigning its pods' uid), the real node up."""
    support.ensure_namespace(control_plane, namespace,
                             labels={"spyre.dev/test-namespace": "true"})
    op = ChartOperator(control_plane, namespace)
    op.start()
    try:
        yield Kube(control_plane, namespace)
    finally:
        op.close()
