"""Deleted while the operator's watches were broken (issue 31, 1): no ghost, on the real API
server.

kopf resumes a broken watch from its last resourceVersion; an API server that restarted (every
cluster upgrade) answers 410 Gone, and kopf lists again. Its indices take what the list
returns, but what was deleted meanwhile gets no DELETED event and stayed in them for good: the
deleted model was reconciled again, its deleted precompile Job kept the cluster's only compile
slot, and the next model waited for ever. Here the operator is paused (SIGSTOP), the API server
restarted, a model and its running precompile Job deleted, etcd's history compacted past the
deletions (so no watch can be resumed to deliver them: 410 Gone, a re-list), and the operator
resumed: within the re-list period (5 s here; 30 s by default) the waiting model compiles and
nothing of the deleted one is written again.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import urllib.request
from typing import Any

import pytest
from spyre_operator.desired import names

from .conftest import ControlPlane, Kube, OperatorProcess
from .test_operator import HOLD, jobs, spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_host_operator")]


def _job_of(kube: Kube, model: str) -> dict[str, Any] | None:
    for j in jobs(kube):
        refs = j["metadata"].get("ownerReferences") or []
        if (j["metadata"].get("labels") or {}).get(names.COMPONENT) == names.COMPONENT_PRECOMPILE \
                and any(r.get("name") == model for r in refs):
            return j
    return None


def _compact_etcd(cp: ControlPlane) -> int:
    """Compact etcd's history up to its current revision, through etcd's JSON gateway on
    loopback (as the API server's periodic compaction would, later); returns the revision."""
    base = f"http://127.0.0.1:{cp.state['ports']['etcd']}/v3"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    key = base64.b64encode(b"/registry/").decode()
    revision = int(post("/kv/range", {"key": key, "limit": 1})["header"]["revision"])
    post("/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def test_a_model_and_its_job_deleted_during_a_watch_gap_leave_no_ghost(
    kube: Kube, control_plane: ControlPlane, kubeconfig: Any, crd: Any
) -> None:
    op = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                         args=["--all-namespaces", "--max-concurrent-compiles", "1"],
                         env={"SPYRE_RESYNC_SECONDS": "5"})
    op.start()
    try:
        # its compile runs until deleted (kwok holds the precompile pod)
        kube.apply_model("gone", spec(precompile={"backoffLimit": 0, "podAnnotations": HOLD}))
        held = kube.wait(lambda: _job_of(kube, "gone"), 60, "the first model's Job")
        kube.apply_model("next", spec(compile={"maxModelLen": 4096}))
        kube.wait_condition("next", "ArtifactReady", "False", reason="WaitingForCompileSlot")

        assert op.proc is not None
        os.kill(op.proc.pid, signal.SIGSTOP)
        try:
            control_plane.restart(("kube-apiserver",))  # the watches break; 410 on resume
            kube.kubectl("delete", "spyremodel", "gone", "--wait=true", "--timeout=60s")
            kube.kubectl("delete", "job", held["metadata"]["name"], "--wait=true",
                         "--timeout=60s")
            assert _compact_etcd(control_plane) > 0
        finally:
            assert op.log_path is not None
            resumed_at = op.log_path.stat().st_size
            os.kill(op.proc.pid, signal.SIGCONT)

        # The slot is free: the waiting model's compile starts within a re-list period.
        kube.wait(lambda: _job_of(kube, "next"), 60, "the waiting model's Job")
        kube.wait(lambda: (kube.condition("next", "ArtifactReady") or {}).get("reason")
                  != "WaitingForCompileSlot", 60, "the waiting model out of the queue")
        # Nothing of the deleted model was written again: a ghost reconcile created its Job
        # anew (the garbage collector then removed it: only the operator's log tells).
        with open(op.log_path, "rb") as f:
            f.seek(resumed_at)
            after = f.read().decode(errors="replace")
        ns, job = kube.ns, held["metadata"]["name"]
        created = [line for line in after.splitlines()
                   if "Created" in line and (f"{ns}/{job}" in line or line.endswith(f"{ns}/gone"))]
        assert created == [], created
        assert "deleted while the watches were broken" in after, after[-3000:]
    finally:
        op.stop()
