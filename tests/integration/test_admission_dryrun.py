"""Admission limits on the real API server (server-side dry run, nothing stored): what the CRD
refuses says the limit, and what it admits at the limit builds children (and Events) the API
server accepts. Before these limits a 64-character claim name was admitted and then every
write of the Job, PVC and pods carrying it as a label value was refused, on every retry; a
237-character model name lost every Event; a zero or negative size or resource passed; and
``--max_model_len=N``, ``-tp N`` and the like slipped past the extraArgs rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
from spyre_operator.api import SpyreModelSpec
from spyre_operator.api.v1alpha1 import MAX_MODEL_NAME
from spyre_operator.kube.apply import build_event

from tests.cluster.controlplane import ControlPlane

from .test_properties_dryrun import children, dry_run

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
BASE: dict[str, Any] = {"model": {"uri": "hf://o/m"}, "compile": {"maxModelLen": 2048}}


def model(spec: dict[str, Any], name: str = "m") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
            "metadata": {"name": name}, "spec": {**BASE, **spec}}  # fmt: skip


LONG_63 = "c" * 63
REFUSED = {
    "volume name of 64": ({"cache": {"volume": {"name": "c" * 64}}}, "63"),
    "claim name of 64": ({"cache": {"claimName": "c" * 64}}, "63"),
    "claim name not a PVC name": ({"cache": {"claimName": "My_Claim"}}, "cache.claimName"),
    "size 0": ({"cache": {"volume": {"size": "0"}}}, "must be a positive quantity"),
    "size -1Gi": ({"cache": {"volume": {"size": "-1Gi"}}}, "must be a positive quantity"),
    "size integer 0": ({"cache": {"volume": {"size": 0}}}, "must be a positive quantity"),
    "serving request -1": ({"serving": {"resources": {"requests": {"cpu": "-1"}}}},
                           "must be a positive quantity"),
    "serving limit 0": ({"serving": {"resources": {"limits": {"memory": "0Gi"}}}},
                        "must be a positive quantity"),
    "precompile limit -2": ({"precompile": {"resources": {"limits": {"cpu": -2}}}},
                            "must be a positive quantity"),
    "nodeSelector value of 64": ({"accelerator": {"nodeSelector": {"pool": "p" * 64}}}, "63"),
    "nodeSelector value -x": ({"precompile": {"nodeSelector": {"pool": "-x"}}},
                              "precompile.nodeSelector"),
    "nodeSelector key a/b/c": ({"accelerator": {"nodeSelector": {"a/b/c": "x"}}},
                               "accelerator.nodeSelector keys must be label keys"),
    "annotation key with a space": ({"serving": {"podAnnotations": {"my note": "x"}}},
                                    "serving.podAnnotations keys must be label keys"),
    "toleration key -x": ({"accelerator": {"tolerations": [{"key": "-x", "operator": "Exists"}]}},
                          "tolerations"),
    "allowFrom cidr and selector": ({"serving": {"allowFrom": [
        {"cidr": "10.0.0.0/8", "podSelector": {"a": "b"}}]}}, "either a cidr, or"),
    "allowFrom empty entry": ({"serving": {"allowFrom": [{}]}}, "either a cidr, or"),
    "allowFrom not a cidr": ({"serving": {"allowFrom": [{"cidr": "10.0.0.0"}]}},
                             "must be a CIDR"),
    "api key twice": ({"serving": {"apiKey": {"name": "k"},
                                   "env": [{"name": "VLLM_API_KEY", "value": "plain"}]}},
                      "serving.env must not set VLLM_API_KEY when serving.apiKey is set"),
    "metrics on the serving port": ({"serving": {"metricsPort": 8000}},
                                    "serving.metricsPort must differ from serving.port"),
    "metricsFrom without metricsPort": ({"serving": {"metricsFrom": [{"podSelector": {}}]}},
                                        "serving.metricsFrom needs serving.metricsPort"),
    "metricsFrom not a cidr": ({"serving": {"metricsPort": 8001,
                                            "metricsFrom": [{"cidr": "10.0.0.0"}]}},
                               "must be a CIDR"),
    "canary deadline within its window": (
        {"serving": {"canary": {"durationSeconds": 600, "deadlineSeconds": 600}}},
        "canary.deadlineSeconds must exceed canary.durationSeconds"),
    "canary deadline within the default window": (
        {"serving": {"canary": {"deadlineSeconds": 300}}},
        "canary.deadlineSeconds must exceed canary.durationSeconds"),
}  # fmt: skip
EXTRA_ARGS_REFUSED = ["--max_model_len=4096", "--max-model-len=4096", "-tp", "-tp=2",
                      "--tensor_parallel_size=2", "--served_model_name=x",
                      "--no_enable_prefix_caching", "--max_num_seqs", "--runner=pooling",
                      "--port=9000", "--max-num-seq=2", "--tensor_par", "--max-model-l=4096",
                      "--max-model-len=" + "4" * 1000,  # abbreviations, long
                      "--api-key=s3cret", "--api_k", "--hf-token=hf_x"]  # fmt: skip (secrets)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_api_server_refuses_and_says_the_limit(
    control_plane: ControlPlane, namespace: str, crd: Any, case: str
) -> None:
    spec, expect = REFUSED[case]
    r = dry_run(control_plane, namespace, [model(spec)])
    assert r.returncode != 0, f"admitted: {spec}"
    assert expect in r.stderr, r.stderr


@pytest.mark.parametrize("arg", EXTRA_ARGS_REFUSED)
def test_extra_args_in_every_spelling_the_rule_covers_are_refused(
    control_plane: ControlPlane, namespace: str, crd: Any, arg: str
) -> None:
    r = dry_run(control_plane, namespace, [model({"serving": {"extraArgs": ["--seed", "1", arg]}})])
    assert r.returncode != 0, f"admitted extraArgs {arg}"
    assert "must not set flags derived from spec" in r.stderr, r.stderr
    assert "use serving.apiKey" in r.stderr, r.stderr  # the secrets' fields named


def test_a_model_name_over_the_limit_is_refused(
    control_plane: ControlPlane, namespace: str, crd: Any
) -> None:
    r = dry_run(control_plane, namespace, [model({}, name="m" * (MAX_MODEL_NAME + 1))])
    assert r.returncode != 0
    assert f"at most {MAX_MODEL_NAME} characters" in r.stderr, r.stderr


def test_at_the_limits_the_model_its_children_and_its_events_are_accepted(
    control_plane: ControlPlane, namespace: str, crd: Any
) -> None:
    """The longest names the CRD admits still make valid label values and object names."""
    name = "m" * MAX_MODEL_NAME
    specs = [
        {"cache": {"volume": {"name": LONG_63, "accessModes": ["ReadWriteOnce"],
                              "size": "0.5Gi"}},
         "accelerator": {"nodeSelector": {"example.com/pool": "p" * 63},
                         "tolerations": [{"key": "example.com/spyre", "operator": "Exists"}]},
         "precompile": {"podAnnotations": {"example.com/note": "any value at all"}},
         "serving": {"resources": {"requests": {"cpu": "500m"}, "limits": {"memory": 1}},
                     "extraArgs": ["--model-impl", "vllm", "--seed", "3", "--max-logprobs", "2",
                                   *[f"--override-generation-config={'x' * 990}"] * 58]}},
        {"cache": {"claimName": LONG_63},
         "serving": {"canary": {"durationSeconds": 600, "deadlineSeconds": 601}}},
    ]  # fmt: skip
    for spec in specs:
        doc = model(spec, name=name)
        r = dry_run(control_plane, namespace, [doc])
        assert r.returncode == 0, r.stderr
        objs = children(name, namespace, SpyreModelSpec.model_validate(doc["spec"]))
        r = dry_run(control_plane, namespace, objs)
        assert r.returncode == 0, r.stderr
    meta = {"name": name, "namespace": namespace, "uid": "3f0e7b4c-0000-4000-8000-000000000001"}
    event = build_event({"metadata": meta}, "Warning", "Test", "m", "op").to_dict()
    r = control_plane.kubectl("create", "-n", namespace, "--dry-run=server", "-o", "name",
                              "-f", "-", input=json.dumps(event), check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
