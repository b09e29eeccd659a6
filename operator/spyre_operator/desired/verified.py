"""The artifact a model's serving pods need not check again (issue 30, "cheap when nothing
changed"), and how they learn it.

Every serving engine answers its artifact's reference prompts before it turns Ready
(``serving.outputCheck``). Once an artifact has served every replica of a rollout under
``Enforce`` (status ``lastGoodArtifactKey``: each of its pods passed), a pod that starts on it
later (a restart, a rescheduled or added replica) need not ask again. The operator writes that
key into the ConfigMap ``<model>-output-check`` (data: short artifact key -> why), and the pod
template reads it through an optional ``configMapKeyRef`` into the engine's
``SPYRE_ENGINE_OUTPUT_VERIFIED``: the kubelet resolves it when the container starts, so the
template never changes when an artifact is verified, and a pod of an artifact not (yet) listed
gets no value and checks. The engine skips the check only when, besides, the model's files are
those the reference answers were recorded from (``answers.passed_before``): the same model name
over changed weights is checked again.

The ConfigMap is derived from status alone (which the operator rebuilds from the cluster), a
child like the PDB: watched, server-side applied, never written over when same-named and not the
operator's, collected with its model. Only the operator's record counts: while a same-named
ConfigMap that is not the operator's exists, pod templates do not read it (every pod checks),
and an entry someone else adds to the operator's is emptied at the next reconcile.
"""

from __future__ import annotations

from typing import Any

import spyre_contract as contract
from lightkube.models.core_v1 import ConfigMapKeySelector, EnvVar, EnvVarSource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from . import names
from .owners import controller_ref
from .plan import ModelPlan

#: The engine's setting (spyre_engine/settings.py, ``output_verified``).
VERIFIED_ENV = contract.OUTPUT_VERIFIED_ENV


def verified_env(model: str, key: str) -> EnvVar:
    """The pod's word that artifact ``key`` passed before: the ConfigMap's entry, if any."""
    return EnvVar(
        name=VERIFIED_ENV,
        valueFrom=EnvVarSource(
            configMapKeyRef=ConfigMapKeySelector(
                name=names.verified_name(model), key=names.short_key(key), optional=True
            )
        ),
    )


def _has_verified_env(deployment: dict[str, Any]) -> bool:
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    return any(e.get("name") == VERIFIED_ENV for c in containers for e in c.get("env") or [])


def wants_verified_env(live: dict[str, Any] | None, key: str) -> bool:
    """Whether the Deployment serving ``key`` gets the reference: always, except a live one
    already serving ``key`` without it (an earlier operator's), which keeps its template rather
    than roll every model at the operator's upgrade; it gets it with its next artifact."""
    if live is None or _has_verified_env(live):
        return True
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    return annotations.get(names.ARTIFACT_KEY_ANNOTATION) != key


def reads_verified(obs: Any, live: dict[str, Any] | None, key: str) -> bool:
    """Whether a Deployment serving ``key`` reads the output-check ConfigMap: as
    :func:`wants_verified_env`, and never while a same-named ConfigMap that is not the
    operator's exists (the kubelet would read its entries, and a pod skip its check)."""
    return "ConfigMap" not in obs.foreign and wants_verified_env(live, key)


def verified_message(key: str) -> str:
    return (
        f"artifact {names.short_key(key)} passed its output check on every replica of its "
        "rollout (status.lastGoodArtifactKey)"
    )


def build_verified_configmap(
    plan: ModelPlan, key: str | None, live: dict[str, Any] | None = None
) -> ConfigMap:
    """``<model>-output-check``: the verified artifact (one: the last good one; None: none).

    Only the operator's own entry may tell a pod to skip its check. An entry someone else
    added to the operator's ConfigMap (the operator's apply would leave it: another field
    manager's) is applied empty, with force: the engine reads an empty value as "not
    verified", and the operator then owns that entry, so its next apply, which leaves it
    out, removes it."""
    data = {names.short_key(key): verified_message(key)} if key else {}
    for k, v in ((live or {}).get("data") or {}).items():
        if k not in data and v:
            data[str(k)] = ""
    return ConfigMap(
        metadata=ObjectMeta(
            name=names.verified_name(plan.name),
            namespace=plan.namespace,
            labels={
                **names.common_labels(names.COMPONENT_SERVER),
                names.MODEL_LABEL: names.model_label_value(plan.name),
            },
            ownerReferences=[controller_ref(plan.owner)],
        ),
        data=data,
    )
