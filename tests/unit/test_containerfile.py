"""operator/Containerfile and engine/Containerfile, checked without a container engine.

tests/integration/test_images.py builds both (tests/images/build.py) and runs them.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from spyre_operator.desired.pod import ENGINE_UID

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "Containerfile"
ENGINE = ROOT / "engine" / "Containerfile"


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), " ".join(rest.split())))
    return out


def _final_stage(path: Path) -> list[tuple[str, str]]:
    ins = _instructions(path)
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last_from:]


def _env(path: Path) -> dict[str, str]:
    """The final stage's ENV (KEY=VALUE forms)."""
    env: dict[str, str] = {}
    for op, rest in _final_stage(path):
        if op == "ENV":
            for word in shlex.split(rest):
                key, sep, value = word.partition("=")
                assert sep, f"ENV {rest}: use the KEY=VALUE form"
                env[key] = value
    return env


def _runs(path: Path) -> str:
    return " ".join(rest for op, rest in _instructions(path) if op == "RUN")


@pytest.mark.parametrize("path", [OPERATOR, ENGINE], ids=["operator", "engine"])
def test_every_copy_source_exists(path: Path) -> None:
    copies = [rest for op, rest in _instructions(path) if op == "COPY"]
    assert copies
    for rest in copies:
        if rest.startswith("--from="):
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


@pytest.mark.parametrize(
    ("path", "arg"), [(OPERATOR, "PYTHON_IMAGE"), (ENGINE, "BASE")], ids=["operator", "engine"]
)
def test_base_is_a_build_argument(path: Path, arg: str) -> None:
    """tests/images/build.py passes its debootstrapped base with --build-arg."""
    ins = _instructions(path)
    assert ins[0][0] == "ARG" and ins[0][1].startswith(f"{arg}=")
    froms = [rest.split()[0] for op, rest in ins if op == "FROM"]
    assert froms and all(f == "${" + arg + "}" for f in froms if not f.startswith("build"))


@pytest.mark.parametrize("path", [OPERATOR, ENGINE], ids=["operator", "engine"])
def test_runs_as_a_numeric_non_root_user(path: Path) -> None:
    users = [rest for op, rest in _instructions(path) if op == "USER"]
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert gid.isdigit() and int(gid) != 0


def test_operator_entrypoint_is_the_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entry,) = [rest for op, rest in _instructions(OPERATOR) if op == "ENTRYPOINT"]
    assert json.loads(entry) == ["spyre-operator"]
    assert scripts["spyre-operator"] == "spyre_operator.cli:main"


def test_operator_has_no_engine_extra() -> None:
    """The operator image must not pull torch/vLLM (the `engine` extra)."""
    runs = _runs(OPERATOR)
    assert "[engine" not in runs and "torch" not in runs and "vllm" not in runs.lower()
    copies = " ".join(rest for op, rest in _instructions(OPERATOR) if op == "COPY")
    assert "engine/" not in copies


def test_operator_user_gets_a_passwd_entry_only_where_missing() -> None:
    """kopf's identity (getpass.getuser()) needs one; a base that has 65532 keeps its own."""
    final = _final_stage(OPERATOR)
    user = final.index(("USER", "65532:65532"))
    runs = " ".join(rest for op, rest in final[:user] if op == "RUN")
    assert "getent passwd 65532 >/dev/null ||" in runs
    assert "useradd --uid 65532" in runs


def test_engine_user_matches_the_operator_pods() -> None:
    users = [rest for op, rest in _instructions(ENGINE) if op == "USER"]
    assert users[-1] == f"{ENGINE_UID}:{ENGINE_UID}"


def test_engine_user_creation_works_on_bases_that_have_uid_1001() -> None:
    """UBI9 python-311 has uid 1001 already: a bare `useradd --uid 1001` fails there."""
    runs = _runs(ENGINE)
    assert f"if ! getent passwd {ENGINE_UID} >/dev/null; then" in runs
    assert f"getent group {ENGINE_UID} >/dev/null || groupadd" in runs
    # every useradd is inside the guard
    for m in re.finditer(r"useradd ", runs):
        guard = runs.rfind(f"if ! getent passwd {ENGINE_UID}", 0, m.start())
        assert guard != -1 and runs.find("fi ", guard) > m.start()


@pytest.mark.parametrize(
    "name",
    [
        # serving pods get it from the operator; precompile Jobs must be able to download
        "HF_HUB_OFFLINE",
        # derived from the engine's flags (--backend, the free port, precompile's cache)
        "SENDNN_INFERENCE_DYNAMO_BACKEND",
        "TORCH_SENDNN_CACHE_ENABLE",
        "MASTER_PORT",
        "SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS",
        "TORCH_SENDNN_CACHE_DIR",
    ],
)
def test_engine_image_env_does_not_override_the_engines_flags(name: str) -> None:
    assert name not in _env(ENGINE)
    assert f"{name}=" not in _runs(ENGINE)


def test_engine_env_follows_upstreams_spyre_image() -> None:
    env = _env(ENGINE)
    assert env["PATH"].startswith("/opt/engine/bin:")
    assert env["VLLM_PLUGINS"] == "sendnn_inference"
    for key in ("FLEX_COMPUTE", "FLEX_DEVICE", "DTLOG_LEVEL", "DT_DEEPRT_VERBOSE",
                "DISTRIBUTED_STRATEGY_IGNORE_MODULES", "TORCH_SENDNN_LOG"):  # fmt: skip
        assert key in env
    # a read-only root filesystem: bytecode compiled at build time, never written at run time
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert "--compile-bytecode" in _runs(ENGINE)


def test_engine_venv_sees_the_bases_site_packages() -> None:
    """On spyre-runtime, torch_sendnn is installed system-wide; the venv must see it."""
    assert "python3 -m venv --system-site-packages /opt/engine" in _runs(ENGINE)
    default = _instructions(ENGINE)[0][1].split("=", 1)[1]
    assert "spyre-runtime" in default


def test_engine_installs_the_engine_extra_without_cuda_addons() -> None:
    runs = _runs(ENGINE)
    assert "-r /src/pyproject.toml --extra engine" in runs
    assert "uv pip uninstall" in runs and "torchvision torchaudio torchcodec" in runs


def test_engine_dependencies_are_a_layer_of_their_own() -> None:
    """The ~8 GB dependency layer depends on pyproject.toml alone, not on the engine's code."""
    ins = _instructions(ENGINE)
    heavy = next(i for i, (op, rest) in enumerate(ins) if op == "RUN" and "--extra engine" in rest)
    before = [rest for op, rest in ins[:heavy] if op == "COPY"]
    assert before == ["pyproject.toml /src/"]
    copies = " ".join(rest for op, rest in ins if op == "COPY")
    assert "engine/spyre_engine" in copies
    assert "operator/" not in copies  # the engine does not import the operator package


def test_engine_entrypoint_sources_the_aiu_setup_then_execs_the_engine() -> None:
    (entry,) = [rest for op, rest in _instructions(ENGINE) if op == "ENTRYPOINT"]
    (script,) = json.loads(entry)
    runs = _runs(ENGINE)
    assert f"> {script}" in runs
    assert "/etc/profile.d/ibm-aiu-setup.sh" in runs
    assert "'exec spyre-engine \"$@\"'" in runs
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["spyre-engine"] == "spyre_engine.cli:main"


def test_engine_download_cache_never_lands_in_the_image() -> None:
    """Without a mounted cache uv runs --no-cache; pip never caches."""
    runs = _runs(ENGINE)
    assert 'cache="--no-cache"' in runs
    assert "pip install --no-cache-dir" in runs
    assert "rm -rf /src" in runs
