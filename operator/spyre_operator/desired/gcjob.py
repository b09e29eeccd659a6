"""The GC Job: ``spyre-engine gc --remove KEYS`` on a cache claim (read-write)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

import spyre_contract as contract
from lightkube.models.batch_v1 import JobSpec
from lightkube.models.core_v1 import (
    Container,
    EmptyDirVolumeSource,
    EnvVar,
    PersistentVolumeClaimVolumeSource,
    PodSpec,
    PodTemplateSpec,
    ResourceRequirements,
    Volume,
    VolumeMount,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ServiceAccount
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

from . import names
from .job import TERMINATION_LOG
from .owners import shared_refs
from .plan import CACHE_MOUNT, ModelPlan, OwnerRef
from .pod import (
    cache_affinity,
    container_security_context,
    pinned_scc,
    placement,
    pod_security_context,
)

COMPONENT_GC = "gc"
#: Annotation on the GC Job with the keys it removes (comma-separated, sorted).
GC_KEYS_ANNOTATION = f"{names.ARTIFACT_KEY_ANNOTATION}s-removed"
#: A finished GC Job goes after this long (the operator reads its result within seconds).
GC_JOB_TTL_SECONDS = 3600
#: The GC pod's ServiceAccount (and its Role and RoleBinding), one per namespace: it lists
#: the pods, Jobs and Deployments that use a key right before removing it (engine inuse.py).
GC_SERVICE_ACCOUNT = "spyre-gc"
#: What the GC pod may do: list, nothing else (the operator holds these itself, so it may
#: grant them).
GC_RULES = (
    ("", "pods"),
    ("batch", "jobs"),
    ("apps", "deployments"),
)


def gc_job_name(claim: str, keys: Iterable[str], sweep: str = "") -> str:
    """Deterministic from the claim and the key set (and the sweep's time, for a sweep): the
    same decision never makes two Jobs."""
    claim_hash = hashlib.sha256(claim.encode()).hexdigest()[:5]
    doc = ",".join(sorted(set(keys))) + (f"|sweep@{sweep}" if sweep else "")
    keys_hash = hashlib.sha256(doc.encode()).hexdigest()[:10]
    return f"spyre-gc-{claim_hash}-{keys_hash}"


def gc_job_labels(claim: str) -> dict[str, str]:
    return {**names.common_labels(COMPONENT_GC), names.CLAIM_LABEL: claim}


#: The engine's variable for gc's ``--keep-models`` (engine settings.py ``env_name``): a JSON
#: list. A variable, not a flag: an engine image older than the sweep of downloaded models
#: ignores it, where it would refuse an unknown flag and remove nothing at all.
KEEP_MODELS_ENV = contract.KEEP_MODELS_ENV


@dataclass(frozen=True)
class Sweep:
    """Also sweep orphans: every dir not in ``keep`` (nor removed) is timed on the volume and
    removed once unknown for ``unused_for_seconds``; ``at`` (when it was decided, for a sweep
    that is a decision of its own) goes into the Job's name. ``keep_models``: the ``hf://``
    models (``ORG/NAME[@REVISION]``) the namespace's SpyreModels name; the claim's downloaded
    models are swept the same way (engine weights.py)."""

    keep: frozenset[str]
    unused_for_seconds: int
    at: str
    keep_models: frozenset[str] = frozenset()


def build_gc_job(
    plan: ModelPlan,
    keys: Iterable[str],
    owners: Iterable[OwnerRef],
    sweep: Sweep | None = None,
) -> Job:
    """Remove ``keys`` from ``plan.claim`` (and sweep orphans) with ``plan``'s engine image,
    placement and precompile.podAnnotations (a CPU pod, like a precompile off the cards);
    owned by every user of the claim."""
    keys = sorted(set(keys))
    sweep_args = (
        [
            contract.KEEP,
            ",".join(sorted(sweep.keep - set(keys))),
            contract.ORPHANS_UNUSED_FOR,
            str(sweep.unused_for_seconds),
        ]
        if sweep is not None
        else []
    )
    spec = plan.spec
    labels = gc_job_labels(plan.claim)
    container = Container(
        name="gc",
        image=spec.engine.image,
        imagePullPolicy=spec.engine.image_pull_policy,
        args=[
            contract.GC,
            contract.CACHE_ROOT,
            CACHE_MOUNT,
            contract.REMOVE,
            ",".join(keys),
            *sweep_args,
            # Each removal asks the API server first whether anything uses the key now.
            contract.CLAIM,
            plan.claim,
            contract.NAMESPACE,
            plan.namespace,
            contract.TERMINATION_LOG,
            TERMINATION_LOG,
        ],
        resources=ResourceRequirements(
            requests={"cpu": "50m", "memory": "128Mi"}, limits={"memory": "512Mi"}
        ),
        volumeMounts=[
            VolumeMount(name="cache", mountPath=CACHE_MOUNT),
            VolumeMount(name="tmp", mountPath="/tmp"),
        ],
        env=(
            [EnvVar(name=KEEP_MODELS_ENV, value=json.dumps(sorted(sweep.keep_models)))]
            if sweep is not None
            else None
        ),
        securityContext=container_security_context(),
        terminationMessagePath=TERMINATION_LOG,
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    return Job(
        metadata=ObjectMeta(
            name=gc_job_name(plan.claim, keys, sweep.at if sweep is not None else ""),
            namespace=plan.namespace,
            labels=labels,
            annotations={GC_KEYS_ANNOTATION: ",".join(keys)},
            ownerReferences=shared_refs(owners),
        ),
        spec=JobSpec(
            backoffLimit=1,
            activeDeadlineSeconds=1800,
            ttlSecondsAfterFinished=GC_JOB_TTL_SECONDS,
            template=PodTemplateSpec(
                metadata=ObjectMeta(
                    labels=labels,
                    annotations=pinned_scc(plan.site, spec.precompile.pod_annotations) or None,
                ),
                spec=PodSpec(
                    restartPolicy="Never",
                    securityContext=pod_security_context(
                        plan.site.platform_assigns_user, plan.site.selinux_change_policy
                    ),
                    containers=[container],
                    volumes=[
                        Volume(
                            name="cache",
                            persistentVolumeClaim=PersistentVolumeClaimVolumeSource(
                                claimName=plan.claim
                            ),
                        ),
                        Volume(name="tmp", emptyDir=EmptyDirVolumeSource()),
                    ],
                    enableServiceLinks=False,
                    serviceAccountName=GC_SERVICE_ACCOUNT,
                    automountServiceAccountToken=True,
                    affinity=cache_affinity(plan),
                    **placement(spec, on_cards=False, precompile=True),
                ),
            ),
        ),
    )


def build_gc_access(
    namespace: str, owners: Iterable[OwnerRef]
) -> tuple[ServiceAccount, Role, RoleBinding]:
    """The GC pod's ServiceAccount, its Role (list pods, Jobs, Deployments of the namespace)
    and the RoleBinding between them; owned like the GC Job (by the claim's users), so they
    go with the last SpyreModel that needed them and are applied again before each GC Job."""

    def meta() -> ObjectMeta:
        return ObjectMeta(
            name=GC_SERVICE_ACCOUNT,
            namespace=namespace,
            labels=names.common_labels(COMPONENT_GC),
            ownerReferences=shared_refs(owners),
        )

    account = ServiceAccount(metadata=meta(), automountServiceAccountToken=False)
    role = Role(
        metadata=meta(),
        rules=[
            PolicyRule(apiGroups=[group], resources=[resource], verbs=["list"])
            for group, resource in GC_RULES
        ],
    )
    binding = RoleBinding(
        metadata=meta(),
        roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="Role", name=GC_SERVICE_ACCOUNT),
        subjects=[Subject(kind="ServiceAccount", name=GC_SERVICE_ACCOUNT, namespace=namespace)],
    )
    return account, role, binding


__all__ = [
    "COMPONENT_GC",
    "GC_KEYS_ANNOTATION",
    "GC_SERVICE_ACCOUNT",
    "Sweep",
    "build_gc_access",
    "build_gc_job",
    "gc_job_labels",
    "gc_job_name",
]
