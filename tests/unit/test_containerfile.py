"""operator/Containerfile, engine/Containerfile and engine/Containerfile.layer, checked without a
container engine.

tests/integration/test_images.py builds the first two (tests/images/build.py) and runs them;
tests/integration/test_layer_image.py builds the layer onto the CPU engine image and onto a base
without vLLM.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
from spyre_operator.desired.pod import ENGINE_UID

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "Containerfile"
ENGINE = ROOT / "engine" / "Containerfile"
#: spyre-engine onto a site's own vLLM-Spyre image (any architecture).
LAYER = ROOT / "engine" / "Containerfile.layer"
ENTRYPOINT_SH = ROOT / "engine" / "entrypoint.sh"


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


def _copy_sources(path: Path) -> list[str]:
    """Every COPY source from the build context (not --from= stages; flags left out)."""
    out = []
    for op, rest in _instructions(path):
        if op == "COPY" and not rest.startswith("--from="):
            *sources, _dest = [w for w in rest.split() if not w.startswith("--")]
            out += sources
    return out


@pytest.mark.parametrize("path", [OPERATOR, ENGINE, LAYER], ids=["operator", "engine", "layer"])
def test_every_copy_source_exists(path: Path) -> None:
    sources = _copy_sources(path)
    assert sources
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


@pytest.mark.parametrize("path", [OPERATOR, ENGINE, LAYER], ids=["operator", "engine", "layer"])
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
    # of the engine's folder only the names both share (stdlib only: tests/unit/test_contract.py)
    engine = [s for s in _copy_sources(OPERATOR) if s.startswith("engine/")]
    assert engine == ["engine/spyre_contract"]


@pytest.mark.parametrize("path", [OPERATOR, ENGINE, LAYER], ids=["operator", "engine", "layer"])
def test_every_image_ships_the_contract(path: Path) -> None:
    """spyre_contract is imported by the operator and by the engine (issue 49, 4); each
    image's .dockerignore (where it has one) admits it."""
    assert "engine/spyre_contract" in _copy_sources(path)
    ignore = path.with_name(path.name + ".dockerignore")
    if ignore.exists():
        assert "!engine/spyre_contract/**" in ignore.read_text().splitlines()


def test_operator_user_gets_a_passwd_entry_only_where_missing() -> None:
    """kopf's identity (getpass.getuser()) needs one; a base that has 65532 keeps its own."""
    final = _final_stage(OPERATOR)
    user = final.index(("USER", "65532:65532"))
    runs = " ".join(rest for op, rest in final[:user] if op == "RUN")
    assert "getent passwd 65532 >/dev/null ||" in runs
    assert "useradd --uid 65532" in runs


@pytest.mark.parametrize("path", [ENGINE, LAYER], ids=["engine", "layer"])
def test_engine_user_matches_the_operator_pods(path: Path) -> None:
    users = [rest for op, rest in _instructions(path) if op == "USER"]
    assert users[-1] == f"{ENGINE_UID}:{ENGINE_UID}"


@pytest.mark.parametrize("path", [ENGINE, LAYER], ids=["engine", "layer"])
def test_engine_user_creation_works_on_bases_that_have_uid_1001(path: Path) -> None:
    """UBI9 python-311 has uid 1001 already: a bare `useradd --uid 1001` fails there."""
    runs = _runs(path)
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
@pytest.mark.parametrize("path", [ENGINE, LAYER], ids=["engine", "layer"])
def test_engine_image_env_does_not_override_the_engines_flags(name: str, path: Path) -> None:
    assert name not in _env(path)
    assert f"{name}=" not in _runs(path)


def test_engine_env_follows_upstreams_spyre_image() -> None:
    env = _env(ENGINE)
    assert env["PATH"].startswith("/opt/engine/bin:")
    assert env["VLLM_PLUGINS"] == "sendnn_inference"
    # upstream's "Required Spyre environment configuration", but FLEX_DEVICE (below)
    for key in ("FLEX_COMPUTE", "DTLOG_LEVEL", "DT_DEEPRT_VERBOSE",
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
    assert "uv pip uninstall" in runs or "$uvpip uninstall" in runs
    assert "torchvision torchaudio torchcodec" in runs


def test_engine_dependencies_are_a_layer_of_their_own() -> None:
    """The ~8 GB dependency layer depends on pyproject.toml and the pins alone (upstream's, and
    the project's lock for the CPU image), not on the engine's code."""
    ins = _instructions(ENGINE)
    heavy = next(i for i, (op, rest) in enumerate(ins) if op == "RUN" and "--extra engine" in rest)
    before = [rest for op, rest in ins[:heavy] if op == "COPY"]
    # ... and engine/lock_pick.py, which picks uv's pin and hashes from the lock (stdlib only)
    assert before == [f"pyproject.toml requirements.lock {' '.join(UPSTREAM_PINS)} "
                      "engine/lock_pick.py /src/"]
    copies = " ".join(rest for op, rest in ins if op == "COPY")
    assert "engine/spyre_engine" in copies
    assert "operator/" not in copies  # the engine does not import the operator package


@pytest.mark.parametrize("path", [ENGINE, LAYER], ids=["engine", "layer"])
def test_engine_entrypoint_sources_the_aiu_setup_then_execs_the_engine(path: Path) -> None:
    """Both images start engine/entrypoint.sh, which ends in `exec spyre-engine`: the operator's
    pods pass only the sub-command and its flags."""
    (entry,) = [rest for op, rest in _instructions(path) if op == "ENTRYPOINT"]
    (script,) = json.loads(entry)
    copies = [rest for op, rest in _instructions(path) if op == "COPY"]
    assert f"--chmod=0755 engine/entrypoint.sh {script}" in copies
    text = ENTRYPOINT_SH.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert '"${SPYRE_AIU_SETUP:-/etc/profile.d/ibm-aiu-setup.sh}"' in text
    assert text.endswith('exec spyre-engine "$@"\n')
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["spyre-engine"] == "spyre_engine.cli:main"
    assert json.loads(_final_stage(path)[-1][1]) == ["serve", "--help"]


def test_engine_download_cache_never_lands_in_the_image() -> None:
    """Without a mounted cache uv runs --no-cache; pip never caches."""
    runs = _runs(ENGINE)
    assert 'cache="--no-cache"' in runs
    assert "pip install --no-cache-dir" in runs
    assert "rm -rf /src" in runs


# --- the production image against upstream's reference image ---------------------------------
#
# Pinned to torch-spyre/sendnn-inference docker/Dockerfile.amd64 (commit 5af45f6a, read for
# this test), whose lines are quoted here:
#   ARG BASE_IMAGE_URL="quay.io/ibm-aiu/spyre-runtime"
#   ARG BASE_IMAGE_TAG="latest"
#   uv venv /opt/vllm --seed --system-site-packages
#   # Always install vllm with empty target device
#   ENV VLLM_TARGET_DEVICE=empty
#   # Required configuration file
#   COPY docker/.senlib.json /home/senuser
#   ENV ... FLEX_DEVICE=PF ...          (here: set by the operator from the card resource)
# docker/simple_vllm_serve.sh:  source /etc/profile.d/ibm-aiu-setup.sh; exec vllm serve "$@"
# pyproject.toml: torch from the "pytorch-cpu" index, url = "https://download.pytorch.org/whl/cpu"
# docs/deploying/docker.md: the base's torch "is guaranteed to be compatible with
# `torch_sendnn`. Overwriting this install with a different version of `torch` may cause issues."
UPSTREAM_SENLIB = {
    "RISCV": {"DOOM": {"enable": False}},
    "SNT_MCI": {"DCR": {"MCI_CTRL": {"ENABLE_RISCV": "0x0"}}},
}
UPSTREAM_BASE = "quay.io/ibm-aiu/spyre-runtime:latest"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: sendnn-inference's own pins (tests/unit/test_upstream_lock.py), copied before the dependency
#: step, used by the production build.
UPSTREAM_PINS = ("engine/upstream-constraints.txt", "engine/upstream-overrides.txt")

#: A stand-in for the base's python3 and the venv's python and uv: logs its argv, answers the
#: version queries the dependency step makes, and creates the venv.
_FAKE_TOOL = """#!/bin/bash
echo "$(basename "$0") $*" >> "$LOG"
case "$*" in
  *"-m venv"*) mkdir -p "${@: -1}/bin"; cp "$0" "${@: -1}/bin/python"; cp "$0" "${@: -1}/bin/uv";;
  *'print(version("torch"))'*) [ -z "$NO_BASE_TORCH" ] || exit 1; echo "2.10.0+cpu";;
  *'print("torch=="'*) printf 'torch==2.10.0+cpu\\ntorchvision==0.25.0+cpu\\n';;
esac
"""


def _args(path: Path) -> dict[str, str]:
    """Each ARG's default."""
    out = {}
    for op, rest in _instructions(path):
        if op == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default
    return out


def _build_args_of_the_cpu_image() -> dict[str, str]:
    from tests.images import build

    spec = build.SPECS["engine"]
    return dict(spec.build_args)


def render_dependency_step(
    tmp_path: Path, overrides: dict[str, str], check: bool = True,
    stderr: list[str] | None = None,
) -> list[str]:
    """Run the engine's dependency RUN step with bash as a builder would (its ARGs in the
    environment), with stand-ins for python and uv; returns the commands it ran, in order
    (``check``: raise when the step fails; ``stderr``: gets what the step wrote there)."""
    (step,) = [r for op, r in _instructions(ENGINE) if op == "RUN" and "--extra engine" in r]
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src" / "pyproject.toml").write_text("")
    for pins in UPSTREAM_PINS:  # what the COPY before the step puts there
        (root / "src" / Path(pins).name).write_text((ROOT / pins).read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(_FAKE_TOOL)
    (bin_dir / "python3").chmod(0o755)
    script = step.replace("/opt/engine", f"{root}/opt/engine").replace("/src", f"{root}/src")
    log = tmp_path / "log"
    env = {k: v.replace("/src/", f"{root}/src/") for k, v in {**_args(ENGINE), **overrides}.items()}
    env |= {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log)}
    out = subprocess.run(["bash", "-c", script], env=env, check=check, stderr=subprocess.PIPE,
                         text=True)  # fmt: skip
    if stderr is not None:
        stderr.append(out.stderr.replace(str(root), ""))
    return [line.replace(str(root), "") for line in log.read_text().splitlines()]


def test_production_base_is_upstreams_spyre_runtime() -> None:
    assert _args(ENGINE)["BASE"] == UPSTREAM_BASE


def test_production_builds_vllm_for_the_empty_device_on_the_bases_cpu_torch(
    tmp_path: Path,
) -> None:
    args = _args(ENGINE)
    assert args["TORCH_INDEX"] == PYTORCH_CPU_INDEX and args["VLLM_TARGET"] == "empty"
    ran = render_dependency_step(tmp_path, {})
    assert ran[0] == "python3 -m venv --system-site-packages /opt/engine"
    torch = next(i for i, c in enumerate(ran) if "--default-index" in c)
    # the base's torch version (torch_sendnn's), CPU build, before anything else is installed
    assert f'--default-index {PYTORCH_CPU_INDEX} torch==2.10.0 torchvision' in ran[torch]
    engine = next(i for i, c in enumerate(ran) if "--extra engine" in c)
    assert torch < engine
    # every later install is held to that torch; vLLM built from source, not PyPI's CUDA wheel
    assert "-c /src/constraints.txt" in ran[engine]
    assert "--no-binary vllm --no-build-isolation-package vllm" in ran[engine]
    # ... and to the versions of sendnn-inference's own lock (tests/unit/test_upstream_lock.py),
    # vLLM's build tools too; torch is the base's
    upstream = "-c /src/upstream-constraints.txt --overrides /src/upstream-overrides.txt"
    later = [c for c in ran[torch + 1:] if c.startswith("uv pip install")]
    assert len(later) == 2 and [c for c in ran if upstream in c] == later
    assert not any("uninstall" in c and "torchvision" in c for c in ran)
    # VLLM_TARGET_DEVICE reaches the build of vLLM
    (step,) = [r for op, r in _instructions(ENGINE) if op == "RUN" and "--extra engine" in r]
    assert 'VLLM_TARGET_DEVICE="$VLLM_TARGET" $uvpip install' in step


def test_production_build_stops_on_a_base_without_torch(tmp_path: Path) -> None:
    """No torch to match (a wrong base): the step fails there, instead of going on to install
    `torch==` and whatever vLLM pins (commands inside `if` bodies of an `&&` list run with
    errexit off, so each must be chained)."""
    with pytest.raises(subprocess.CalledProcessError):
        render_dependency_step(tmp_path, {"NO_BASE_TORCH": "1"})
    ran = render_dependency_step(tmp_path / "again", {"NO_BASE_TORCH": "1"}, check=False)
    assert not any(c.startswith("uv pip install") for c in ran), ran


def test_cpu_image_is_the_same_file_with_pypis_wheels_at_the_locks_versions(
    tmp_path: Path,
) -> None:
    """PyPI's vLLM wheel and the torch it pins, at the versions of the project's lock (what
    `make install` puts in the venv the engine tests run in), not upstream's."""
    overrides = _build_args_of_the_cpu_image()
    assert overrides == {"TORCH_INDEX": "", "VLLM_TARGET": "",
                         "UPSTREAM_CONSTRAINTS": "/src/requirements.lock",
                         "UPSTREAM_OVERRIDES": ""}  # fmt: skip
    ran = render_dependency_step(tmp_path, overrides)
    assert not any("--default-index" in c or "--no-binary" in c for c in ran)
    assert not any("upstream" in c for c in ran)  # PyPI's vLLM wheel pins another torch
    (engine,) = [c for c in ran if "--extra engine" in c]
    assert "-r /src/pyproject.toml --extra engine" in engine
    assert "-c /src/requirements.lock" in engine
    assert any("uninstall" in c and "torchvision torchaudio torchcodec" in c for c in ran)


def test_production_warns_when_the_bases_torch_is_not_upstreams(tmp_path: Path) -> None:
    """The base's torch is kept (torch_sendnn's); the build says when upstream's lock has
    another (the stand-in base has 2.10.0, the lock 2.11.0), and not when they agree."""
    errors: list[str] = []
    render_dependency_step(tmp_path, {}, stderr=errors)
    assert "WARNING: the base's torch 2.10.0+cpu is not sendnn-inference's (2.11.0+cpu)" in (
        errors[0])
    same = tmp_path / "same.txt"
    same.write_text("# upstream: torch==2.10.0+cpu\n")
    render_dependency_step(tmp_path / "same", {"UPSTREAM_CONSTRAINTS": str(same)}, stderr=errors)
    assert "WARNING" not in errors[1]


def test_upstreams_pins_are_staged_for_the_cpu_image_too() -> None:
    """The COPY runs in both variants: the CPU build's context (and hash) has the files."""
    from tests.images import build

    assert set(UPSTREAM_PINS) <= set(build.SPECS["engine"].inputs)


@pytest.mark.parametrize("path", [ENGINE, LAYER], ids=["engine", "layer"])
def test_production_ships_upstreams_senlib_json(path: Path) -> None:
    copies = [rest for op, rest in _instructions(path) if op == "COPY"]
    assert "engine/senlib.json /home/engine/.senlib.json" in copies
    # where the entrypoint links it from
    assert "senlib=/home/engine/.senlib.json" in ENTRYPOINT_SH.read_text()
    assert json.loads((ROOT / "engine" / "senlib.json").read_text()) == UPSTREAM_SENLIB
    from tests.images import build

    for src in ("engine/senlib.json", "engine/entrypoint.sh"):
        assert src in build.SPECS["engine"].inputs  # staged and hashed


def test_flex_device_is_not_baked_the_operator_sets_it() -> None:
    assert "FLEX_DEVICE" not in _env(ENGINE)
    assert "FLEX_DEVICE=" not in _runs(ENGINE)


def _entrypoint(tmp_path: Path) -> Path:
    """The images' entrypoint (engine/entrypoint.sh), its .senlib.json under ``tmp_path``."""
    script = tmp_path / "entrypoint"
    senlib = tmp_path / "image-home" / ".senlib.json"
    senlib.parent.mkdir()
    senlib.write_text((ROOT / "engine" / "senlib.json").read_text())
    script.write_text(ENTRYPOINT_SH.read_text().replace("/home/engine/.senlib.json", str(senlib)))
    return script


def test_entrypoint_survives_the_aiu_setup_failing_on_a_read_only_root(tmp_path: Path) -> None:
    """ibm-aiu-setup.sh writes /tmp/etc and copies to /etc/aiu; with a read-only root the copy
    fails, under the setup's own `set -e` too, and so does its last step (a chmod of /tmp/etc
    on some bases). The engine must start anyway, with all the environment the setup exports
    (the steps after a failing one run) and the .senlib.json in $HOME."""
    script = _entrypoint(tmp_path)
    setup = tmp_path / "ibm-aiu-setup.sh"
    setup.write_text(
        "set -e\nexport AIU_WORLD_SIZE=1\nmkdir -p \"$TMPDIR/etc\"\n"
        "cp \"$TMPDIR/etc\" /proc/read-only/senlib_config.json\nexport AFTER=1\n"
        "chmod -R g+w /proc/read-only\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    engine = bin_dir / "spyre-engine"
    engine.write_text('#!/bin/bash\necho "args=$* aiu=$AIU_WORLD_SIZE after=${AFTER:-}"\n'
                      'readlink "$HOME/.senlib.json"\n')  # fmt: skip
    engine.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp_path),
           "SPYRE_AIU_SETUP": str(setup)}  # fmt: skip
    out = subprocess.run(["bash", str(script), "serve", "--x"], env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    first, link = out.stdout.splitlines()
    assert first == "args=serve --x aiu=1 after=1"
    assert link.endswith("image-home/.senlib.json")
    assert "exited 1 (read-only root?)" in out.stderr


def test_flex_device_pairs_with_the_card_resource_compile_only_leaves_it_to_the_plugin() -> None:
    """FLEX_DEVICE as upstream pairs it with the resource (spyre-operator's integration tests:
    spyre_vf -> VF, spyre_pf -> PF); compiling with sendnn_compile_only the plugin sets
    FLEX_DEVICE=COMPILE itself, read from the installed plugin's source."""
    import importlib.util
    import re

    from spyre_operator.desired.pod import flex_device

    assert flex_device("ibm.com/spyre_vf") == "VF"
    for pf in ("ibm.com/spyre_pf", "ibm.com/spyre_pf_tier1", "ibm.com/aiu_pf"):
        assert flex_device(pf) == "PF"
    spec = importlib.util.find_spec("sendnn_inference")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sendnn-inference is not installed (make install)")
    platform_py = Path(next(iter(spec.submodule_search_locations))) / "platform.py"
    assert re.search(r'DYNAMO_BACKEND == "sendnn_compile_only":\s*\n\s*'
                     r'os\.environ\["FLEX_DEVICE"\] = "COMPILE"', platform_py.read_text()), (
        "the plugin no longer sets FLEX_DEVICE for compile-only: the precompile pod must")


# --- engine/Containerfile.layer: spyre-engine onto a site's own vLLM-Spyre image -------------


def _layer_install_step() -> str:
    (step,) = [r for op, r in _instructions(LAYER) if op == "RUN" and "pip install" in r]
    return step


def test_layer_base_is_required_and_python_is_a_build_argument() -> None:
    """No default base that pretends to exist; PYTHON is the base's interpreter with vLLM."""
    ins = _instructions(LAYER)
    assert ins[0] == ("ARG", "BASE")
    assert [rest for op, rest in ins if op == "FROM"] == ["${BASE}"]
    assert _args(LAYER)["PYTHON"] == "python3"
    assert '"$PYTHON" -m pip install' in _layer_install_step()


def test_layer_installs_only_spyre_engine() -> None:
    """As engine/Containerfile's last install: the repository's package without dependencies,
    from a context without the operator package, and without the operator's console script."""
    step = _layer_install_step()
    assert "-m pip install --no-deps --force-reinstall" in step
    assert step.endswith('"$PYTHON" -c "import spyre_engine.cli, sendnn_inference, vllm"')
    assert "--extra engine" not in step and "uv " not in step and "torch" not in step
    assert 'rm -rf /src "$scripts/spyre-operator"' in step
    assert "compileall.compile_dir(spyre_engine.__path__[0]" in step  # read-only root at run time
    sources = _copy_sources(LAYER)
    assert "engine/spyre_engine" in sources
    assert not any(s.startswith("operator") for s in sources)
    assert _env(LAYER)["PYTHONDONTWRITEBYTECODE"] == "1"


def test_layer_checks_the_base_before_installing_and_after() -> None:
    """The check runs from the source tree before pip (a base without vLLM fails with the
    message, not with pip's error), and the installed console script checks again."""
    step = _layer_install_step()
    first = step.index('PYTHONPATH=/src/engine PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -m '
                       "spyre_engine.compat")  # fmt: skip
    install = step.index("-m pip install")
    again = step.index("&& spyre-engine check-base")
    assert first < install < again
    # --build-arg reaches the check, and the image's starts (empty by default: checked)
    assert _args(LAYER)["SPYRE_ENGINE_SKIP_BASE_CHECK"] == ""
    assert _env(LAYER)["SPYRE_ENGINE_SKIP_BASE_CHECK"] == "${SPYRE_ENGINE_SKIP_BASE_CHECK}"


def test_layer_keeps_the_engine_images_conventions() -> None:
    """What the operator's pods rely on, as in engine/Containerfile."""
    for path in (ENGINE, LAYER):
        (entry,) = [rest for op, rest in _instructions(path) if op == "ENTRYPOINT"]
        assert json.loads(entry) == ["/usr/local/bin/spyre-engine-entrypoint"]
    layer, engine = _env(LAYER), _env(ENGINE)
    for key in ("HOME", "VLLM_PLUGINS", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"):
        assert layer[key] == engine[key], key
    # the base's own Spyre runtime settings and PATH are left alone
    assert "PATH" not in layer and "FLEX_COMPUTE" not in layer


def test_layer_dockerignore_admits_every_copy_source() -> None:
    """A builder that sends the context (docker, remote podman) sends only what COPY needs."""
    ignore = (ROOT / "engine" / "Containerfile.layer.dockerignore").read_text().splitlines()
    admitted = [line[1:].removesuffix("/**") for line in ignore if line.startswith("!")]
    assert ignore[1] == "*"
    assert sorted(admitted) == sorted(_copy_sources(LAYER))
