"""SpyreModel specs shared by unit and golden tests."""

from __future__ import annotations

from typing import Any

from spyre_operator.api.v1alpha1 import Toleration
from spyre_operator.desired.site import SiteDefaults

GENERATE: dict[str, Any] = {"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@a1b2c3"}}
GENERATE_TP4: dict[str, Any] = {
    "model": {"uri": "pvc://models/granite/8b", "servedName": "granite"},
    "compile": {"tensorParallelSize": 4, "maxModelLen": 32768, "maxNumSeqs": 4,
                "maxNumBatchedTokens": 512},
    "replicas": 3,
    "serving": {
        "extraArgs": ["--disable-log-requests"],
        "env": [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "DT_OPT", "value": "varsub=1"}],
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}},
    },
    # a CPU pool with more CPUs than a server's: the Job still gets the servers' thread count
    "precompile": {"maxLoadProcesses": 2,
                   "resources": {"requests": {"cpu": "16", "memory": "128Gi"}}},
    "accelerator": {"resourceName": "ibm.com/spyre_pf", "nodeSelector": {"pool": "spyre"}},
    "cache": {"claimName": "shared-cache"},
}
EMBED: dict[str, Any] = {
    "model": {"uri": "hf://ibm-granite/granite-embedding-125m-english"},
    "task": "embed",
    "compile": {
        "warmupShapes": [{"promptLen": 64, "batchSize": 4}, {"promptLen": 512, "batchSize": 1}],
        "backend": "eager",
    },
    "accelerator": {"schedulerName": ""},
    "cache": {"volume": {"name": "embed-cache", "size": "10Gi", "retainPolicy": "Delete",
                         "accessModes": ["ReadWriteOnce"], "storageClassName": "local"}},
}
ALL = {"generate": GENERATE, "generate-tp4": GENERATE_TP4, "embed": EMBED}
#: An admin's cluster-wide defaults (the chart's ``defaults`` values) for unset fields.
SITE = SiteDefaults(
    engine_image="registry.example.com/spyre/spyre-engine:1.0",
    image_pull_secrets=("registry-pull",),
    resource_name="ibm.com/spyre_pf",
    scheduler_name="site-scheduler",
    serving_node_selector={"pool": "spyre"},
    serving_tolerations=(Toleration(key="spyre", operator="Exists", effect="NoSchedule"),),
    precompile_node_selector={"pool": "cpu"},
    storage_class_name="nfs-rwx",
)
#: Samples planned under SITE (golden files <name>.<kind>.yaml).
UNDER_SITE = {"generate-site": GENERATE}
#: Samples whose cards are claimed through DRA (accelerator.deviceClassName): the pods on the
#: cards (here the servers and, onCards, the precompile Job) and the ResourceClaimTemplate.
ON_DEVICE_CLASS = {
    "generate-dra": {
        **GENERATE_TP4,
        "accelerator": {"deviceClassName": "spyre-standard-vf", "nodeSelector": {"pool": "spyre"}},
        "precompile": {**GENERATE_TP4["precompile"], "onCards": True},
    },
}


def model(name: str, spec: dict[str, Any], *, ns: str = "ns", uid: str | None = None,
          generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A SpyreModel object as the API server would return it (before defaulting)."""
    body: dict[str, Any] = {
        "apiVersion": "serving.spyre.dev/v1alpha1",
        "kind": "SpyreModel",
        "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                     "generation": generation},
        "spec": spec,
    }
    if status is not None:
        body["status"] = status
    return body
