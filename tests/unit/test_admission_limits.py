"""Limits the generated CRD enforces at admission, so that nothing it admits makes the operator
write an object the API server refuses: a cache claim's name becomes a label value (63
characters), a model's name the prefix of its Events' names, a quantity a PVC size or a pod's
resources, and an extra vLLM argument must not set what the engine sets.

The CEL rules run on the local control plane in tests/integration/test_admission_dryrun.py;
here the schema is checked, and the regular expressions (the same text in Python and RE2)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from spyre_engine.vllm_args import MANAGED
from spyre_operator.api.v1alpha1 import (
    EXTRA_ARGS_RULE,
    LABEL_VALUE_PATTERN,
    MANAGED_ARG_HEAD,
    MANAGED_ARG_PATTERN,
    MANAGED_ARGS,
    MAX_MODEL_NAME,
    POSITIVE_QUANTITY_PATTERN,
    QUALIFIED_NAME,
    QUANTITY_PATTERN,
)
from spyre_operator.gen.crd import build_crd
from spyre_operator.kube.apply import build_event

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def _walk(node: dict[str, Any], path: str):  # type: ignore[no-untyped-def]
    yield path, node
    for k, v in (node.get("properties") or {}).items():
        yield from _walk(v, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_cache_claim_names_fit_a_label_value() -> None:
    cache = _schema()["properties"]["spec"]["properties"]["cache"]["properties"]
    volume = cache["volume"]["properties"]["name"]
    claim = cache["claimName"]
    assert volume["maxLength"] == 63 and claim["maxLength"] == 63
    assert "63 characters" in volume["description"] and "63 characters" in claim["description"]
    assert re.match(claim["pattern"], "my-cache.v2") and not re.match(claim["pattern"], "My_Cache")


def test_the_longest_model_name_still_has_events() -> None:
    root = _schema()["x-kubernetes-validations"]
    assert [r["rule"] for r in root] == [f"size(self.metadata.name) <= {MAX_MODEL_NAME}"]
    assert f"at most {MAX_MODEL_NAME} characters" in root[0]["message"]
    model = {"metadata": {"name": "m" * MAX_MODEL_NAME, "namespace": "ns", "uid": "u"}}
    name = build_event(model, "Normal", "Test", "message", "op").metadata.name
    assert len(name) == 253 and DNS_SUBDOMAIN.match(name)
    longer = {"metadata": {**model["metadata"], "name": "m" * (MAX_MODEL_NAME + 1)}}
    assert len(build_event(longer, "Normal", "Test", "m", "op").metadata.name) > 253


def _quantity_nodes() -> list[tuple[str, dict[str, Any]]]:
    return [(p, n) for p, n in _walk(_schema(), "$") if n.get("pattern") == QUANTITY_PATTERN]


def test_every_quantity_must_be_positive() -> None:
    paths = {p for p, _ in _quantity_nodes()}
    assert {"$.spec.cache.volume.size", "$.spec.serving.resources.requests{}",
            "$.spec.precompile.resources.limits{}"} <= paths, paths  # fmt: skip
    for path, node in _quantity_nodes():
        rules = node.get("x-kubernetes-validations") or []
        assert any("self > 0" in r["rule"] for r in rules), path
        assert all("positive quantity" in r["message"] for r in rules), path


@pytest.mark.parametrize(
    "value,positive",
    [("50Gi", True), ("1", True), ("500m", True), ("0.5", True), (".5", True), ("+2", True),
     ("1e3", True), ("0.01Gi", True), ("100M", True),
     ("0", False), ("0Gi", False), ("0.0", False), ("-1Gi", False), ("-0.5", False),
     ("0e3", False), ("+0", False), ("000", False)],
)  # fmt: skip
def test_positive_quantity_pattern(value: str, positive: bool) -> None:
    assert re.match(QUANTITY_PATTERN, value), value  # a quantity at all
    assert bool(re.match(POSITIVE_QUANTITY_PATTERN, value)) is positive


REFUSED = ["--max_model_len=4096", "--max-model-len", "-tp", "-tp=2", "--tensor_parallel_size=2",
           "--served_model_name=x", "--served-model-name", "--no_enable_prefix_caching",
           "--max_num_batched_tokens", "--model", "--model=/x", "--port=9000", "--runner",
           "--shutdown_timeout=1", "--max-model-l=4096", "--max_num_seq", "--tensor_par=2",
           "--ser=x", "--no-enable-prefix"]  # fmt: skip (abbreviations: issue 31, 12)
ALLOWED = ["--model-impl", "--seed", "--enforce_eager", "--max-num-scheduled-tokens=4",
           "--portal", "-tpx", "--dtype=float16", "--hostname", "--mode", "--max-num",
           "--se", "--model-impl=x"]  # fmt: skip


@pytest.mark.parametrize("arg", REFUSED)
def test_the_extra_args_rule_refuses_every_spelling_it_can(arg: str) -> None:
    assert re.match(MANAGED_ARG_PATTERN, arg)


@pytest.mark.parametrize("arg", ALLOWED)
def test_the_extra_args_rule_lets_other_flags_pass(arg: str) -> None:
    assert not re.match(MANAGED_ARG_PATTERN, arg)


def test_the_extra_args_rule_is_in_the_crd() -> None:
    serving = _schema()["properties"]["spec"]["properties"]["serving"]["properties"]
    (rule,) = serving["extraArgs"]["x-kubernetes-validations"]
    assert rule["rule"] == EXTRA_ARGS_RULE
    assert f".matches('{MANAGED_ARG_PATTERN}')" in EXTRA_ARGS_RULE


@pytest.mark.parametrize("arg", REFUSED + ALLOWED)
def test_the_rule_decides_on_the_head_of_an_argument_as_on_all_of_it(arg: str) -> None:
    """The CRD rule matches an argument's first MANAGED_ARG_HEAD characters (CEL's cost):
    the same answer as the whole argument, however long."""
    assert max(len(a) for a in MANAGED_ARGS) + 1 < MANAGED_ARG_HEAD
    for tail in ("", "x" * 2000, "=" + "y" * 2000):
        whole = arg + tail
        head = whole[:MANAGED_ARG_HEAD]
        assert bool(re.match(MANAGED_ARG_PATTERN, head)) == bool(
            re.match(MANAGED_ARG_PATTERN, whole)), whole[:60]


def test_the_admission_rule_covers_what_the_engine_refuses() -> None:
    """Each vLLM setting the engine refuses (decided by vLLM's parser) has its option in the
    admission rule, so the common spellings never reach a pod."""
    options = {"--" + dest.replace("_", "-") for dest in MANAGED if dest != "model_tag"}
    options |= {"--no-enable-prefix-caching"}
    assert options <= set(MANAGED_ARGS), options - set(MANAGED_ARGS)


@pytest.mark.parametrize(
    "key,ok",
    [("pool", True), ("example.com/pool", True), ("kubernetes.io/hostname", True),
     ("a_b.c-D", True), ("x" * 63, True), ("x" * 64, False), ("-pool", False),
     ("Example.com/pool", False), ("a/b/c", False), ("", False), ("pool ", False)],
)  # fmt: skip
def test_label_keys(key: str, ok: bool) -> None:
    assert bool(re.match(f"^{QUALIFIED_NAME}$", key)) is ok


def test_pod_label_and_annotation_maps_are_checked() -> None:
    """nodeSelector keys and values and pod annotation keys go into the pod template: one the
    API server refuses made every write of the Job or Deployment fail."""
    spec = _schema()["properties"]["spec"]["properties"]
    maps = {
        "accelerator.nodeSelector": spec["accelerator"]["properties"]["nodeSelector"],
        "precompile.nodeSelector": spec["precompile"]["properties"]["nodeSelector"],
        "serving.podAnnotations": spec["serving"]["properties"]["podAnnotations"],
        "precompile.podAnnotations": spec["precompile"]["properties"]["podAnnotations"],
    }
    for what, node in maps.items():
        (rule,) = node["x-kubernetes-validations"]
        assert QUALIFIED_NAME in rule["rule"] and what in rule["message"], what
        assert node["maxProperties"] == 64, what
    for what in ("accelerator.nodeSelector", "precompile.nodeSelector"):
        value = maps[what]["additionalProperties"]
        assert value["maxLength"] == 63 and value["pattern"] == LABEL_VALUE_PATTERN
        assert re.match(value["pattern"], "cpu-pool_1.a") and not re.match(value["pattern"], "-x")
