"""The engine index's layers built for real (issue 46, 1): ``release.build_engine_layer`` on a
stand-in vLLM-Spyre base (tests/images/Containerfile.vllm-standin: a venv with pydantic and
empty ``vllm``/``sendnn_inference`` packages at supported versions), and the result starts
``spyre-engine check-base`` through its entrypoint. This host's architecture only so far; the
foreign ones (the same build under qemu-user-static) are not run yet."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
import uuid
from collections.abc import Iterator

import pytest
from packaging.specifiers import SpecifierSet
from spyre_engine import compat

from tests.images import build

from ..unit.test_release_gates import R

pytestmark = [
    pytest.mark.images,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("buildah") is None,
                       reason="needs root and buildah"),
]

VERSION = tomllib.loads((build.ROOT / "pyproject.toml").read_text())["project"]["version"]
#: Versions the stand-in claims: ones spyre-engine supports (compat.SUPPORTED).
STANDIN = {"vllm": "0.28.0", "sendnn-inference": "2.6.3"}


def test_the_standin_versions_are_supported() -> None:
    for name, version in STANDIN.items():
        assert version in SpecifierSet(compat.SUPPORTED[name]), (name, version)


@pytest.fixture(scope="module")
def standin() -> Iterator[str]:
    """The stand-in base for this host's architecture, in buildah's storage."""
    base = build.ensure_base(build.HOST_ARCH)
    ref = f"localhost/vllm-spyre-standin-{build.HOST_ARCH}:{uuid.uuid4().hex[:8]}"
    ca = build.HOST_CA_BUNDLE
    build.run([*build.buildah_cmd(), "build", "--isolation", "chroot", "--pull=never",
               *(["--volume", f"{ca}:{ca}:ro"] if ca.is_file() else []),
               "--build-arg", f"BASE={base}",
               "--build-arg", f"VLLM_VERSION={STANDIN['vllm']}",
               "--build-arg", f"SENDNN_VERSION={STANDIN['sendnn-inference']}",
               "-f", str(build.ROOT / "tests/images/Containerfile.vllm-standin"), "-t", ref,
               str(build.ROOT / "tests/images")])  # fmt: skip
    yield ref
    subprocess.run([*build.buildah_cmd(), "rmi", "-f", ref], capture_output=True)


def test_the_layer_for_this_architecture_starts_spyre_engine(standin: str) -> None:
    ref = R.build_engine_layer(build.HOST_ARCH, standin, "/opt/vllm/bin/python")
    ctr = build.buildah("from", "--pull=never", ref, capture=True)
    try:
        ran = build.run_in(ctr, ["/usr/local/bin/spyre-engine-entrypoint", "check-base"],
                           env={"HOME": "/tmp"})
        assert ran.returncode == 0, ran.stderr
        lines = ran.stdout.splitlines()
        assert lines[0].startswith(f"sendnn-inference {STANDIN['sendnn-inference']}"), lines
        assert lines[1].startswith(f"vllm {STANDIN['vllm']}"), lines
        assert lines[-1] == f"supported by spyre-engine {VERSION}", lines
        arch = build.buildah("inspect", "--format", "{{.OCIv1.Architecture}}", ref, capture=True)
        assert arch == build.HOST_ARCH
    finally:
        subprocess.run([*build.buildah_cmd(), "rm", ctr], capture_output=True)
        subprocess.run([*build.buildah_cmd(), "rmi", "-f", ref], capture_output=True)
