"""Issue 30, item 4: a pod restarted on an artifact that already passed its output check does
not check again. The operator names that artifact in ``<model>-output-check`` (from status
alone), each pod template reads it through an optional configMapKeyRef, and a template an
earlier operator wrote keeps its bytes (an upgrade rolls no model)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from spyre_engine.cli import build_parser, load_settings
from spyre_engine.settings import ServeSettings, split_passthrough
from spyre_operator.api.v1alpha1 import SpyreModelStatus
from spyre_operator.decide import Observed, decide
from spyre_operator.desired import names
from spyre_operator.desired.verified import VERIFIED_ENV

from .samples import GENERATE
from .test_reconcile import deployment_obj, plan_for
from .test_rollback import T0, _complete, _with_status, model


def _configmap(d: Any) -> dict[str, Any] | None:
    cm = next((o for o in d.apply if o.kind == "ConfigMap"), None)
    return cm.to_dict() if cm is not None else None


def _env(dep: dict[str, Any]) -> list[dict[str, Any]]:
    [container] = dep["spec"]["template"]["spec"]["containers"]
    return [e for e in container.get("env") or [] if e["name"] == VERIFIED_ENV]


def _main(d: Any) -> dict[str, Any]:
    dep: dict[str, Any] = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    return dep


#: What an engine's precompile says of the reference answers it recorded.
REFERENCES = {"source": "eager", "prompts": 8, "tokens": 128, "tolerance": 0.08}


def _compiled(m: dict[str, Any], references: bool = True) -> Observed:
    """The model's precompile finished, with reference answers (or none: a pooling model, an
    engine from before the check, a compile under outputCheck Off)."""
    obs = _complete(m)
    if references:
        summary = {**json.loads(obs.job_pods[0]["terminated"]["message"]),
                   "references": REFERENCES}
        obs.job_pods[0]["terminated"]["message"] = json.dumps(summary)
    return obs


def _served(spec: dict[str, Any], references: bool = True
            ) -> tuple[dict[str, Any], Any, Observed]:
    """The model compiled, then its Deployment rolled out with every replica available."""
    m = model("m", spec)
    d = decide(m, _compiled(m, references), T0)
    assert _configmap(d) is None, "nothing served yet, nothing verified"
    obs = _compiled(m, references)
    obs.deployment = deployment_obj(d, ready=1)
    return _with_status(m, d.status), decide(_with_status(m, d.status), obs, T0), obs


def test_the_artifact_that_served_every_replica_is_named_and_each_pod_reads_its_entry() -> None:
    m, d, _ = _served(GENERATE)
    key = plan_for(m).key
    assert d.status["lastGoodArtifactKey"] == key
    cm = _configmap(d)
    assert cm is not None and cm["metadata"]["name"] == names.verified_name("m")
    assert list(cm["data"]) == [names.short_key(key)], cm
    assert cm["metadata"]["ownerReferences"][0]["name"] == "m"
    [env] = _env(_main(d))
    ref = env["valueFrom"]["configMapKeyRef"]
    assert ref == {"name": names.verified_name("m"), "key": names.short_key(key),
                   "optional": True}  # fmt: skip
    # The engine's own settings read the value the kubelet resolves from that entry.
    ours, passthrough = split_passthrough(["serve", "--model", "x", "--artifact-dir", "/a"])
    flags = {k: v for k, v in vars(build_parser().parse_args(ours)).items() if k != "command"}
    os.environ[VERIFIED_ENV] = cm["data"][names.short_key(key)]
    try:
        settings = load_settings("serve", flags, passthrough)
    finally:
        del os.environ[VERIFIED_ENV]
    assert isinstance(settings, ServeSettings)
    assert settings.output_verified == cm["data"][names.short_key(key)]


def test_an_artifact_served_under_warn_or_off_is_not_named_and_off_reads_nothing() -> None:
    for mode in ("Warn", "Off"):
        spec = copy.deepcopy(GENERATE)
        spec["serving"] = {**spec.get("serving", {}), "outputCheck": mode}
        _, d, _ = _served(spec)
        assert d.status["lastGoodArtifactKey"]
        assert _configmap(d) is None, mode
        assert bool(_env(_main(d))) == (mode == "Warn"), mode


def test_a_template_an_earlier_operator_wrote_is_kept_until_its_next_artifact() -> None:
    """A live Deployment serving the spec's artifact without the reference keeps its template
    (an upgrade of the operator restarts no model); the next artifact's template has it."""
    m, d, obs = _served(GENERATE)
    old = copy.deepcopy(obs.deployment)
    assert old is not None
    for c in old["spec"]["template"]["spec"]["containers"]:
        c["env"] = [e for e in c["env"] if e["name"] != VERIFIED_ENV]
    obs.deployment = old
    d = decide(m, obs, T0)
    assert _env(_main(d)) == [], "the earlier operator's template changed: every model rolls"
    assert _main(d)["spec"]["template"] == old["spec"]["template"]
    edited = copy.deepcopy(GENERATE)
    edited["compile"] = {"maxModelLen": 3072}
    m2 = _with_status(model("m", edited), d.status)
    obs2 = _complete(m2)
    obs2.deployment = old
    d2 = decide(m2, obs2, T0)
    assert _main(d2)["metadata"]["annotations"][names.ARTIFACT_KEY_ANNOTATION] == plan_for(m2).key
    [env] = _env(_main(d2))
    assert env["valueFrom"]["configMapKeyRef"]["key"] == names.short_key(plan_for(m2).key)


def test_a_same_named_configmap_that_is_not_ours_is_reported_and_not_written() -> None:
    m, d, obs = _served(GENERATE)
    obs.foreign["ConfigMap"] = (
        f"ConfigMap {names.verified_name('m')} exists and is not managed by the operator: "
        "delete it or rename the SpyreModel")
    d = decide(m, obs, T0)
    assert _configmap(d) is None
    assert "not managed by the operator" in json.dumps(d.status["conditions"])


def test_pods_never_read_a_same_named_configmap_that_is_not_ours() -> None:
    """Issue 44: a ``<model>-output-check`` ConfigMap someone else wrote, naming a key, made
    pods of that key skip their check (the kubelet reads it whoever owns it). While one
    exists, the pod templates (main and canary) do not read it: every pod checks."""
    m, d, obs = _served(GENERATE)
    assert _env(_main(d)), "the operator's ConfigMap is read"
    obs.foreign["ConfigMap"] = f"ConfigMap {names.verified_name('m')} is not the operator's"
    d = decide(m, obs, T0)
    assert _env(_main(d)) == [], "a foreign ConfigMap is read by the pods"
    from .test_canary import _a_serves_then_b_compiled, _canary

    _, b, obs = _a_serves_then_b_compiled()
    obs.foreign["ConfigMap"] = "not ours"
    canary = _canary(decide(b, obs, T0))
    assert canary is not None and _env(canary) == []


def test_an_entry_someone_else_added_to_our_configmap_is_emptied() -> None:
    """The operator's ConfigMap with an entry another writer added (server-side apply keeps
    another manager's fields): the next apply sets it empty (the engine reads that as not
    verified) and takes it over, so the apply after leaves it out and it goes."""
    m, d, obs = _served(GENERATE)
    cm = _configmap(d)
    assert cm is not None
    mine = names.short_key(plan_for(m).key)
    cm["data"]["0123456789ab"] = "trust me"
    obs.verified_configmap = cm
    d = decide(m, obs, T0)
    again = _configmap(d)
    assert again is not None and again["data"]["0123456789ab"] == ""
    assert again["data"][mine], "the operator's own entry is kept"
    # Nothing verified (an Off model), yet someone's entry: it is emptied too.
    off = copy.deepcopy(GENERATE)
    off.setdefault("serving", {})["outputCheck"] = "Off"
    m2, _, obs2 = _served(off)
    obs2.verified_configmap = {"metadata": {"name": names.verified_name("m")},
                               "data": {mine: "trust me"}}  # fmt: skip
    cm2 = _configmap(decide(m2, obs2, T0))
    assert cm2 is not None and cm2["data"] == {mine: ""}


def test_the_outcome_is_on_the_models_status_not_only_in_a_configmap() -> None:
    """Issue 44, 8: where a GitOps tool reads it: which artifact passed, when, on how many
    pods; kept (with its time) by later reconciles."""
    m, d, obs = _served(GENERATE)
    key = plan_for(m).key
    check = d.status["outputCheck"]
    assert check == {"artifactKey": key, "result": "Passed", "pods": 1, "time": T0}, check
    again = decide(_with_status(m, d.status), obs, "2026-11-21T11:00:00Z")
    assert again.status["outputCheck"]["time"] == T0
    off = copy.deepcopy(GENERATE)
    off.setdefault("serving", {})["outputCheck"] = "Off"
    _, d_off, _ = _served(off)
    assert "outputCheck" not in d_off.status, "nothing was checked"


def test_an_artifact_without_references_is_recorded_as_unchecked_not_passed() -> None:
    """An artifact whose precompile recorded no reference answers (a pooling model, an engine
    from before the check, a compile under Off) rolled out under Enforce was recorded as
    Passed: nothing had been asked. Unchecked, saying why."""
    m, d, _ = _served(GENERATE, references=False)
    check = d.status["outputCheck"]
    assert check["result"] == "Unchecked" and check["artifactKey"] == plan_for(m).key, check
    assert "no reference answers" in check["message"] and "pods" not in check, check
    SpyreModelStatus.model_validate(d.status)  # the CRD's enum has it


def test_a_refused_artifact_is_recorded_as_failed() -> None:
    from .test_canary import _a_serves_then_b_compiled, _canary

    _, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T0)
    mismatch = json.dumps({"reason": "OutputMismatch", "message": "prompt 0 position 3: ..."})
    obs.canary_deployment = _canary(d)
    obs.server_pods = [{"name": "m-canary-x", "artifact": plan_for(b).short_key, "canary": True,
                        "terminated": {"exitCode": 1, "message": mismatch}}]  # fmt: skip
    d = decide(_with_status(b, d.status), obs, T0)
    check = d.status["outputCheck"]
    assert (check["artifactKey"], check["result"]) == (plan_for(b).key, "Failed"), check
    assert "position 3" in check["message"]
