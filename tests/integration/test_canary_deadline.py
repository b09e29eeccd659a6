"""A canary whose pod never comes up fails by its deadline (issue 44, 4) on the real control
plane: kwok plays the pods, and the canary's pod never turns Ready
(``kwok.spyre.dev/not-ready``, tests/cluster/kwok/pod-ready-not-ready.yaml, set through the
edit's ``serving.podAnnotations``, which reach the canary's pods only: the main Deployment
keeps the served spec until a promotion). The previous artifact serves throughout; by the
deadline the new artifact is refused with CanaryDeadlineExceeded and its canary removed."""

from __future__ import annotations

from typing import Any

import pytest
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names

from .conftest import Kube, OperatorProcess

pytestmark = pytest.mark.integration

MODEL = "late"
CANARY = {"replicas": 1, "durationSeconds": 10, "deadlineSeconds": 25, "minRequests": 3}


def spec(length: int, seqs: int, **serving: Any) -> dict[str, Any]:
    """A shape the plugin supports for the model (3072 x 16 and 8192 x 4 at tp=1)."""
    return {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        "compile": {"maxModelLen": length, "maxNumSeqs": seqs},
        "precompile": {"backoffLimit": 0},
        "serving": {"canary": CANARY, **serving},
    }


def _served_key(kube: Kube) -> str | None:
    dep = kube.get("deployment", names.server_name(MODEL)) or {}
    return (dep.get("metadata") or {}).get("annotations", {}).get(names.ARTIFACT_KEY_ANNOTATION)


def test_a_canary_whose_pod_never_comes_up_fails_by_its_deadline(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model(MODEL, spec(3072, 16))
    kube.wait_condition(MODEL, "Ready", reason="Serving", timeout=90)
    key1 = kube.model(MODEL)["status"]["servingArtifactKey"]
    kube.apply_model(MODEL, spec(8192, 4, podAnnotations={"kwok.spyre.dev/not-ready": "true"}))
    running = kube.wait(lambda: (s := kube.model(MODEL)["status"].get("canary") or {}).get(
        "phase") == "Running" and s, 90, "the canary running")  # fmt: skip
    assert running["artifactKey"] != key1 and running.get("deadlineTime"), running
    canary = kube.wait(lambda: kube.get("deployment", names.canary_name(MODEL)), 30,
                       "the canary Deployment")  # fmt: skip
    pods = canary["spec"]["template"]["metadata"].get("annotations") or {}
    assert pods.get("kwok.spyre.dev/not-ready") == "true", pods

    def refused() -> dict[str, Any] | None:
        m = kube.model(MODEL)
        art = m["status"].get("artifact") or {}
        return m if art.get("reason") == C.CANARY_DEADLINE_EXCEEDED else None

    # the deadline (25 s from the canary's start) and a reconcile after it
    m = kube.wait(refused, 90, "the new artifact refused by the canary's deadline")
    art, st = m["status"]["artifact"], m["status"]["canary"]
    assert art["phase"] == "Failed" and art["key"] == running["artifactKey"], art
    assert st["phase"] == "Failed" and st["reason"] == C.CANARY_DEADLINE_EXCEEDED, st
    degraded = kube.condition(MODEL, "Degraded")
    assert degraded and degraded["reason"] == C.CANARY_DEADLINE_EXCEEDED, degraded
    ready = kube.wait_condition(MODEL, "Ready", reason=C.SERVING_PREVIOUS_ARTIFACT, timeout=30)
    assert ready["status"] == "True", ready
    # the main Deployment never left the first artifact, nor took the canary's annotation
    assert _served_key(kube) == key1
    main = kube.get("deployment", names.server_name(MODEL))
    assert "kwok.spyre.dev/not-ready" not in (
        main["spec"]["template"]["metadata"].get("annotations") or {}), main["spec"]
    assert (main.get("status") or {}).get("availableReplicas") == 1, main.get("status")
    kube.wait(lambda: kube.get("deployment", names.canary_name(MODEL)) is None, 60,
              "the refused canary removed")  # fmt: skip
