"""``status`` of a SpyreModel: conditions, the artifact, the cache, the canary."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .common import ApiModel
from .model import WarmupShape


class Condition(ApiModel):
    """A status condition (as metav1.Condition)."""

    type: str = Field(description="Condition type, e.g. Ready.")
    status: str = Field(
        description="True, False or Unknown.",
        json_schema_extra={"enum": ["True", "False", "Unknown"]},
    )
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed from."
    )
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )


class ReferencesStatus(ApiModel):
    """The artifact's reference answers, as its precompile recorded them (issue 30)."""

    source: str | None = Field(
        default=None,
        description=(
            "Where they were answered: self (the vLLM that compiled, on the artifact's own "
            "backend) or eager (a CPU run for sendnn_compile_only, which runs no model)."
        ),
    )
    prompts: int | None = Field(default=None, description="Prompts answered.")
    tokens: int | None = Field(default=None, description="Tokens generated over all prompts.")
    tolerance: float | None = Field(
        default=None, description="Largest probability difference a serving pod may show."
    )


class ArtifactStatus(ApiModel):
    """The compiled artifact for the current spec."""

    key: str | None = Field(default=None, description="Content-addressed artifact key.")
    path: str | None = Field(default=None, description="Artifact directory in the cache volume.")
    phase: str | None = Field(
        default=None,
        description="Pending, Compiling, Ready or Failed.",
        json_schema_extra={"enum": ["Pending", "Compiling", "Ready", "Failed"]},
    )
    job_name: str | None = Field(default=None, description="The precompile Job.")
    compile_seconds: float | None = Field(default=None, description="Compile wall time.")
    size_bytes: int | None = Field(default=None, description="Artifact size on disk.")
    completed_at: str | None = Field(default=None, description="When compilation finished.")
    message: str | None = Field(default=None, description="Detail, e.g. the failure reason.")
    claim: str | None = Field(
        default=None, description="The cache claim this artifact is (being) compiled on."
    )
    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description=(
            "UID of the cache claim the artifact was compiled on: a claim deleted and created "
            "again under the same name holds no artifact."
        ),
    )
    attempts: int | None = Field(
        default=None, description="Precompile Jobs run for this key on this claim so far."
    )
    model_revision: str | None = Field(
        default=None,
        description=(
            "The commit the precompile Job downloaded, for hf:// models (what @main meant "
            "when this artifact was compiled)."
        ),
    )
    next_retry_at: str | None = Field(
        default=None,
        description=(
            "When a failed compile is retried (bounded exponential backoff). Set the "
            "annotation serving.spyre.dev/retry-compile to a new value to retry at once."
        ),
    )
    retry_token: str | None = Field(
        default=None,
        description="The last serving.spyre.dev/retry-compile value acted upon.",
    )
    reason: str | None = Field(
        default=None,
        description=(
            "CamelCase reason of the last failed compile (PrecompileFailed, or the engine's "
            "own, e.g. ModelNotFound); kept with the message once the failed Job is removed."
        ),
    )
    references: ReferencesStatus | None = Field(
        default=None,
        description=(
            "The reference answers every serving pod checks its own against before it turns "
            "Ready; absent when the precompile recorded none (eager, a pooling model, an "
            "engine from before the check)."
        ),
    )
    waiting_since: str | None = Field(
        default=None,
        description=(
            "While the model waits for a slot of the cluster-wide precompile budget "
            "(WaitingForCompileSlot): since when; the oldest waiting model goes first."
        ),
    )


class CachedArtifact(ApiModel):
    """An artifact this model compiled or served, known to be on a cache claim.

    Remembered so that reverting a compile-affecting edit serves the artifact again at once,
    without a precompile Job, as long as it is on the same claim (same claimUID).
    """

    key: str = Field(description="Content-addressed artifact key.")
    claim: str = Field(description="The cache claim the artifact is on.")
    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description="UID of that claim when the artifact was recorded (a new claim has none).",
    )
    path: str | None = Field(default=None, description="Artifact directory in the cache volume.")
    model: str | None = Field(default=None, description="spec.model.uri it was compiled from.")
    shape: str | None = Field(default=None, description="The compile shape, in short.")
    size_bytes: int | None = Field(default=None, description="Artifact size on disk.")
    compile_seconds: float | None = Field(default=None, description="Compile wall time.")
    completed_at: str | None = Field(default=None, description="When compilation finished.")
    model_revision: str | None = Field(
        default=None, description="The commit an hf:// model resolved to, if known."
    )
    in_use: bool | None = Field(
        default=None,
        description="The spec needs it or the Deployment serves it.",
    )
    last_used: str | None = Field(
        default=None,
        description=(
            "When it was last in use: the time it stopped being needed or served (for one in "
            "use, when it was recorded or came back into use)."
        ),
    )


class CacheStatus(ApiModel):
    """What this model knows to be on its cache claims."""

    artifacts: list[CachedArtifact] | None = Field(
        default=None,
        description=(
            "Artifacts this model compiled or served, most recently used first (at most 16): "
            "reverting to one of them on the same claim serves it without compiling."
        ),
    )
    used_bytes: int | None = Field(
        default=None,
        description="Total size of the listed artifacts on the current cache claim.",
    )
    usage: str | None = Field(
        default=None,
        description="used_bytes in human units and how many artifacts, e.g. '2.1 GiB in 3'.",
    )
    capacity_bytes: int | None = Field(
        default=None, description="The current cache claim's capacity (its PVC's status)."
    )
    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description="UID of the cache claim capacityBytes and freeBytes describe.",
    )
    free_bytes: int | None = Field(
        default=None,
        description=(
            "Free space on the current cache claim as last measured on the volume (by the "
            "newest garbage-collection Job on it; absent until one ran)."
        ),
    )
    weights_bytes: int | None = Field(
        default=None,
        description=(
            "Size of the models downloaded onto the current cache claim (hf:// models, in "
            "its hub directory, beside the artifacts) as last measured on the volume."
        ),
    )
    measured_at: str | None = Field(
        default=None,
        description="When freeBytes and weightsBytes were measured (the GC Job's completion).",
    )


class CompileStatus(ApiModel):
    """The compile shape the operator uses: the spec's fields, the omitted ones filled in."""

    tensor_parallel_size: int | None = Field(default=None, description="Cards per replica.")
    max_model_len: int | None = Field(default=None, description="Context length (decoders).")
    max_num_seqs: int | None = Field(default=None, description="Decode batch size (decoders).")
    warmup_shapes: list[WarmupShape] | None = Field(
        default=None, description="Static shapes (pooling models)."
    )
    source: str | None = Field(
        default=None,
        description=(
            "Spec (every field given), SupportedConfiguration (omitted fields from the "
            "plugin's supported configurations of the model) or Fallback (a model the plugin "
            "does not list by id, unchecked: 1 card, 4096 tokens, 4 sequences)."
        ),
        json_schema_extra={"enum": ["Spec", "SupportedConfiguration", "Fallback"]},
    )
    supported_model: str | None = Field(
        default=None,
        description="The plugin's model_configs.yaml entry the model uri names, if any.",
    )
    message: str | None = Field(
        default=None, description="Which shape, why, and the other supported ones."
    )


class EffectiveStatus(ApiModel):
    """The per-site settings in use: the spec's, or the operator's defaults for those unset."""

    engine_image: str | None = Field(default=None, description="The engine image.")
    image_pull_secrets: list[str] | None = Field(
        default=None, description="Secrets the engine image is pulled with."
    )
    service_account_name: str | None = Field(
        default=None,
        description="The ServiceAccount of the precompile and serving pods (unset: default).",
    )
    resource_name: str | None = Field(
        default=None, description="The extended resource the pods request cards as."
    )
    device_class_name: str | None = Field(
        default=None,
        description="The DeviceClass the pods claim cards of through DRA (instead of a resource).",
    )
    scheduler_name: str | None = Field(
        default=None,
        description="The scheduler of pods on the cards (empty: the cluster's default).",
    )
    storage_class_name: str | None = Field(
        default=None,
        description=(
            "The cache PVC's StorageClass: the live PVC's, else the one it is created with "
            "(unset: the cluster's default)."
        ),
    )
    from_defaults: list[str] | None = Field(
        default=None,
        description=(
            "The spec fields left unset that follow the operator's defaults, e.g. "
            "engine.image: changing the default changes them at the next reconcile."
        ),
    )


class OperatorStamp(ApiModel):
    """Which operator install wrote a status, and when (see control/peers.py)."""

    install: str | None = Field(
        default=None, description="The install's Lease, <namespace>/<name>: one per release."
    )
    identity: str | None = Field(default=None, description="The replica (pod) that wrote.")
    written_at: str | None = Field(
        default=None, description="When it wrote the status last (RFC 3339)."
    )


class ScaleToZeroStatus(ApiModel):
    """Scale to zero (autoscaling.minReplicas 0), as KEDA reports it."""

    last_active_time: str | None = Field(
        default=None,
        description="When KEDA last saw a trigger active (the ScaledObject's lastActiveTime).",
    )
    scaled_to_zero_since: str | None = Field(
        default=None, description="Since when spec.replicas is 0 (RFC 3339); absent above zero."
    )


class CanaryStatus(ApiModel):
    """spec.serving.canary's progress for the spec's artifact."""

    artifact_key: str | None = Field(default=None, description="The artifact on the canary.")
    phase: Literal["Running", "Passed", "Failed"] | None = Field(
        default=None,
        description=(
            "Running: its pods serve beside the previous artifact's. Passed: the Deployment "
            "rolls out to it. Failed: a canary pod broke the bounds (CanaryFailed), it was "
            "not passed by its deadline (CanaryDeadlineExceeded) or aborted by the annotation "
            "(CanaryAborted); the previous artifact keeps serving."
        ),
    )
    created_time: str | None = Field(
        default=None, description="When the canary began (its deadline counts from here)."
    )
    deadline_time: str | None = Field(
        default=None, description="When a canary not passed by then fails."
    )
    start_time: str | None = Field(
        default=None,
        description=(
            "When every canary pod was last Ready (the window's start): a canary pod that is "
            "created again or restarts starts the window again."
        ),
    )
    passed_time: str | None = Field(default=None, description="When the canary passed.")
    judged_requests: int | None = Field(
        default=None,
        description=(
            "The fewest inference requests a canary pod judged (its engine's count, read from "
            "the pod): the canary passes only once every canary pod judged minRequests."
        ),
    )
    min_requests: int | None = Field(
        default=None, description="canary.minRequests, the count each canary pod needs."
    )
    reason: str | None = Field(
        default=None,
        description=(
            "How it ended: WindowPassed, PromotedByAnnotation, CanaryFailed, "
            "CanaryDeadlineExceeded or CanaryAborted."
        ),
    )
    message: str | None = Field(default=None, description="Why it passed or failed.")
    baseline_from: str | None = Field(
        default=None,
        description=(
            "The window start the baseline's starting counts were taken for "
            "(baselineStart): the previous artifact's pods are compared over the window "
            "from then."
        ),
    )
    baseline_start: list[ServedCounts] | None = Field(
        default=None,
        description=(
            "What each of the previous artifact's pods had served when the window started "
            "(read from the pods); what they serve from then on is the baseline."
        ),
    )
    comparison: CanaryComparison | None = Field(
        default=None, description="The canary and the baseline over the window, side by side."
    )
    baseline_verdict: str | None = Field(
        default=None,
        description=(
            "Why the canary compared worse than the baseline at the window's end (it then "
            "fails with CanaryFailed)."
        ),
    )


class ServedCounts(ApiModel):
    """What one serving pod had served since Ready (its engine's /health/served)."""

    pod: str = Field(description="The pod.")
    judged: int = Field(ge=0, description="Inference requests the model answered or failed.")
    errors: int = Field(ge=0, description="Of them, answered with a server error.")
    ttft_sum: float | None = Field(default=None, ge=0, description="Seconds to first token.")
    ttft_count: int | None = Field(default=None, ge=0, description="Requests timed so.")
    tpot_sum: float | None = Field(default=None, ge=0, description="Seconds per output token.")
    tpot_count: int | None = Field(default=None, ge=0, description="Requests timed so.")


class ServedFigures(ApiModel):
    """One side of the comparison over the canary's window."""

    pods: int = Field(ge=0, description="Pods whose figures were read.")
    requests: int = Field(ge=0, description="Inference requests answered or failed.")
    error_ratio: float | None = Field(default=None, description="Share of server errors.")
    ttft_seconds: float | None = Field(default=None, description="Mean time to first token.")
    tpot_seconds: float | None = Field(
        default=None, description="Mean time per output token."
    )


class CanaryComparison(ApiModel):
    """The canary's figures beside the previous artifact's pods' (the baseline)."""

    canary: ServedFigures
    baseline: ServedFigures
    message: str | None = Field(default=None, description="What the comparison concluded.")


class OutputCheckStatus(ApiModel):
    """The last output-check outcome the operator recorded (serving.outputCheck)."""

    artifact_key: str | None = Field(default=None, description="The artifact it concerns.")
    result: Literal["Passed", "Failed", "Unchecked"] | None = Field(
        default=None,
        description=(
            "Passed: every replica of the artifact's rollout answered its reference prompts "
            "as recorded (under Enforce); its later pods skip the check while its files are "
            "unchanged. Failed: a pod of it answered unlike its reference (OutputMismatch). "
            "Unchecked: it rolled out, but its precompile recorded no reference answers."
        ),
    )
    time: str | None = Field(default=None, description="When the operator recorded it.")
    pods: int | None = Field(default=None, description="Passed: the replicas that passed.")
    message: str | None = Field(
        default=None, description="Failed: the first divergence; Unchecked: why.")


class AllocatedDevice(ApiModel):
    """A device allocated to a serving pod's ResourceClaim (DRA)."""

    pod: str = Field(description="The serving pod.")
    driver: str = Field(description="The DRA driver, e.g. spyre.ibm.com.")
    pool: str = Field(description="The driver's pool (IBM's driver: one per node).")
    device: str = Field(description="The device in the pool, e.g. 0000-1a-00-1.")


class SpyreModelStatus(ApiModel):
    """Observed state of a SpyreModel."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status reflects."
    )
    artifact: ArtifactStatus | None = Field(
        default=None, description="The artifact the current spec needs."
    )
    compile: CompileStatus | None = Field(
        default=None, description="The compile shape in use, and where it comes from."
    )
    effective: EffectiveStatus | None = Field(
        default=None,
        description=(
            "The per-site settings in use (engine image, pull secrets, card resource, "
            "scheduler, StorageClass): the spec's, or the operator's defaults."
        ),
    )
    cache: CacheStatus | None = Field(
        default=None, description="Artifacts this model knows to be on its cache claims."
    )
    serving_artifact_key: str | None = Field(
        default=None,
        description="Artifact key the serving Deployment runs (differs while a new one compiles).",
    )
    served_spec: str | None = Field(
        default=None,
        description=(
            "The spec the serving Deployment is built from (canonical JSON): while a new "
            "artifact compiles, a deleted Deployment is recreated from it, serving "
            "servingArtifactKey."
        ),
    )
    last_good_artifact_key: str | None = Field(
        default=None,
        description=(
            "The artifact the Deployment last finished rolling out with every replica Ready "
            "(an engine that checks its answers turns Ready only once they matched the "
            "artifact's reference): what a model serves again when a newer artifact is "
            "refused for OutputMismatch."
        ),
    )
    last_good_served_spec: str | None = Field(
        default=None,
        description="The spec lastGoodArtifactKey was served from (canonical JSON).",
    )
    canary: CanaryStatus | None = Field(
        default=None, description="Only with serving.canary: the new artifact's canary."
    )
    output_check: OutputCheckStatus | None = Field(
        default=None,
        description=(
            "The last output check's outcome (the operator's own record: the "
            "<model>-output-check ConfigMap only tells pods which artifact passed)."
        ),
    )
    replicas: int | None = Field(default=None, description="Serving pods (all versions).")
    ready_replicas: int | None = Field(default=None, description="Ready serving pods.")
    selector: str | None = Field(
        default=None, description="Label selector of serving pods (for the scale subresource)."
    )
    endpoint: str | None = Field(
        default=None, description="In-cluster OpenAI base URL, e.g. http://name.ns.svc:8000/v1."
    )
    scale_to_zero: ScaleToZeroStatus | None = Field(
        default=None, description="Only with autoscaling.minReplicas 0: last use and time at zero."
    )
    devices: list[AllocatedDevice] | None = Field(
        default=None,
        max_length=16,
        description=(
            "Only with accelerator.deviceClassName: the devices allocated to the serving pods' "
            "ResourceClaims, by pod name (at most 16)."
        ),
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description=(
            "Ready, CacheVolumeReady, ArtifactReady, Progressing and Degraded; plus Reconciling "
            "and Stalled (mirrors of Progressing and Degraded, for kstatus/Flux); RoutingReady "
            "when routing.inferencePool is set."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    operator: OperatorStamp | None = Field(
        default=None,
        description=(
            "The operator install that wrote this status last. Another install that finds "
            "it fresh leaves the model alone and reports an OperatorConflict Event."
        ),
    )
