"""Cluster-wide defaults of the per-site settings, and the engine-image allow-list (pure).

A SpyreModel that leaves a per-site field unset (the engine image and its pull secrets, the
card resource, the scheduler, node placement, the cache's StorageClass, how many workers of a
precompile pod compile at once) follows the operator's default for it at every reconcile: the
CRD has no default for these fields, because the API server would write one into each object
at creation and an operator upgrade or an admin's change would then never reach existing
models. ``plan_model`` fills them in from
:class:`SiteDefaults` (the operator's flags, from the chart's ``defaults`` values), so the
builders and the artifact key see the effective values and stay pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from .. import __version__
from ..api.v1alpha1 import SpyreModelSpec, Toleration

#: The built-in defaults: what the CRD used to write into every SpyreModel, so an operator run
#: without the chart's ``defaults`` (tests, a laptop) behaves as before.
#: The engine image of this release's version (README "Get a release" pins the
#: released one by digest through the chart's defaults.engineImage).
BUILTIN_ENGINE_IMAGE = f"ghcr.io/spyre-model-operator/spyre-engine:{__version__}"
BUILTIN_RESOURCE_NAME = "ibm.com/spyre_vf"
BUILTIN_SCHEDULER_NAME = "spyre-scheduler"


@dataclass(frozen=True)
class SiteDefaults:
    """The operator's defaults for per-site SpyreModel fields, and the engine images allowed.

    Lists and maps that are empty set nothing: a model that leaves the field unset then runs
    without it, as before.
    """

    engine_image: str = BUILTIN_ENGINE_IMAGE
    image_pull_secrets: tuple[str, ...] = ()
    #: ServiceAccount of the precompile and serving pods; "" is the namespace's default.
    service_account_name: str = ""
    resource_name: str = BUILTIN_RESOURCE_NAME
    #: The DeviceClass of models that name neither a card resource nor a class (DRA); "" is
    #: none: they request the extended resource ``resource_name``.
    device_class_name: str = ""
    #: "" is the cluster's default scheduler. Not applied to DRA pods (see resolve_site).
    scheduler_name: str = BUILTIN_SCHEDULER_NAME
    serving_node_selector: Mapping[str, str] = field(default_factory=dict)
    serving_tolerations: tuple[Toleration, ...] = ()
    precompile_node_selector: Mapping[str, str] = field(default_factory=dict)
    precompile_tolerations: tuple[Toleration, ...] = ()
    #: StorageClass of cache PVCs the operator creates; "" is the cluster's default class.
    storage_class_name: str = ""
    #: precompile.maxLoadProcesses (SENDNN_INFERENCE_MAX_LOAD_PROCESSES of the precompile Job):
    #: how many tensor-parallel workers load and compile at once, for the CPU pool's memory;
    #: None is the plugin's default (all of them).
    precompile_max_load_processes: int | None = None
    #: Engine images a model may run (shell-style patterns, e.g. registry.example.com/spyre/*);
    #: empty: any.
    allowed_engine_images: tuple[str, ...] = ()
    #: The platform assigns each pod's uid, gid and fsGroup (OpenShift's restricted-v2 SCC): the
    #: operator's pods set none (``--pod-user``; pod.pod_security_context).
    platform_assigns_user: bool = False
    #: The SCC every pod the operator makes pins (the pod annotation
    #: ``openshift.io/required-scc``; ``--required-scc``); "" pins none.
    required_scc: str = ""
    #: How the pods' SELinux label reaches their volumes (``seLinuxChangePolicy`` of every pod
    #: the operator makes, ``--selinux-change-policy``): "MountOption" (a mount option, no
    #: walk of the cache), "Recursive" (the runtime relabels every file), "" sets none (the
    #: cluster's default). One value for all pods: pods sharing a volume must agree.
    selinux_change_policy: str = ""

    def for_served_spec(self) -> SiteDefaults:
        """The defaults to re-plan a spec a Deployment was built from (its served-spec
        annotation, ``status.servedSpec``) with: that spec was resolved when it was built, so
        a list or map it lacks was empty then, and a default added since must not change the
        pods that keep serving the previous artifact (a roll of its own before the switch)."""
        return SiteDefaults(
            engine_image=self.engine_image,
            resource_name=self.resource_name,
            device_class_name=self.device_class_name,
            scheduler_name=self.scheduler_name,
            # Not a default of a spec field but how every pod must look to be admitted here.
            platform_assigns_user=self.platform_assigns_user,
            required_scc=self.required_scc,
            selinux_change_policy=self.selinux_change_policy,
        )

    def allows(self, image: str) -> bool:
        """Whether ``image`` is on the allow-list (or there is none)."""
        return not self.allowed_engine_images or any(
            fnmatchcase(image, p) for p in self.allowed_engine_images
        )

    def refusal(self, image: str, defaulted: bool) -> str | None:
        """Why a model may not run ``image`` (None: it may), for its conditions."""
        if self.allows(image):
            return None
        where = (
            "the operator's default engine image (spec.engine.image is unset)"
            if defaulted
            else "spec.engine.image"
        )
        return (
            f"engine image {image} ({where}) is not in the operator's allowed engine images "
            f"({', '.join(self.allowed_engine_images)}): use an allowed image, or ask the "
            "cluster admin to allow it (chart value allowedEngineImages); nothing is compiled"
        )


#: Spec fields that follow the operator's defaults when unset (as status.effective names them).
ENGINE_IMAGE = "engine.image"
IMAGE_PULL_SECRETS = "engine.imagePullSecrets"
SERVICE_ACCOUNT_NAME = "engine.serviceAccountName"
RESOURCE_NAME = "accelerator.resourceName"
DEVICE_CLASS_NAME = "accelerator.deviceClassName"
SCHEDULER_NAME = "accelerator.schedulerName"
SERVING_NODE_SELECTOR = "accelerator.nodeSelector"
SERVING_TOLERATIONS = "accelerator.tolerations"
PRECOMPILE_NODE_SELECTOR = "precompile.nodeSelector"
PRECOMPILE_TOLERATIONS = "precompile.tolerations"
PRECOMPILE_MAX_LOAD_PROCESSES = "precompile.maxLoadProcesses"
STORAGE_CLASS_NAME = "cache.volume.storageClassName"


def _unset(update: dict[str, Any], used: list[str], path: str, attr: str, value: Any) -> None:
    used.append(path)
    if value or isinstance(value, str):  # an empty list or map sets nothing
        update[attr] = value


def resolve_site(spec: SpyreModelSpec, site: SiteDefaults) -> tuple[SpyreModelSpec, list[str]]:
    """``spec`` with its unset per-site fields filled in from ``site``, and which those were.

    The cache's StorageClass is not filled in here: it matters only when the PVC is created
    (an existing PVC keeps its class), which decide_cache knows.

    Cards come one way: a model naming neither a resource nor a DeviceClass takes the site's
    DeviceClass if it has one, else its resource. A model on a DeviceClass (its own or the
    site's) that leaves schedulerName unset goes to the cluster's default scheduler, not the
    site's: with DRA, IBM's Spyre Operator deploys no spyre-scheduler and kube-scheduler
    allocates the claims.
    """
    acc = spec.accelerator
    dra = acc.device_class_name is not None or (
        acc.resource_name is None and bool(site.device_class_name)
    )
    resource = None if dra else site.resource_name
    scheduler = "" if dra else site.scheduler_name
    # (section of the spec, field, its path in status.effective.fromDefaults, the default)
    defaults: tuple[tuple[str, str, str, Any], ...] = (
        ("engine", "image", ENGINE_IMAGE, site.engine_image),
        ("engine", "image_pull_secrets", IMAGE_PULL_SECRETS, list(site.image_pull_secrets)),
        # None when there is no default: an empty name would enter every served-spec annotation.
        ("engine", "service_account_name", SERVICE_ACCOUNT_NAME, site.service_account_name or None),
        ("accelerator", "resource_name", RESOURCE_NAME, resource),
        ("accelerator", "device_class_name", DEVICE_CLASS_NAME,
         site.device_class_name if dra else None),
        ("accelerator", "scheduler_name", SCHEDULER_NAME, scheduler),
        ("accelerator", "node_selector", SERVING_NODE_SELECTOR, dict(site.serving_node_selector)),
        ("accelerator", "tolerations", SERVING_TOLERATIONS, list(site.serving_tolerations)),
        ("precompile", "node_selector", PRECOMPILE_NODE_SELECTOR,
         dict(site.precompile_node_selector)),
        ("precompile", "tolerations", PRECOMPILE_TOLERATIONS, list(site.precompile_tolerations)),
    )  # fmt: skip
    used: list[str] = []
    changes: dict[str, dict[str, Any]] = {}
    for section, attr, path, value in defaults:
        if value is None and path in (RESOURCE_NAME, DEVICE_CLASS_NAME):
            continue  # the other way of asking for cards is in use
        if getattr(getattr(spec, section), attr) is None:
            _unset(changes.setdefault(section, {}), used, path, attr, value)
    # A number without a built-in value: followed only when the operator has one (otherwise
    # the plugin's default applies, as for a model that never heard of the operator's flag).
    loads = site.precompile_max_load_processes
    if spec.precompile.max_load_processes is None and loads is not None:
        changes.setdefault("precompile", {})["max_load_processes"] = loads
        used.append(PRECOMPILE_MAX_LOAD_PROCESSES)
    if spec.cache.claim_name is None and (
        spec.cache.volume is None or spec.cache.volume.storage_class_name is None
    ):
        used.append(STORAGE_CLASS_NAME)
    update = {
        section: getattr(spec, section).model_copy(update=fields)
        for section, fields in changes.items()
        if fields
    }
    return (spec.model_copy(update=update) if update else spec), used


def effective_status(
    spec: SpyreModelSpec, from_defaults: Sequence[str], storage_class: str | None
) -> dict[str, Any]:
    """status.effective: the per-site settings of a resolved spec (see resolve_site)."""
    out: dict[str, Any] = {
        "engineImage": spec.engine.image,
        "imagePullSecrets": list(spec.engine.image_pull_secrets or []),
        "serviceAccountName": spec.engine.service_account_name or None,
        "resourceName": spec.accelerator.resource_name,
        "deviceClassName": spec.accelerator.device_class_name,
        "schedulerName": spec.accelerator.scheduler_name,
        "storageClassName": storage_class,
        "fromDefaults": list(from_defaults),
    }
    return {k: v for k, v in out.items() if v is not None}
