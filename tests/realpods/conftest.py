"""Fixtures shared by the real-pod modules that need no engine image."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixtures import _namespace_name
from tests.cluster.node import RealNode
from tests.contract.realpods import ChartOperator
from tests.integration.conftest import Kube
from tests.realpods import support


@pytest.fixture(scope="module")
def kube(control_plane: ControlPlane, real_node: RealNode,
         request: pytest.FixtureRequest) -> Iterator[Kube]:
    """The module's namespace, made to behave as OpenShift's restricted-v2 SCC (support.
    ensure_namespace), with its own operator (the chart-installed one, watching only it, the
    platform assigning its pods' uid), the real node up. One per module (its tests name their
    models apart): a chart install and a namespace per test cost ~20 s each."""
    namespace = _namespace_name(request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_"))
    support.ensure_namespace(control_plane, namespace,
                             labels={"spyre.dev/test-namespace": "true"})
    op = ChartOperator(control_plane, namespace)
    op.start()
    try:
        yield Kube(control_plane, namespace)
    finally:
        op.close()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false",
                              "--ignore-not-found", check=False, timeout=30)
