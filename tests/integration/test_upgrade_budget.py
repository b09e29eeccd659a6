"""A new cluster-wide default engine image reaches 10 models, staged by the compile budget.

On the real API server (kwok plays the pods): the operator runs with
``--default-engine-image`` and ``--max-concurrent-compiles 3``; 10 SpyreModels that leave
``engine.image`` unset serve. The admin's upgrade is a restart with a new default (what a
``helm upgrade --set defaults.engineImage=...`` does): no model is edited, every key changes,
and the precompile Jobs (held by kwok until the test, playing the compiler, lets one finish)
run at most 3 at a time, the oldest waiting model first, while every model keeps serving its
previous artifact until its own new one is ready.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Kube, OperatorProcess

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
HOLD = {"kwok.spyre.dev/hold": "true"}
OLD, NEW = "registry.local/spyre-engine:1.0", "registry.local/spyre-engine:2.0"
MODELS = [f"m{i}" for i in range(10)]
BUDGET = 3


def _spec(i: int) -> dict[str, Any]:
    return {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        # distinct keys; shapes the plugin's table does not list (kwok plays the compile)
        "compile": {"maxModelLen": 2048 + 64 * i, "requireKnownConfiguration": False},
        "precompile": {"backoffLimit": 0, "podAnnotations": HOLD},
    }


def _operator(kube: Kube, image: str) -> OperatorProcess:
    op = OperatorProcess(
        kube.cp.kubeconfig, kube.cp.root / ".cluster" / "logs",
        args=["--namespace", kube.ns, "--no-leader-elect", "--default-engine-image", image,
              "--max-concurrent-compiles", str(BUDGET)],
    )  # fmt: skip
    op.start()
    return op


def _jobs(kube: Kube) -> list[dict[str, Any]]:
    return kube.items("jobs", "app.kubernetes.io/managed-by=spyre-model-operator")


def _running(job: dict[str, Any]) -> bool:
    conds = {c["type"] for c in (job.get("status") or {}).get("conditions") or []
             if c.get("status") == "True"}  # fmt: skip
    return not conds & {"Complete", "Failed"}


def _compile_all(kube: Kube, image: str) -> dict[str, Any]:
    """Play the compiler: let one held precompile pod finish at a time until every model
    serves an artifact of ``image``; what was seen on the way."""
    seen: dict[str, Any] = {"max_running": 0, "waiting": set(), "order": []}

    def done() -> bool:
        running = [j for j in _jobs(kube) if _running(j)]
        seen["max_running"] = max(seen["max_running"], len(running))
        models = {n: kube.model(n) for n in MODELS}
        for n, m in models.items():
            conds = {c["type"]: c for c in (m.get("status") or {}).get("conditions") or []}
            if conds.get("ArtifactReady", {}).get("reason") == "WaitingForCompileSlot":
                seen["waiting"].add(n)
        if all(_serves(m, image) for m in models.values()):
            return True
        held = sorted((j for j in running if j["metadata"]["name"] not in seen["order"]),
                      key=lambda j: j["metadata"]["creationTimestamp"])  # fmt: skip
        if held:
            name = held[0]["metadata"]["name"]
            seen["order"].append(name)
            kube.kubectl("annotate", "pods", "-l", f"job-name={name}", "kwok.spyre.dev/hold-")
        return False

    kube.wait(done, 300, f"every model serving an artifact of {image}")
    return seen


def _serves(m: dict[str, Any], image: str) -> bool:
    st = m.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
    return (ready.get("reason") == "Serving" and (st.get("effective") or {}).get("engineImage")
            == image and st.get("servingArtifactKey") == (st.get("artifact") or {}).get("key"))


@pytest.fixture
def models(kube: Kube, no_host_operator: None) -> Iterator[OperatorProcess]:
    op = _operator(kube, OLD)
    try:
        for i, n in enumerate(MODELS):
            kube.apply_model(n, _spec(i))
        yield op
    finally:
        op.stop()


def test_a_new_default_image_recompiles_every_model_three_at_a_time(
    kube: Kube, models: OperatorProcess
) -> None:
    first = _compile_all(kube, OLD)
    assert first["max_running"] <= BUDGET, first
    assert first["waiting"], "10 first compiles with 3 slots: some model waited its turn"
    old_keys = {n: kube.model(n)["status"]["servingArtifactKey"] for n in MODELS}
    generations = {n: kube.model(n)["metadata"]["generation"] for n in MODELS}

    # the admin's upgrade: a new default, no model edited
    models.stop()
    op = _operator(kube, NEW)
    try:
        def all_following() -> bool:
            return all((kube.model(n)["status"].get("artifact") or {}).get("key") != old_keys[n]
                       for n in MODELS)  # fmt: skip

        kube.wait(all_following, 60, "every model planned with the new default image")
        for n in MODELS:  # still serving the old artifact, nothing lost
            m = kube.model(n)
            assert m["metadata"]["generation"] == generations[n], "a model was edited"
            dep = kube.get("deployment", n)
            assert dep["metadata"]["labels"][f"{GROUP}/artifact"] == old_keys[n][:12]
            ready = next(c for c in m["status"]["conditions"] if c["type"] == "Ready")
            assert ready["status"] == "True", (n, ready)
        second = _compile_all(kube, NEW)
    finally:
        op.stop()
    assert second["max_running"] <= BUDGET, second
    assert len(second["waiting"]) >= len(MODELS) - BUDGET, second["waiting"]
    for n in MODELS:
        m = kube.model(n)
        assert m["status"]["effective"]["engineImage"] == NEW
        assert "engine.image" in m["status"]["effective"].get("fromDefaults", []), m["status"]
        assert m["status"]["servingArtifactKey"] != old_keys[n]
