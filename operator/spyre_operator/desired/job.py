"""The precompile Job: runs the engine image in compile mode to fill the artifact directory."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import spyre_contract as contract
from lightkube.models.batch_v1 import JobSpec
from lightkube.models.core_v1 import Container, EnvVar, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job

from . import names
from .devices import container_claims, pod_claims
from .key import compile_env
from .owners import shared_refs
from .plan import ModelPlan, OwnerRef
from .pod import (
    cache_affinity,
    card_requests,
    compiles_on_cards,
    container_security_context,
    download_env,
    download_volumes,
    load_processes_env,
    merge_env,
    pinned_scc,
    placement,
    plugin_env,
    pod_security_context,
    precompile_backend,
    resources,
    shape_args,
    user_env,
    volumes,
)

#: The engine writes its one-line JSON summary (or failure reason) here.
TERMINATION_LOG = contract.TERMINATION_LOG_PATH
#: A finished precompile Job is removed after a day: status keeps what it said (the
#: artifact's size and compile time, or the failure's reason and message and the next retry).
PRECOMPILE_JOB_TTL_SECONDS = 86400


def job_labels(plan: ModelPlan) -> dict[str, str]:
    """Labels on the Job and its pod (no model label: the Job is shared)."""
    return {
        **names.common_labels(names.COMPONENT_PRECOMPILE),
        names.ARTIFACT_LABEL: plan.short_key,
        names.CLAIM_LABEL: plan.claim,
    }


def template_hash(template: PodTemplateSpec) -> str:
    """A hash of a pod template: a Job built from another spec has another one."""
    doc = json.dumps(template.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def build_precompile_job(plan: ModelPlan, owners: Iterable[OwnerRef], attempt: int = 1) -> Job:
    """One Job per (claim, key), owned by every SpyreModel that needs that artifact.

    ``attempt`` counts the Jobs run for this (claim, key): the retry budget is the Job's, not
    each model's. The template's hash and the model it was built from are annotations, so a
    stuck Job whose model changed a field outside the key (placement, resources, secrets)
    can be told apart and replaced.
    """
    spec = plan.spec
    vols, mounts = volumes(plan, read_only=False)
    # sendnn artifacts are built with sendnn_compile_only on a CPU node unless
    # precompile.onCards; the CPU backends never use cards.
    on_cards = compiles_on_cards(spec)
    backend = precompile_backend(spec)
    cards = card_requests(spec, on_cards)
    env: list[EnvVar] = merge_env(
        [*user_env(compile_env(spec)), *download_env(plan)],
        [*plugin_env(plan, plan.key, backend), *load_processes_env(spec)],
    )
    dl_vols, dl_mounts = download_volumes(plan)
    vols, mounts = vols + dl_vols, mounts + dl_mounts
    container = Container(
        name="precompile",
        image=spec.engine.image,
        imagePullPolicy=spec.engine.image_pull_policy,
        args=[
            contract.PRECOMPILE,
            *shape_args(plan, backend),
            contract.ARTIFACT_DIR,
            plan.artifact_dir(),
            contract.ARTIFACT_KEY,
            plan.key,
            contract.TERMINATION_LOG,
            TERMINATION_LOG,
            *([] if spec.compile.require_known_configuration
              else [contract.NO_REQUIRE_KNOWN_CONFIG]),
            # Nothing will be checked: no reference answers (on eager, no vLLM started for them)
            *([contract.REFERENCE_ANSWERS, "off"] if spec.serving.output_check == "Off" else []),
        ],  # fmt: skip
        env=env,
        resources=resources(spec.precompile.resources, cards, container_claims(plan, on_cards)),
        volumeMounts=mounts,
        securityContext=container_security_context(),
        terminationMessagePath=TERMINATION_LOG,
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    labels = job_labels(plan)
    annotations = {names.ARTIFACT_KEY_ANNOTATION: plan.key}
    pod_annotations = pinned_scc(plan.site, {**(spec.precompile.pod_annotations or {}),
                                             **annotations})
    placement_fields = placement(spec, on_cards=on_cards, precompile=True)
    template = PodTemplateSpec(
        metadata=ObjectMeta(labels=labels, annotations=pod_annotations),
        spec=PodSpec(
            restartPolicy="Never",
            securityContext=pod_security_context(
                plan.site.platform_assigns_user, plan.site.selinux_change_policy
            ),
            containers=[container],
            volumes=vols,
            enableServiceLinks=False,
            serviceAccountName=plan.spec.engine.service_account_name or None,
            automountServiceAccountToken=False,
            affinity=cache_affinity(plan),
            resourceClaims=pod_claims(plan, on_cards) or None,
            **placement_fields,
        ),
    )
    job_annotations = {
        **annotations,
        names.ATTEMPT_ANNOTATION: str(attempt),
        names.TEMPLATE_HASH_ANNOTATION: template_hash(template),
        names.TEMPLATE_OF_ANNOTATION: plan.name,
    }
    return Job(
        metadata=ObjectMeta(
            name=plan.job_name,
            namespace=plan.namespace,
            labels=labels,
            annotations=job_annotations,
            ownerReferences=shared_refs(owners),
        ),
        spec=JobSpec(
            backoffLimit=spec.precompile.backoff_limit,
            activeDeadlineSeconds=spec.precompile.active_deadline_seconds,
            ttlSecondsAfterFinished=PRECOMPILE_JOB_TTL_SECONDS,
            template=template,
        ),
    )
