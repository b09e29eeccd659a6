"""The serving Deployment: vLLM pods that load a precompiled artifact and never compile."""

from __future__ import annotations

import json

import spyre_contract as contract
from lightkube.models.apps_v1 import DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment
from lightkube.models.core_v1 import (
    Container,
    ContainerPort,
    EnvVar,
    EnvVarSource,
    HTTPGetAction,
    Lifecycle,
    LifecycleHandler,
    PodSpec,
    PodTemplateSpec,
    Probe,
    SecretKeySelector,
    SleepAction,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment

from ..api.v1alpha1 import API_KEY_ENV, CanarySpec, SpyreModelSpec
from . import names
from .devices import container_claims, pod_claims
from .job import TERMINATION_LOG
from .owners import controller_ref
from .plan import ENDPOINT_GRACE_SECONDS, ModelPlan
from .pod import (
    cache_affinity,
    cache_claim_labels,
    card_requests,
    container_security_context,
    merge_env,
    pinned_scc,
    placement,
    plugin_env,
    pod_security_context,
    resources,
    serves_on_cards,
    shape_args,
    user_env,
    volumes,
)
from .verified import verified_env

PORT_NAME = "http"
#: The container port of /metrics when serving.metricsPort gives them a port of their own.
METRICS_PORT_NAME = "metrics"
#: Probe paths of `spyre-engine serve` (engine/spyre_engine): startup passes once the model is
#: loaded, readiness fails as soon as a drain starts, liveness only if the engine is wedged.
STARTUP_PATH = contract.STARTUP_PATH
READY_PATH = contract.READY_PATH
LIVE_PATH = contract.LIVE_PATH
#: Loading a large model from the cache onto the cards can take many minutes.
STARTUP_BUDGET_SECONDS = 1800
#: The start-up probe's period: the pod turns Ready (joins the Service) at the first probe after
#: the engine serves. With 10 s a new replica joined 7.2 s after its first answer (scale-up 1.26x
#: a bare vLLM load); with 1 s, 0.6-0.9 s (1.08x; tests/bench/RESULTS.md). One local GET a
#: second while a pod starts.
STARTUP_PROBE_PERIOD_SECONDS = 1
#: Scheduling, image pull and volume attach come on top of the start-up probe's budget. The
#: Deployment's progress deadline covers both, so a slow but healthy model load is never
#: reported as a stalled rollout (Argo CD and Flux fail on ProgressDeadlineExceeded).
PROGRESS_DEADLINE_SECONDS = STARTUP_BUDGET_SECONDS + 600


def server_labels(plan: ModelPlan, key: str) -> dict[str, str]:
    """Labels on the Deployment and its pods."""
    return {
        **names.common_labels(names.COMPONENT_SERVER),
        **names.server_selector(plan.name),
        **cache_claim_labels(plan),
        names.ARTIFACT_LABEL: names.short_key(key),
    }


def serve_args(plan: ModelPlan, key: str, canary: CanarySpec | None = None) -> list[str]:
    """`spyre-engine serve` arguments for the artifact ``key`` (a canary's: with its bounds)."""
    spec = plan.spec
    args = [
        contract.SERVE,
        *shape_args(plan, str(spec.compile.backend)),
        contract.ARTIFACT_DIR, plan.artifact_dir(key),
        contract.ARTIFACT_KEY, key,
        contract.PORT, str(spec.serving.port),
        *([contract.METRICS_PORT, str(spec.serving.metrics_port)]
          if spec.serving.metrics_port is not None else []),
        contract.DRAIN_TIMEOUT, str(plan.drain_seconds),
        contract.TERMINATION_LOG, TERMINATION_LOG,
    ]  # fmt: skip
    if not plan.is_pooling:
        args.append(contract.PREFIX_CACHING if spec.serving.prefix_caching
                    else contract.NO_PREFIX_CACHING)
    # Only when set: an engine image from before these limits knows no such flags.
    if spec.serving.max_in_flight is not None:
        args += [contract.MAX_IN_FLIGHT, str(spec.serving.max_in_flight)]
    if spec.serving.body_timeout_seconds is not None:
        args += [contract.BODY_TIMEOUT, str(spec.serving.body_timeout_seconds)]
    if spec.serving.output_check != "Enforce":
        # Only when not the default: an engine image from before the check knows no such flag.
        args += [contract.OUTPUT_CHECK, spec.serving.output_check.lower()]
    if canary is not None:
        args += [
            contract.CANARY_SECONDS, str(canary.duration_seconds),
            contract.CANARY_MAX_ERROR_RATIO, str(canary.max_error_ratio),
            contract.CANARY_MIN_REQUESTS, str(canary.min_requests),
        ]  # fmt: skip
        if canary.max_mean_latency_seconds is not None:
            args += [contract.CANARY_MAX_MEAN_LATENCY, str(canary.max_mean_latency_seconds)]
    if spec.serving.extra_args:
        args += [contract.PASSTHROUGH, *spec.serving.extra_args]
    return args


def served_spec_json(spec: SpyreModelSpec) -> str:
    """The spec this Deployment was built from, canonical JSON.

    While a new artifact compiles, the Deployment keeps serving the old one and must keep being
    built from the old spec (its shape and compile-time env match the old artifact); the
    operator reads it back from this annotation.
    """
    return json.dumps(
        spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
        sort_keys=True,
        separators=(",", ":"),
    )


def _probe(path: str, period: int, failures: int) -> Probe:
    return Probe(
        httpGet=HTTPGetAction(path=path, port=PORT_NAME),
        periodSeconds=period,
        failureThreshold=failures,
        timeoutSeconds=5,
    )


def api_key_env(spec: SpyreModelSpec) -> list[EnvVar]:
    """The API key vLLM checks on /v1/*, from serving.apiKey's Secret (none: no check)."""
    ref = spec.serving.api_key
    if ref is None:
        return []
    return [EnvVar(name=API_KEY_ENV, valueFrom=EnvVarSource(
        secretKeyRef=SecretKeySelector(name=ref.name, key=ref.key)))]


def container_ports(spec: SpyreModelSpec) -> list[ContainerPort]:
    """``http`` (API, probes; /metrics too unless they have a port of their own: ``metrics``)."""
    ports = [ContainerPort(name=PORT_NAME, containerPort=spec.serving.port, protocol="TCP")]
    if spec.serving.metrics_port is not None:
        ports.append(ContainerPort(
            name=METRICS_PORT_NAME, containerPort=spec.serving.metrics_port, protocol="TCP"))
    return ports


def build_canary_deployment(plan: ModelPlan, key: str, verified: bool = True) -> Deployment:
    """spec.serving.canary's Deployment: the new artifact ``key`` on canary.replicas pods that
    judge their own requests (``--canary-seconds``). Its pods carry the server selector's
    labels, so the model's Service spreads requests over them and the main Deployment's; its
    own selector adds CANARY_LABEL (ReplicaSets select by pod-template-hash too, so neither
    Deployment's ReplicaSets take the other's pods)."""
    canary = plan.spec.serving.canary
    assert canary is not None
    dep = build_deployment(plan, key, canary, verified)
    assert dep.metadata is not None and dep.spec is not None
    assert dep.spec.template.metadata is not None
    labels = {**(dep.metadata.labels or {}), names.CANARY_LABEL: "true"}
    dep.metadata.name = names.canary_name(plan.name)
    dep.metadata.labels = labels
    dep.spec.replicas = canary.replicas
    dep.spec.selector = LabelSelector(
        matchLabels={**names.server_selector(plan.name), names.CANARY_LABEL: "true"}
    )
    dep.spec.template.metadata.labels = labels
    return dep


def build_deployment(
    plan: ModelPlan, key: str, canary: CanarySpec | None = None, verified: bool = True
) -> Deployment:
    """The Deployment serving artifact ``key`` (the spec's key, or the previous one while the
    new artifact compiles). ``verified``: its pods read whether ``key`` passed its output check
    before (verified.py; False for a live template from before that, kept as it is)."""
    spec = plan.spec
    on_cards = serves_on_cards(spec)
    vols, mounts = volumes(plan, read_only=True)
    env = merge_env(
        user_env(spec.serving.env or []),
        [
            *plugin_env(plan, key, str(spec.compile.backend)),
            # Load from the artifact; never compile on the serving path.
            EnvVar(name="SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS", value="1"),
            EnvVar(name="HF_HUB_OFFLINE", value="1"),
            *api_key_env(spec),
            *([verified_env(plan.name, key)]
              if verified and spec.serving.output_check != "Off" else []),
        ],
    )  # fmt: skip
    labels = server_labels(plan, key)
    pod_annotations = pinned_scc(plan.site, {**(spec.serving.pod_annotations or {}),
                                             names.ARTIFACT_KEY_ANNOTATION: key})
    if spec.serving.metrics_port is not None:
        pod_annotations[names.METRICS_PORT_ANNOTATION] = str(spec.serving.metrics_port)
    container = Container(
        name="engine",
        image=spec.engine.image,
        imagePullPolicy=spec.engine.image_pull_policy,
        args=serve_args(plan, key, canary),
        env=env,
        ports=container_ports(spec),
        resources=resources(
            spec.serving.resources, card_requests(spec, on_cards), container_claims(plan, on_cards)
        ),
        volumeMounts=mounts,
        securityContext=container_security_context(),
        startupProbe=_probe(
            STARTUP_PATH,
            STARTUP_PROBE_PERIOD_SECONDS,
            STARTUP_BUDGET_SECONDS // STARTUP_PROBE_PERIOD_SECONDS,
        ),
        readinessProbe=_probe(READY_PATH, 5, 2),
        livenessProbe=_probe(LIVE_PATH, 10, 6),
        terminationMessagePath=TERMINATION_LOG,
        terminationMessagePolicy="FallbackToLogsOnError",
        # Stay in service until the endpoint removal has reached every kube-proxy, then drain.
        lifecycle=Lifecycle(
            preStop=LifecycleHandler(sleep=SleepAction(seconds=ENDPOINT_GRACE_SECONDS))
        ),
    )
    rollout = spec.serving.rollout
    return Deployment(
        metadata=ObjectMeta(
            name=names.server_name(plan.name),
            namespace=plan.namespace,
            labels=labels,
            annotations={
                names.ARTIFACT_KEY_ANNOTATION: key,
                names.SERVED_SPEC_ANNOTATION: served_spec_json(spec),
            },
            ownerReferences=[controller_ref(plan.owner)],
        ),
        spec=DeploymentSpec(
            replicas=spec.replicas,
            progressDeadlineSeconds=PROGRESS_DEADLINE_SECONDS,
            selector=LabelSelector(matchLabels=names.server_selector(plan.name)),
            strategy=DeploymentStrategy(
                type="RollingUpdate",
                rollingUpdate=RollingUpdateDeployment(
                    maxSurge=rollout.max_surge, maxUnavailable=rollout.max_unavailable
                ),
            ),
            template=PodTemplateSpec(
                metadata=ObjectMeta(labels=labels, annotations=pod_annotations),
                spec=PodSpec(
                    securityContext=pod_security_context(
                        plan.site.platform_assigns_user, plan.site.selinux_change_policy
                    ),
                    terminationGracePeriodSeconds=plan.termination_grace_seconds,
                    containers=[container],
                    volumes=vols,
                    enableServiceLinks=False,
                    # spec.engine.serviceAccountName (SCCs, pull secrets); the engine never
                    # calls the Kubernetes API, so no token.
                    serviceAccountName=spec.engine.service_account_name or None,
                    automountServiceAccountToken=False,
                    affinity=cache_affinity(plan),
                    resourceClaims=pod_claims(plan, on_cards) or None,
                    **placement(spec, on_cards=on_cards),
                ),
            ),
        ),
    )
