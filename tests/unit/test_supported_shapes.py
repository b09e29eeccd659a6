"""Compile shapes from the plugin's supported list (spyre_operator.desired.shapes).

The operator's copy of the plugin's ``model_configs.yaml`` is the installed plugin's; a spec that
gives only ``model.uri`` gets a supported shape; an unsupported explicit shape is refused with
the supported ones; every shipped and documented SpyreModel resolves without a refusal. (The
plugin's own registry judges the same shapes in tests/engine/test_supported_configs.py.)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_operator.api import SpyreModelSpec
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C
from spyre_operator.desired import shapes
from spyre_operator.desired.key import artifact_key

from tests.documented_models import documented_models, mentions_of_spyre_models

from .samples import model

NOW = "2026-01-01T00:00:00Z"


def _plugin_file() -> Path:
    spec = importlib.util.find_spec("sendnn_inference")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "config" / "model_configs.yaml"


def resolve(spec: dict[str, Any]) -> shapes.ShapeResolution:
    return shapes.resolve_compile(SpyreModelSpec.model_validate(spec))


def test_the_copy_is_the_installed_plugins_file() -> None:
    """A sendnn-inference bump fails here until ``make supported-configs`` copies the new list."""
    lines = shapes.SUPPORTED_CONFIGS_FILE.read_text().splitlines(keepends=True)
    copied = "".join(lines[shapes.SUPPORTED_CONFIGS_HEADER_LINES :])
    assert copied == _plugin_file().read_text(), "refresh with: make supported-configs"
    version = importlib.metadata.version("sendnn-inference")
    assert shapes.SUPPORTED_CONFIGS_VERSION == f"sendnn-inference {version}"
    assert f"sendnn-inference {version}:" in lines[0]


def test_uri_only_gets_a_supported_shape_of_every_listed_model() -> None:
    """For every entry (generate or pooling as listed), ``model.uri`` alone resolves to one of
    the entry's own shapes, the fewest cards first; and each tensorParallelSize it lists too."""
    models = shapes.supported_models()
    assert len(models) > 20
    for name in models:
        match = shapes.plugin_entry(name, models)
        listed = shapes.supported_shapes(models[match])
        pooling = bool(listed[0].warmup_shapes)
        spec: dict[str, Any] = {"model": {"uri": f"hf://{name}"}}
        if pooling:
            spec["task"] = "embed"
        for tp in [None, *sorted({s.tensor_parallel_size for s in listed})]:
            if tp is not None:
                spec["compile"] = {"tensorParallelSize": tp}
            r = resolve(spec)
            assert r.refusal is None, (name, tp, r.refusal)
            c = r.compile
            got = shapes.Supported(
                c.tensor_parallel_size or 0,
                None if pooling else c.max_model_len,
                None if pooling else c.max_num_seqs,
                tuple((w.prompt_len, w.batch_size) for w in c.warmup_shapes or []),
            )
            assert got in listed, (name, tp, got)
            assert r.source == shapes.SOURCE_SUPPORTED and r.supported_model == match
            if tp is None:
                assert got.tensor_parallel_size == min(s.tensor_parallel_size for s in listed)


def test_the_longest_context_is_chosen_and_the_others_are_named() -> None:
    r = resolve({"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"}})
    assert (r.compile.tensor_parallel_size, r.compile.max_model_len, r.compile.max_num_seqs) == (
        1, 8192, 4,
    )
    assert "maxModelLen=3072 maxNumSeqs=16" in r.message  # the other TP 1 shape
    r4 = resolve({"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct"},
                  "compile": {"tensorParallelSize": 4}})
    assert (r4.compile.max_model_len, r4.compile.max_num_seqs) == (32768, 32)
    seqs = resolve({"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct"},
                    "compile": {"maxNumSeqs": 16}})
    assert (seqs.compile.tensor_parallel_size, seqs.compile.max_model_len) == (1, 3072)


def test_an_unsupported_explicit_shape_is_refused_with_the_supported_ones() -> None:
    m = model("m", {"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct"},
                    "compile": {"tensorParallelSize": 4, "maxModelLen": 32768, "maxNumSeqs": 4}})
    d = decide(m, Observed(), NOW)
    ready = next(c for c in d.status["conditions"] if c["type"] == C.READY)
    assert ready["reason"] == C.UNSUPPORTED_CONFIGURATION
    assert "tensorParallelSize=4 maxModelLen=32768 maxNumSeqs=32" in ready["message"]
    assert "tensorParallelSize=1 maxModelLen=8192 maxNumSeqs=4" in ready["message"]
    assert not d.apply and d.job is None, "nothing is created for a refused shape"
    assert d.events and d.events[0][:2] == ("Warning", C.UNSUPPORTED_CONFIGURATION)


def test_the_plugins_match_decides_for_models_with_the_same_architecture() -> None:
    """multilingual-e5-large-instruct has e5-large's architecture: the plugin matches every
    such config to e5-large (listed first), so only e5-large's 512x64 is accepted."""
    models = shapes.supported_models()
    assert shapes.plugin_entry("intfloat/multilingual-e5-large-instruct", models) == (
        "intfloat/multilingual-e5-large"
    )
    r = resolve({"model": {"uri": "hf://intfloat/multilingual-e5-large-instruct"},
                 "task": "embed"})
    assert [(w.prompt_len, w.batch_size) for w in r.compile.warmup_shapes or []] == [(512, 64)]
    assert "architecture of intfloat/multilingual-e5-large-instruct" in r.message
    # the FP8 entry has more fields than the base one: each is its own match
    assert shapes.plugin_entry("ibm-granite/granite-3.3-8b-instruct-FP8", models) == (
        "ibm-granite/granite-3.3-8b-instruct-FP8"
    )
    assert shapes.plugin_entry("ibm-granite/granite-3.3-8b-instruct", models) == (
        "ibm-granite/granite-3.3-8b-instruct"
    )


def test_unlisted_models_and_unchecked_backends() -> None:
    unknown = {"model": {"uri": "hf://acme/my-granite-finetune"}}
    r = resolve(unknown)
    assert r.refusal and "set compile.maxModelLen and maxNumSeqs" in r.refusal
    explicit = resolve({**unknown, "compile": {"maxModelLen": 8192, "maxNumSeqs": 4}})
    assert explicit.refusal is None and "precompile Job checks" in explicit.message
    for opt_out in ({"requireKnownConfiguration": False}, {"backend": "inductor"}):
        r = resolve({**unknown, "compile": opt_out})
        assert r.refusal is None and r.source == shapes.SOURCE_FALLBACK
        assert (r.compile.tensor_parallel_size, r.compile.max_model_len) == (1, 4096)
    # a listed model with an unlisted shape on a CPU backend: kept, said so
    cpu = resolve({"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct"},
                   "compile": {"backend": "eager", "maxModelLen": 512, "maxNumSeqs": 2}})
    assert cpu.refusal is None and "not checked" in cpu.message
    pooling = resolve({**unknown, "task": "embed"})
    assert pooling.refusal and "set compile.warmupShapes" in pooling.refusal


def test_pvc_models_are_found_by_their_last_path_element() -> None:
    r = resolve({"model": {"uri": "pvc://weights/models/Mistral-Small-3.2-24B-Instruct-2506"}})
    assert r.supported_model == "mistralai/Mistral-Small-3.2-24B-Instruct-2506"
    assert (r.compile.tensor_parallel_size, r.compile.max_model_len) == (2, 8192)


def test_the_key_hashes_the_resolved_shape() -> None:
    """Omitted and spelt out: one artifact. Edit and revert: the same key. A list that chooses
    another shape (a plugin upgrade): another key."""
    bare = {"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct"}}
    spelt = {**bare, "compile": {"tensorParallelSize": 1, "maxModelLen": 8192, "maxNumSeqs": 4}}
    key = artifact_key(SpyreModelSpec.model_validate(bare))
    assert artifact_key(SpyreModelSpec.model_validate(spelt)) == key
    edited = {**bare, "compile": {"maxModelLen": 3072}}
    assert artifact_key(SpyreModelSpec.model_validate(edited)) != key
    assert artifact_key(SpyreModelSpec.model_validate(bare)) == key
    upgraded = yaml.safe_load(shapes.SUPPORTED_CONFIGS_FILE.read_text())["models"]
    upgraded["ibm-granite/granite-3.3-8b-instruct"]["continuous_batching_configs"] = [
        {"tp_size": 1, "max_model_len": 16384, "max_num_seqs": 4}
    ]
    spec = SpyreModelSpec.model_validate(bare)
    assert shapes.resolve_compile(spec, upgraded).compile.max_model_len == 16384


def test_status_says_which_shape_and_why() -> None:
    d = decide(model("m", {"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct"}}),
               Observed(), NOW)
    st = d.status["compile"]
    assert st["source"] == "SupportedConfiguration"
    assert st["supportedModel"] == "ibm-granite/granite-3.3-8b-instruct"
    assert (st["tensorParallelSize"], st["maxModelLen"], st["maxNumSeqs"]) == (1, 8192, 4)
    job_args = d.job.spec.template.spec.containers[0].args if d.job else []
    assert job_args[job_args.index("--max-model-len") + 1] == "8192"


def test_the_parser_finds_every_documented_spyremodel() -> None:
    found = documented_models()
    assert len(found) == mentions_of_spyre_models() >= 5
    assert {w.split("#")[0].split(":")[0] for w, _ in found} >= {
        "operator/samples/granite-embedding.yaml", "README.md", "docs/reference.md",
        "docs/openshift.md", "charts/spyre-model-operator/templates/NOTES.txt",
    }


@pytest.mark.parametrize(
    "where,doc", documented_models(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_documented_spyremodel_resolves_to_a_supported_shape(
    where: str, doc: dict[str, Any]
) -> None:
    spec = SpyreModelSpec.model_validate(doc["spec"])
    r = shapes.resolve_compile(spec)
    assert r.refusal is None, f"{where}: {r.refusal}"
    if shapes.checks_known(spec):
        assert r.supported_model, f"{where}: the operator cannot check {spec.model.uri}"


def test_supported_model_names_the_entry_for_a_uri_that_does_not() -> None:
    """A PVC copy in the Hub cache's layout (its last element a commit): the hint decides; a
    hint that names no entry is refused with the entries."""
    uri = "pvc://weights/models--ibm-granite--granite-3.3-8b-instruct/snapshots/0123abcd"
    assert resolve({"model": {"uri": uri}}).refusal  # unlisted, no shape, check on
    r = resolve({"model": {"uri": uri},
                 "compile": {"supportedModel": "ibm-granite/granite-3.3-8b-instruct",
                             "tensorParallelSize": 4}})
    assert r.refusal is None and r.supported_model == "ibm-granite/granite-3.3-8b-instruct"
    assert (r.compile.max_model_len, r.compile.max_num_seqs) == (32768, 32)
    bad = resolve({"model": {"uri": uri}, "compile": {"supportedModel": "acme/nope"}})
    assert bad.refusal and "ibm-granite/granite-3.3-8b-instruct" in bad.refusal
