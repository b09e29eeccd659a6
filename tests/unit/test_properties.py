"""Property tests of the artifact key (hypothesis).

The key (``desired.key.artifact_key``) must be stable under defaulting and field order, must
not change when any non-compile field changes, and must change when any compile field
(``key_inputs``: model URI, task, every ``spec.compile`` field, the engine image, the
compile-time environment, the serving pods' whole CPUs) changes.

``specs()`` generates specs the CRD accepts (it mirrors the schema and the CEL rules); the
integration test ``test_properties_dryrun`` checks that claim against the API server.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.key import artifact_key, engine_cpus, key_inputs
from spyre_operator.desired.shapes import resolve_compile

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

NAME = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
HF_PART = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)
REVISION = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)
POOLING = ("embed", "score", "rerank")
BACKENDS = ("sendnn", "inductor", "eager")  # sendnn_compile_only cannot serve (CEL)
IMAGES = ("quay.io/spyre/engine:1.0", "registry.example/engine:2", "registry.example/e@sha256:"
          + "a" * 64)
#: Environment names that are not compile inputs (and not reserved by the operator).
PLAIN_ENV = ("LOG_LEVEL", "HF_TOKEN_PATH", "VLLM_LOGGING_LEVEL", "OMP_NUM_THREADS")
#: Environment names that are compile inputs (desired.key.is_compile_env).
COMPILE_ENV = ("DT_OPT", "FLEX_COMPUTE", "SENCORES", "SENDNN_INFERENCE_WARMUP_PROMPT_LENS",
               "TORCH_SENDNN_LOG", "VLLM_DT_CHUNK_LEN", "SENDNN_INFERENCE_UPDATE_THREAD_CONFIG")
QUANTITY = st.sampled_from(["1", "500m", "2", "1Gi", "512Mi", "64Gi", "100M"])
ENV_VALUE = st.text(st.characters(codec="ascii", categories=["L", "N"]), max_size=8)


def model_uri() -> st.SearchStrategy[str]:
    hf = st.builds(lambda o, n, r: f"hf://{o}/{n}" + (f"@{r}" if r else ""),
                   HF_PART, HF_PART, st.none() | REVISION)
    pvc = st.builds(lambda c, p: f"pvc://{c}/{p}", NAME, st.from_regex(r"[a-z0-9/]{0,12}",
                                                                     fullmatch=True))
    return hf | pvc


def warmup_shapes() -> st.SearchStrategy[list[dict[str, int]]]:
    shape = st.fixed_dictionaries({"promptLen": st.integers(1, 2048).map(lambda n: 64 * n),
                                   "batchSize": st.integers(1, 256)})
    return st.lists(shape, min_size=1, max_size=3)


def optional(d: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict with any subset of the keys (absent keys take the CRD's defaults)."""
    return st.fixed_dictionaries({}, optional=d)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A SpyreModel spec the CRD accepts, with some fields left to their defaults."""
    task = draw(st.sampled_from(("generate", "generate", *POOLING)))
    compile_ = draw(optional({
        "tensorParallelSize": st.sampled_from([1, 2, 4, 8]),
        "maxModelLen": st.integers(64, 131072),
        "maxNumSeqs": st.integers(1, 256),
        "maxNumBatchedTokens": st.integers(1, 2048).map(lambda n: 64 * n),
        "backend": st.sampled_from(BACKENDS),
    }))
    if task != "generate":
        compile_["warmupShapes"] = draw(warmup_shapes())
    env_names = draw(st.lists(st.sampled_from(PLAIN_ENV + COMPILE_ENV), unique=True, max_size=4))
    serving = draw(optional({
        "prefixCaching": st.booleans(),
        "extraArgs": st.lists(st.sampled_from(["--disable-log-stats", "--seed=1",
                                               "--uvicorn-log-level=warning"]), max_size=2),
        "port": st.integers(1024, 65535),
        "shutdownGracePeriodSeconds": st.integers(0, 3600),
        "resources": optional({"requests": st.fixed_dictionaries({"cpu": QUANTITY}),
                               "limits": st.fixed_dictionaries({"memory": QUANTITY})}),
        "podAnnotations": st.dictionaries(st.sampled_from(["a.example/x", "b"]), ENV_VALUE,
                                          max_size=2),
        "rollout": optional({"maxSurge": st.integers(1, 2), "maxUnavailable": st.integers(1, 2)}),
    }))
    if env_names:
        serving["env"] = [{"name": n, "value": draw(ENV_VALUE)} for n in env_names]
    cache = draw(st.sampled_from(["default", "claim", "volume"]))
    spec: dict[str, Any] = {
        "model": {"uri": draw(model_uri())},
        **draw(optional({
            "replicas": st.integers(0, 8),
            "precompile": optional({"backoffLimit": st.integers(0, 10),
                                    "activeDeadlineSeconds": st.integers(60, 10000)}),
            "engine": optional({"image": st.sampled_from(IMAGES)}),
            "accelerator": optional({
                "resourceName": st.sampled_from(["ibm.com/spyre_vf", "ibm.com/spyre_pf"]),
                "schedulerName": st.sampled_from(["", "spyre-scheduler"]),
                "nodeSelector": st.dictionaries(st.sampled_from(["pool", "zone"]), NAME,
                                                max_size=1),
            }),
        })),
    }
    if draw(st.booleans()) or task != "generate":
        spec["task"] = task
    if compile_ or draw(st.booleans()):
        spec["compile"] = compile_
    if serving:
        spec["serving"] = serving
    if draw(st.booleans()):
        spec["model"]["servedName"] = draw(HF_PART)
    if cache == "claim":
        spec["cache"] = {"claimName": draw(NAME)}
    elif cache == "volume":
        spec["cache"] = {"volume": draw(optional({
            "name": NAME, "size": st.sampled_from(["1Gi", "50Gi", "100Gi"]),
            "retainPolicy": st.sampled_from(["Retain", "Delete"]),
        }))}
    return spec


def key(spec: dict[str, Any]) -> str:
    return artifact_key(SpyreModelSpec.model_validate(spec))


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same document with every mapping's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


def setpath(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    node = out
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
    return out


# ------------------------------------------------------------------------------ properties


@SETTINGS
@given(specs())
def test_key_is_stable_under_defaulting(spec: dict[str, Any]) -> None:
    """Writing every default out explicitly (as the API server's defaulting would) is a no-op."""
    explicit = SpyreModelSpec.model_validate(spec).model_dump(by_alias=True, mode="json")
    assert key(explicit) == key(spec)
    # and dropping the defaults again
    minimal = SpyreModelSpec.model_validate(spec).model_dump(
        by_alias=True, mode="json", exclude_defaults=True)
    assert key(minimal) == key(spec)


@SETTINGS
@given(specs(), st.randoms(use_true_random=False))
def test_key_is_stable_under_field_order(spec: dict[str, Any], rnd: random.Random) -> None:
    assert key(shuffled(spec, rnd)) == key(spec)


@st.composite
def non_compile_edits(draw: st.DrawFn) -> tuple[tuple[str, ...], Any]:
    """A (path, value) that changes a field outside key_inputs()."""
    return draw(st.one_of(
        st.tuples(st.just(("replicas",)), st.integers(0, 8)),
        st.tuples(st.just(("serving", "prefixCaching")), st.booleans()),
        st.tuples(st.just(("serving", "port")), st.integers(1024, 65535)),
        st.tuples(st.just(("serving", "shutdownGracePeriodSeconds")), st.integers(0, 3600)),
        st.tuples(st.just(("serving", "extraArgs")),
                  st.lists(st.sampled_from(["--seed=2", "--disable-log-requests"]), max_size=2)),
        st.tuples(st.just(("serving", "resources", "limits", "memory")), QUANTITY),
        st.tuples(st.just(("accelerator", "resourceName")),
                  st.sampled_from(["ibm.com/spyre_vf", "ibm.com/spyre_pf"])),
        st.tuples(st.just(("accelerator", "schedulerName")),
                  st.sampled_from(["", "spyre-scheduler", "other"])),
        st.tuples(st.just(("precompile", "backoffLimit")), st.integers(0, 10)),
        st.tuples(st.just(("precompile", "podAnnotations")),
                  st.dictionaries(st.sampled_from(["x", "y"]), ENV_VALUE, max_size=2)),
        st.tuples(st.just(("model", "servedName")), HF_PART),
        st.tuples(st.just(("cache",)), st.builds(lambda n: {"claimName": n}, NAME)),
        st.tuples(st.just(("cache",)), st.builds(lambda n: {"volume": {"name": n}}, NAME)),
        st.tuples(st.just(("engine", "imagePullPolicy")), st.sampled_from(["Always", "Never"])),
        st.tuples(st.just(("routing",)), st.builds(
            lambda n, p: {"inferencePool": {"endpointPicker": {"name": n, "port": p}}},
            NAME, st.integers(1, 65535))),
    ))


@SETTINGS
@given(specs(), non_compile_edits())
def test_non_compile_fields_never_change_the_key(
    spec: dict[str, Any], edit: tuple[tuple[str, ...], Any]
) -> None:
    path, value = edit
    assert key(setpath(spec, path, value)) == key(spec)


@SETTINGS
@given(specs(), st.lists(st.sampled_from(PLAIN_ENV), unique=True, max_size=3), ENV_VALUE)
def test_non_compile_env_never_changes_the_key(
    spec: dict[str, Any], names: list[str], value: str
) -> None:
    env = [e for e in spec.get("serving", {}).get("env", []) if e["name"] not in names]
    env += [{"name": n, "value": value} for n in names]
    assert key(setpath(spec, ("serving", "env"), env)) == key(spec)


@st.composite
def compile_edits(draw: st.DrawFn, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with one input of key_inputs() changed to a different valid value."""
    m = SpyreModelSpec.model_validate(spec)
    pooling = str(m.task) != "generate"
    field = draw(st.sampled_from([
        "uri", "task", "tp", "maxModelLen", "maxNumSeqs", "chunk", "backend", "image", "env",
        "cpu", *(["warmupShapes"] if pooling else []),
    ]))
    c = resolve_compile(m).compile  # the shape the key hashes: omitted fields as chosen
    if field == "uri":
        new = draw(model_uri())
        assume(new != m.model.uri)
        return setpath(spec, ("model", "uri"), new)
    if field == "task":
        new_task = draw(st.sampled_from(["generate", *POOLING]))
        assume(new_task != str(m.task))
        out = setpath(spec, ("task",), new_task)
        out.setdefault("compile", {})
        if new_task == "generate":
            out["compile"].pop("warmupShapes", None)
        elif not pooling:
            out["compile"]["warmupShapes"] = draw(warmup_shapes())
        return out
    simple: dict[str, tuple[str, Any, st.SearchStrategy[Any]]] = {
        "tp": ("tensorParallelSize", c.tensor_parallel_size, st.sampled_from([1, 2, 4, 8])),
        "maxModelLen": ("maxModelLen", c.max_model_len, st.integers(64, 131072)),
        "maxNumSeqs": ("maxNumSeqs", c.max_num_seqs, st.integers(1, 256)),
        "chunk": ("maxNumBatchedTokens", c.max_num_batched_tokens,
                  st.integers(1, 2048).map(lambda n: 64 * n)),
        "backend": ("backend", str(c.backend), st.sampled_from(BACKENDS)),
    }
    if field in simple:
        name, old, strategy = simple[field]
        new = draw(strategy)
        assume(new != old)
        return setpath(spec, ("compile", name), new)
    if field == "warmupShapes":
        new_shapes = draw(warmup_shapes())
        assume([[w["promptLen"], w["batchSize"]] for w in new_shapes]
               != [[w.prompt_len, w.batch_size] for w in c.warmup_shapes or []])
        return setpath(spec, ("compile", "warmupShapes"), new_shapes)
    if field == "cpu":  # the serving pods' whole CPUs, the plugin's thread count
        cpus = draw(st.sampled_from(["1", "1500m", "2", "3", "7.5", "64"]))
        edited = setpath(spec, ("serving", "resources", "limits", "cpu"), cpus)
        assume(engine_cpus(SpyreModelSpec.model_validate(edited)) != engine_cpus(m))
        return edited
    if field == "image":
        new = draw(st.sampled_from([*IMAGES, "registry.example/other:3"]))
        assume(new != m.engine.image)
        return setpath(spec, ("engine", "image"), new)
    # a compile-time environment variable: added, changed or removed
    env = copy.deepcopy(spec.get("serving", {}).get("env", []))
    name = draw(st.sampled_from(COMPILE_ENV))
    current = next((e for e in env if e["name"] == name), None)
    if current is None:
        env.append({"name": name, "value": draw(ENV_VALUE)})
    elif draw(st.booleans()):
        env.remove(current)
    else:
        new = draw(ENV_VALUE)
        assume(new != current.get("value"))
        current["value"] = new
    return setpath(spec, ("serving", "env"), env)


@SETTINGS
@given(st.data())
def test_compile_fields_always_change_the_key(data: st.DataObject) -> None:
    spec = data.draw(specs())
    edited = data.draw(compile_edits(spec))
    before, after = SpyreModelSpec.model_validate(spec), SpyreModelSpec.model_validate(edited)
    assert key_inputs(before) != key_inputs(after)
    assert artifact_key(after) != artifact_key(before)


@SETTINGS
@given(specs(), st.sampled_from([("2", "2000m"), ("1500m", "2"), ("3", "2.1"), ("64", 64)]))
def test_the_serving_cpu_counts_in_whole_cpus(
    spec: dict[str, Any], same: tuple[str | int, str | int]
) -> None:
    """The key hashes the whole CPUs the plugin is given, not how the quantity is spelt."""
    a, b = same
    assert key(setpath(spec, ("serving", "resources", "limits", "cpu"), a)) == key(
        setpath(spec, ("serving", "resources", "limits", "cpu"), b))
