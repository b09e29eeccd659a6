"""The production engine image installs the versions of upstream's lock (issue "Installable from
a release", item 4): engine/upstream-constraints.txt holds what the uv.lock in the sdist of the
sendnn-inference that pyproject.toml pins resolves for Linux x86_64, and
engine/upstream-overrides.txt the overrides that lock was resolved with; engine/Containerfile's
production path installs with both (its CPU variant, tests/images/build.py, with neither).

The sdist comes from PyPI once, into ``~/.cache/spyre-model-operator/sdists`` (outside the
repository), and is checked against the sha256 the constraints' header records (and, when
downloaded, against PyPI's index). Regenerate both files after a sendnn-inference bump:

    .venv/bin/python tests/unit/test_upstream_lock.py
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tarfile
import tomllib
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "engine" / "upstream-constraints.txt"
OVERRIDES = ROOT / "engine" / "upstream-overrides.txt"
CONTAINERFILE = ROOT / "engine" / "Containerfile"
PLUGIN = "sendnn-inference"
INDEX = "https://pypi.org/simple"
#: The production image's platform (spyre-runtime, x86_64); its python is 3.11 or 3.12, for
#: which upstream's lock resolves the same.
MACHINES = ("x86_64", "s390x", "ppc64le")
PYTHON = "3.11"
#: Not constrained: the image installs the base's torch (the one torch_sendnn is built for)
#: from the pytorch CPU index, and the torchvision that goes with it.
FROM_THE_BASE = ("torch", "torchvision")
REGENERATE = ".venv/bin/python tests/unit/test_upstream_lock.py"


def cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "spyre-model-operator" / "sdists"


def pinned_version() -> str:
    """The plugin's version the engine extra pins (``sendnn-inference==X``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [Requirement(r) for r in project["optional-dependencies"]["engine"]
              if canonicalize_name(Requirement(r).name) == PLUGIN]  # fmt: skip
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req}: the engine extra pins one version"
    return spec.version


def sdist_name(version: str) -> str:
    return f"{PLUGIN.replace('-', '_')}-{version}.tar.gz"


def _index_entry(filename: str) -> dict[str, Any]:
    """PyPI's simple index (PEP 691 JSON) entry of ``filename``: its url and sha256."""
    accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
    req = urllib.request.Request(f"{INDEX}/{PLUGIN}/", headers=accept)
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    (entry,) = [f for f in files if f["filename"] == filename]
    return entry  # type: ignore[no-any-return]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sdist(version: str) -> Path:
    """The plugin's sdist, downloaded once into the cache; checked against PyPI's sha256."""
    path = cache_dir() / sdist_name(version)
    if path.exists():
        return path
    entry = _index_entry(path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with urllib.request.urlopen(entry["url"], timeout=300) as r:
        partial.write_bytes(r.read())
    assert sha256(partial) == entry["hashes"]["sha256"], f"{entry['url']}: sha256 differs"
    partial.replace(path)
    return path


def read_sdist(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(uv.lock, pyproject.toml) at the sdist's top."""
    out = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] in ("uv.lock", "pyproject.toml"):
                fh = tar.extractfile(member)
                assert fh is not None
                out[parts[1]] = tomllib.loads(fh.read().decode())
    return out["uv.lock"], out["pyproject.toml"]


def environment(machine: str) -> dict[str, str]:
    return {"implementation_name": "cpython", "implementation_version": f"{PYTHON}.0",
            "os_name": "posix", "platform_machine": machine,
            "platform_python_implementation": "CPython", "platform_release": "",
            "platform_system": "Linux", "platform_version": "",
            "python_full_version": f"{PYTHON}.0", "python_version": PYTHON,
            "sys_platform": "linux", "extra": ""}  # fmt: skip


def resolved(lock: dict[str, Any], machine: str) -> dict[str, str]:
    """What ``uv sync --no-dev`` installs from ``lock`` on Linux ``machine``: name -> version
    (the plugin itself left out)."""
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for package in lock["package"]:
        by_name[package["name"]].append(package)
    env = environment(machine)
    out: dict[str, str] = {}
    todo: list[tuple[dict[str, Any], tuple[str, ...]]] = [(by_name[PLUGIN][0], ())]
    seen: set[tuple[str, str | None, tuple[str, ...]]] = set()
    while todo:
        package, extras = todo.pop()
        key = (package["name"], package.get("version"), extras)
        if key in seen:
            continue
        seen.add(key)
        if package["name"] != PLUGIN:
            assert out.setdefault(package["name"], package["version"]) == package["version"]
        deps = list(package.get("dependencies", []))
        for extra in extras:
            deps += package.get("optional-dependencies", {}).get(extra, [])
        for dep in deps:
            if "marker" in dep and not Marker(dep["marker"]).evaluate(env):
                continue
            (target,) = [p for p in by_name[dep["name"]]
                         if "version" not in dep or p["version"] == dep["version"]]  # fmt: skip
            todo.append((target, tuple(dep.get("extra", ()))))
    return out


def render(version: str, digest: str, lock: dict[str, Any], pyproject: dict[str, Any]
           ) -> tuple[str, str]:  # fmt: skip
    """The text of engine/upstream-constraints.txt and engine/upstream-overrides.txt."""
    pins = resolved(lock, "x86_64")
    elsewhere = []
    for machine in MACHINES[1:]:
        there = resolved(lock, machine)
        assert all(there[n] == v for n, v in pins.items() if n in there), machine
        missing = sorted(set(pins) - set(there))
        elsewhere.append(f"# {machine}: {len(missing)} fewer, among them "
                         f"{', '.join(n for n in missing if n in ('vllm', 'pyarrow', 'ray'))}")
    name = sdist_name(version)
    common = [f"# From {name} (PyPI): its uv.lock and pyproject.toml; the sdist's sha256",
              f"# {digest}",
              "# Regenerate (after a sendnn-inference bump in pyproject.toml):",
              f"#   {REGENERATE}"]  # fmt: skip
    constraints = [
        f"# The versions sendnn-inference {version}'s own lock resolves for Linux x86_64 (python",
        f"# {PYTHON}; 3.12 the same; not its dev group): engine/Containerfile's production path",
        "# installs with -c this file (and --overrides engine/upstream-overrides.txt).",
        *common,
        "# Local version labels dropped (==0.28.0 allows the 0.28.0+empty a source build names).",
        "# Not constrained, the image installs the base's torch (torch_sendnn's) from the pytorch",
        "# CPU index (the build warns when it is not upstream's):",
        *(f"# upstream: {n}=={pins[n]}" for n in FROM_THE_BASE),
        "# Upstream's lock on s390x/ppc64le leaves out vLLM and its tree (pre-installed there):",
        *elsewhere,
        *(f"{n}=={Version(v).public}" for n, v in sorted(pins.items()) if n not in FROM_THE_BASE),
    ]
    overrides = [
        f"# [tool.uv] override-dependencies of sendnn-inference {version}'s pyproject.toml, with",
        "# which its uv.lock was resolved (e.g. opencv-python-headless below vLLM's range, no",
        "# triton): engine/Containerfile's production path installs with --overrides this file.",
        *common,
        "# Its torch and torchvision overrides left out: the image takes the base's torch.",
        *(o for o in pyproject["tool"]["uv"]["override-dependencies"]
          if canonicalize_name(Requirement(o).name) not in FROM_THE_BASE),
    ]  # fmt: skip
    return "\n".join(constraints) + "\n", "\n".join(overrides) + "\n"


def header_sha256() -> tuple[str, str]:
    """(sdist file name, sha256) the committed constraints name."""
    m = re.search(r"^# From (\S+) \(PyPI\): .*sha256\n# ([0-9a-f]{64})$", CONSTRAINTS.read_text(),
                  re.M)  # fmt: skip
    assert m, f"{CONSTRAINTS.name}: no '# From <sdist> (PyPI): ... sha256' + '# <hex>' lines"
    return m[1], m[2]


def pins(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            out[canonicalize_name(req.name)] = spec.version
    return out


@pytest.fixture(scope="module")
def upstream() -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    version = pinned_version()
    path = sdist(version)
    named, digest = header_sha256()
    assert named == path.name, f"{CONSTRAINTS.name} is for {named}, pyproject pins {version}: " \
                               f"run {REGENERATE}"  # fmt: skip
    assert sha256(path) == digest, f"{path}: not the sdist {CONSTRAINTS.name} was made from"
    return (version, digest, *read_sdist(path))


def test_every_constrained_version_is_upstreams(upstream: tuple[Any, ...]) -> None:
    _, _, lock, _ = upstream
    theirs = {n: Version(v).public for n, v in resolved(lock, "x86_64").items()
              if n not in FROM_THE_BASE}  # fmt: skip
    ours = pins(CONSTRAINTS.read_text())
    differ = {n: (v, theirs.get(n)) for n, v in ours.items() if theirs.get(n) != v}
    assert not differ, f"ours vs upstream's lock: {differ}"
    assert not theirs.keys() - ours.keys(), "upstream's lock has more: run " + REGENERATE
    assert {"vllm", "transformers", "opencv-python-headless"} <= ours.keys()


def test_the_files_are_what_the_sdist_makes(upstream: tuple[Any, ...]) -> None:
    """Both files, header and all, as the regeneration writes them: the overrides too, and the
    torch pins the build compares the base's with."""
    constraints, overrides = render(*upstream)
    assert CONSTRAINTS.read_text() == constraints, f"run {REGENERATE}"
    assert OVERRIDES.read_text() == overrides, f"run {REGENERATE}"


def test_the_header_names_upstreams_torch_for_the_build_to_compare(
    upstream: tuple[Any, ...],
) -> None:
    _, _, lock, pyproject = upstream
    ours = dict(re.findall(r"^# upstream: (\S+)==(\S+)$", CONSTRAINTS.read_text(), re.M))
    resolved_torch = {n: v for n, v in resolved(lock, "x86_64").items() if n in FROM_THE_BASE}
    assert ours == resolved_torch
    # the version upstream's pyproject overrides torch to (its CPU build, +cpu, in the lock)
    (torch,) = [Requirement(o) for o in pyproject["tool"]["uv"]["override-dependencies"]
                if Requirement(o).name == "torch"]  # fmt: skip
    assert Version(ours["torch"]).public in torch.specifier


def main() -> int:
    version = pinned_version()
    path = sdist(version)
    digest = _index_entry(path.name)["hashes"]["sha256"]
    assert sha256(path) == digest, f"{path}: not PyPI's sdist (delete it and run again)"
    constraints, overrides = render(version, digest, *read_sdist(path))
    CONSTRAINTS.write_text(constraints)
    OVERRIDES.write_text(overrides)
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)} and {OVERRIDES.relative_to(ROOT)} "
          f"from {path}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
