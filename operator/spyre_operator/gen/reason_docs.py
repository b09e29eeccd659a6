"""What each reason a SpyreModel's conditions carry means, and what to do (issue 47, 4 and 6).

The reasons table of docs/troubleshooting.md is generated from :data:`REASONS` (``make crds``
writes it; tests/unit/test_reasons_walk.py fails when the page drifts, when a reason of
decide/conditions.py has no entry, or when an entry's remedy names nothing to act on). Edit the
table here. Cells are Markdown; the order is the table's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decide import conditions as C


@dataclass(frozen=True)
class Reason:
    """One row: on which conditions the reason shows, what it means, what to do."""

    where: str
    means: str
    todo: str


REASONS: dict[str, Reason] = {
    C.SERVING: Reason(
        where="Ready=True",
        means="replicas of the current artifact are available",
        todo="nothing",
    ),
    C.SERVING_PREVIOUS_ARTIFACT: Reason(
        where="Ready=True",
        means=("a new artifact compiles (or compiles on a new cache claim) after a "
               "compile-affecting edit; the pods of the previous artifact keep serving"),
        todo="wait; `ArtifactReady` shows the compile",
    ),
    C.SCALED_TO_ZERO: Reason(
        where="Ready=True",
        means="`replicas: 0`",
        todo="scale up: `kubectl scale spyremodel/NAME --replicas 1`",
    ),
    C.COMPILING: Reason(
        where="Ready, ArtifactReady=False; Progressing=True",
        means="the precompile Job runs (or is about to)",
        todo="wait; `kubectl logs job/<status.artifact.jobName>`",
    ),
    C.WAITING_FOR_COMPILE_SLOT: Reason(
        where="ArtifactReady=False (and Ready=False while nothing serves); Progressing=True",
        means=("the model needs a precompile Job but all slots of the cluster-wide compile "
               "budget are in use (\"3 of 3 precompile slots in use (max-concurrent-compiles); "
               "queued 5th\"); no Job is created yet, pods of a previous artifact keep serving "
               "(`Ready=True ServingPreviousArtifact`); a freed slot goes to the namespace "
               "holding the fewest slots, oldest waiting first "
               "(`status.artifact.waitingSince`); with "
               "`budget.maxConcurrentCompilesPerNamespace` the message may say its namespace "
               "holds its share (\"2 of 2 precompile slots of this namespace in use\")"),
        todo=("wait; or raise `budget.maxConcurrentCompiles` "
              "([Upgrade](operations.md#upgrade)); a precompile Job whose pod cannot start "
              "(`PrecompileUnschedulable`, `ImagePullFailed`) holds its slot until it is fixed, "
              "replaced or reaches its 2 h deadline: `kubectl get jobs -A -l "
              "app.kubernetes.io/component=precompile`"),
    ),
    C.WAITING_FOR_ROLLOUT_SLOT: Reason(
        where="Progressing=True (Ready=True `ServingPreviousArtifact`)",
        means=("the new artifact is ready but all slots of the rollout budget are in use; the "
               "Deployment keeps serving the previous artifact until a rollout completes"),
        todo=("wait; or raise `budget.maxConcurrentRollouts`; a switch stuck on its own pods "
              "holds its slot until its progress deadline (`RolloutStalled`); a scale-up of an "
              "artifact that rolled out (an HPA or KEDA at the cluster's capacity) holds none"),
    ),
    C.ROLLING_OUT: Reason(
        where="Ready=False; Progressing=True",
        means="serving pods are starting (loading the artifact)",
        todo=("wait; if it lasts, look at the pods (`kubectl get pods -l "
              "serving.spyre.dev/model=NAME`)"),
    ),
    C.PODS_NOT_READY: Reason(
        where="Ready=False",
        means="the Deployment has no pod at all yet or none available",
        todo="`kubectl describe` the Deployment and its pods",
    ),
    C.INSUFFICIENT_CAPACITY: Reason(
        where="Progressing=True",
        means=("some replicas wait for a node with free cards (or CPU, memory); the message is "
               "the scheduler's; the others serve and `Ready` stays True"),
        todo="free or add cards, or lower `replicas`",
    ),
    C.DEVICES_UNAVAILABLE: Reason(
        where="Progressing=True",
        means=("the model's cards come through DRA (`accelerator.deviceClassName`) and some "
               "replicas wait for a node because their ResourceClaim cannot be allocated: no "
               "node offers enough free devices of the class; the message is the scheduler's; "
               "the others serve and `Ready` stays True"),
        todo=("free or add devices of the class (`kubectl get resourceslices`), or lower "
              "`replicas` or `tensorParallelSize`"),
    ),
    C.DEVICE_CLASS_NOT_FOUND: Reason(
        where="Degraded=True; Progressing=True while pods wait",
        means=("`accelerator.deviceClassName` (or the chart's `defaults.deviceClassName`) names "
               "a DeviceClass the cluster does not have; the message names it"),
        todo=("fix the name (`kubectl get deviceclasses`; IBM's Spyre Operator in DRA mode makes "
              "`spyre-pf`, `spyre-standard-vf`, `spyre-privileged-vf`) or turn DRA on there"),
    ),
    C.SCHEDULER_NOT_RUNNING: Reason(
        where="Progressing=True",
        means=("serving pods have waited 60 s (the operator's "
               "`SPYRE_SCHEDULER_SILENCE_SECONDS`) without any scheduler looking at them (no "
               "`PodScheduled` condition): the scheduler they name "
               "(`accelerator.schedulerName`, or the chart's `defaults.schedulerName`; built "
               "in: `spyre-scheduler`) is not installed or not running; the message names it"),
        todo=("install IBM's Spyre Operator, which runs `spyre-scheduler`, or fix the scheduler "
              "name"),
    ),
    C.RECONCILED: Reason(
        where="Progressing=False",
        means="nothing in progress",
        todo="nothing",
    ),
    C.AS_EXPECTED: Reason(
        where="Degraded=False",
        means="nothing to fix",
        todo="nothing",
    ),
    C.ARTIFACT_AVAILABLE: Reason(
        where="ArtifactReady=True",
        means="the artifact exists on the claim",
        todo="nothing",
    ),
    C.PRECOMPILE_FAILED: Reason(
        where="ArtifactReady=False; Degraded=True",
        means=("the compile failed; the message is the engine's termination log, with the "
               "attempt and the next retry time (retries back off from 1 min to 1 h)"),
        todo=("fix the cause, then retry at once: `kubectl annotate --overwrite spyremodel/NAME "
              "serving.spyre.dev/retry-compile=$(date +%s)`"),
    ),
    C.UNSUPPORTED_BASE: Reason(
        where="ArtifactReady=False; Degraded=True",
        means=("the engine image's vLLM or sendnn-inference is not a version its spyre-engine "
               "supports (the message names what it found and what it needs)"),
        todo=("use a base with the supported versions "
              "([engine/README.md](../engine/README.md)), or the spyre-engine release that "
              "supports yours"),
    ),
    C.INSUFFICIENT_CACHE_SPACE: Reason(
        where="ArtifactReady=False; Degraded=True",
        means=("the precompile stopped before compiling: the last artifact of this shape on the "
               "claim (any key: an engine upgrade gives the same shape a new one) took more, "
               "with a 25% margin, than the claim has free; the message names both sizes"),
        todo=("grow `cache.volume.size` (a StorageClass that allows expansion; else a new "
              "`cache.volume.name`), or a shorter `cache.volume.retention` so garbage "
              "collection removes unused artifacts; then `kubectl annotate --overwrite "
              "spyremodel/NAME serving.spyre.dev/retry-compile=1`"),
    ),
    C.PRECOMPILE_UNSCHEDULABLE: Reason(
        where="ArtifactReady=False; Progressing=True",
        means=("no node fits the precompile pod (the scheduler's message); not `Degraded`, "
               "since a node may free up"),
        todo=("check `precompile.nodeSelector`, `tolerations`, `resources`; with "
              "`precompile.onCards`, free cards"),
    ),
    C.PRECOMPILE_POD_REJECTED: Reason(
        where="ArtifactReady=False; Degraded=True",
        means=("the Job controller cannot create the pod (its `FailedCreate`: a ResourceQuota, "
               "LimitRange or Pod Security refusal)"),
        todo=("raise the quota or fix the namespace's policy (`kubectl describe job "
              "<status.artifact.jobName>` shows the refusal); the Job is replaced once a field "
              "outside the artifact key changes"),
    ),
    C.MODEL_NOT_FOUND: Reason(
        where="ArtifactReady=False; Degraded=True",
        means="the hub has no such repository, revision or file (it answered 404)",
        todo="fix `model.uri` (and `@revision`) or `downloadEnv` (`HF_ENDPOINT`)",
    ),
    C.MODEL_DOWNLOAD_FAILED: Reason(
        where="ArtifactReady=False; Degraded=True",
        means=("the download failed for another reason than the repository; the message names "
               "the cause: the hub's name does not resolve, a proxy refused, TLS failed, the "
               "hub did not answer in time or answered 5xx, or the cache claim filled up"),
        todo=("per the message: `HF_ENDPOINT` or `HTTPS_PROXY`/`NO_PROXY` in "
              "`model.downloadEnv`, the CA in `model.caBundle`, egress NetworkPolicies; a full "
              "claim: `cache.volume.size` or `cache.volume.retention`; the compile is retried "
              "with back-off"),
    ),
    C.MODEL_ACCESS_DENIED: Reason(
        where="ArtifactReady=False; Degraded=True",
        means="the hub answered 401/403: a gated or private model without a token that has access",
        todo=("set `model.tokenSecret` to a token with access (accept the model's licence on "
              "the hub)"),
    ),
    C.UNSUPPORTED_CONFIGURATION: Reason(
        where="ArtifactReady=False; Degraded=True",
        means=("the compile shape is not one the Spyre plugin lists for the model (the message "
               "names the supported ones; nothing is created), or an FP8 model cannot be "
               "compiled off the cards"),
        todo=("use a listed shape (or omit it), set `compile.supportedModel` for a fine-tune or "
              "mirror, set `precompile.onCards: true` for FP8; `requireKnownConfiguration: "
              "false` skips the check"),
    ),
    C.ENGINE_IMAGE_NOT_ALLOWED: Reason(
        where="Ready, ArtifactReady=False; Degraded=True",
        means=("the engine image in use (the model's `engine.image`, or the operator's default "
               "if unset; `status.effective.engineImage`) matches none of the chart's "
               "`allowedEngineImages`; nothing is compiled or changed, a Deployment already "
               "serving keeps serving"),
        todo=("use an allowed image, or unset `engine.image` to follow the default; the cluster "
              "admin extends `allowedEngineImages`"),
    ),
    C.IMAGE_PULL_FAILED: Reason(
        where="Ready or ArtifactReady=False; Degraded=True",
        means=("the engine image cannot be pulled (`ErrImagePull`, `ImagePullBackOff`, "
               "`InvalidImageName`; the kubelet's message, within 30 s)"),
        todo=("fix `engine.image` (or the chart's `defaults.engineImage`) or add pull secrets "
              "(`engine.imagePullSecrets`, `defaults.imagePullSecrets`)"),
    ),
    C.CONTAINER_CONFIG_ERROR: Reason(
        where="Ready or ArtifactReady=False; Degraded=True",
        means=("a container cannot be created: a Secret, ConfigMap or key it references is "
               "missing (`tokenSecret`, `caBundle`, `serving.env`, `modelConfigFile`)"),
        todo=("create it (`kubectl -n NS create secret ...`) or fix the reference in the field "
              "named"),
    ),
    C.ENGINE_FAILED: Reason(
        where="Ready=False; Degraded=True",
        means=("a serving pod's engine exits (crash loop); the message has the engine's reason, "
               "e.g. `InvalidSettings` for an `extraArgs` flag the operator sets itself"),
        todo="`kubectl logs` the pod; fix `serving.extraArgs`/`env`/`resources`",
    ),
    C.OUTPUT_MISMATCH: Reason(
        where=("ArtifactReady=False; Degraded=True (Ready=True `ServingPreviousArtifact` while "
               "the last artifact rolled out serves, else Ready=False)"),
        means=("a serving pod of the new artifact answered the artifact's reference prompts "
               "unlike the answers its precompile recorded, and stopped before it turned Ready; "
               "the message names the first diverging prompt, position, expected and actual "
               "token and their probabilities. The artifact is not promoted and not compiled "
               "again (the same inputs give the same graphs); the Deployment goes back to "
               "`status.lastGoodArtifactKey`"),
        todo=("find what changed between compile and serve (the model's weights on its claim, "
              "the engine image, the plugin); after a fix, set the annotation "
              "`serving.spyre.dev/retry-compile` to a new value to check again, or edit the "
              "spec; `spec.serving.outputCheck: Warn` serves anyway and logs the mismatch"),
    ),
    C.CANARY_FAILED: Reason(
        where="ArtifactReady=False; Degraded=True (Ready=True `ServingPreviousArtifact`)",
        means=("with `spec.serving.canary`, a canary pod of the new artifact broke the model's "
               "bounds: more than `maxErrorRatio` of its inference requests answered with a "
               "server error once `minRequests` were answered, or (with "
               "`maxMeanLatencySeconds`) a higher mean latency; or, at the window's end, its "
               "mean time to first token or per output token was more than `maxLatencyRatio` "
               "times the previous artifact's pods' over the same window "
               "(`status.canary.comparison`); the message says which, with the counts. The "
               "canary pods are removed, the artifact is not promoted (nor compiled again), and "
               "the previous artifact, which never stopped serving, keeps serving; "
               "`status.canary` says `Failed`"),
        todo=("read the canary pod's log and the engine's `spyre_engine_requests_total`; after "
              "a fix, set the annotation `serving.spyre.dev/retry-compile` to a new value to "
              "run the canary again, or edit the spec"),
    ),
    C.CANARY_RUNNING: Reason(
        where="Progressing=True (Ready=True `ServingPreviousArtifact`)",
        means=("with `spec.serving.canary`, the new artifact passed its output check and serves "
               "on its canary pods beside the previous artifact's for `durationSeconds` from "
               "when they last turned Ready; the message says how far the window is and what "
               "each canary pod judged ([verified-promotion.md](verified-promotion.md))"),
        todo=("nothing; promote or abort early with `serving.spyre.dev/canary-promote` or "
              "`canary-abort`"),
    ),
    C.CANARY_AWAITING_TRAFFIC: Reason(
        where="Progressing=True (Ready=True `ServingPreviousArtifact`)",
        means=("the canary's window is over but a canary pod judged fewer than `minRequests` "
               "inference requests (its engine's count, read from the pod's `/health/canary`; a "
               "client's 4xx does not count): an idle canary proves nothing, so the previous "
               "artifact keeps serving; `status.canary.judgedRequests` says how many of "
               "`minRequests`"),
        todo=("send traffic to the model, or promote by hand "
              "(`serving.spyre.dev/canary-promote`); it fails at `canary.deadlineSeconds`"),
    ),
    C.CANARY_DEADLINE_EXCEEDED: Reason(
        where="ArtifactReady=False; Degraded=True (Ready=True `ServingPreviousArtifact`)",
        means=("with `spec.serving.canary`, the canary was not passed within "
               "`canary.deadlineSeconds` (default `durationSeconds` + 1800) of its start: its "
               "pods never all turned Ready (an image pull, a crash loop, no card; a canary "
               "pod's failure shows in `Degraded` while it runs), or kept restarting, which "
               "starts the window again. The message says what the canary was doing then; the "
               "previous artifact keeps serving"),
        todo=("fix the cause, then set `serving.spyre.dev/retry-compile` to a new value to run "
              "the canary again"),
    ),
    C.CANARY_ABORTED: Reason(
        where="ArtifactReady=False; Degraded=True (Ready=True `ServingPreviousArtifact`)",
        means=("the annotation `serving.spyre.dev/canary-abort` names the canary's artifact "
               "(`status.canary.artifactKey`'s first 12 characters); the previous artifact "
               "keeps serving"),
        todo=("remove the annotation and set `serving.spyre.dev/retry-compile` to a new value "
              "to run it again, or edit the spec"),
    ),
    C.WINDOW_PASSED: Reason(
        where="`status.canary.reason` (phase `Passed`); Progressing=True `RollingOut`",
        means=("with `spec.serving.canary`, every canary pod served its window within the "
               "bounds, judging at least `minRequests`; the main Deployment rolls out to the "
               "new artifact and the canary is removed once that rollout is done "
               "([verified-promotion.md](verified-promotion.md#windowpassed))"),
        todo="nothing; `Progressing` is `RollingOut` until the Deployment is done",
    ),
    C.PROMOTED_BY_ANNOTATION: Reason(
        where="`status.canary.reason` (phase `Passed`); Progressing=True `RollingOut`",
        means=("someone set the annotation `serving.spyre.dev/canary-promote` to the canary's "
               "artifact during its window: promoted without waiting for its evidence "
               "([verified-promotion.md](verified-promotion.md#promotedbyannotation))"),
        todo="nothing; `Progressing` is `RollingOut` until the Deployment is done",
    ),
    C.ARTIFACT_CORRUPT: Reason(
        where="Ready=False; Degraded=True",
        means=("a serving pod found the artifact missing files, truncated or changed against "
               "its manifest"),
        todo=("delete the precompile Job (`status.artifact.jobName`): the operator compiles it "
              "again, once"),
    ),
    C.ARTIFACT_MISMATCH: Reason(
        where="Ready=False; Degraded=True",
        means=("a serving pod found no catalog entry for its shape, or one compiled by another "
               "compiler stack (a base image changed under a reused tag)"),
        todo=("build the engine under a new tag in `engine.image` (a new key compiles anew) or "
              "delete the precompile Job (`status.artifact.jobName`)"),
    ),
    C.ROLLOUT_STALLED: Reason(
        where="Degraded=True",
        means="the Deployment exceeded its progress deadline",
        todo=("look at the new pods and their Events (`kubectl get pods -l "
              "serving.spyre.dev/model=NAME`, `kubectl describe pod`)"),
    ),
    C.RECONCILE_ERROR: Reason(
        where="Degraded=True (or Reconciling=True)",
        means=("the API server rejected a write (the message is the server's: an admission "
               "webhook, a quota), or the operator failed unexpectedly"),
        todo=("read the message and the operator's log (`kubectl -n spyre-system logs "
              "deploy/spyre-model-operator`); fix the policy that refuses the object"),
    ),
    C.NAME_CONFLICT: Reason(
        where=("Degraded=True (or RoutingReady=False); Ready=False too when it is the model's "
               "Service (its endpoint reaches someone else's)"),
        means=("a Deployment, Service, PodDisruptionBudget, HPA or InferencePool with the "
               "model's name exists and is not the operator's; it is never taken over"),
        todo="rename the model (`metadata.name`) or delete the other object (`kubectl delete`)",
    ),
    C.INVALID_SPEC: Reason(
        where="Ready=False; Degraded=True",
        means="the spec cannot be used (the message names the field)",
        todo="fix the field the message names (`kubectl edit spyremodel NAME`)",
    ),
    C.CLAIM_BOUND: Reason(
        where="CacheVolumeReady=True",
        means="the cache PVC is bound",
        todo="nothing",
    ),
    C.CLAIM_NEARLY_FULL: Reason(
        where="CacheVolumeReady=True",
        means=("the artifacts on the claim use `cache.usageWarningPercent` (default 85) of its "
               "capacity (a Warning Event); a compile on a full claim fails with \"no space "
               "left on device\""),
        todo=("grow `cache.volume.size` (needs a StorageClass that allows expansion), lower "
              "`retention`, or delete unused models"),
    ),
    C.CLAIM_CREATING: Reason(
        where="CacheVolumeReady=False",
        means="the operator is creating the cache PVC",
        todo="wait",
    ),
    C.CLAIM_PENDING: Reason(
        where="CacheVolumeReady=False",
        means=("the PVC is not bound (a StorageClass that binds on first use binds it with the "
               "precompile pod)"),
        todo=("`kubectl describe pvc`: usually no StorageClass that provides `ReadWriteMany`; "
              "set `cache.volume.storageClassName`"),
    ),
    C.CLAIM_NOT_FOUND: Reason(
        where="CacheVolumeReady, ArtifactReady, Ready=False; Degraded=True",
        means="`cache.claimName` (or the `pvc://` model's claim) names a PVC that does not exist",
        todo="create the PVC or fix `cache.claimName` (or the `pvc://` URI in `model.uri`)",
    ),
    C.CLAIM_LOST: Reason(
        where="CacheVolumeReady=False; Degraded=True",
        means="the PVC lost its volume (its PersistentVolume is gone)",
        todo=("`kubectl delete pvc` a claim the operator manages (`cache.volume`): it is "
              "created empty and the artifacts compile again; restore the volume of a "
              "`cache.claimName` claim, or name another"),
    ),
    C.CLAIM_TERMINATING: Reason(
        where="CacheVolumeReady=False; Degraded=True",
        means=("the PVC is being deleted; the message names the finalizers holding it "
               "(`kubernetes.io/pvc-protection` while pods mount it)"),
        todo=("once it is gone, a PVC the operator manages (`cache.volume`) is created again "
              "and the artifacts compile again; recreate a `cache.claimName` PVC yourself"),
    ),
    C.CLAIM_CONFLICT: Reason(
        where="Degraded=True",
        means=("another SpyreModel named the same managed PVC first, with another size, class "
               "or access modes"),
        todo="use the same settings, or another `cache.volume.name`",
    ),
    C.CLAIM_IMMUTABLE: Reason(
        where="Degraded=True",
        means="an edit a bound PVC cannot take (class, access modes, a smaller size)",
        todo=("revert it, or use a new `cache.volume.name` (compiles on the new claim while the "
              "old one serves)"),
    ),
    C.AUTOSCALER_PENDING: Reason(
        where="Autoscaling=Unknown",
        means="the HPA has not evaluated yet",
        todo="wait",
    ),
    C.AUTOSCALER_ACTIVE: Reason(
        where="Autoscaling=True",
        means="the HPA can read the metrics and scale",
        todo="nothing",
    ),
    C.SCALE_TO_ZERO_ACTIVE: Reason(
        where="Autoscaling=True",
        means=("`minReplicas: 0`: KEDA's ScaledObject is Ready and its HTTP add-on routes the "
               "model's Service; requests wake the model and idleness takes it to zero"),
        todo="nothing",
    ),
    C.SCALE_TO_ZERO_UNAVAILABLE: Reason(
        where="Autoscaling=False",
        means=("`minReplicas: 0` cannot work here: KEDA or its HTTP add-on is not installed (or "
               "the operator may not use it, or runs with scale to zero off), the interceptor "
               "has no endpoints, or a trigger cannot be built; the message carries the API "
               "server's"),
        todo=("install KEDA and its HTTP add-on and set the chart's `scaleToZero.enabled=true` "
              "([operations](operations.md)), or set `autoscaling.minReplicas` to 1"),
    ),
    C.SCALED_OBJECT_NOT_READY: Reason(
        where="Autoscaling=False",
        means="KEDA reports the model's ScaledObject not Ready (its message)",
        todo=("`kubectl describe scaledobject NAME` (named like the serving Deployment); KEDA's "
              "operator log"),
    ),
    C.REPLICAS_AT_ZERO: Reason(
        where="Autoscaling=False",
        means=("`autoscaling.minReplicas` went back to 1 or more while `spec.replicas` is 0: an "
               "HPA does not scale from zero"),
        todo="`kubectl scale spyremodel/NAME --replicas 1`",
    ),
    C.INFERENCE_POOL_ACCEPTED: Reason(
        where="RoutingReady=True",
        means="a Gateway accepted the pool",
        todo="nothing",
    ),
    C.INFERENCE_POOL_PENDING: Reason(
        where="RoutingReady=False",
        means="no Gateway has reported on the pool (no HTTPRoute uses it yet)",
        todo="reference the pool from an HTTPRoute's `backendRefs` ([reference](reference.md))",
    ),
    C.INFERENCE_POOL_NOT_ACCEPTED: Reason(
        where="RoutingReady=False",
        means="a Gateway refused the pool (its reason and message)",
        todo=("fix what the Gateway says (`kubectl get inferencepool NAME -o yaml`, its "
              "`status.parents`)"),
    ),
    C.INFERENCE_POOL_REFS_NOT_RESOLVED: Reason(
        where="RoutingReady=False",
        means="a Gateway cannot resolve the pool's references, e.g. the endpoint picker's Service",
        todo="fix `routing.inferencePool.endpointPicker`",
    ),
    C.INFERENCE_POOL_CRD_MISSING: Reason(
        where="RoutingReady=False",
        means="the cluster does not serve `inference.networking.k8s.io/v1` InferencePools",
        todo=("install the Gateway API Inference Extension CRDs (`kubectl apply` them), or "
              "unset `routing.inferencePool`; pools appear within a minute"),
    ),
    C.INFERENCE_POOL_FORBIDDEN: Reason(
        where="RoutingReady=False",
        means="the operator may not read or write InferencePools",
        todo="grant the chart's RBAC (`helm upgrade`)",
    ),
}

BEGIN = ("<!-- Generated by `make crds` from operator/spyre_operator/gen/reason_docs.py: edit the "
         "reasons there, not here. -->")
END = "<!-- End of the generated reasons table. -->"


def render_table() -> str:
    """The reasons table, in Markdown."""
    lines = ["| Reason | Where | What it means | What to do |", "|---|---|---|---|"]
    lines += [f"| `{reason}` | {r.where} | {r.means} | {r.todo} |" for reason, r in REASONS.items()]
    return "\n".join(lines) + "\n"


def splice(page: str) -> str:
    """``page`` (docs/troubleshooting.md) with the table between its markers generated anew."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} markers")
    return head + begin + "\n\n" + render_table() + "\n" + end + tail
