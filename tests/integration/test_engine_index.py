"""The engine index's layers built for real (issue 46, 1): ``release.build_engine_layer`` on a
stand-in vLLM-Spyre base (tests/images/Containerfile.vllm-standin: a venv with pydantic and
empty ``vllm``/``sendnn_inference`` packages at supported versions), and the result starts
``spyre-engine check-base`` through its entrypoint. This host's architecture by default;
``SPYRE_ENGINE_LAYER_ARCHS=amd64,s390x,ppc64le`` adds the foreign ones (their debootstrapped
bases, the stand-in and the layer built and started under qemu-user-static: minutes each)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from packaging.specifiers import SpecifierSet
from spyre_engine import compat

from tests.images import build
from tests.scripts import script

from .test_reproducible import Built, config_differences, differences

R = script("release")

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


ARCHS = [a.strip() for a in os.environ.get("SPYRE_ENGINE_LAYER_ARCHS", build.HOST_ARCH).split(",")
         if a.strip()]  # fmt: skip


def _standin(arch: str) -> str:
    """The stand-in base for ``arch``, in buildah's storage (its debootstrapped base first)."""
    if arch != build.HOST_ARCH:
        build.ensure_binfmt(arch)
    base = build.ensure_base(arch)
    ref = f"localhost/vllm-spyre-standin-{arch}:{uuid.uuid4().hex[:8]}"
    ca = build.HOST_CA_BUNDLE
    build.run([*build.buildah_cmd(), "build", "--isolation", "chroot", "--pull=never",
               *(["--volume", f"{ca}:{ca}:ro"] if ca.is_file() else []),
               "--arch", arch, "--build-arg", f"BASE={base}",
               "--build-arg", f"VLLM_VERSION={STANDIN['vllm']}",
               "--build-arg", f"SENDNN_VERSION={STANDIN['sendnn-inference']}",
               "-f", str(build.ROOT / "tests/images/Containerfile.vllm-standin"), "-t", ref,
               str(build.ROOT / "tests/images")])  # fmt: skip
    return ref


#: {arch: its stand-in base}, as the ``layers`` fixture built them
STANDINS: dict[str, str] = {}


@pytest.fixture(scope="module")
def layers() -> Iterator[dict[str, str]]:
    """{arch: the engine layer on that architecture's stand-in base}, for every ARCHS."""
    made: list[str] = []
    out: dict[str, str] = {}
    try:
        for arch in ARCHS:
            standin = STANDINS[arch] = _standin(arch)
            made.append(standin)
            out[arch] = R.build_engine_layer(arch, standin, "/opt/vllm/bin/python")
            made.append(out[arch])
        yield out
    finally:
        for ref in reversed(made):
            subprocess.run([*build.buildah_cmd(), "rmi", "-f", ref], capture_output=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_layer_for_each_architecture_starts_spyre_engine(
    arch: str, layers: dict[str, str]
) -> None:
    ref = layers[arch]
    ctr = build.buildah("from", "--pull=never", ref, capture=True)
    try:
        ran = build.run_in(ctr, ["/usr/local/bin/spyre-engine-entrypoint", "check-base"],
                           env={"HOME": "/tmp"})
        assert ran.returncode == 0, ran.stderr
        lines = ran.stdout.splitlines()
        assert lines[0].startswith(f"sendnn-inference {STANDIN['sendnn-inference']}"), lines
        assert lines[1].startswith(f"vllm {STANDIN['vllm']}"), lines
        assert lines[-1] == f"supported by spyre-engine {VERSION}", lines
        built = build.buildah("inspect", "--format", "{{.OCIv1.Architecture}}", ref,
                              capture=True)  # fmt: skip
        assert built == arch
    finally:
        subprocess.run([*build.buildah_cmd(), "rm", ctr], capture_output=True)


def test_the_layer_is_rebuilt_bit_for_bit_on_the_same_base(layers: dict[str, str]) -> None:
    """Issue 48, 1: the engine layer built again on the same base, nothing reused, is the same
    image (dated SOURCE_DATE_EPOCH, its bytecode hash-checked): a site that rebuilds a release's
    engine on its base digest gets the release's digest."""
    arch = build.HOST_ARCH
    again = R.build_engine_layer(arch, STANDINS[arch], "/opt/vllm/bin/python",
                                 ref=f"localhost/spyre-engine-layer-again:{uuid.uuid4().hex[:8]}",
                                 cache=False)  # fmt: skip
    try:
        ids = [build.buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref,
                             capture=True).strip() for ref in (layers[arch], again)]  # fmt: skip
        if ids[0] != ids[1]:
            trees = [Built.tree_of(ref) for ref in (layers[arch], again)]
            diff = config_differences(layers[arch], again) + differences(*trees)
            raise AssertionError(f"the engine layer built twice differs ({ids}):\n  "
                                 + "\n  ".join(diff))
    finally:
        subprocess.run([*build.buildah_cmd(), "rmi", "-f", again], capture_output=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """CNCF distribution on loopback (the cluster's registry binary), plain HTTP."""
    from tests.cluster.controlplane import free_ports, registry_bin, wait_until

    exe = registry_bin()
    if not exe.exists():
        pytest.skip(f"{exe} missing (make binaries)")
    (port,) = free_ports(1)
    d = tmp_path_factory.mktemp("registry")
    (d / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {d / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([str(exe), "serve", str(d / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_until(up, 30, "the registry", 0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_layers_are_pushed_as_one_index(layers: dict[str, str], registry: str) -> None:
    refs = [R.labelled(ref, R.ENGINE_NAME, "0.0.0-test") for ref in layers.values()]
    try:
        pinned, platforms = R.push_index(R.ENGINE_NAME, refs, registry, "0.0.0-test", True)
    finally:
        for ref in refs:
            subprocess.run([*build.buildah_cmd(), "rmi", "-f", ref], capture_output=True)
    assert sorted(platforms) == sorted(f"linux/{a}" for a in layers), platforms
    repo, _, digest = pinned.partition("@")
    assert repo == f"{registry}/{R.ENGINE_NAME}"
    accept = ", ".join(("application/vnd.oci.image.index.v1+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json"))
    req = urllib.request.Request(f"http://{registry}/v2/{R.ENGINE_NAME}/manifests/{digest}",
                                 headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        index = json.loads(r.read())
    got = sorted(m["platform"]["architecture"] for m in index["manifests"])
    assert got == sorted(layers), index
