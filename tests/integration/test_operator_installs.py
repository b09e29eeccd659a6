"""Two operator installs on one control plane (real processes, real Leases).

- Overlapping watch scopes: two installs with their Leases in different namespaces both lead;
  one finds the other's fresh stamp on a model, writes nothing to it and says so (Warning
  Event ``OperatorConflict`` naming both, a log line, ``spyre_operator_conflicts_total``).
- Two releases in one namespace: each has its own Lease (the name is per install), so both
  lead and each writes the models of its own scope. With one constant Lease name, one of them
  stayed a standby forever and its tenant's models were never reconciled, silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane, wait_until

from .conftest import Kube, OperatorProcess, settle_writes
from .test_operator import spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_host_operator", "crd")]


@pytest.fixture
def extra_namespaces(control_plane: ControlPlane, namespace: str) -> Iterator[list[str]]:
    """Two more namespaces, named after the test's: Lease homes and a second tenant."""
    made = [f"{namespace}-x", f"{namespace}-y"]
    for ns in made:
        control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield made
    for ns in made:
        control_plane.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found",
                              check=False, timeout=30)  # fmt: skip


def _operator(cp: ControlPlane, kubeconfig: Path, *args: str) -> OperatorProcess:
    op = OperatorProcess(kubeconfig, cp.root / ".cluster" / "logs", args=list(args))
    op.start()
    return op


def _conflict_events(kube: Kube, name: str) -> list[dict[str, Any]]:
    out = kube.kubectl("get", "events", "-o", "json", "--field-selector",
                       f"involvedObject.name={name},reason=OperatorConflict")  # fmt: skip
    return list(json.loads(out)["items"])


def test_overlapping_watch_scopes_are_reported(
    control_plane: ControlPlane, kubeconfig: Path, kube: Kube, extra_namespaces: list[str]
) -> None:
    home_a, home_b = extra_namespaces
    ops = [_operator(control_plane, kubeconfig, "--namespace", kube.ns,
                     "--leader-election-namespace", home)
           for home in (home_a, home_b)]  # fmt: skip
    try:
        kube.apply_model("shared", spec())
        events = kube.wait(lambda: _conflict_events(kube, "shared"), 90,
                           "an OperatorConflict Event on the model")  # fmt: skip
        message = events[0]["message"]
        installs = {f"{home_a}/spyre-model-operator", f"{home_b}/spyre-model-operator"}
        assert all(i in message for i in installs), message
        assert events[0]["type"] == "Warning"
        assert kube.model("shared")["status"]["operator"]["install"] in installs
        reporters = [op for op in ops
                     if op.metrics().get("spyre_operator_conflicts_total", 0) >= 1]
        assert reporters, "no install counted the conflict"
        for op in reporters:
            assert op.log_path is not None and "OperatorConflict" in op.log_path.read_text()
    finally:
        for op in ops:
            op.stop()


def test_two_releases_in_one_namespace_both_lead_their_own_scope(
    control_plane: ControlPlane, kubeconfig: Path, kube: Kube, extra_namespaces: list[str]
) -> None:
    home, tenant_b = extra_namespaces  # tenant a is kube.ns; both installs live in `home`
    kube_b = Kube(control_plane, tenant_b)
    ops = [_operator(control_plane, kubeconfig, "--namespace", ns,
                     "--leader-election-namespace", home, "--leader-election-lease", lease)
           for ns, lease in ((kube.ns, "tenant-a-spyre"), (tenant_b, "tenant-b-spyre"))]
    try:
        kube.apply_model("a", spec())
        kube_b.apply_model("b", spec())
        tenants = ((kube, "a", "tenant-a-spyre"), (kube_b, "b", "tenant-b-spyre"))
        # both reconciled (with one shared Lease, one operator stayed a standby: no status)
        wait_until(lambda: all((k.model(n).get("status") or {}).get("operator")
                               for k, n, _ in tenants), 90, "both models reconciled")
        for k, name, lease in tenants:
            assert k.model(name)["status"]["operator"]["install"] == f"{home}/{lease}"
        leases = json.loads(control_plane.kubectl("get", "leases", "-n", home, "-o", "json").stdout)
        holders = {item["metadata"]["name"]: item["spec"].get("holderIdentity")
                   for item in leases["items"]}  # fmt: skip
        assert set(holders) >= {"tenant-a-spyre", "tenant-b-spyre"}, holders
        assert all(holders[n] for n in ("tenant-a-spyre", "tenant-b-spyre")), holders
        wait_until(lambda: all(op.metrics().get("spyre_operator_leader") == 1 for op in ops),
                   30, "both installs leading")  # fmt: skip
    finally:
        for op in ops:
            op.stop()


def test_two_running_installs_do_not_take_an_idle_model_from_each_other(
    control_plane: ControlPlane, kubeconfig: Path, kube: Kube, extra_namespaces: list[str],
    crd: Any,
) -> None:
    """Issue 31, item 6: the stamp moves only with a real write, so the other install found
    an idle model's stamp stale after the window and took the model; then the first took it
    back: a status write and a Warning Event per model every window. Now a stale stamp whose
    install holds its Lease is left alone: after the conflict is reported once, the model
    keeps one owner and nobody writes to it while its stamp grows many windows old."""
    window = 2.0
    ops = []
    for home in extra_namespaces:
        op = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                             args=["--namespace", kube.ns, "--leader-election-namespace", home],
                             env={"SPYRE_PEER_WINDOW_SECONDS": str(window)})
        op.start()
        ops.append(op)
    try:
        kube.apply_model("shared", spec())
        kube.wait(lambda: _conflict_events(kube, "shared"), 90, "the conflict reported")
        kube.wait_condition("shared", "Ready", timeout=60)

        def stamp() -> dict[str, Any]:
            return dict(kube.model("shared")["status"]["operator"])

        for op in ops:  # the owner's trailing status writes (before the fix: takeovers)
            settle_writes(op, kube.ns)
        first, writes = stamp(), [op.namespace_writes(kube.ns) for op in ops]

        def age() -> float:
            written = datetime.fromisoformat(stamp()["writtenAt"].replace("Z", "+00:00"))
            return (datetime.now(UTC) - written).total_seconds()

        def same_owner_no_write() -> bool:
            assert stamp()["install"] == first["install"], (
                f"taken from {first['install']} by {stamp()['install']}")
            assert [op.namespace_writes(kube.ns) for op in ops] == writes, "a write to it"
            return age() >= 5 * window

        wait_until(same_owner_no_write, 120, f"the idle model's stamp {5 * window:.0f}s old")
    finally:
        for op in ops:
            op.stop()
