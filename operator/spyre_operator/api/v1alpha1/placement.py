"""Where pods run: the precompile Job, the engine image, tolerations and the accelerator."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .common import (
    DNS_SUBDOMAIN_PATTERN,
    EXTENDED_RESOURCE_PATTERN,
    QUALIFIED_NAME,
    ApiModel,
    NodeSelector,
    cel,
    keys_are_qualified_names,
)
from .serving import ResourceRequirements


class PrecompileSpec(ApiModel):
    """The precompile Job. Nothing here changes the artifact key."""

    backoff_limit: int = Field(
        default=1, ge=0, le=10, description="Retries of a failed compile pod."
    )
    active_deadline_seconds: int = Field(
        default=7200, ge=60, description="Wall-clock limit of the precompile Job."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="CPU/memory for the precompile container."
    )
    pod_annotations: dict[str, str] | None = Field(
        default=None,
        description="Annotations added to the precompile pod.",
        max_length=64,
        json_schema_extra=keys_are_qualified_names("precompile.podAnnotations"),
    )
    max_load_processes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many tensor-parallel workers of the precompile pod load and compile the model "
            "at once (SENDNN_INFERENCE_MAX_LOAD_PROCESSES, given to the precompile Job only): "
            "fewer use less memory when compiling with tensorParallelSize > 1, and take "
            "longer; 0 is no limit. Unset: the operator's default (its "
            "--default-precompile-max-load-processes), else the plugin's (no limit). Not part "
            "of the artifact key."
        ),
    )
    on_cards: bool = Field(
        default=False,
        description=(
            "For compile.backend sendnn: compile on the Spyre cards (the Job requests "
            "tensorParallelSize cards through the accelerator's scheduler) instead of with "
            "sendnn_compile_only on a CPU node (the default: the cards keep serving while a new "
            "artifact compiles). Ignored by the CPU backends, which never use cards."
        ),
    )
    node_selector: NodeSelector | None = Field(
        default=None,
        max_length=64,
        json_schema_extra=keys_are_qualified_names("precompile.nodeSelector"),
        description=(
            "Node labels the precompile pod must match when it compiles off the cards "
            "(e.g. a CPU pool with enough memory for the compiler). Unset: the operator's "
            "default (chart defaults.precompile.nodeSelector); {} for none."
        ),
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description=(
            "Tolerations of the precompile pod when it compiles off the cards. Unset: the "
            "operator's default (chart defaults.precompile.tolerations); [] for none."
        ),
    )


class EngineSpec(ApiModel):
    """The engine image (vLLM + Spyre plugin + spyre-engine; the image is part of the artifact
    key), how it is pulled and the ServiceAccount its pods run as."""

    image: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Engine container image; pin a digest for reproducible artifacts. Unset: the "
            "operator's default engine image (its --default-engine-image, the chart's "
            "defaults.engineImage), followed at every reconcile (status.effective shows it)."
        ),
    )
    image_pull_policy: str = Field(
        default="IfNotPresent",
        description="Image pull policy: Always, IfNotPresent or Never.",
        json_schema_extra={"enum": ["Always", "IfNotPresent", "Never"]},
    )
    image_pull_secrets: list[str] | None = Field(
        default=None,
        description=(
            "Names of Secrets used to pull the image. Unset: the operator's default (chart "
            "defaults.imagePullSecrets); [] for none."
        ),
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "ServiceAccount of the model's precompile and serving pods (its token is not "
            "mounted: the engine never calls the API server). Platforms grant SCCs and pull "
            "secrets to ServiceAccounts. Unset: the operator's default (chart "
            "defaults.serviceAccountName), else the namespace's default ServiceAccount. Not "
            "part of the artifact key."
        ),
    )


class Toleration(ApiModel):
    """A toleration (as in a Pod spec)."""

    key: str | None = Field(
        default=None, description="Taint key.", pattern=f"^({QUALIFIED_NAME})?$", max_length=317
    )
    operator: str | None = Field(
        default=None,
        description="Exists or Equal.",
        json_schema_extra={"enum": ["Exists", "Equal"]},
    )
    value: str | None = Field(default=None, description="Taint value.")
    effect: str | None = Field(
        default=None,
        description="NoSchedule, PreferNoSchedule or NoExecute.",
        json_schema_extra={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class AcceleratorSpec(ApiModel):
    """Which Spyre cards the pods request and where they may run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.resourceName) && has(self.deviceClassName))",
                    "set accelerator.resourceName (the device plugin's extended resource) or "
                    "accelerator.deviceClassName (a DRA DeviceClass), not both",
                )
            ]
        }
    )

    resource_name: str | None = Field(
        default=None,
        description=(
            "Extended resource for Spyre cards, as the device plugin advertises it: "
            "ibm.com/spyre_vf, ibm.com/spyre_pf, ibm.com/spyre_pf_tier0/1/2, or "
            "ibm.com/aiu_pf on older installs. Any valid extended-resource name is accepted. "
            "Unset: the operator's default (chart defaults.cardResource, built in "
            "ibm.com/spyre_vf)."
        ),
        max_length=253,
        pattern=EXTENDED_RESOURCE_PATTERN,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!self.startsWith('kubernetes.io/') && !self.contains('.kubernetes.io/') "
                    "&& !self.startsWith('requests.')",
                    "accelerator.resourceName must be an extended resource outside the "
                    "kubernetes.io domain, e.g. ibm.com/spyre_vf",
                )
            ]
        },
    )
    device_class_name: str | None = Field(
        default=None,
        description=(
            "DeviceClass of Spyre cards under Dynamic Resource Allocation (IBM's Spyre "
            "Operator in DRA mode: spyre-pf, spyre-standard-vf, spyre-privileged-vf), instead "
            "of an extended resource: the operator makes a ResourceClaimTemplate asking for "
            "the model's cards of this class and its pods on the cards claim from it; they "
            "are placed by the cluster's default scheduler unless schedulerName is set. "
            "Unset: the operator's default (chart defaults.deviceClassName) if it has one and "
            "resourceName is unset, else the extended resource."
        ),
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    scheduler_name: str | None = Field(
        default=None,
        description=(
            "Pod scheduler of pods on the cards; \"\" means the cluster's default scheduler. "
            "Unset: the operator's default (chart defaults.schedulerName, built in "
            "spyre-scheduler); with a deviceClassName, the cluster's default scheduler."
        ),
        max_length=253,
    )
    node_selector: NodeSelector | None = Field(
        default=None,
        description=(
            "Node labels the pods must match. Unset: the operator's default (chart "
            "defaults.serving.nodeSelector); {} for none."
        ),
        max_length=64,
        json_schema_extra=keys_are_qualified_names("accelerator.nodeSelector"),
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description=(
            "Tolerations for tainted accelerator nodes. Unset: the operator's default (chart "
            "defaults.serving.tolerations); [] for none."
        ),
    )


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany"]
