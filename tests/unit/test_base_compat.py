"""The base check (engine/spyre_engine/compat.py): precompile and serve refuse an image whose
sendnn-inference or vLLM this spyre-engine does not support, naming what they found and need.

Pure: versions are passed in or ``importlib.metadata.version`` is replaced; vLLM never starts.
tests/integration/test_layer_image.py builds engine/Containerfile.layer onto real bases.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from spyre_engine import cli, compat
from spyre_engine.summary import (
    REASON_UNSUPPORTED_BASE,
    FailureSummary,
    parse_termination_message,
)

ROOT = Path(__file__).resolve().parents[2]
#: The version messages name (pyproject.toml's: the one place it is set).
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SUPPORTED_VERSIONS = {"sendnn-inference": "2.6.3", "vllm": "0.28.0"}


def fake_versions(
    monkeypatch: pytest.MonkeyPatch, versions: dict[str, str | None]
) -> Callable[[str], str]:
    """``importlib.metadata.version`` answering ``versions`` (None: not installed) for the
    supported distributions and the truth for every other one."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name in versions:
            found = versions[name]
            if found is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return found
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.delenv(compat.SKIP_ENV, raising=False)
    return version


def nothing_heavy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI goes past the base check (settings, the vLLM argument check)."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("got past the base check")

    monkeypatch.setattr(cli, "load_settings", boom)
    monkeypatch.setattr(cli, "_refuse_managed_vllm_args", boom)


# --- the one list of supported versions ------------------------------------------------------


def test_supported_is_pyprojects_pin_and_the_plugins_vllm_range() -> None:
    """SUPPORTED (in the image, where pyproject.toml is not) = the ``engine`` extra's
    sendnn-inference pin, and the vLLM range that sendnn-inference itself declares."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["engine"]
    pins = {r.name: r for r in map(Requirement, extra)}
    assert set(compat.SUPPORTED) <= set(pins)
    assert pins["sendnn-inference"].specifier == SpecifierSet(compat.SUPPORTED["sendnn-inference"])
    try:
        plugin_version = importlib.metadata.version("sendnn-inference")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("sendnn-inference is not installed (make install)")
    # the metadata read below is the pinned release's
    assert pins["sendnn-inference"].specifier.contains(plugin_version), plugin_version
    requires = [Requirement(r) for r in importlib.metadata.requires("sendnn-inference") or []]
    (vllm,) = [
        r for r in requires if r.name == "vllm" and (r.marker is None or r.marker.evaluate())
    ]
    assert vllm.specifier == SpecifierSet(compat.SUPPORTED["vllm"]), (
        f"sendnn-inference {plugin_version} requires {vllm}; compat.SUPPORTED says "
        f"{compat.SUPPORTED['vllm']}"
    )


def test_this_environment_is_a_supported_base() -> None:
    """The .venv (and the CPU engine image) install what the engine extra pins."""
    result = compat.check_base()
    assert result.ok, result.message


# --- the verdict -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "versions",
    [
        SUPPORTED_VERSIONS,
        {"sendnn-inference": "2.6.3", "vllm": "0.26.0"},  # the range's ends
        {"sendnn-inference": "2.6.3", "vllm": "0.28.0.post1"},
        {"sendnn-inference": "2.6.3", "vllm": "0.28.0+empty"},  # built for the empty device
        {"sendnn-inference": "2.6.3+s390x", "vllm": "0.27.1.dev3+gabcdef"},  # as `pip check`
    ],
)
def test_supported_versions_pass(versions: dict[str, str]) -> None:
    result = compat.check_base(versions, python="/opt/vllm/bin/python")
    assert result.ok, result.message
    assert result.problems == ()
    assert "/opt/vllm/bin/python" in result.message


@pytest.mark.parametrize(
    ("versions", "problem"),
    [
        ({"sendnn-inference": "2.5.0", "vllm": "0.27.1"}, "sendnn-inference 2.5.0 is not ==2.6.3"),
        ({"sendnn-inference": "2.6.4", "vllm": "0.28.0"}, "sendnn-inference 2.6.4 is not ==2.6.3"),
        ({"sendnn-inference": "2.6.3", "vllm": "0.28.1"}, "vllm 0.28.1 is not >=0.26.0,<0.28.1"),
        ({"sendnn-inference": "2.6.3", "vllm": "0.25.2"}, "vllm 0.25.2 is not >=0.26.0,<0.28.1"),
        ({"sendnn-inference": "2.6.3", "vllm": "0.28.1.dev7"}, "vllm 0.28.1.dev7 is not"),
        ({"sendnn-inference": "2.6.3", "vllm": "main-ibm"}, "vllm main-ibm is not a PEP 440"),
        ({"sendnn-inference": "2.6.3", "vllm": None}, "vllm is not installed"),
    ],
)
def test_unsupported_versions_are_refused_naming_found_and_needed(
    versions: dict[str, str | None], problem: str
) -> None:
    result = compat.check_base(versions, python="/opt/vllm/bin/python")
    assert not result.ok
    assert result.problems == (problem,) or problem in result.problems[0]
    assert result.message.startswith(
        f"spyre-engine {VERSION} supports sendnn-inference ==2.6.3 and vllm >=0.26.0,<0.28.1; "
        f"this image has sendnn-inference {versions['sendnn-inference']} and vllm "
        f"{versions['vllm'] or 'not installed'} (in /opt/vllm/bin/python): {problem}"
    )


def test_a_bare_python_is_named_as_missing_both_without_packaging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The layer's build runs the check before installing anything: on a base without vLLM
    there may be no ``packaging`` either, and the answer must still be the message."""
    for name in ("packaging", "packaging.specifiers", "packaging.version"):
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    result = compat.check_base({"sendnn-inference": None, "vllm": None}, python="/usr/bin/python3")
    assert result.problems == ("sendnn-inference is not installed", "vllm is not installed")
    assert "this image has sendnn-inference not installed and vllm not installed" in result.message
    # versions found but nothing to compare them with: said so, never a traceback
    result = compat.check_base(SUPPORTED_VERSIONS)
    assert not result.ok and "'packaging' is not installed" in result.message


def test_the_module_runs_from_the_source_tree_with_nothing_installed(tmp_path: Path) -> None:
    """What Containerfile.layer runs first: ``python -m spyre_engine.compat`` with only the
    source on PYTHONPATH (-S: no site-packages, so no vLLM, plugin, packaging or pydantic)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "engine"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop(compat.SKIP_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "spyre_engine.compat"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "sendnn-inference not installed (supported: ==2.6.3)" in proc.stdout
    assert "vllm not installed (supported: >=0.26.0,<0.28.1)" in proc.stdout
    # the source tree's version, not "0+unknown" (nothing installed) nor an older install's
    assert f"unsupported base: spyre-engine {VERSION} supports" in proc.stderr
    assert "sendnn-inference is not installed; vllm is not installed" in proc.stderr


def test_the_version_is_the_source_trees_then_the_installed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a source tree (the layer's build, before pip; the base may hold an older
    spyre-engine) its pyproject.toml; installed (no pyproject.toml beside the package), the
    distribution's metadata."""
    assert compat.engine_version() == VERSION
    site = tmp_path / "lib" / "python3" / "site-packages" / "spyre_engine"
    site.mkdir(parents=True)
    monkeypatch.setattr(compat, "__file__", str(site / "compat.py"))
    monkeypatch.setattr(compat, "__version__", "9.9.9")
    assert compat.engine_version() == "9.9.9"
    (site.parents[1] / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "1"\n')
    assert compat.engine_version() == "9.9.9"


# --- precompile and serve refuse before anything heavy ---------------------------------------


@pytest.mark.parametrize("command", ["precompile", "serve"])
def test_wrong_plugin_version_is_refused_with_both_versions(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_versions(monkeypatch, {"sendnn-inference": "2.5.0", "vllm": "0.28.0"})
    nothing_heavy(monkeypatch)
    term = tmp_path / "term"
    code = cli.main([command, "--model", "/m", "--artifact-dir", str(tmp_path),
                     "--termination-log", str(term)])  # fmt: skip
    assert code == 1
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary)
    assert failure.reason == REASON_UNSUPPORTED_BASE == "UnsupportedBase"
    assert "supports sendnn-inference ==2.6.3 and vllm >=0.26.0,<0.28.1" in failure.message
    assert "this image has sendnn-inference 2.5.0 and vllm 0.28.0" in failure.message
    assert f"(in {sys.executable})" in failure.message
    assert compat.SKIP_ENV in failure.message


def test_missing_vllm_is_refused_as_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_versions(monkeypatch, {"sendnn-inference": "2.6.3", "vllm": None})
    nothing_heavy(monkeypatch)
    term = tmp_path / "term"
    # invalid settings too (no --model): the base is reported first
    assert cli.main(["serve", "--termination-log", str(term)]) == 1
    failure = json.loads(term.read_text())
    assert failure["reason"] == "UnsupportedBase"
    assert "this image has sendnn-inference 2.6.3 and vllm not installed" in failure["message"]
    assert "vllm is not installed" in failure["message"]


def test_skip_env_starts_on_an_unsupported_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_versions(monkeypatch, {"sendnn-inference": "2.5.0", "vllm": "0.28.0"})
    monkeypatch.setenv(compat.SKIP_ENV, "1")
    term = tmp_path / "term"
    # past the check: the missing --model is the next thing refused
    assert cli.main(["serve", "--termination-log", str(term)]) == 2
    assert json.loads(term.read_text())["reason"] == "InvalidSettings"
    assert "starting on an unsupported base" in caplog.text and "2.5.0" in caplog.text


def test_cache_commands_do_not_need_a_supported_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """usage and gc (the GC Jobs) use neither vLLM nor the plugin."""
    fake_versions(monkeypatch, {"sendnn-inference": None, "vllm": None})
    term = tmp_path / "term"
    assert (
        cli.main(["usage", "--cache-root", str(tmp_path / "cache"), "--termination-log", str(term)])
        == 0
    )
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["totalBytes"] == 0


# --- spyre-engine check-base -----------------------------------------------------------------


def test_check_base_prints_the_versions_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_versions(monkeypatch, {"sendnn-inference": "2.6.3", "vllm": "0.28.0+empty"})
    assert cli.main(["check-base"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "sendnn-inference 2.6.3 (supported: ==2.6.3)",
        "vllm 0.28.0+empty (supported: >=0.26.0,<0.28.1)",
        f"python {sys.executable}",
        f"supported by spyre-engine {VERSION}",
    ]


def test_check_base_exits_1_with_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_versions(monkeypatch, {"sendnn-inference": None, "vllm": "0.27.1"})
    assert cli.main(["check-base"]) == 1
    captured = capsys.readouterr()
    assert "sendnn-inference not installed (supported: ==2.6.3)" in captured.out
    assert "vllm 0.27.1 (supported: >=0.26.0,<0.28.1)" in captured.out
    assert captured.err.startswith("unsupported base: spyre-engine ")
    assert "sendnn-inference is not installed" in captured.err
    monkeypatch.setenv(compat.SKIP_ENV, "1")
    assert cli.main(["check-base"]) == 0
    assert "ignored (SPYRE_ENGINE_SKIP_BASE_CHECK=1)" in capsys.readouterr().err
