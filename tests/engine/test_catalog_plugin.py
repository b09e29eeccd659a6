"""Catalog entries and effective shapes, judged by the plugin's OWN code on CPU.

``plugin_probe.py`` builds vLLM's config the way ``vllm serve`` does (the plugin's
``check_and_update_config`` caps unknown sendnn configurations, applies model_configs.yaml,
exports VLLM_DT_*) and asks the plugin's ``match_from_pre_compile_catalog`` about the entries the
engine writes. No torch_sendnn needed: the sendnn backend only imports it in the workers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spyre_engine import catalog, known_configs
from spyre_engine.launch import plugin_env, vllm_command
from spyre_engine.settings import PrecompileSettings, ServeSettings

from tests.unit.test_spyre_pins import GRANITE_33_8B_ARCH

pytestmark = pytest.mark.engine

PROBE = Path(__file__).with_name("plugin_probe.py")

# The architecture of ibm-granite/granite-3.3-8b-instruct in model_configs.yaml (the pin-drift
# test checks it against the installed file).
GRANITE_33_8B = GRANITE_33_8B_ARCH


def _variant(tiny_model: Path, dest: Path, **config: Any) -> Path:
    """The tiny model with config.json fields replaced (weights linked; never loaded here)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in tiny_model.iterdir():
        if item.name != "config.json":
            target = dest / item.name
            if not target.exists():
                os.symlink(item, target)
    cfg = json.loads((tiny_model / "config.json").read_text())
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def _case(settings: PrecompileSettings, model: Path, catalogs: list[Any]) -> dict[str, Any]:
    cmd = vllm_command(settings, str(model), host="127.0.0.1", port=1)
    args = ["--model", str(model), *cmd[cmd.index("serve") + 2 :]]
    env = plugin_env(settings, require_precompiled=False, base={})
    keep = {k: v for k, v in env.items() if k.startswith(("SENDNN_INFERENCE_", "VLLM_DT_"))}
    return {"args": args, "env": keep, "catalogs": catalogs}


def _probe(cases: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_DT_", "SENDNN_"))}
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE-RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(line.removeprefix("PROBE-RESULT "))  # type: ignore[no-any-return]


def _settings(model: Path, art: Path, **kw: Any) -> PrecompileSettings:
    """Precompile settings; unknown configurations only pass with --no-require-known-config."""
    kw.setdefault("require_known_config", False)
    return PrecompileSettings.model_validate({"model": str(model), "artifact_dir": art, **kw})


def test_entries_match_with_the_plugins_own_matcher(tiny_model: Path, tmp_path: Path) -> None:
    big = _variant(tiny_model, tmp_path / "big", max_position_embeddings=131072)
    known = _variant(tiny_model, tmp_path / "granite33", **GRANITE_33_8B)
    art = tmp_path / "art"
    settings = [
        # sendnn, a configuration the plugin does not know: it caps seqs at 32 and len at 32K.
        (_settings(big, art, max_model_len=65536, max_num_seqs=64), big),
        # within the caps, the default chunk (the plugin's 512, not vLLM's)
        (_settings(big, art, max_model_len=2048, max_num_seqs=1), big),
        # inductor: no registry, no caps; an explicit chunk
        (
            _settings(
                big,
                art,
                backend="inductor",
                max_model_len=65536,
                max_num_seqs=64,
                max_num_batched_tokens=256,
            ),
            big,
        ),
        # compile-only: the entry a sendnn server (the probe below) must find
        (_settings(big, art, backend="sendnn_compile_only", max_model_len=4096), big),
        # a known configuration of granite-3.3-8b-instruct (tp 1, 8192 x 4)
        (
            _settings(known, art, max_model_len=8192, max_num_seqs=4, require_known_config=True),
            known,
        ),
        # pooling: the warmup shapes decide max len and seqs, whatever the flags say
        (
            _settings(big, art, task="embed", warmup_shapes="64x4,128x2", max_model_len=1024),
            big,
        ),
    ]
    cases = []
    expected = []
    for s, model in settings:
        config_json = known_configs.read_config_json(model)
        env = plugin_env(s, require_precompiled=False, base={})
        entry = catalog.make_entry(s, str(model), "2.6.3", config_json, env)
        expected.append((s, entry))
        stringly = json.loads(json.dumps(entry))
        stringly["data"]["NUM_AIUS"] = str(s.tensor_parallel_size)
        requested = json.loads(json.dumps(entry))
        if not s.is_pooling:
            requested["data"]["VLLM_DT_MAX_CONTEXT_LEN"] = s.max_model_len
            requested["data"]["VLLM_DT_MAX_BATCH_SIZE"] = s.max_num_seqs
        # The server that uses the artifact: a compile-only artifact is served with sendnn.
        server = (
            s.model_copy(update={"backend": "sendnn"}) if s.backend == "sendnn_compile_only" else s
        )
        catalogs = [[entry], [stringly], {}, [stringly, entry], [requested]]
        cases.append(_case(server, model, catalogs))
    results = _probe(cases, tmp_path)

    for (s, entry), result in zip(expected, results, strict=True):
        assert "error" not in result, result
        data = entry["data"]
        # The plugin finds the engine's entry; "4" is not 4 for it; {} is an empty catalog.
        assert result["matches"][:4] == [0, -1, -1, 1], (data, result)
        # Our matcher agrees with the plugin on the same entries.
        wanted = catalog.entry_data(s, str(s.model), known_configs.read_config_json(s.model))
        assert catalog.find_entry([entry], wanted) is not None
        assert catalog.find_entry([json.loads(json.dumps(e)) for e in [entry]], wanted)
        stringly = json.loads(json.dumps(entry))
        stringly["data"]["NUM_AIUS"] = str(s.tensor_parallel_size)
        assert catalog.find_entry([stringly], wanted) is None
        # The entry records what the plugin configured, not what was asked.
        if s.is_pooling:
            assert result["max_model_len"] == 128 and result["max_num_seqs"] == 4
            continue
        assert data["VLLM_DT_MAX_CONTEXT_LEN"] == result["max_model_len"]
        assert data["VLLM_DT_MAX_BATCH_SIZE"] == result["max_num_seqs"]
        assert data["VLLM_DT_CHUNK_LEN"] == result["max_num_batched_tokens"]
        assert str(data["VLLM_DT_CHUNK_LEN"]) == result["env"]["VLLM_DT_CHUNK_LEN"]
        assert (
            str(data["VLLM_DT_MAX_BATCH_TKV_LIMIT"]) == result["env"]["VLLM_DT_MAX_BATCH_TKV_LIMIT"]
        )
        # The env torch_sendnn compiles for: max(seqs, 2).
        assert result["env"]["VLLM_DT_MAX_BATCH_SIZE"] == str(
            max(data["VLLM_DT_MAX_BATCH_SIZE"], 2)
        )
        capped = (s.max_model_len, s.max_num_seqs) != (
            data["VLLM_DT_MAX_CONTEXT_LEN"],
            data["VLLM_DT_MAX_BATCH_SIZE"],
        )
        # An entry of the requested (uncapped) values never matches a capped configuration.
        assert result["matches"][4] == (-1 if capped else 0)

    by_case = [e["data"] for _, e in expected]
    assert by_case[0]["VLLM_DT_MAX_CONTEXT_LEN"] == 32768
    assert by_case[0]["VLLM_DT_MAX_BATCH_SIZE"] == 32
    assert by_case[0]["VLLM_DT_MAX_BATCH_TKV_LIMIT"] == 131072
    assert by_case[1]["VLLM_DT_CHUNK_LEN"] == 512
    assert by_case[2]["VLLM_DT_MAX_CONTEXT_LEN"] == 65536 and by_case[2]["VLLM_DT_CHUNK_LEN"] == 256
    assert by_case[4]["VLLM_DT_MAX_BATCH_TKV_LIMIT"] == 8192 * 4  # known, no device env


def test_known_configuration_check_agrees_with_the_plugin(tiny_model: Path, tmp_path: Path) -> None:
    """Unknown combination + SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG=1: the plugin raises; the
    engine says so first, naming the nearest supported shapes."""
    known = _variant(tiny_model, tmp_path / "granite33", **GRANITE_33_8B)
    art = tmp_path / "art"
    ok = _settings(known, art, max_model_len=8192, max_num_seqs=4, require_known_config=True)
    bad = _settings(known, art, max_model_len=8192, max_num_seqs=8, require_known_config=True)
    results = _probe([_case(ok, known, []), _case(bad, known, [])], tmp_path)
    assert "error" not in results[0], results[0]
    assert "SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG" in results[1].get("error", ""), results[1]
    config_json = known_configs.read_config_json(known)
    assert known_configs.check_configuration(config_json, 1, 8192, 4).known
    check = known_configs.check_configuration(config_json, 1, 8192, 8)
    assert not check.known and check.model == "ibm-granite/granite-3.3-8b-instruct"
    assert str(check.nearest[0]) == "tp=1 maxModelLen=8192 maxNumSeqs=4"
    assert "tp=1 maxModelLen=8192 maxNumSeqs=4" in check.message


def test_sendnn_precompile_of_an_unknown_configuration_fails_fast(
    tiny_model: Path, tmp_path: Path
) -> None:
    known = _variant(tiny_model, tmp_path / "granite33", **GRANITE_33_8B)
    term = tmp_path / "term"
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", "precompile", "--model", str(known)]
        + ["--artifact-dir", str(tmp_path / "art"), "--termination-log", str(term)]
        + ["--max-model-len", "8192", "--max-num-seqs", "8"],
        capture_output=True,
        text=True,
        # "fast": it fails before vLLM loads the model (the reason below), not within a time;
        # its imports alone took past 120 s in a cold run's load (.ci/README.md)
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    failure = json.loads(term.read_text())
    assert failure["reason"] == "UnsupportedConfiguration"
    assert "maxModelLen=8192 maxNumSeqs=4" in failure["message"]
    assert not (tmp_path / "art" / catalog.CATALOG_FILENAME).exists()
    shutil.rmtree(tmp_path / "art", ignore_errors=True)


def _serve_case(settings: ServeSettings, model: Path) -> dict[str, Any]:
    """What ``spyre-engine serve`` gives vLLM: its command line and the plugin's environment."""
    cmd = vllm_command(settings, str(model), host="127.0.0.1", port=1)
    args = ["--model", str(model), *cmd[cmd.index("serve") + 2 :]]
    env = plugin_env(settings, require_precompiled=True, base={})
    prefixes = ("SENDNN_INFERENCE_", "VLLM_DT_", "TORCH_SENDNN_", "DISABLE_COMPILATION")
    return {"args": args, "env": {k: v for k, v in env.items() if k.startswith(prefixes)},
            "catalogs": []}  # fmt: skip


def test_pooling_servers_are_not_forced_into_disable_compilation(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The plugin's own check_and_update_config with serve's environment: for a decoder it sets
    DISABLE_COMPILATION itself (torch_sendnn then only loads); for a pooling model it returns
    early (upstream: precompiled mode does not support pooling) and the engine no longer forces
    it. The pooling server reads its graphs from torch_sendnn's cache, which is the artifact
    precompile filled for the same warmup shapes (serve refuses other shapes before vLLM
    starts: tests/engine/test_pooling.py)."""
    art = tmp_path / "art"
    common = {"model": str(tiny_model), "artifact_dir": art, "backend": "sendnn"}
    decoder = ServeSettings.model_validate(
        {**common, "max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 128}
    )
    catalog.add_entry(art, catalog.make_entry(decoder, str(tiny_model), "2.6.3"))
    pooling = ServeSettings.model_validate(
        {**common, "task": "embed", "warmup_shapes": "64x4", "max_model_len": 512}
    )
    dec_case, pool_case = _serve_case(decoder, tiny_model), _serve_case(pooling, tiny_model)
    dec_case["env"].pop("DISABLE_COMPILATION")  # let the plugin decide
    assert "DISABLE_COMPILATION" not in pool_case["env"]
    dec, pool = _probe([dec_case, pool_case], tmp_path)
    assert "error" not in dec and "error" not in pool, (dec, pool)
    assert dec["env"]["DISABLE_COMPILATION"] == "true"
    assert pool["env"]["DISABLE_COMPILATION"] is None
    assert pool["env"]["TORCH_SENDNN_CACHE_ENABLE"] == "1"
    assert pool["env"]["TORCH_SENDNN_CACHE_DIR"] == str(art.resolve())
    assert pool["env"]["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] == "64"


def test_the_plugins_matcher_at_tp_2_and_4_and_warmup_shapes_in_both_orders(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The plugin's match_from_pre_compile_catalog on vLLM's own config at TP 2 and TP 4 (the
    supported granite-3.3-8b shapes) and for pooling warmup shapes given in either order, with
    a catalog holding every entry: each server finds its own entry, and our matcher
    (catalog.find_entry, which serve uses before vLLM starts) picks the same one."""
    known = _variant(tiny_model, tmp_path / "granite33", **GRANITE_33_8B)
    art = tmp_path / "art"
    settings = [
        _settings(known, art, tensor_parallel_size=2, max_model_len=8192, max_num_seqs=4),
        _settings(known, art, tensor_parallel_size=4, max_model_len=32768, max_num_seqs=32),
        _settings(tiny_model, art, task="embed", warmup_shapes="64x4,128x2", max_model_len=512),
        _settings(tiny_model, art, task="embed", warmup_shapes="128x2,64x4", max_model_len=512),
    ]
    models = [known, known, tiny_model, tiny_model]
    entries = []
    for s, model in zip(settings, models, strict=True):
        env = plugin_env(s, require_precompiled=False, base={})
        entries.append(
            catalog.make_entry(s, str(model), "2.6.3", known_configs.read_config_json(model), env)
        )
    cases = [_case(s, m, [entries]) for s, m in zip(settings, models, strict=True)]
    results = _probe(cases, tmp_path)
    for i, (s, model, result) in enumerate(zip(settings, models, results, strict=True)):
        assert "error" not in result, result
        assert result["matches"] == [i], (str(s.warmup_shapes or s.tensor_parallel_size), result)
        wanted = catalog.entry_data(s, str(model), known_configs.read_config_json(model))
        assert catalog.find_entry(entries, wanted) is entries[i]
    # the two orders are two entries, not one
    pooling = [e["data"]["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] for e in entries[2:]]
    assert pooling == ["64,128", "128,64"]
