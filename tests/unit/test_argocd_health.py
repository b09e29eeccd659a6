"""The Argo CD health check (charts/spyre-model-operator/argocd/health.lua) on sample objects.

Argo CD runs health checks in gopher-lua (Lua 5.1, base and table libraries only); the script
runs here in Lua 5.1 through lupa with the object as the global ``obj``, exactly as Argo CD
passes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C

from tests.unit.samples import GENERATE, model

lupa = pytest.importorskip("lupa.lua51")

CHART = Path(__file__).resolve().parents[2] / "charts" / "spyre-model-operator"
HEALTH_LUA = CHART / "argocd" / "health.lua"
ARGOCD_CM = CHART / "argocd" / "argocd-cm.yaml"
HEALTH_KEY = "resource.customizations.health.serving.spyre.dev_SpyreModel"


def _to_lua(rt: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return rt.table_from({k: _to_lua(rt, v) for k, v in value.items()})
    if isinstance(value, list):
        return rt.table_from([_to_lua(rt, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """Run health.lua the way Argo CD does: a fresh VM, ``obj`` global, top-level return."""
    rt = lupa.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    # Argo CD opens only the base and table libraries (unless useOpenLibs is set).
    for lib in ("string", "os", "io", "math", "debug"):
        rt.execute(f"{lib} = nil")
    rt.globals().obj = _to_lua(rt, obj)
    fn = rt.execute(f"return function() {HEALTH_LUA.read_text()} end")
    hs = fn()
    return str(hs["status"]), str(hs["message"] or "")


def cond(type_: str, status: str, reason: str, message: str = "", gen: int = 1) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": gen, "lastTransitionTime": "2025-01-01T00:00:00Z"}


def status(ready: tuple[str, str], progressing: tuple[str, str] = ("False", C.RECONCILED),
           degraded: tuple[str, str] = ("False", C.AS_EXPECTED), gen: int = 1,
           cond_gen: int | None = None) -> dict[str, Any]:
    g = gen if cond_gen is None else cond_gen
    return {
        "observedGeneration": gen,
        "conditions": [
            cond(C.READY, *ready, message="1/1 replicas serving", gen=g),
            cond(C.CACHE_VOLUME_READY, "True", C.CLAIM_BOUND, gen=g),
            cond(C.ARTIFACT_READY, "True", C.ARTIFACT_AVAILABLE, gen=g),
            cond(C.PROGRESSING, *progressing, gen=g),
            cond(C.DEGRADED, *degraded, message="exit code 1", gen=g),
        ],
    }


def sample(st: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    return model("granite", GENERATE, generation=generation, status=st)


CASES = {
    "no status yet": (sample(None), "Progressing"),
    "status without conditions": (sample({"observedGeneration": 1}), "Progressing"),
    "serving": (sample(status(("True", C.SERVING))), "Healthy"),
    "scaled to zero": (sample(status(("True", C.SCALED_TO_ZERO))), "Healthy"),
    "compiling": (
        sample(status(("False", C.COMPILING), progressing=("True", C.COMPILING))), "Progressing"),
    "rolling out": (
        sample(status(("False", C.ROLLING_OUT), progressing=("True", C.ROLLING_OUT))),
        "Progressing"),
    "pods not ready": (sample(status(("False", C.PODS_NOT_READY))), "Progressing"),
    "ready unknown": (sample(status(("Unknown", "Pending"))), "Progressing"),
    "new spec compiling, previous artifact serving": (
        sample(status(("True", C.SERVING_PREVIOUS_ARTIFACT),
                      progressing=("True", C.COMPILING))), "Progressing"),
    "new spec failed, previous artifact serving": (
        sample(status(("True", C.SERVING_PREVIOUS_ARTIFACT),
                      degraded=("True", C.PRECOMPILE_FAILED))), "Degraded"),
    "precompile failed": (
        sample(status(("False", C.PRECOMPILE_FAILED), degraded=("True", C.PRECOMPILE_FAILED))),
        "Degraded"),
    "failure reason on Ready only": (
        sample(status(("False", C.ENGINE_FAILED))), "Degraded"),
    "spec edited, operator has not caught up": (
        sample(status(("True", C.SERVING), gen=1), generation=2), "Progressing"),
    "stale conditions": (
        sample(status(("True", C.SERVING), gen=2, cond_gen=1), generation=2), "Progressing"),
}


@pytest.mark.parametrize("obj,expected", list(CASES.values()), ids=list(CASES))
def test_health(obj: dict[str, Any], expected: str) -> None:
    assert health(obj)[0] == expected


@pytest.mark.parametrize(
    "reason",
    [C.PRECOMPILE_FAILED, C.CLAIM_NOT_FOUND, C.CLAIM_LOST, C.ENGINE_FAILED, C.ROLLOUT_STALLED,
     C.INVALID_SPEC, C.ARTIFACT_CORRUPT, C.ARTIFACT_MISMATCH, C.IMAGE_PULL_FAILED,
     C.CONTAINER_CONFIG_ERROR, C.CLAIM_TERMINATING],
)
def test_every_degraded_reason_is_degraded(reason: str) -> None:
    st, message = health(sample(status(("False", reason), degraded=("True", reason))))
    assert st == "Degraded"
    assert reason in message and "exit code 1" in message


def test_message_names_the_condition() -> None:
    assert health(sample(status(("True", C.SERVING))))[1] == (
        "Ready=True (Serving): 1/1 replicas serving")


def test_failure_reasons_match_the_operator() -> None:
    """The Lua's failure set = the operator's warning reasons except transient API errors and
    the routing reasons (RoutingReady only: Argo CD health follows Ready and Degraded), and
    ClaimNearlyFull (a warning on CacheVolumeReady=True; the model serves)."""
    block = re.search(r"failure_reasons = \{(.*?)\}", HEALTH_LUA.read_text(), re.S)
    assert block is not None
    lua_reasons = set(re.findall(r"(\w+) = true", block.group(1)))
    assert lua_reasons == (
        set(C.WARNING_REASONS) - {C.RECONCILE_ERROR, C.CLAIM_NEARLY_FULL} - C.ROUTING_REASONS
    )


def test_status_computed_by_the_operator() -> None:
    """A status from the real reconcile: a fresh model waits for its artifact."""
    m = sample(None)
    d = decide(m, Observed(), "2025-01-01T00:00:00Z")
    m["status"] = d.status
    assert health(m)[0] == "Progressing"


def test_invalid_spec_from_the_operator_is_degraded() -> None:
    m = model("bad", {"model": {"uri": "not-a-uri"}, "replicas": -1})
    m["status"] = decide(m, Observed(), "2025-01-01T00:00:00Z").status
    ready = C.find(m["status"]["conditions"], C.READY)
    assert ready is not None and ready["reason"] == C.INVALID_SPEC
    assert health(m)[0] == "Degraded"


def test_argocd_cm_snippet_is_the_same_script() -> None:
    data = yaml.safe_load(ARGOCD_CM.read_text())["data"]
    assert data[HEALTH_KEY] == HEALTH_LUA.read_text()
