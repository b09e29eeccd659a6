"""pytest plugin: the local control plane as fixtures.

Register it from ``tests/conftest.py`` with ``pytest_plugins = ["tests.cluster.fixtures"]``.

Fixtures
--------
``control_plane`` (session)
    A running :class:`~tests.cluster.controlplane.ControlPlane` (the repository's ``.cluster/``,
    or ``$SPYRE_CLUSTER_ROOT/.cluster/`` when that is set). A healthy cluster that is
    already running (``make cluster-up``) is reused and left running; one this session
    started is stopped at the end unless ``SPYRE_KEEP_CLUSTER=1``. Missing binaries fail
    the test with a message naming ``make binaries``; nothing is skipped.
``kubeconfig`` (session)
    Path of the admin kubeconfig; also exported as ``KUBECONFIG`` for the session.
``namespace`` (function)
    A fresh namespace with PodSecurity ``restricted`` enforced (and warned/audited), whose
    ``default`` ServiceAccount exists. Deleted (without waiting) after the test.
``real_node`` (session)
    The real node (:class:`~tests.cluster.node.RealNode`) up and Ready, with its Spyre cards
    advertised and the pause and busybox images in its containerd. Started on first use (a
    node that is already running is reused and left running); stopped at session end if
    this session started it, unless ``SPYRE_KEEP_CLUSTER=1``. Pods meant for it use
    ``nodeSelector: NODE_SELECTOR`` and ``tolerations: [NODE_TOLERATION]`` (tests.cluster.node)
    and images imported with ``real_node.import_image(archive)``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.controlplane import BinariesMissing, ClusterError, ControlPlane, wait_until
from tests.cluster.node import NodeError, RealNode

PSA_LEVEL = "restricted"


#: The directory whose ``.cluster/`` holds the session's control plane, when not the
#: repository's: ``make test`` gives its kwok session a control plane of its own there
#: (tests/streams.py), beside the one the real-node session uses.
ROOT_ENV = "SPYRE_CLUSTER_ROOT"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    cp = ControlPlane(os.environ.get(ROOT_ENV) or None)
    try:
        cp.check_binaries()
    except BinariesMissing as e:
        pytest.fail(str(e), pytrace=False)
    # Somebody else's cluster (make cluster-up, another session): reuse it, never stop it.
    was_running = cp.pid("kube-apiserver") is not None
    try:
        cp.up()
    except (ClusterError, TimeoutError) as e:
        pytest.fail(f"could not start the local control plane: {e} (logs: {cp.logs})", False)
    yield cp
    if not was_running and not os.environ.get("SPYRE_KEEP_CLUSTER"):
        cp.down()


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Iterator[Path]:
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(control_plane.kubeconfig)
    yield control_plane.kubeconfig
    if old is None:
        os.environ.pop("KUBECONFIG", None)
    else:
        os.environ["KUBECONFIG"] = old


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    # Static PVs whose claims were deleted by earlier tests become Available again.
    control_plane.recycle_pvs()
    name = _namespace_name(request.node.name)
    labels = {
        f"pod-security.kubernetes.io/{mode}": PSA_LEVEL for mode in ("enforce", "warn", "audit")
    }
    labels.update(
        {f"pod-security.kubernetes.io/{m}-version": "latest" for m in ("enforce", "warn", "audit")}
    )
    labels["spyre.dev/test-namespace"] = "true"
    control_plane.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )
    wait_until(
        lambda: (
            control_plane.kubectl(
                "get", "serviceaccount", "default", "-n", name, check=False
            ).returncode
            == 0
        ),
        30,
        f"the default ServiceAccount in {name}",
    )
    yield name
    control_plane.kubectl(
        "delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False, timeout=30
    )


@pytest.fixture(scope="session")
def real_node(control_plane: ControlPlane) -> Iterator[RealNode]:
    node = control_plane.node
    try:
        node.check_prerequisites()
    except NodeError as e:
        pytest.fail(str(e), pytrace=False)
    was_running = node.running()
    try:
        node.up()
    except (NodeError, ClusterError, TimeoutError) as e:
        pytest.fail(f"could not start the real node: {e} (logs: {control_plane.logs}/node-*.log)",
                    False)
    yield node
    if not was_running and not os.environ.get("SPYRE_KEEP_CLUSTER"):
        leaks = node.down()
        assert not leaks, f"the real node left behind: {leaks}"
