"""Resolve a SpyreModel into the concrete values every builder needs (pure)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from typing import Any

from ..api.v1alpha1 import POOLING_TASKS, CacheVolumeSpec, SpyreModelSpec, Task
from . import names
from .key import artifact_key
from .shapes import ShapeResolution, resolve_compile
from .site import SiteDefaults, resolve_site

#: Where the cache claim is mounted, in the precompile Job (read-write) and the serving pods
#: (read-only). Same path in both, so anything a compiler records by absolute path still holds.
CACHE_MOUNT = "/cache"
#: Where a pvc:// model's claim is mounted (read-only).
MODEL_MOUNT = "/models"
#: Hugging Face downloads of hf:// models, inside the cache claim.
HF_CACHE_DIR = f"{CACHE_MOUNT}/hub"
#: Margin between the engine's drain deadline and the kubelet's SIGKILL: after the drain the
#: engine gives vLLM's engine core and tensor-parallel workers (the processes holding the
#: cards) up to 33 s to exit by themselves, and its watchdog fires at drain + 38 s
#: (HARD_EXIT_AFTER_DEADLINE in engine/spyre_engine/serve.py; tests/unit compares the two). The
#: kubelet must not SIGKILL before that.
TERMINATION_MARGIN_SECONDS = 40
#: A terminating serving pod keeps accepting requests this long before the engine is told to
#: drain (a preStop sleep): the pod leaves the Service's endpoints at once, but kube-proxy on
#: every node needs a moment to stop sending it new connections. Without it a rollout under
#: traffic lost requests (tests/realpods).
ENDPOINT_GRACE_SECONDS = 5


@dataclass(frozen=True)
class OwnerRef:
    """Identity of a SpyreModel, for ownerReferences."""

    name: str
    uid: str


@dataclass(frozen=True)
class ModelPlan:
    """Everything derived from one SpyreModel's spec (no cluster state)."""

    name: str
    namespace: str
    uid: str
    spec: SpyreModelSpec
    key: str
    claim: str
    #: The operator creates the claim (cache.volume) rather than using an existing one.
    claim_managed: bool
    volume: CacheVolumeSpec | None
    served_name: str
    model_arg: str
    model_claim: str | None
    #: The compile shape (``spec.compile`` holds it resolved), its source, or why it is refused.
    shape: ShapeResolution | None = None
    #: The operator's defaults ``spec`` was resolved with (a re-plan of a served spec uses
    #: them too), and the spec fields that were unset and follow them.
    site: SiteDefaults = field(default_factory=SiteDefaults)
    from_defaults: tuple[str, ...] = ()
    #: An existing claim (cache.claimName) whose live accessModes lack ReadWriteMany: one node
    #: mounts it, so its users share that node like a managed ReadWriteOnce volume's users
    #: (set from the observed PVC: ``with_live_claim``).
    claim_single_node: bool = False

    @property
    def image_refusal(self) -> str | None:
        """Why the engine image may not run here (the allow-list), or None."""
        return self.site.refusal(
            self.spec.engine.image or "", "engine.image" in self.from_defaults
        )

    def storage_class(self, live_pvc: dict[str, Any] | None) -> str | None:
        """The cache PVC's StorageClass: the live PVC's, else the spec's, else the default."""
        live = ((live_pvc or {}).get("spec") or {}).get("storageClassName")
        if live is not None:
            return str(live)
        if self.volume is not None and self.volume.storage_class_name is not None:
            return self.volume.storage_class_name
        return (self.site.storage_class_name or None) if self.claim_managed else None

    @property
    def owner(self) -> OwnerRef:
        return OwnerRef(self.name, self.uid)

    @property
    def short_key(self) -> str:
        return names.short_key(self.key)

    @property
    def job_name(self) -> str:
        return names.precompile_job_name(self.key, self.claim)

    @property
    def is_pooling(self) -> bool:
        return Task(self.spec.task) in POOLING_TASKS

    def artifact_dir(self, key: str | None = None) -> str:
        """Artifact directory for ``key`` (default: this spec's key) inside the cache mount."""
        return f"{CACHE_MOUNT}/artifacts/{key or self.key}"

    @property
    def endpoint(self) -> str:
        svc = names.server_name(self.name)
        return f"http://{svc}.{self.namespace}.svc:{self.spec.serving.port}/v1"

    @property
    def drain_seconds(self) -> int:
        return self.spec.serving.shutdown_grace_period_seconds

    @property
    def termination_grace_seconds(self) -> int:
        return ENDPOINT_GRACE_SECONDS + self.drain_seconds + TERMINATION_MARGIN_SECONDS


def default_served_name(uri: str) -> str:
    """org/name for hf://org/name[@rev]; the last path element for pvc://claim/path."""
    if uri.startswith("hf://"):
        return uri[len("hf://") :].split("@", 1)[0]
    path = uri[len("pvc://") :].rstrip("/")
    return posixpath.basename(path) or path.split("/", 1)[0]


def resolve_model(uri: str) -> tuple[str, str | None]:
    """The engine's ``--model`` argument and the claim to mount for pvc:// models."""
    if uri.startswith("pvc://"):
        claim, _, path = uri[len("pvc://") :].partition("/")
        return posixpath.join(MODEL_MOUNT, path.strip("/")) if path else MODEL_MOUNT, claim
    return uri, None


def plan_model(
    name: str, namespace: str, uid: str, spec: SpyreModelSpec, site: SiteDefaults | None = None
) -> ModelPlan:
    """Resolve one SpyreModel (``plan.spec.compile`` has every shape field set, and the
    per-site fields it leaves unset are the operator's defaults ``site``)."""
    site = site or SiteDefaults()
    spec, from_defaults = resolve_site(spec, site)
    shape = resolve_compile(spec)
    spec = spec.model_copy(update={"compile": shape.compile})
    if spec.cache.claim_name:
        claim, managed, volume = spec.cache.claim_name, False, None
    else:
        volume = spec.cache.volume or CacheVolumeSpec()
        claim, managed = volume.name, True
    model_arg, model_claim = resolve_model(spec.model.uri)
    return ModelPlan(
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        key=artifact_key(spec),
        claim=claim,
        claim_managed=managed,
        volume=volume,
        served_name=spec.model.served_name or default_served_name(spec.model.uri),
        model_arg=model_arg,
        model_claim=model_claim,
        shape=shape,
        site=site,
        from_defaults=tuple(from_defaults),
    )


def with_live_claim(plan: ModelPlan, live_pvc: dict[str, Any] | None) -> ModelPlan:
    """``plan`` knowing whether its existing claim (cache.claimName) can be mounted by one
    node only (its accessModes, which the spec does not say). Managed claims: as is."""
    if plan.claim_managed or live_pvc is None:
        return plan
    modes = ((live_pvc.get("spec") or {}).get("accessModes")) or []
    single = bool(modes) and "ReadWriteMany" not in modes
    return replace(plan, claim_single_node=single) if single else plan
