"""The worked examples of docs/verified-promotion.md, computed by the operator's own code.

Each example builds one situation of verified promotion (the output check and the canary) the
way tests/unit/test_canary.py does: a SpyreModel and what the operator observes of its
children, passed through the pure reconcile decision (``decide``) at fixed times. The engine's
side is the engine's own code too: the output check's verdict (spyre_engine.answers) and the
canary's (spyre_engine.canary) write the termination messages the operator reads. What the
page shows is an excerpt of the resulting object as ``kubectl get spyremodel -o yaml`` prints
it (keys sorted; conditions without ``lastTransitionTime`` and ``observedGeneration``).

The page holds each block between ``<!-- example: NAME -->`` and ``<!-- end -->``.
tests/unit/test_verified_promotion_doc.py fails when a block differs from what this computes;
``python -m tests.docs_examples --write`` rewrites the blocks.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from spyre_engine import answers as engine_answers
from spyre_engine import canary as engine_canary
from spyre_engine.summary import REASON_ENGINE_FAILED, FailureSummary
from spyre_operator.api import SpyreModelSpec
from spyre_operator.control.common import compact_pod
from spyre_operator.decide import Decision, Observed, decide
from spyre_operator.decide import conditions as C
from spyre_operator.decide.canary_report import CanaryReport, ServedReport
from spyre_operator.decide.observed import CANARY_ABORT_ANNOTATION, CANARY_PROMOTE_ANNOTATION
from spyre_operator.desired import names
from spyre_operator.desired.plan import ModelPlan, plan_model

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "verified-promotion.md"
REGENERATE = "python -m tests.docs_examples --write"

NAME, NAMESPACE, UID = "granite", "team-a", "uid-granite"
OLD_IMAGE = "registry.example.com/spyre/spyre-engine:1.0"
NEW_IMAGE = "registry.example.com/spyre/spyre-engine:1.1"
CANARY = {"replicas": 1, "durationSeconds": 600, "minRequests": 50, "maxErrorRatio": 0.05,
          "maxMeanLatencySeconds": 2.0}  # fmt: skip
#: The model of every example: a new engine image makes a new artifact (its key includes the
#: image), which is what verified promotion is for.
SPEC: dict[str, Any] = {
    "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@a1b2c3"},
    "engine": {"image": NEW_IMAGE},
    "replicas": 2,
    "serving": {"canary": CANARY},
}
#: The output check's example: no canary, a spare card for the switch.
NO_CANARY_SPEC: dict[str, Any] = {
    **{k: v for k, v in SPEC.items() if k != "serving"},
    "serving": {"rollout": {"maxSurge": 1, "maxUnavailable": 0}},
}

# The clock: the previous artifact served since 09:10; the new one compiled at 10:02:30.
SERVED = "2026-11-21T09:10:00Z"
COMPILED = "2026-11-21T10:02:30Z"
CANARY_CREATED = "2026-11-21T10:03:00Z"
CANARY_READY = "2026-11-21T10:04:30Z"
MID_WINDOW = "2026-11-21T10:09:30Z"
WINDOW_OVER = "2026-11-21T10:15:00Z"  # 600 s after CANARY_READY, and 30 s more
DEADLINE = "2026-11-21T10:43:00Z"  # CANARY_CREATED + durationSeconds + 1800

CANARY_POD = "granite-canary-6d5f8b9c7-x2k4q"
NEW_POD = "granite-7c9d4f6b5-m8p2t"
#: The previous artifact's two pods (the baseline), and what each had served when the canary's
#: window started (since 09:10: 3,000 requests, 180 ms to the first token, 40 ms per token).
OLD_PODS = ("granite-5b8c7d9f4-h2j6k", "granite-5b8c7d9f4-q9w3e")
BASELINE_BEFORE = ServedReport(3000, 1, 5400.0, ttft=(540.0, 3000), tpot=(120.0, 3000))


# ------------------------------------------------------------------------------ the cluster


def _model(spec: dict[str, Any], status: dict[str, Any] | None = None,
           annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": NAME, "namespace": NAMESPACE, "uid": UID, "generation": 2}
    if annotations:
        meta["annotations"] = dict(annotations)
    body: dict[str, Any] = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
                            "metadata": meta, "spec": copy.deepcopy(spec)}  # fmt: skip
    if status is not None:
        body["status"] = copy.deepcopy(status)
    return body


def plan_for(m: dict[str, Any]) -> ModelPlan:
    return plan_model(NAME, NAMESPACE, UID, SpyreModelSpec.model_validate(m["spec"]))


_CLAIM = {
    "metadata": {"labels": {"app.kubernetes.io/managed-by": "spyre-model-operator"},
                 "uid": "pvc-uid-1", "creationTimestamp": "2026-11-01T09:00:00Z"},
    "spec": {"volumeName": "pv-1"},
    "status": {"phase": "Bound"},
}  # fmt: skip


def _compiled(m: dict[str, Any]) -> Observed:
    """The model's precompile Job finished: its pod's summary says what it recorded."""
    plan = plan_for(m)
    job = {
        "metadata": {"name": plan.job_name, "uid": "job-uid", "resourceVersion": "5",
                     "ownerReferences": [{"kind": "SpyreModel", "name": NAME, "uid": UID}]},
        "status": {"startTime": "2026-11-21T10:00:00Z", "completionTime": COMPILED,
                   "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
    }  # fmt: skip
    summary = ('{"key":null,"path":"/cache/x","compileSeconds":150.0,"sizeBytes":3221225472,'
               '"versions":{},"references":{"source":"eager","prompts":8,"tokens":128,'
               '"tolerance":0.08}}')  # fmt: skip
    obs = Observed(cache_pvc=_CLAIM, job=job)
    obs.job_pods = [{"name": f"{plan.job_name}-abcde",
                     "terminated": {"exitCode": 0, "message": summary, "finishedAt": COMPILED}}]
    return obs


def _available(deployment: dict[str, Any], n: int, replicas: int | None = None) -> dict[str, Any]:
    dep = copy.deepcopy(deployment)
    dep["metadata"]["generation"] = 1
    total = n if replicas is None else replicas
    dep["status"] = {"observedGeneration": 1, "replicas": total, "updatedReplicas": total,
                     "readyReplicas": n, "availableReplicas": n}  # fmt: skip
    return dep


def _deployment(d: Decision, name: str) -> dict[str, Any]:
    dep = next(o for o in d.apply if o.kind == "Deployment" and o.metadata.name == name)
    out: dict[str, Any] = dep.to_dict()
    return out


def _with_status(m: dict[str, Any], d: Decision) -> dict[str, Any]:
    m = copy.deepcopy(m)
    m["status"] = copy.deepcopy(d.status)
    return m


def _pod(name: str, key: str, *, canary: bool, ready_since: str | None = None,
         waiting: tuple[str, str] | None = None,
         terminated: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A serving pod as the API server lists it, reduced by the operator's own compact_pod."""
    labels = {**names.server_selector(NAME), names.ARTIFACT_LABEL: names.short_key(key)}
    if canary:
        labels[names.CANARY_LABEL] = "true"
    cs: dict[str, Any] = {"ready": ready_since is not None}
    if waiting is not None:
        cs["state"] = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    else:
        cs["state"] = {"running": {"startedAt": CANARY_CREATED}}
    if terminated is not None:
        cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error",
                                          "message": terminated, "finishedAt": MID_WINDOW}}
    conds = [{"type": "PodScheduled", "status": "True"}]
    if ready_since is not None:
        conds.append({"type": "Ready", "status": "True", "lastTransitionTime": ready_since})
    pod = {"metadata": {"name": name, "labels": labels, "creationTimestamp": CANARY_CREATED},
           "spec": {"nodeName": "spyre-node-2"},
           "status": {"phase": "Running" if waiting is None else "Pending",
                      "containerStatuses": [cs], "conditions": conds}}  # fmt: skip
    return compact_pod(pod)


# ------------------------------------------------------------------------------ the engine


def _output_mismatch() -> str:
    """The termination message of a pod whose answers left the reference (engine's verdict):
    seven of the eight reference prompts (the six short ones, ``long`` and ``prefix``: answers.
    shaped_prompts) answered as recorded, the third one not."""
    refs, got = [], []
    ids = [f"p{i}" for i in range(len(engine_answers.DEFAULT_PROMPTS))] + ["long", "prefix"]
    for i, pid in enumerate(ids):
        prompt = [100 + i, 200 + i, 300 + i]
        tokens, logprobs = [1000 + i, 11, 220, 16, 13], [-0.05, -0.2, -0.1, math.log(0.91), -0.3]
        refs.append(engine_answers.Answer(pid, prompt, tokens, logprobs))
        if i == 2:  # position 3: another token, far less likely than the reference's was
            tokens, logprobs = [*tokens[:3], 17, 13], [*logprobs[:3], math.log(0.62), -0.3]
        got.append(engine_answers.Answer(pid, prompt, tokens, logprobs))
    verdict = engine_answers.judge(refs, got, engine_answers.DEFAULT_TOLERANCE)
    return FailureSummary(reason=C.OUTPUT_MISMATCH, message=verdict.message(),
                          output_check=verdict.summary()).to_line()  # fmt: skip


def _canary_failed() -> str:
    """The termination message of a canary pod whose own requests broke the bounds."""
    spec = SPEC["serving"]["canary"]
    bounds = engine_canary.CanaryBounds(spec["durationSeconds"], spec["maxErrorRatio"],
                                        spec["minRequests"], spec["maxMeanLatencySeconds"])
    tally = engine_canary.Tally()
    why = None
    for i in range(200):
        tally.add(500 if i % 6 == 5 else 200, 0.8)
        why = engine_canary.verdict(bounds, tally)
        if why is not None:
            break
    assert why is not None
    return FailureSummary(reason=C.CANARY_FAILED, message=why).to_line()


# ------------------------------------------------------------------------------ the situations


def _served_then_new_image(spec: dict[str, Any]) -> tuple[dict[str, Any], Observed]:
    """The model served the artifact of OLD_IMAGE on every replica; its spec now names
    NEW_IMAGE, whose artifact has just compiled. Returns (the model, what the operator sees)."""
    old_spec = copy.deepcopy(spec)
    old_spec["engine"] = {"image": OLD_IMAGE}
    a = _model(old_spec)
    d = decide(a, _compiled(a), SERVED)
    serving = _available(_deployment(d, NAME), 2)
    obs = _compiled(a)
    obs.deployment = serving
    d = decide(_with_status(a, d), obs, SERVED)
    b = _model(spec, d.status)
    obs = _compiled(b)
    obs.deployment = serving
    return b, obs


def _canary_started() -> tuple[dict[str, Any], Observed, Decision]:
    """The canary of the new artifact was created, and its pod turned Ready."""
    b, obs = _served_then_new_image(SPEC)
    d = decide(b, obs, CANARY_CREATED)
    obs.canary_deployment = _available(_deployment(d, names.canary_name(NAME)), 1)
    obs.server_pods = [_pod(CANARY_POD, plan_for(b).key, canary=True, ready_since=CANARY_READY),
                       *(_pod(p, _old_key(b), canary=False, ready_since=SERVED)
                         for p in OLD_PODS)]  # fmt: skip
    obs.served_reports = _served(0, 0.0, 0.0)
    b = _with_status(b, d)
    d = decide(b, obs, CANARY_READY)
    return _with_status(b, d), obs, d


def _old_key(b: dict[str, Any]) -> str:
    return str((b.get("status") or {}).get("servingArtifactKey") or "")


def _served(
    judged: int, ttft: float, tpot: float, baseline: tuple[float, float] = (0.18, 0.04)
) -> dict[str, ServedReport | str]:
    """What the pods say they served: the canary ``judged`` requests at ``ttft`` and ``tpot``
    seconds; each baseline pod twice as many as the canary in the same time, at
    ``baseline``'s."""
    out: dict[str, ServedReport | str] = {
        CANARY_POD: ServedReport(judged, 0, judged * 1.2, ttft=(judged * ttft, judged),
                                 tpot=(judged * tpot, judged)),
    }  # fmt: skip
    b = BASELINE_BEFORE
    for pod in OLD_PODS:
        n = 2 * judged
        out[pod] = ServedReport(
            b.judged + n, b.errors, b.seconds + n * 1.2,
            ttft=(b.ttft[0] + n * baseline[0], b.ttft[1] + n),  # type: ignore[index]
            tpot=(b.tpot[0] + n * baseline[1], b.tpot[1] + n),  # type: ignore[index]
        )  # fmt: skip
    return out


def _settled(
    m: dict[str, Any], obs: Observed, d: Decision, now: str
) -> tuple[dict[str, Any], Decision]:
    """After a refusal: what the decision wrote happened (the canary and the refusing pods
    are gone, the main Deployment serves the previous artifact on every replica); the state
    the model stays in until its spec changes or a retry is asked for."""
    m = _with_status(m, d)
    obs.canary_deployment, obs.server_pods = None, []
    obs.deployment = _available(_deployment(d, NAME), m["spec"]["replicas"])
    return m, decide(m, obs, now)


def output_mismatch() -> tuple[dict[str, Any], Decision]:
    b, obs = _served_then_new_image(NO_CANARY_SPEC)
    d = decide(b, obs, COMPILED)  # the Deployment switches to the new artifact
    obs.deployment = _available(_deployment(d, NAME), 2, replicas=3)
    crashed = ("CrashLoopBackOff", "back-off 10s restarting failed container")
    obs.server_pods = [_pod(NEW_POD, plan_for(b).key, canary=False, waiting=crashed,
                            terminated=_output_mismatch())]  # fmt: skip
    b = _with_status(b, d)
    return _settled(b, obs, decide(b, obs, MID_WINDOW), MID_WINDOW)


def _canary_judged(judged: int, errors: int, at: str,
                   annotations: dict[str, str] | None = None) -> tuple[dict[str, Any], Decision]:
    """The canary pod has counted ``judged`` requests (``errors`` of them failed) at ``at``."""
    b, obs, _ = _canary_started()
    obs.canary_reports = {CANARY_POD: CanaryReport(judged=judged, errors=errors)}
    obs.served_reports = _served(judged, 0.21, 0.042)
    if annotations:
        b["metadata"]["annotations"] = annotations
    return b, decide(b, obs, at)


def canary_running() -> tuple[dict[str, Any], Decision]:
    return _canary_judged(31, 0, MID_WINDOW)


def canary_awaiting_traffic() -> tuple[dict[str, Any], Decision]:
    return _canary_judged(12, 0, WINDOW_OVER)


def window_passed() -> tuple[dict[str, Any], Decision]:
    return _canary_judged(214, 2, WINDOW_OVER)


def promoted_by_annotation() -> tuple[dict[str, Any], Decision]:
    b, _, _ = _canary_started()
    return _canary_judged(31, 0, MID_WINDOW, {CANARY_PROMOTE_ANNOTATION: plan_for(b).short_key})


def canary_aborted() -> tuple[dict[str, Any], Decision]:
    b, obs, _ = _canary_started()
    b["metadata"]["annotations"] = {CANARY_ABORT_ANNOTATION: plan_for(b).short_key}
    return _settled(b, obs, decide(b, obs, MID_WINDOW), MID_WINDOW)


def canary_failed() -> tuple[dict[str, Any], Decision]:
    b, obs, _ = _canary_started()
    obs.canary_deployment = _available(obs.canary_deployment or {}, 0, replicas=1)
    obs.server_pods = [_pod(CANARY_POD, plan_for(b).key, canary=True,
                            terminated=_canary_failed())]  # fmt: skip
    return _settled(b, obs, decide(b, obs, MID_WINDOW), MID_WINDOW)


def slower_than_baseline() -> tuple[dict[str, Any], Decision]:
    """The window is over with the requests it needs, but the new artifact takes 3x the
    previous one's time to the first token: refused on the next reconcile."""
    b, obs, _ = _canary_started()
    obs.canary_reports = {CANARY_POD: CanaryReport(judged=214, errors=0)}
    obs.served_reports = _served(214, 0.54, 0.043)
    d = decide(b, obs, WINDOW_OVER)
    b = _with_status(b, d)
    return _settled(b, obs, decide(b, obs, WINDOW_OVER), WINDOW_OVER)


def canary_deadline_exceeded() -> tuple[dict[str, Any], Decision]:
    b, obs = _served_then_new_image(SPEC)
    d = decide(b, obs, CANARY_CREATED)
    obs.canary_deployment = _available(_deployment(d, names.canary_name(NAME)), 0, replicas=1)
    obs.server_pods = [_pod(CANARY_POD, plan_for(b).key, canary=True, waiting=(
        "CrashLoopBackOff", "back-off 5m0s restarting failed container"),
        terminated=FailureSummary(reason=REASON_ENGINE_FAILED, message=(
            "vLLM exited with code 1: RuntimeError: no Spyre device found")).to_line())]
    b = _with_status(b, d)
    d = decide(b, obs, MID_WINDOW)
    b = _with_status(b, d)
    return _settled(b, obs, decide(b, obs, DEADLINE), DEADLINE)


# ------------------------------------------------------------------------------ the excerpts


@dataclass(frozen=True)
class Example:
    """One block of the page: the situation, and what of the object the page shows."""

    build: Callable[[], tuple[dict[str, Any], Decision]]
    #: condition types shown (with status, reason and message)
    conditions: tuple[str, ...]
    #: status fields shown, each with the keys shown (None: all)
    fields: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    #: show the model's annotations
    annotations: bool = False
    #: the reason it leads to, when its name is not one (a case of a reason)
    reason: str | None = None


_FAILED = ("artifactKey", "phase", "reason")
_SERVING = ("servingArtifactKey", None)

#: The examples, in the page's order; the table of conditions (gitops) shows Ready,
#: Progressing and Degraded of each.
EXAMPLES: dict[str, Example] = {
    C.OUTPUT_MISMATCH: Example(
        output_mismatch, (C.DEGRADED,),
        (("outputCheck", ("artifactKey", "result", "time")),
         ("artifact", ("key", "phase", "reason", "references")), _SERVING),
    ),
    C.CANARY_RUNNING: Example(
        canary_running, (C.PROGRESSING,),
        (("canary", ("artifactKey", "phase", "deadlineTime", "startTime", "judgedRequests",
                     "minRequests")),),
    ),
    C.CANARY_AWAITING_TRAFFIC: Example(
        canary_awaiting_traffic, (C.PROGRESSING,),
        (("canary", ("phase", "startTime", "deadlineTime", "judgedRequests", "minRequests")),),
    ),
    C.WINDOW_PASSED: Example(
        window_passed, (),
        (("canary", ("phase", "reason", "message", "passedTime", "comparison")),),
    ),
    C.PROMOTED_BY_ANNOTATION: Example(
        promoted_by_annotation, (),
        (("canary", ("phase", "reason", "message", "passedTime")),),
        annotations=True,
    ),
    C.CANARY_FAILED: Example(
        canary_failed, (C.DEGRADED,), (("canary", _FAILED),),
    ),
    "SlowerThanBaseline": Example(
        slower_than_baseline, (C.DEGRADED,),
        (("canary", (*_FAILED, "comparison")),), reason=C.CANARY_FAILED,
    ),
    C.CANARY_DEADLINE_EXCEEDED: Example(
        canary_deadline_exceeded, (C.DEGRADED,),
        (("canary", _FAILED),),
    ),
    C.CANARY_ABORTED: Example(
        canary_aborted, (C.DEGRADED,), (("canary", _FAILED),), annotations=True,
    ),
}  # fmt: skip


class _Dumper(yaml.SafeDumper):
    """kubectl's look: keys sorted, lists not indented under their key, "True" and times in
    double quotes."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # A string YAML would read as something else (a boolean, a time) or an empty one: quoted.
    plain = dumper.resolve(yaml.ScalarNode, value, (True, False))
    style = '"' if not value or plain != "tag:yaml.org,2002:str" else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def excerpt(name: str) -> dict[str, Any]:
    """What the page shows of the example ``name``'s object."""
    ex = EXAMPLES[name]
    m, d = ex.build()
    status: dict[str, Any] = {}
    shown = [{k: c[k] for k in ("type", "status", "reason", "message")}
             for c in d.status["conditions"] if c["type"] in ex.conditions]  # fmt: skip
    if shown:
        status["conditions"] = shown
    for field, keys in ex.fields:
        value = d.status.get(field)
        if isinstance(value, dict) and keys is not None:
            value = {k: value[k] for k in keys if k in value}
        status[field] = value
    out: dict[str, Any] = {}
    if ex.annotations:
        out["metadata"] = {"annotations": m["metadata"].get("annotations") or {}}
    out["status"] = status
    return out


def render(name: str) -> str:
    """The fenced block the page holds for ``name``."""
    text = yaml.dump(excerpt(name), Dumper=_Dumper, sort_keys=True, width=100,
                     default_flow_style=False, allow_unicode=True)  # fmt: skip
    return f"```yaml\n{text}```\n"


def spec_block() -> str:
    """The examples' SpyreModel (the block named ``spec``). No namespace: the page says it is
    team-a's, and tests/integration/test_documented_models.py applies every documented model
    in a namespace of its own (kubectl refuses a manifest naming another)."""
    body = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
            "metadata": {"name": NAME}, "spec": SPEC}  # fmt: skip
    return f"```yaml\n{yaml.dump(body, Dumper=_Dumper, sort_keys=False)}```\n"


HEALTH_LUA = ROOT / "charts" / "spyre-model-operator" / "argocd" / "health.lua"


def argocd_health(obj: dict[str, Any]) -> str:
    """The chart's Argo CD health check on ``obj``, run as Argo CD runs it (Lua 5.1, the base
    and table libraries, ``obj`` global; tests/unit/test_argocd_health.py does the same)."""
    import lupa.lua51 as lupa

    rt = lupa.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    for lib in ("string", "os", "io", "math", "debug"):
        rt.execute(f"{lib} = nil")

    def to_lua(v: Any) -> Any:
        if isinstance(v, dict):
            return rt.table_from({k: to_lua(x) for k, x in v.items()})
        if isinstance(v, list):
            return rt.table_from([to_lua(x) for x in v])
        return v

    rt.globals().obj = to_lua(obj)
    return str(rt.execute(f"return function() {HEALTH_LUA.read_text()} end")()["status"])


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's generic rule (cli-utils, what Flux reads): status.observedGeneration behind
    is InProgress; else the first of the conditions, in their order, that is Reconciling=True
    (InProgress) or Stalled=True (Failed); else Current."""
    if (obj.get("status") or {}).get("observedGeneration") != obj["metadata"].get("generation"):
        return "InProgress"
    for c in obj["status"].get("conditions") or []:
        if c["type"] == C.RECONCILING and c["status"] == C.TRUE:
            return "InProgress"
        if c["type"] == C.STALLED and c["status"] == C.TRUE:
            return "Failed"
    return "Current"


def gitops_table() -> str:
    """Per example: Ready, Progressing and Degraded, and what Argo CD and Flux make of them."""
    rows = ["| Example | Ready | Progressing | Degraded | Argo CD | Flux (kstatus) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for name, ex in EXAMPLES.items():
        m, d = ex.build()
        obj = {**m, "status": d.status}
        by = {c["type"]: c for c in d.status["conditions"]}
        cells = [f"{by[t]['status']} `{by[t]['reason']}`" for t in (C.READY, C.PROGRESSING,
                                                                     C.DEGRADED)]  # fmt: skip
        rows.append(f"| [{name}](#{name.lower()}) | {' | '.join(cells)} | "
                    f"{argocd_health(obj)} | {kstatus(obj)} |")  # fmt: skip
    return "\n".join(rows) + "\n"


def blocks() -> dict[str, str]:
    """Every block of the page, by name, as this code computes it."""
    return {"spec": spec_block(), **{name: render(name) for name in EXAMPLES},
            "gitops": gitops_table()}  # fmt: skip


# ------------------------------------------------------------------------------ the page

_BLOCK = re.compile(r"^<!-- example: (\S+) -->\n(.*?)^<!-- end -->$", re.M | re.S)


def page_blocks(text: str) -> dict[str, str]:
    """The blocks the page holds, by name."""
    return {m.group(1): m.group(2) for m in _BLOCK.finditer(text)}


def rewrite(text: str, computed: dict[str, str]) -> str:
    """``text`` with every block it names replaced by the computed one."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        body = computed.get(name, m.group(2))
        return f"<!-- example: {name} -->\n{body}<!-- end -->"

    return _BLOCK.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the blocks of {PAGE.name}")
    ap.add_argument("name", nargs="*", help="print these blocks (default: all)")
    args = ap.parse_args(argv)
    computed = blocks()
    if args.write:
        text = PAGE.read_text()
        new = rewrite(text, computed)
        missing = sorted(set(computed) - set(page_blocks(text)))
        if new != text:
            PAGE.write_text(new)
        print(f"{PAGE.relative_to(ROOT)}: {'rewritten' if new != text else 'unchanged'}"
              + (f"; no marker for {', '.join(missing)}" if missing else ""))  # fmt: skip
        return 0
    for name in args.name or list(computed):
        print(f"<!-- example: {name} -->\n{computed[name]}<!-- end -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
