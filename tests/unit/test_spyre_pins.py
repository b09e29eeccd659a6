"""Pin drift: what the engine and the operator rely on in the installed plugin and vLLM.

Read from the installed files (never imported: no vLLM start-up here), so a version bump of
sendnn-inference or vLLM fails here, naming what moved, instead of on a cluster with cards:
  - the plugin's environment variables we set or read (``sendnn_inference/envs.py``), and the
    backend names;
  - the catalog the plugin reads (``compilation_utils.py``): its file name and every key it
    reads from an entry, and the environment variables it reads and sets;
  - the ``model_configs.yaml`` layout and the entries our tests and docs use;
  - the ``Configurations for Spyre.`` log line the engine parses to record what was compiled
    (``platform.py``), rendered with its own format string and parsed with ours;
  - the vLLM variables we set (``vllm/envs.py``), ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` among
    them;
  - the thread count the operator pins (``platform.py``): SENDNN_INFERENCE_NUM_CPUS comes
    before the cgroup quota, is divided among the tensor-parallel workers into
    DT_PARALLEL_THREADS for every backend, sendnn_compile_only included; and
    SENDNN_INFERENCE_MAX_LOAD_PROCESSES still staggers the model load and the warmup compile.
Each check is fed a modified copy of those files too, to show it fails on a simulated rename.
The plugin's matcher itself (types, TP 2 and 4, warmup shapes in both orders) is run on CPU in
``tests/engine/test_catalog_plugin.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from spyre_engine import catalog, launch
from spyre_engine.settings import Backend

ROOT = Path(__file__).resolve().parents[2]
#: Our sources that name plugin variables (not the tests).
OUR_SOURCES = [*(ROOT / "engine" / "spyre_engine").rglob("*.py"),
               *(ROOT / "engine" / "spyre_contract").rglob("*.py"),
               *(ROOT / "operator" / "spyre_operator").rglob("*.py")]  # fmt: skip

#: Keys of a catalog entry the plugin reads, all of which precompile writes (catalog.py).
CATALOG_KEYS = {
    "data",
    "sendnn_inference_version",
    "MODEL_NAME",
    "NUM_AIUS",
    "VLLM_DT_MAX_CONTEXT_LEN",
    "VLLM_DT_MAX_BATCH_SIZE",
    "SENDNN_INFERENCE_WARMUP_PROMPT_LENS",
    "SENDNN_INFERENCE_WARMUP_BATCH_SIZES",
}
#: Environment compilation_utils.py reads or sets that the engine sets or relies on (launch.py).
CATALOG_ENV = {"TORCH_SENDNN_CACHE_DIR", "TORCH_SENDNN_CACHE_ENABLE",
               "SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS", "DISABLE_COMPILATION"}  # fmt: skip
#: vLLM variables the engine sets (launch.plugin_env).
VLLM_ENV = {"VLLM_PLUGINS", "VLLM_NO_USAGE_STATS", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"}
#: model_configs.yaml keys known_configs.py (and the operator's shape choice) read.
MODEL_KEYS = {"architecture", "continuous_batching_configs", "static_batching_configs"}
CB_KEYS = {"tp_size", "max_model_len", "max_num_seqs"}
STATIC_KEYS = {"tp_size", "warmup_shapes"}
#: Entries our tests and docs use: the model, its architecture and the shapes named.
GRANITE_33_8B = "ibm-granite/granite-3.3-8b-instruct"
GRANITE_33_8B_ARCH = {
    "model_type": "granite",
    "num_hidden_layers": 40,
    "max_position_embeddings": 131072,
    "hidden_size": 4096,
    "vocab_size": 49159,
    "num_key_value_heads": 8,
    "num_attention_heads": 32,
}
GRANITE_33_8B_SHAPES = [(1, 8192, 4), (4, 32768, 32)]


@dataclass(frozen=True)
class Installed:
    """The files read: the plugin's package dir and vLLM's envs.py."""

    plugin: Path
    vllm_envs: Path


def installed() -> Installed:
    plugin = importlib.util.find_spec("sendnn_inference")
    vllm = importlib.util.find_spec("vllm")
    assert plugin and plugin.submodule_search_locations and vllm and vllm.origin
    return Installed(
        Path(next(iter(plugin.submodule_search_locations))), Path(vllm.origin).parent / "envs.py"
    )


def _dict_keys(path: Path, name: str) -> set[str]:
    """String keys of the module-level dict assigned to ``name``."""
    for node in ast.walk(ast.parse(path.read_text())):
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.Dict):
            return {k.value for k in value.keys if isinstance(k, ast.Constant)}
    return set()


def _strings(path: Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _keys_read(path: Path) -> set[str]:
    """String constants used as ``x["KEY"]`` or ``x.get("KEY")``."""
    keys = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            keys.add(n.slice.value)
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and n.args
            and isinstance(n.args[0], ast.Constant)
        ):
            keys.add(n.args[0].value)
    return {k for k in keys if isinstance(k, str)}


def env_drift(src: Installed) -> list[str]:
    """Plugin variables our code names that the plugin no longer defines; backend names."""
    defined = _dict_keys(src.plugin / "envs.py", "environment_variables")
    problems = []
    for path in sorted(OUR_SOURCES):
        for name in sorted(set(re.findall(r"\bSENDNN_INFERENCE_[A-Z0-9_]+\b", path.read_text()))):
            if name not in defined:
                rel = path.relative_to(ROOT)
                problems.append(f"sendnn_inference/envs.py no longer defines {name} ({rel})")
    text = (src.plugin / "envs.py").read_text() + (src.plugin / "platform.py").read_text()
    for backend in Backend:
        if f'"{backend.value}"' not in text:
            problems.append(f"the plugin no longer names the backend {backend.value!r}")
    return problems


def catalog_drift(src: Installed) -> list[str]:
    """The catalog file name and the keys and variables compilation_utils.py reads."""
    path = src.plugin / "compilation_utils.py"
    problems = []
    names = _strings(path)
    if catalog.CATALOG_FILENAME not in names:
        problems.append(f"compilation_utils.py no longer reads {catalog.CATALOG_FILENAME}")
    read = _keys_read(path) - {"config"}  # os.environ-style reads are checked below
    for key in sorted(read - CATALOG_KEYS - CATALOG_ENV):
        problems.append(f"compilation_utils.py reads catalog key {key}, which precompile "
                        "does not write")  # fmt: skip
    for key in sorted(CATALOG_KEYS - read):
        problems.append(f"compilation_utils.py no longer reads catalog key {key}")
    for name in sorted(CATALOG_ENV - names):
        problems.append(f"compilation_utils.py no longer uses the variable {name}")
    return problems


def model_configs_drift(src: Installed) -> list[str]:
    """The layout known_configs.py reads and the entries our tests and docs name."""
    doc = yaml.safe_load((src.plugin / "config" / "model_configs.yaml").read_text())
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict) or not models:
        return ["model_configs.yaml has no 'models' mapping"]
    problems = []
    for name, spec in models.items():
        if "architecture" not in spec or not set(spec) & (MODEL_KEYS - {"architecture"}):
            problems.append(f"model_configs.yaml entry {name} has none of {sorted(MODEL_KEYS)}")
        for cb in spec.get("continuous_batching_configs") or []:
            if not CB_KEYS <= set(cb):
                problems.append(f"{name}: a continuous batching config lacks "
                                f"{sorted(CB_KEYS - set(cb))}")  # fmt: skip
        for st in spec.get("static_batching_configs") or []:
            if not STATIC_KEYS <= set(st):
                problems.append(f"{name}: a static batching config lacks "
                                f"{sorted(STATIC_KEYS - set(st))}")  # fmt: skip
    granite = models.get(GRANITE_33_8B)
    if granite is None:
        return [*problems, f"model_configs.yaml no longer lists {GRANITE_33_8B}"]
    arch = {k: v for k, v in granite["architecture"].items() if k in GRANITE_33_8B_ARCH}
    if arch != GRANITE_33_8B_ARCH:
        problems.append(f"{GRANITE_33_8B}: architecture is now {arch}")
    shapes = {(c.get("tp_size"), c.get("max_model_len"), c.get("max_num_seqs"))
              for c in granite.get("continuous_batching_configs") or []}  # fmt: skip
    for shape in GRANITE_33_8B_SHAPES:
        if shape not in shapes:
            problems.append(f"{GRANITE_33_8B}: no longer supports tp x len x seqs {shape}")
    if not any("quantization_config" in (s.get("architecture") or {}) for s in models.values()):
        problems.append("no entry declares quantization_config (how precompile tells FP8)")
    return problems


def _config_log_format(platform_py: Path) -> str | None:
    for n in ast.walk(ast.parse(platform_py.read_text())):
        if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant):
            fmt = n.args[0].value
            if isinstance(fmt, str) and fmt.startswith("Configurations for Spyre"):
                return fmt
    return None


def log_line_drift(src: Installed) -> list[str]:
    """The plugin's line, rendered with its own format, parsed by the engine's pattern."""
    fmt = _config_log_format(src.plugin / "platform.py")
    if fmt is None:
        return ["platform.py no longer logs 'Configurations for Spyre. ...'"]
    values = iter([8192, 4, 64, 1024, True, True, 0, 0])
    line = re.sub(r"%[dsr]", lambda m: str(next(values)), fmt)
    match = launch._SPYRE_CONFIG_LINE.search(line)
    if match is None:
        return [f"the engine's _SPYRE_CONFIG_LINE no longer parses the plugin's line: {line!r}"]
    if tuple(int(g) for g in match.groups()) != (8192, 4, 1024):
        return [f"_SPYRE_CONFIG_LINE reads {match.groups()} from {line!r}"]
    return []


def vllm_env_drift(src: Installed) -> list[str]:
    defined = _dict_keys(src.vllm_envs, "environment_variables")
    return [f"vllm/envs.py no longer defines {name}" for name in sorted(VLLM_ENV - defined)]


#: The plugin's variables the operator sets for threads and compile concurrency, and their
#: defaults when unset (0: count the CPUs; 0: every worker at once; 1: set the thread variables).
THREAD_ENV_DEFAULTS = {"SENDNN_INFERENCE_NUM_CPUS": "0",
                       "SENDNN_INFERENCE_MAX_LOAD_PROCESSES": "0",
                       "SENDNN_INFERENCE_UPDATE_THREAD_CONFIG": "1"}  # fmt: skip
#: Where the plugin staggers its workers by SENDNN_INFERENCE_MAX_LOAD_PROCESSES: the model load
#: and the warmup's compile.
MAX_LOAD_READERS = ("model_executor/model_loader/spyre.py", "v1/worker/spyre_worker.py")


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name),
                None)  # fmt: skip


def _names(node: ast.AST) -> set[str]:
    """Every Name id and Attribute attr under ``node``."""
    return {getattr(n, "id", None) or getattr(n, "attr", "") for n in ast.walk(node)} - {""}


def _getenv_defaults(envs_py: Path) -> dict[str, str]:
    """``os.getenv("NAME", "default")`` calls of envs.py, as {NAME: default}."""
    out = {}
    for n in ast.walk(ast.parse(envs_py.read_text())):
        if (isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "getenv"
                and len(n.args) == 2 and all(isinstance(a, ast.Constant) for a in n.args)):
            out[str(n.args[0].value)] = str(n.args[1].value)  # type: ignore[attr-defined]
    return out


def thread_drift(src: Installed) -> list[str]:
    """What desired/pod.py thread_env and load_processes_env rely on in the plugin."""
    problems = []
    defaults = _getenv_defaults(src.plugin / "envs.py")
    for name, default in THREAD_ENV_DEFAULTS.items():
        if defaults.get(name) != default:
            problems.append(f"envs.py: {name} defaults to {defaults.get(name)!r}, not "
                            f"{default!r}")  # fmt: skip
    tree = ast.parse((src.plugin / "platform.py").read_text())
    threading = next((n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                      and any(getattr(t, "id", None) == "THREADING_ENVS" for t in n.targets)),
                     None)  # fmt: skip
    names = {e.value for e in getattr(threading, "elts", []) if isinstance(e, ast.Constant)}
    if "DT_PARALLEL_THREADS" not in names:
        problems.append("platform.py: THREADING_ENVS no longer lists DT_PARALLEL_THREADS")
    count = _function(tree, "get_cpu_count")
    first_if = next((n for n in (count.body if count else []) if isinstance(n, ast.If)), None)
    if first_if is None or "SENDNN_INFERENCE_NUM_CPUS" not in _names(first_if.test) or not any(
        isinstance(n, ast.Return) for n in first_if.body
    ):
        problems.append("platform.py: get_cpu_count no longer returns SENDNN_INFERENCE_NUM_CPUS "
                        "before it reads the cgroup quota")  # fmt: skip
    check = _function(tree, "_check_threading_config")
    divided = check is not None and any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
        and getattr(n.right, "id", None) == "worker_count" for n in ast.walk(check)
    )  # fmt: skip
    sets = check is not None and any(
        isinstance(n, ast.For) and getattr(n.iter, "id", None) == "THREADING_ENVS"
        and "environ" in _names(n) for n in ast.walk(check)
    )  # fmt: skip
    if not divided or not sets:
        problems.append("platform.py: _check_threading_config no longer sets THREADING_ENVS to "
                        "the CPU count divided among the workers")  # fmt: skip
    update = _function(tree, "check_and_update_config")
    if update is None or not any(
        isinstance(n, ast.Expr) and "_check_threading_config" in _names(n) for n in update.body
    ):
        problems.append("platform.py: check_and_update_config no longer calls "
                        "_check_threading_config for every backend")  # fmt: skip
    for rel in MAX_LOAD_READERS:
        if "SENDNN_INFERENCE_MAX_LOAD_PROCESSES" not in _names(
            ast.parse((src.plugin / rel).read_text())
        ):
            problems.append(f"{rel} no longer reads SENDNN_INFERENCE_MAX_LOAD_PROCESSES")
    return problems


CHECKS: list[Callable[[Installed], list[str]]] = [
    env_drift, catalog_drift, model_configs_drift, log_line_drift, vllm_env_drift, thread_drift
]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_installed_plugin_and_vllm_are_what_we_rely_on(check: Callable) -> None:  # type: ignore[type-arg]
    assert check(installed()) == []


def _copy(tmp_path: Path) -> Installed:
    src = installed()
    plugin = tmp_path / "sendnn_inference"
    for rel in ("envs.py", "compilation_utils.py", "platform.py", "config/model_configs.yaml",
                *MAX_LOAD_READERS):
        (plugin / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src.plugin / rel, plugin / rel)
    shutil.copy(src.vllm_envs, tmp_path / "vllm_envs.py")
    return Installed(plugin, tmp_path / "vllm_envs.py")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer has {old!r}: update this simulation"
    path.write_text(text.replace(old, new))


SIMULATED = [
    ("envs.py", '"SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG"', '"SENDNN_INFERENCE_REQUIRE_KNOWN_CFG"',
     env_drift, "no longer defines SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG"),
    ("compilation_utils.py", '["NUM_AIUS"]', '["NUM_SPYRE_CARDS"]',
     catalog_drift, "reads catalog key NUM_SPYRE_CARDS"),
    ("compilation_utils.py", '"pre_compiled_cache_catalog.json"', '"precompiled_catalog.json"',
     catalog_drift, "no longer reads pre_compiled_cache_catalog.json"),
    ("config/model_configs.yaml", "max_num_seqs:", "max_batch_size:",
     model_configs_drift, "lacks ['max_num_seqs']"),
    ("platform.py", "max_num_seqs=%d, block_size", "max_batch=%d, block_size",
     log_line_drift, "no longer parses the plugin's line"),
    ("vllm_envs.py", '"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": lambda',
     '"VLLM_WORKER_SHUTDOWN_TIMEOUT": lambda',
     vllm_env_drift, "no longer defines VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"),
    ("envs.py", '"SENDNN_INFERENCE_NUM_CPUS": lambda', '"SENDNN_INFERENCE_CPUS": lambda',
     env_drift, "no longer defines SENDNN_INFERENCE_NUM_CPUS"),
    ("envs.py", '"SENDNN_INFERENCE_MAX_LOAD_PROCESSES", "0"',
     '"SENDNN_INFERENCE_MAX_LOAD_PROCESSES", "1"',
     thread_drift, "SENDNN_INFERENCE_MAX_LOAD_PROCESSES defaults to '1'"),
    ("platform.py", '"DT_PARALLEL_THREADS",  # affects', '"DT_THREADS",  # affects',
     thread_drift, "no longer lists DT_PARALLEL_THREADS"),
    ("platform.py", "if (num_cpu := envs_spyre.SENDNN_INFERENCE_NUM_CPUS) > 0:",
     "if (num_cpu := 0) > 0:",
     thread_drift, "no longer returns SENDNN_INFERENCE_NUM_CPUS"),
    ("platform.py", "math.ceil(cpu_count / worker_count)", "math.ceil(cpu_count)",
     thread_drift, "divided among the workers"),
    ("platform.py", "        cls._check_threading_config(parallel_config.world_size)",
     '        if envs_spyre.SENDNN_INFERENCE_DYNAMO_BACKEND == "sendnn":\n'
     "            cls._check_threading_config(parallel_config.world_size)",
     thread_drift, "for every backend"),
    ("v1/worker/spyre_worker.py", "envs_spyre.SENDNN_INFERENCE_MAX_LOAD_PROCESSES", "0",
     thread_drift, "spyre_worker.py no longer reads SENDNN_INFERENCE_MAX_LOAD_PROCESSES"),
]  # fmt: skip


@pytest.mark.parametrize(("rel", "old", "new", "check", "named"), SIMULATED,
                         ids=[s[4] for s in SIMULATED])  # fmt: skip
def test_a_simulated_upstream_change_fails_naming_it(
    tmp_path: Path, rel: str, old: str, new: str, check: Callable, named: str  # type: ignore[type-arg]
) -> None:
    copy = _copy(tmp_path)
    assert check(copy) == []  # the unmodified copy passes
    target = copy.vllm_envs if rel == "vllm_envs.py" else copy.plugin / rel
    _edit(target, old, new)
    problems = check(copy)
    assert any(named in p for p in problems), problems
