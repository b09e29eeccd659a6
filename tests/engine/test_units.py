"""Settings, catalog, summary, env and command building: pure, no vLLM (runs in make test-unit)."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from spyre_engine import catalog
from spyre_engine.launch import plugin_env, vllm_command
from spyre_engine.settings import (
    PrecompileSettings,
    ServeSettings,
    WarmupShape,
    parse_warmup_shapes,
    settings_from_sources,
)
from spyre_engine.summary import (
    FailureSummary,
    PrecompileSummary,
    parse_termination_message,
)

REPO = Path(__file__).resolve().parents[2]


def serve_settings(**kw: object) -> ServeSettings:
    base: dict[str, object] = {"model": "/m", "artifact_dir": "/a"}
    base.update(kw)
    return ServeSettings.model_validate(base)


# ---------------------------------------------------------------- settings


def test_flag_beats_env_and_env_beats_default() -> None:
    env = {
        "SPYRE_ENGINE_MODEL": "/env-model",
        "SPYRE_ENGINE_ARTIFACT_DIR": "/art",
        "SPYRE_ENGINE_MAX_MODEL_LEN": "1024",
        "SPYRE_ENGINE_PREFIX_CACHING": "false",
        "SPYRE_ENGINE_VLLM_ARGS": "--seed 3 --dtype 'float32'",
    }
    s = settings_from_sources(ServeSettings, {"model": "/flag-model"}, env)
    assert s.model == "/flag-model"
    assert s.max_model_len == 1024
    assert s.prefix_caching is False
    assert s.vllm_args == ["--seed", "3", "--dtype", "float32"]
    assert s.port == 8000 and s.tensor_parallel_size == 1
    assert str(s.termination_log) == "/dev/termination-log"


def test_warmup_shapes_parse_and_format() -> None:
    assert parse_warmup_shapes("64x4, 128x2") == [
        WarmupShape(prompt_len=64, batch_size=4),
        WarmupShape(prompt_len=128, batch_size=2),
    ]
    with pytest.raises(ValueError):
        parse_warmup_shapes("64by4")


@pytest.mark.parametrize(
    "kw, fragment",
    [
        ({"task": "embed"}, "needs --warmup-shapes"),
        ({"warmup_shapes": "64x4"}, "pooling tasks only"),
        ({"task": "embed", "warmup_shapes": "100x4"}, "multiple of 64"),
        ({"task": "embed", "warmup_shapes": "1024x4", "max_model_len": 512}, "exceeds"),
        ({"max_num_batched_tokens": 100}, "multiple of 64"),
        ({"backend": "cuda"}, "backend"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"model": "hf://"}, "ORG/NAME"),
        ({"metrics_port": 8000}, "--metrics-port 8000 must differ"),
        ({"metrics_port": 9000, "internal_port": 9000}, "--metrics-port 9000 must differ"),
    ],
)
def test_invalid_settings_are_rejected(kw: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        serve_settings(**kw)
    assert fragment in str(info.value)


def test_pooling_settings() -> None:
    s = serve_settings(task="embed", warmup_shapes="64x4,128x2")
    assert s.is_pooling and [str(w) for w in s.warmup_shapes] == ["64x4", "128x2"]


# ---------------------------------------------------------------- summary


def test_summary_round_trip() -> None:
    line = PrecompileSummary(
        key="k",
        path="/a",
        compileSeconds=1.5,
        sizeBytes=10,
        versions={"sendnn_inference": "2.6.3", "vllm": "0.28.0", "torch": "2.13.0"},  # type: ignore[arg-type]
    ).to_line()
    assert "\n" not in line and '"compileSeconds":1.5' in line and '"sizeBytes":10' in line
    parsed = parse_termination_message(line)
    assert isinstance(parsed, PrecompileSummary) and parsed.versions.vllm == "0.28.0"
    fail = FailureSummary(reason="ArtifactMismatch", message="no\nentry").to_line()
    assert json.loads(fail) == {"reason": "ArtifactMismatch", "message": "no entry"}
    parsed_fail = parse_termination_message("some log line\n" + fail + "\n")
    assert isinstance(parsed_fail, FailureSummary) and parsed_fail.reason == "ArtifactMismatch"


@pytest.mark.parametrize("text", [None, "", "not json", "[1,2]", '{"other": 1}', '{"path": 3}'])
def test_summary_parse_rejects_foreign_text(text: str | None) -> None:
    assert parse_termination_message(text) is None


# ---------------------------------------------------------------- catalog


def test_catalog_add_is_idempotent_and_in_plugin_format(tmp_path: Path) -> None:
    s = serve_settings(artifact_dir=tmp_path, max_model_len=512, max_num_seqs=4)
    entry = catalog.make_entry(s, "/m", "2.6.3")
    assert catalog.add_entry(tmp_path, entry) is True
    assert catalog.add_entry(tmp_path, entry) is False
    data = json.loads((tmp_path / catalog.CATALOG_FILENAME).read_text())
    assert data == [
        {
            "sendnn_inference_version": "2.6.3",
            "dynamo_backend": "sendnn",
            # the CPU machine has no Spyre compiler stack: recorded as absent
            "compiler_stack": {"torch_sendnn": None, "deeptools": None},
            "data": {
                "MODEL_NAME": "/m",
                "NUM_AIUS": 1,
                "VLLM_DT_MAX_CONTEXT_LEN": 512,
                "VLLM_DT_MAX_BATCH_SIZE": 4,
                "VLLM_DT_CHUNK_LEN": 512,  # the plugin's default chunk
                # sendnn, configuration unknown to the plugin: it caps the limit at 128K
                "VLLM_DT_MAX_BATCH_TKV_LIMIT": 131072,
            },
        }
    ]
    assert catalog.find_entry(data, catalog.entry_data(s, "/m")) is not None
    assert catalog.find_entry(data, catalog.entry_data(s, "/other")) is None


def test_catalog_pooling_entry(tmp_path: Path) -> None:
    s = serve_settings(task="embed", warmup_shapes="64x4,128x2")
    data = catalog.entry_data(s, "/m")
    assert data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] == "64,128"
    assert data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] == "4,2"
    assert "VLLM_DT_MAX_CONTEXT_LEN" not in data


@pytest.mark.parametrize("content", ['{"data": {}}', "{not json", '[{"nodata": 1}]'])
def test_catalog_malformed_is_an_error(tmp_path: Path, content: str) -> None:
    (tmp_path / catalog.CATALOG_FILENAME).write_text(content)
    with pytest.raises(catalog.CatalogError):
        catalog.read_catalog(tmp_path)


def _add_many(args: tuple[str, int]) -> None:
    directory, seqs = args
    s = PrecompileSettings.model_validate(
        {"model": "/m", "artifact_dir": directory, "max_num_seqs": seqs}
    )
    for _ in range(3):
        catalog.add_entry(Path(directory), catalog.make_entry(s, "/m", "2.6.3"))


def test_catalog_concurrent_writers_keep_every_entry(tmp_path: Path) -> None:
    with multiprocessing.get_context("fork").Pool(8) as pool:
        pool.map(_add_many, [(str(tmp_path), n) for n in range(1, 25)])
    entries = catalog.read_catalog(tmp_path)
    assert sorted(e["data"]["VLLM_DT_MAX_BATCH_SIZE"] for e in entries) == list(range(1, 25))
    assert not list(tmp_path.glob(".catalog-*.tmp"))


# ---------------------------------------------------------------- env and command


def test_plugin_env_sets_defaults_but_keeps_existing_site_settings(tmp_path: Path) -> None:
    s = serve_settings(artifact_dir=tmp_path, backend="inductor")
    base = {"MASTER_ADDR": "10.0.0.1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/elsewhere", "TMPDIR": "/x"}
    env = plugin_env(s, require_precompiled=True, base=base)
    assert env["MASTER_ADDR"] == "10.0.0.1"
    assert env["MASTER_PORT"].isdigit()
    assert env["VLLM_PLUGINS"] == "sendnn_inference"
    assert env["SENDNN_INFERENCE_DYNAMO_BACKEND"] == "inductor"
    assert env["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] == "1"
    assert env["TORCH_SENDNN_CACHE_ENABLE"] == "1"
    assert env["TORCH_SENDNN_CACHE_DIR"] == str(tmp_path.resolve())
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path.resolve()))
    assert env["TMPDIR"].startswith(str(tmp_path.resolve()))
    pre = PrecompileSettings.model_validate({"model": "/m", "artifact_dir": tmp_path})
    env = plugin_env(
        pre, require_precompiled=False, base={"SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS": "1"}
    )
    assert env["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] == "0"


def test_vllm_command_carries_the_shape() -> None:
    s = serve_settings(
        tensor_parallel_size=2,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=128,
        prefix_caching=False,
        served_name="tiny",
        vllm_args=["--seed", "1"],
    )
    cmd = vllm_command(s, "/m", host="127.0.0.1", port=9, prefix_caching=False)
    joined = " ".join(cmd)
    for part in (
        "serve /m",
        "--served-model-name tiny",
        "--tensor-parallel-size 2",
        "--max-model-len 512",
        "--max-num-seqs 4",
        "--max-num-batched-tokens 128",
        "--no-enable-prefix-caching",
        "--port 9",
    ):
        assert part in joined
    assert cmd[-2:] == ["--seed", "1"]


# ---------------------------------------------------------------- CLI without vLLM


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_refuses_without_catalog_entry(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    art = tmp_path / "art"
    term = tmp_path / "term"
    common = ["--model", str(model), "--artifact-dir", str(art), "--termination-log", str(term)]
    proc = _cli("serve", *common, "--max-model-len", "512")
    assert proc.returncode != 0
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "ArtifactMismatch"
    # An entry for another shape is not enough either; the message names both.
    s = serve_settings(artifact_dir=art, max_model_len=1024)
    catalog.add_entry(art, catalog.make_entry(s, str(model), "2.6.3"))
    proc = _cli("serve", *common, "--max-model-len", "512", "--backend", "eager")
    assert proc.returncode != 0
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "ArtifactMismatch"
    assert "maxModelLen=512" in failure.message and "maxModelLen=1024" in failure.message


def test_invalid_settings_and_missing_model_have_reasons(tmp_path: Path) -> None:
    term = tmp_path / "term"
    proc = _cli(
        "serve",
        "--model",
        "/m",
        "--artifact-dir",
        str(tmp_path),
        "--max-num-batched-tokens",
        "100",
        "--termination-log",
        str(term),
    )
    assert proc.returncode != 0
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "InvalidSettings"
    assert "--max-num-batched-tokens" in failure.message
    proc = _cli(
        "precompile",
        "--model",
        str(tmp_path / "nope"),
        "--artifact-dir",
        str(tmp_path / "a"),
        "--termination-log",
        str(term),
        "--backend",
        "eager",
    )
    assert proc.returncode != 0
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "ModelNotFound"


def test_bad_command_line_is_invalid_settings(tmp_path: Path) -> None:
    term = tmp_path / "term"
    proc = _cli("serve", "--termination-log", str(term), "--backend", "cuda")
    assert proc.returncode == 2
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "InvalidSettings"
    assert "cuda" in failure.message


def test_pure_modules_import_without_vllm_or_torch() -> None:
    code = (
        "import sys\n"
        "for name in ('vllm', 'torch', 'sendnn_inference', 'aiohttp', 'prometheus_client'):\n"
        "    sys.modules[name] = None\n"
        "import spyre_engine.summary, spyre_engine.settings, spyre_engine.catalog\n"
        "import spyre_engine.manifest, spyre_engine.gc\n"
        "import spyre_engine.cli\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# ---------------------------------------------------------------- Containerfile


def test_containerfile_refers_to_things_that_exist() -> None:
    text = (REPO / "engine" / "Containerfile").read_text()
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            for src in words[1:-1]:
                if not src.startswith("--"):
                    assert (REPO / src).exists(), f"COPY source {src} missing"
    # Either the console script itself or an entrypoint script that execs it.
    entrypoint = (REPO / "engine" / "entrypoint.sh").read_text()
    assert 'ENTRYPOINT ["spyre-engine"]' in text or (
        "engine/entrypoint.sh /usr/local/bin/spyre-engine-entrypoint" in text
        and 'exec spyre-engine "$@"' in entrypoint
    )
    assert "USER 1001" in text
    # Site defaults only: the backend, the cache switch and MASTER_PORT come from the engine's
    # flags (launch.plugin_env), whatever the image says.
    for env in ("VLLM_PLUGINS=sendnn_inference", "MASTER_ADDR"):
        assert env in text
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'spyre-engine = "spyre_engine.cli:main"' in pyproject
    assert "sendnn-inference==2.6.3" in pyproject


def test_the_engine_writes_group_writable_files() -> None:
    """Issue 28: under an assigned uid (OpenShift) the pods of a claim share it through the
    group; whatever the engine and the compiler create there is group-writable (umask 002)."""
    code = ("import os; from spyre_engine import cli; os.umask(0o022); cli.main(['usage', "
            "'--cache-root', '/nonexistent']); print(oct(os.umask(0)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "0o2", (r.stdout, r.stderr[-2000:])
