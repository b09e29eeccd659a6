"""Every shipped or documented SpyreModel is admitted by the API server (server-side dry run).

The list is ``tests.documented_models``: samples, README/docs/GITOPS YAML blocks, the chart NOTES.
The operator's resolution of their shapes is checked in tests/unit/test_supported_shapes.py and
the plugin's own verdict in tests/engine/test_supported_configs.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.documented_models import documented_models

from .conftest import Kube, OperatorProcess

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "where,doc", documented_models(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_documented_spyremodel_is_admitted(
    control_plane: ControlPlane, namespace: str, crd: Any, where: str, doc: dict[str, Any]
) -> None:
    r = control_plane.kubectl(
        "apply", "-n", namespace, "--server-side", "--dry-run=server",
        "--field-manager=docs", "-f", "-", input=json.dumps(doc), check=False,
    )  # fmt: skip
    assert r.returncode == 0, f"{where}: {r.stderr}"


def test_uri_only_gets_the_supported_shape_and_an_unlisted_one_is_refused(
    kube: Kube, operator: OperatorProcess
) -> None:
    """With the real API server and operator: ``model.uri`` alone compiles the plugin's shape
    for the model (status.compile says so); an explicit shape the plugin does not list is
    refused with UnsupportedConfiguration, naming the supported ones, and creates nothing."""
    hold = {"podAnnotations": {"kwok.spyre.dev/hold": "true"}}
    uri = "hf://ibm-granite/granite-3.3-8b-instruct@main"
    kube.apply_model("bare", {"model": {"uri": uri}, "precompile": hold})
    kube.wait_condition("bare", "Progressing", "True", reason="Compiling", timeout=60)
    st = kube.model("bare")["status"]["compile"]
    assert st["source"] == "SupportedConfiguration", st
    assert (st["tensorParallelSize"], st["maxModelLen"], st["maxNumSeqs"]) == (1, 8192, 4)
    [job] = [j for j in kube.items("jobs", "app.kubernetes.io/managed-by=spyre-model-operator")
             if j["metadata"]["labels"].get("serving.spyre.dev/model") == "bare"
             or "bare" in json.dumps(j["metadata"].get("ownerReferences", []))]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "8192"

    kube.apply_model("unlisted", {"model": {"uri": uri}, "compile": {
        "tensorParallelSize": 4, "maxModelLen": 32768, "maxNumSeqs": 4}})
    ready = kube.wait_condition("unlisted", "Ready", "False", reason="UnsupportedConfiguration")
    assert "tensorParallelSize=4 maxModelLen=32768 maxNumSeqs=32" in ready["message"]
    assert kube.get("deployment", "unlisted") is None and kube.get("service", "unlisted") is None
