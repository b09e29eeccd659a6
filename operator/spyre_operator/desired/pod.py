"""Pod pieces shared by the precompile Job and the serving Deployment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import spyre_contract as contract
from lightkube.models.core_v1 import (
    Affinity,
    Capabilities,
    ConfigMapVolumeSource,
    EmptyDirVolumeSource,
    EnvVar,
    EnvVarSource,
    LocalObjectReference,
    ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource,
    PodAffinity,
    PodAffinityTerm,
    PodSecurityContext,
    ResourceClaim,
    ResourceRequirements,
    SeccompProfile,
    SecretKeySelector,
    SecurityContext,
    Toleration,
    Volume,
    VolumeMount,
)
from lightkube.models.meta_v1 import LabelSelector

from ..api.v1alpha1 import ResourceRequirements as ApiResources
from ..api.v1alpha1 import SpyreModelSpec
from . import names
from .devices import card_count, device_class
from .key import engine_cpus
from .plan import CACHE_MOUNT, HF_CACHE_DIR, MODEL_MOUNT, ModelPlan
from .site import BUILTIN_RESOURCE_NAME, SiteDefaults

#: The engine image's non-root user (engine/Containerfile), pinned where the platform assigns
#: none (plain Kubernetes). Its primary group is 0, as OpenShift gives an assigned uid.
ENGINE_UID = 1001

CACHE_VOLUME = "compile-cache"
MODEL_VOLUME = "model"
TMP_VOLUME = "tmp"
SHM_VOLUME = "dshm"


#: OpenShift's pod annotation naming the SCC a pod must be admitted under (4.14+): without it
#: a pod gets the highest-priority SCC its ServiceAccount may use (``anyuid`` on many AI
#: clusters: the image's uid, no fsGroup, a cache claim it cannot write).
REQUIRED_SCC_ANNOTATION = "openshift.io/required-scc"


def pinned_scc(site: SiteDefaults, annotations: Mapping[str, str] | None) -> dict[str, str]:
    """A pod template's annotations with the site's SCC pinned (the site's wins over the
    model's podAnnotations: which SCC pods run under is the cluster admin's choice; with none
    pinned a model's own stays, and OpenShift still checks that its ServiceAccount may use
    it)."""
    out = dict(annotations or {})
    if site.required_scc:
        out[REQUIRED_SCC_ANNOTATION] = site.required_scc
    return out


#: seLinuxChangePolicy values (Kubernetes 1.32+; "" sets none).
SELINUX_CHANGE_POLICIES = ("", "MountOption", "Recursive")


def pod_security_context(
    platform_assigns_user: bool, selinux_change_policy: str = ""
) -> PodSecurityContext:
    """Passes PodSecurity `restricted` and OpenShift's `restricted-v2` SCC.

    Where the platform assigns the user (``platform_assigns_user``: OpenShift gives each
    namespace a uid and fsGroup range and refuses pods that pin one outside it), no uid, gid
    or fsGroup is set: the pod runs as the assigned uid in group 0 with the assigned fsGroup,
    and the images keep what they write group-writable. Elsewhere the engine's uid is pinned
    and fsGroup makes the cache claim writable.

    ``selinux_change_policy`` (the site's, one for every pod: pods sharing the cache claim must
    agree, or some stay in ContainerCreating): "MountOption" mounts an eligible volume with the
    pod's label instead of relabelling every file of a cache of tens of GB at each start;
    "Recursive" relabels (the runtime's walk); "" leaves the field to the cluster's default.
    """
    uid = None if platform_assigns_user else ENGINE_UID
    return PodSecurityContext(
        runAsNonRoot=True,
        runAsUser=uid,
        runAsGroup=uid,
        fsGroup=uid,
        # A cache of tens of GB would otherwise be re-chowned at every pod start.
        fsGroupChangePolicy="OnRootMismatch",
        seLinuxChangePolicy=selinux_change_policy or None,
        seccompProfile=SeccompProfile(type="RuntimeDefault"),
    )


def container_security_context() -> SecurityContext:
    """No privilege escalation, no capabilities, read-only root filesystem."""
    return SecurityContext(
        allowPrivilegeEscalation=False,
        readOnlyRootFilesystem=True,
        runAsNonRoot=True,
        capabilities=Capabilities(drop=["ALL"]),
    )


#: The backend that runs on Spyre cards, and the one that builds its artifacts on a CPU node.
CARD_BACKEND = contract.CARD_BACKEND
COMPILE_ONLY_BACKEND = contract.COMPILE_ONLY_BACKEND


def serves_on_cards(spec: SpyreModelSpec) -> bool:
    """The serving pods need Spyre cards (and the Spyre scheduler): backend sendnn only."""
    return str(spec.compile.backend) == CARD_BACKEND


def compiles_on_cards(spec: SpyreModelSpec) -> bool:
    """The precompile pod needs cards: sendnn with precompile.onCards (off by default)."""
    return serves_on_cards(spec) and spec.precompile.on_cards


def precompile_backend(spec: SpyreModelSpec) -> str:
    """What the precompile Job compiles with: sendnn artifacts are built off the cards."""
    if serves_on_cards(spec) and not spec.precompile.on_cards:
        return COMPILE_ONLY_BACKEND
    return str(spec.compile.backend)


def card_requests(spec: SpyreModelSpec, on_cards: bool) -> dict[str, int]:
    """The Spyre card request of a pod as an extended resource (none for a pod that does not
    use cards, or that claims them through DRA: devices.pod_claims)."""
    if not on_cards or device_class(spec) is not None:
        return {}
    # plan_model resolved the card resource (the operator's default if unset; the built-in
    # one for a bare spec).
    resource = spec.accelerator.resource_name or BUILTIN_RESOURCE_NAME
    return {resource: card_count(spec)}


def shape_args(plan: ModelPlan, backend: str) -> list[str]:
    """Engine flags for the model and compile shape, identical in precompile and serve
    (but for the backend: a sendnn artifact is compiled with sendnn_compile_only)."""
    spec = plan.spec
    c = spec.compile
    args = [
        contract.MODEL, plan.model_arg,
        contract.SERVED_NAME, plan.served_name,
        contract.TASK, str(spec.task),
        contract.TENSOR_PARALLEL_SIZE, str(c.tensor_parallel_size),
        contract.MAX_MODEL_LEN, str(c.max_model_len),
        contract.MAX_NUM_SEQS, str(c.max_num_seqs),
        contract.MAX_NUM_BATCHED_TOKENS, str(c.max_num_batched_tokens),
        contract.BACKEND, backend,
    ]  # fmt: skip
    if c.warmup_shapes:
        shapes = ",".join(f"{w.prompt_len}x{w.batch_size}" for w in c.warmup_shapes)
        args += [contract.WARMUP_SHAPES, shapes]
    if plan.model_claim is None:
        args += [contract.HF_CACHE_DIR, HF_CACHE_DIR]
    return args


def flex_device(resource_name: str) -> str:
    """The Spyre runtime's FLEX_DEVICE for the card resource a pod requests: ``VF`` for virtual
    functions (ibm.com/spyre_vf), else ``PF`` (ibm.com/spyre_pf, its tiers, ibm.com/aiu_pf).
    The same for a DeviceClass: ``VF`` for IBM's spyre-standard-vf and spyre-privileged-vf,
    else ``PF`` (spyre-pf, and the driver's catch-all class spyre.ibm.com).

    As upstream pairs them: IBM's spyre-operator runs its integration workloads with
    ``ibm.com/spyre_vf`` + ``FLEX_DEVICE=VF`` and ``ibm.com/spyre_pf`` + ``FLEX_DEVICE=PF``
    (test/integration/integration_test.go, test/manifest/workloads/smalltoy-pod.yaml); the
    plugin's image bakes ``PF`` (docker/Dockerfile.amd64). Neither the device plugin
    (Allocate sets PCIDEVICE_IBM_COM_AIU_PF only) nor the DRA driver (its CDI edits) injects
    FLEX_DEVICE, so the pod must carry it. ``VFIO`` appears upstream only in the device
    plugin's own init container. Compiling with ``sendnn_compile_only``, the plugin sets
    ``FLEX_DEVICE=COMPILE`` itself (sendnn_inference/platform.py), so only serving pods get it.
    """
    name = resource_name.rpartition("/")[2].lower().replace("-", "_")
    return "VF" if name.endswith("_vf") or "_vf_" in name else "PF"


def thread_env(spec: SpyreModelSpec) -> list[EnvVar]:
    """SENDNN_INFERENCE_NUM_CPUS from the serving pods' cpu, for the precompile Job and the
    serving pods of the artifact alike (the value is part of its key: key.engine_cpus).

    The plugin (sendnn_inference/platform.py) takes it before the pod's cgroup quota
    (``get_cpu_count``) and, with SENDNN_INFERENCE_UPDATE_THREAD_CONFIG on (its default), sets
    OMP_NUM_THREADS and DT_PARALLEL_THREADS ("affects the compilation during warmup") to it
    divided by the tensor-parallel workers, rounded up (``_check_threading_config``), for
    every backend, sendnn_compile_only included. The Job and the servers have the same
    tensorParallelSize, so their workers get the same threads wherever each pod runs.
    """
    cpus = engine_cpus(spec)
    return [] if cpus is None else [EnvVar(name="SENDNN_INFERENCE_NUM_CPUS", value=str(cpus))]


def load_processes_env(spec: SpyreModelSpec) -> list[EnvVar]:
    """SENDNN_INFERENCE_MAX_LOAD_PROCESSES for the precompile Job, when precompile gives one.

    The plugin lets that many tensor-parallel workers at a time load the model and compile it
    (sendnn_inference/utils.py ``stagger_region``, around the model load and the warmup's
    compile); 0, its default, lets all of them at once.
    """
    n = spec.precompile.max_load_processes
    return [] if n is None else [EnvVar(name="SENDNN_INFERENCE_MAX_LOAD_PROCESSES", value=str(n))]


def plugin_env(plan: ModelPlan, key: str, backend: str) -> list[EnvVar]:
    """The Spyre plugin's cache settings for the artifact ``key``, its thread count, and for a
    pod on the cards (``backend`` sendnn) the FLEX_DEVICE of its card resource.

    The thread count only for an artifact whose key hashed it, ``plan.key``: a Deployment
    still serving an artifact an earlier operator keyed (compiled without it) keeps the
    environment it had, rather than roll at the upgrade and again at the switch.
    """
    on_cards = backend == CARD_BACKEND
    acc = plan.spec.accelerator
    flex = acc.device_class_name or acc.resource_name or BUILTIN_RESOURCE_NAME
    return [
        *model_config_env(plan.spec),
        *(thread_env(plan.spec) if key == plan.key else []),
        *([EnvVar(name="FLEX_DEVICE", value=flex_device(flex))] if on_cards else []),
        *(EnvVar(name=k, value=v)
          for k, v in contract.sendnn_cache_env(backend, plan.artifact_dir(key)).items()),
        EnvVar(name="HOME", value="/tmp"),
        EnvVar(
            name="SPYRE_ENGINE_POD_NAME",
            valueFrom=EnvVarSource(fieldRef=ObjectFieldSelector(fieldPath="metadata.name")),
        ),
    ]


#: Where model.caBundle is mounted in the precompile pod.
CA_BUNDLE_DIR = "/etc/spyre-model-operator/ca"
CA_VOLUME = "download-ca"


def download_env(plan: ModelPlan) -> list[EnvVar]:
    """What the precompile Job needs to download an hf:// model (never given to servers)."""
    model = plan.spec.model
    if plan.model_claim is not None:
        return []
    env = user_env(model.download_env or [])
    if model.token_secret is not None:
        env.append(
            EnvVar(
                name="HF_TOKEN",
                valueFrom=EnvVarSource(
                    secretKeyRef=SecretKeySelector(
                        name=model.token_secret.name, key=model.token_secret.key
                    )
                ),
            )
        )
    if model.ca_bundle is not None:
        path = f"{CA_BUNDLE_DIR}/{model.ca_bundle.key}"
        env += [
            EnvVar(name="REQUESTS_CA_BUNDLE", value=path),
            EnvVar(name="SSL_CERT_FILE", value=path),
        ]
    return env


MODEL_CONFIG_DIR = "/etc/spyre-model-operator/model-configs"
MODEL_CONFIG_VOLUME = "model-configs"


def model_config_env(spec: SpyreModelSpec) -> list[EnvVar]:
    """SENDNN_INFERENCE_MODEL_CONFIG_FILE for a site model_configs.yaml (Job and servers)."""
    ref = spec.compile.model_config_file
    if ref is None:
        return []
    path = f"{MODEL_CONFIG_DIR}/{ref.key}"
    return [EnvVar(name="SENDNN_INFERENCE_MODEL_CONFIG_FILE", value=path)]


def model_config_volumes(spec: SpyreModelSpec) -> tuple[list[Volume], list[VolumeMount]]:
    ref = spec.compile.model_config_file
    if ref is None:
        return [], []
    return (
        [Volume(name=MODEL_CONFIG_VOLUME, configMap=ConfigMapVolumeSource(name=ref.name))],
        [VolumeMount(name=MODEL_CONFIG_VOLUME, mountPath=MODEL_CONFIG_DIR, readOnly=True)],
    )


def download_volumes(plan: ModelPlan) -> tuple[list[Volume], list[VolumeMount]]:
    """The CA bundle volume of the precompile pod, if any."""
    ca = plan.spec.model.ca_bundle
    if plan.model_claim is not None or ca is None:
        return [], []
    return (
        [Volume(name=CA_VOLUME, configMap=ConfigMapVolumeSource(name=ca.name))],
        [VolumeMount(name=CA_VOLUME, mountPath=CA_BUNDLE_DIR, readOnly=True)],
    )


def merge_env(user: list[EnvVar], operator: list[EnvVar]) -> list[EnvVar]:
    """User entries, minus the names the operator sets, then the operator's entries.

    A container's env is a map keyed by name: a user entry the CRD admits but the operator
    also sets (HOME, HF_HUB_OFFLINE, ...) would make server-side apply reject the whole
    object ("duplicate entries for key"), so the operator's value wins.
    """
    taken = {e.name for e in operator}
    return [*(e for e in user if e.name not in taken), *operator]


def user_env(entries: list) -> list[EnvVar]:  # type: ignore[type-arg]
    """Convert API env entries to typed EnvVars."""
    return [
        cast(EnvVar, EnvVar.from_dict(e.model_dump(by_alias=True, exclude_none=True)))
        for e in entries
    ]


def resources(
    api: ApiResources | None, cards: dict[str, int], claims: list[ResourceClaim] | None = None
) -> ResourceRequirements:
    """Container resources with the Spyre cards added to requests and limits (an extended
    resource) or as the pod's claims (DRA)."""
    requests = {k: str(v) for k, v in ((api.requests if api else None) or {}).items()}
    limits = {k: str(v) for k, v in ((api.limits if api else None) or {}).items()}
    for name, count in cards.items():
        requests[name] = str(count)
        limits[name] = str(count)
    return ResourceRequirements(
        requests=requests or None, limits=limits or None, claims=claims or None
    )


def volumes(plan: ModelPlan, *, read_only: bool) -> tuple[list[Volume], list[VolumeMount]]:
    """Cache claim (and model claim) volumes, plus writable scratch space."""
    vols = [
        Volume(
            name=CACHE_VOLUME,
            persistentVolumeClaim=PersistentVolumeClaimVolumeSource(
                claimName=plan.claim, readOnly=read_only or None
            ),
        ),
        Volume(name=TMP_VOLUME, emptyDir=EmptyDirVolumeSource()),
        Volume(name=SHM_VOLUME, emptyDir=EmptyDirVolumeSource(medium="Memory")),
    ]
    mounts = [
        VolumeMount(name=CACHE_VOLUME, mountPath=CACHE_MOUNT, readOnly=read_only or None),
        VolumeMount(name=TMP_VOLUME, mountPath="/tmp"),
        VolumeMount(name=SHM_VOLUME, mountPath="/dev/shm"),
    ]
    if plan.model_claim is not None:
        vols.append(
            Volume(
                name=MODEL_VOLUME,
                persistentVolumeClaim=PersistentVolumeClaimVolumeSource(
                    claimName=plan.model_claim, readOnly=True
                ),
            )
        )
        mounts.append(VolumeMount(name=MODEL_VOLUME, mountPath=MODEL_MOUNT, readOnly=True))
    cfg_vols, cfg_mounts = model_config_volumes(plan.spec)
    return vols + cfg_vols, mounts + cfg_mounts


def single_node_cache(plan: ModelPlan) -> bool:
    """A cache claim one node mounts (ReadWriteOnce): its users must share one node. A managed
    volume's access modes are in the spec; an existing claim's come from the live PVC."""
    if not plan.claim_managed:
        return plan.claim_single_node
    return plan.volume is not None and "ReadWriteMany" not in plan.volume.access_modes


def cache_claim_labels(plan: ModelPlan) -> dict[str, str]:
    """Pod labels for co-location on a single-node cache (empty otherwise)."""
    return {names.CLAIM_LABEL: plan.claim} if single_node_cache(plan) else {}


def cache_affinity(plan: ModelPlan) -> Affinity | None:
    """With a ReadWriteOnce cache, every pod mounting it runs on the node of the others.

    The first pod (no peer yet) may go anywhere: the scheduler lets a pod that matches its own
    required affinity term start a group.
    """
    if not single_node_cache(plan):
        return None
    return Affinity(
        podAffinity=PodAffinity(
            requiredDuringSchedulingIgnoredDuringExecution=[
                PodAffinityTerm(
                    labelSelector=LabelSelector(matchLabels={names.CLAIM_LABEL: plan.claim}),
                    topologyKey="kubernetes.io/hostname",
                )
            ]
        )
    )


def placement(  # type: ignore[type-arg]
    spec: SpyreModelSpec, *, on_cards: bool, precompile: bool = False
) -> dict:
    """schedulerName, nodeSelector, tolerations and pull secrets for a PodSpec.

    A pod on the cards goes through the accelerator's scheduler, node selector and
    tolerations. A pod without cards never uses the Spyre scheduler: a precompile pod compiling
    off the cards uses precompile.nodeSelector/tolerations, a CPU-backend server the
    accelerator's node selector and tolerations.
    """
    acc = spec.accelerator
    out: dict = {}  # type: ignore[type-arg]
    if on_cards and acc.scheduler_name:
        out["schedulerName"] = acc.scheduler_name
    selector, tolerations = acc.node_selector, acc.tolerations
    if precompile and not on_cards:
        selector, tolerations = spec.precompile.node_selector, spec.precompile.tolerations
    if selector:
        out["nodeSelector"] = dict(selector)
    if tolerations:
        out["tolerations"] = [
            Toleration.from_dict(t.model_dump(by_alias=True, exclude_none=True))
            for t in tolerations
        ]
    if spec.engine.image_pull_secrets:
        out["imagePullSecrets"] = [
            LocalObjectReference(name=n) for n in spec.engine.image_pull_secrets
        ]
    return out
