"""Names, labels and annotations every child object carries."""

from __future__ import annotations

import hashlib
import re

from .. import GROUP

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "spyre-model-operator"
COMPONENT = "app.kubernetes.io/component"
NAME = "app.kubernetes.io/name"
MODEL_LABEL = f"{GROUP}/model"
ARTIFACT_LABEL = f"{GROUP}/artifact"
CLAIM_LABEL = f"{GROUP}/cache-claim"
COMPONENT_PRECOMPILE = "precompile"
COMPONENT_SERVER = "server"
COMPONENT_CACHE = "cache"
#: A model's ResourceClaimTemplates (DRA: desired/devices.py).
COMPONENT_CARDS = "cards"

#: Annotation on a Job with the full artifact key (labels hold only the short key).
ARTIFACT_KEY_ANNOTATION = f"{GROUP}/artifact-key"
#: Label on a serving Deployment: a digest of the artifact and claims (``<key>/<claim>,...``)
#: whose rollout it completed once (every asked replica updated and available). Written by the
#: operator when it sees that; a Deployment that serves what it names is not switching,
#: whatever its availability now (a scale-up waiting for cards holds no rollout slot). A label,
#: not an annotation: the API server starts a new generation of a Deployment when its
#: annotations change, and the rollout read as not done until the controller observed it
#: (Reconciling flapped back to True). See decide/rollout.py.
ROLLED_OUT_LABEL = f"{GROUP}/rolled-out"
#: Where earlier builds kept the record (the identity itself, as an annotation); still read.
ROLLED_OUT_ANNOTATION = ROLLED_OUT_LABEL
#: On a managed cache PVC: the artifact keys garbage collection removed from it (or found
#: absent), ``{"<key>": "<removed at>"}`` as JSON, the newest ``REMOVED_ARTIFACTS_KEPT``. The
#: GC Job's own report goes with the Job (its TTL); this record lives as long as the volume, so
#: a revert to a removed key compiles it again whenever it comes. See decide/gc.py.
REMOVED_ARTIFACTS_ANNOTATION = f"{GROUP}/removed-artifacts"
REMOVED_ARTIFACTS_KEPT = 64
#: On serving pods whose /metrics have a port of their own (serving.metricsPort): its number.
#: The chart's PodMonitor skips such pods on the ``http`` port (there /metrics answers 404).
METRICS_PORT_ANNOTATION = f"{GROUP}/metrics-port"

#: Annotations on a precompile Job: the attempt it is for this (claim, key) (one retry budget
#: per key and claim, whoever of the models sharing it retries), a hash of its pod template
#: and the SpyreModel whose spec the template was built from (a stuck Job is replaced when
#: that model's template changed; see decide/precompile_state.py).
ATTEMPT_ANNOTATION = f"{GROUP}/attempt"
TEMPLATE_HASH_ANNOTATION = f"{GROUP}/pod-template-hash"
TEMPLATE_OF_ANNOTATION = f"{GROUP}/pod-template-of"

#: Annotation on the Deployment with the spec it was built from (see deployment.py).
SERVED_SPEC_ANNOTATION = f"{GROUP}/served-spec"

#: Length of the key in labels and object names (48 bits: collisions are not a concern
#: per namespace, and the full key is on the Job's annotation and in the artifact path).
SHORT_KEY_LEN = 12
MAX_NAME = 63


def short_key(key: str) -> str:
    """The artifact key as used in labels and names."""
    return key[:SHORT_KEY_LEN]


def precompile_job_name(key: str, claim: str) -> str:
    """One precompile Job per (cache claim, artifact key), named from both."""
    claim_hash = hashlib.sha256(claim.encode()).hexdigest()[:5]
    return f"spyre-compile-{short_key(key)}-{claim_hash}"


#: A Service name is an RFC 1035 label; a SpyreModel name is a DNS subdomain (dots, a leading
#: digit and up to 253 characters are allowed). Users name models after the model
#: ("granite-3.3-8b"), so child names are derived, not copied.
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NAME_HASH_LEN = 6


def _derived(model: str, valid: bool, suffix: str = "") -> str:
    """``model + suffix`` if ``valid``, else a readable label-safe form plus a hash of the full
    name, then ``suffix``, within MAX_NAME characters.

    The hash keeps two models whose readable forms coincide ("a.b" and "a-b") apart.
    """
    if valid:
        return model + suffix
    readable = re.sub(r"[^-a-z0-9]", "-", model)
    if not readable[:1].isalpha():
        readable = "m-" + readable
    digest = hashlib.sha256(model.encode()).hexdigest()[:_NAME_HASH_LEN]
    room = MAX_NAME - _NAME_HASH_LEN - 1 - len(suffix)
    return f"{readable[:room].rstrip('-')}-{digest}{suffix}"


def _suffixed(model: str, suffix: str) -> str:
    """``model + suffix`` when that is an RFC 1035 label of at most MAX_NAME characters, else
    a derived name (as server_name) that keeps the suffix."""
    name = model + suffix
    return _derived(model, len(name) <= MAX_NAME and bool(_DNS1035_LABEL.match(name)), suffix)


def server_name(model: str) -> str:
    """Name of the serving Deployment, Service and PodDisruptionBudget.

    The model's own name when it is a valid Service name (an RFC 1035 label), so most models
    keep a predictable Service; otherwise a derived name (status.endpoint gives it).
    """
    return _derived(model, len(model) <= MAX_NAME and bool(_DNS1035_LABEL.match(model)))


#: Suffix of the Service that selects a scale-to-zero model's serving pods directly (the HTTP
#: add-on's interceptor forwards to it; the model's own Service then points at the interceptor).
ENGINE_SUFFIX = "-engine"


def engine_service_name(model: str) -> str:
    """``<model>-engine`` when that is an RFC 1035 label, else a derived name (as server_name)
    that keeps the suffix: always a valid Service name of at most 63 characters."""
    return _suffixed(model, ENGINE_SUFFIX)


#: Suffix of the canary Deployment (spec.serving.canary): a new artifact's first pods.
CANARY_SUFFIX = "-canary"
#: On the canary Deployment and its pods (value "true"), in its selector: the main Deployment's
#: selector (server_selector) matches the canary's pods too, so the Service reaches them.
CANARY_LABEL = f"{GROUP}/canary"


def canary_name(model: str) -> str:
    """``<model>-canary``, a valid Deployment name of at most 63 characters (as engine)."""
    return _suffixed(model, CANARY_SUFFIX)


#: Suffix of the ConfigMap naming the artifact that passed its output check (desired/verified.py).
VERIFIED_SUFFIX = "-output-check"


def verified_name(model: str) -> str:
    """``<model>-output-check``, a valid ConfigMap name of at most 63 characters (as engine)."""
    return _suffixed(model, VERIFIED_SUFFIX)


#: Suffix of the ExternalName Service in a scale-to-zero model's namespace that names the
#: operator's cold-start responder (the add-on dials a failover Service in the HTTPScaledObject's
#: own namespace only).
COLDSTART_SUFFIX = "-coldstart"


def coldstart_service_name(model: str) -> str:
    """``<model>-coldstart``, a valid Service name of at most 63 characters (as engine)."""
    return _suffixed(model, COLDSTART_SUFFIX)


#: Where the cold-start responder answers KEDA's ``metrics-api`` trigger whether a model is
#: starting (``<path>/<namespace>/<name>``, JSON ``{"starting": 0 | 1}``): a woken model stays
#: active until a replica is Ready, however long its load takes.
STARTING_PATH = "/scaletozero/v1/starting"
#: The JSON field of that answer (the trigger's ``valueLocation``).
STARTING_FIELD = "starting"


def starting_path(namespace: str, model: str) -> str:
    """The responder's path that says whether ``namespace/model`` is starting."""
    return f"{STARTING_PATH}/{namespace}/{model}"


#: Infix of a model's ResourceClaimTemplate names: ``<model>-cards-<hash of its request>``.
CARDS_INFIX = "-cards-"
_CARDS_HASH_LEN = 8


def cards_template_name(model: str, device_class: str, count: int) -> str:
    """The ResourceClaimTemplate asking for ``count`` cards of ``device_class`` for ``model``.

    A template's spec is immutable, so what it asks for is in its name: another class or
    count is another template, created beside the one the serving pods were made from
    (they keep their claims; the unused one is deleted once no pod refers to it).
    """
    digest = hashlib.sha256(f"{device_class}/{count}".encode()).hexdigest()[:_CARDS_HASH_LEN]
    return _suffixed(model, CARDS_INFIX + digest)


def mirror_slice_name(model: str) -> str:
    """The EndpointSlice that gives a scale-to-zero model's Service the interceptor's endpoints."""
    return server_name(model) + "-interceptor"


def model_label_value(model: str) -> str:
    """The model's name as a label value (at most 63 characters)."""
    return _derived(model, len(model) <= MAX_NAME)


def common_labels(component: str) -> dict[str, str]:
    """Labels on every child."""
    return {MANAGED_BY: MANAGED_BY_VALUE, NAME: "spyre-model", COMPONENT: component}


def server_selector(model: str) -> dict[str, str]:
    """Immutable Deployment selector: the model, never the artifact (that changes)."""
    return {MODEL_LABEL: model_label_value(model), COMPONENT: COMPONENT_SERVER}
