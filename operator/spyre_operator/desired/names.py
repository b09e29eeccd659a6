"""Names, labels and annotations every child object carries."""

from __future__ import annotations

import hashlib

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

#: Annotation on a Job with the full artifact key (labels hold only the short key).
ARTIFACT_KEY_ANNOTATION = f"{GROUP}/artifact-key"

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


def server_name(model: str) -> str:
    """The serving Deployment, Service and PodDisruptionBudget share the model's name."""
    return model


def common_labels(component: str) -> dict[str, str]:
    """Labels on every child."""
    return {MANAGED_BY: MANAGED_BY_VALUE, NAME: "spyre-model", COMPONENT: component}


def server_selector(model: str) -> dict[str, str]:
    """Immutable Deployment selector: the model, never the artifact (that changes)."""
    return {MODEL_LABEL: model, COMPONENT: COMPONENT_SERVER}
