"""The operator and engine images, built here (tests/images/build.py) and run without Kubernetes.

Each image is run the way its pod runs it: as the pod's uid/gid, the root filesystem mounted
read-only, /tmp a fresh tmpfs (the pods' emptyDir), the image's own environment and entrypoint.
A cold engine build takes ~10-15 min; later runs reuse the cached archives (tests/images/README.md).

    .venv/bin/python -m pytest -m images tests/integration/test_images.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.images import build

# Registered here as well as in pyproject (--strict-markers): selectable with `-m images`.
_config = getattr(pytest.mark, "_config", None)
if _config is not None and not any(
    m.split(":")[0].strip() == "images" for m in _config.getini("markers")
):
    _config.addinivalue_line("markers", "images: builds (or reuses) and runs the container images")

pytestmark = [
    pytest.mark.images,
    pytest.mark.slow,
    pytest.mark.timeout(3600),  # a cold engine build on 2 busy cores
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("buildah") is None or shutil.which("debootstrap") is None,
        reason="needs root, buildah and debootstrap (apt-get install buildah debootstrap)",
    ),
]

#: Set by the image (ENV) they would beat what the engine derives from its flags (issue 12),
#: or block precompile downloads (HF_HUB_OFFLINE: serving pods get it from the operator).
FORBIDDEN_ENGINE_ENV = (
    "HF_HUB_OFFLINE",
    "SENDNN_INFERENCE_DYNAMO_BACKEND",
    "TORCH_SENDNN_CACHE_ENABLE",
    "MASTER_PORT",
)


@dataclass
class Rootfs:
    """A container of an image, mounted, runnable as a pod would run it."""

    ref: str
    container: str
    path: Path
    config: dict  # type: ignore[type-arg]

    @property
    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.config.get("Env") or [])

    @property
    def entrypoint(self) -> list[str]:
        return list(self.config.get("Entrypoint") or [])

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in the rootfs: read-only root, tmpfs /tmp, as ``user`` (default: image's)."""
        user = user or self.config.get("User") or "0:0"
        uid, _, gid = user.partition(":")
        gid = gid or uid
        full_env = {**self.env, **(env or {})}
        script = r"""
set -e
root=$1; uid=$2; gid=$3; workdir=$4; shift 4
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o mode=1777,size=2g tmpfs "$root/tmp"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
cd "$root"
exec chroot --userspec="$uid:$gid" --groups="$gid" "$root" /bin/sh -c \
  'cd "$0" && exec "$@"' "$workdir" /usr/bin/env -i "$@"
"""
        workdir = self.config.get("WorkingDir") or "/"
        cmd = [
            "unshare", "--mount", "--propagation", "private", "--fork", "--pid", "--mount-proc",
            "sh", "-c", script, "sh", str(self.path), uid, gid, workdir,
            *(f"{k}={v}" for k, v in full_env.items()), *argv,
        ]  # fmt: skip
        return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)

    def read(self, rel: str) -> str:
        return (self.path / rel.lstrip("/")).read_text()


@contextmanager
def mounted(img: build.Image) -> Iterator[Rootfs]:
    ref = build.in_storage(img)
    config = json.loads(build.buildah("inspect", "--type", "image", ref, capture=True))
    cfg = config["OCIv1"]["config"]
    ctr = build.buildah("from", "--pull=never", ref, capture=True)
    try:
        path = Path(build.buildah("mount", ctr, capture=True))
        yield Rootfs(ref, ctr, path, cfg)
    finally:
        subprocess.run([*build.buildah_cmd(), "umount", ctr], capture_output=True)
        subprocess.run([*build.buildah_cmd(), "rm", ctr], capture_output=True)


@pytest.fixture(scope="session")
def operator_image() -> build.Image:
    return build.ensure_image("operator")


@pytest.fixture(scope="session")
def engine_image() -> build.Image:
    return build.ensure_image("engine")


@pytest.fixture(scope="module")
def operator_rootfs(operator_image: build.Image) -> Iterator[Rootfs]:
    with mounted(operator_image) as r:
        yield r


@pytest.fixture(scope="module")
def engine_rootfs(engine_image: build.Image) -> Iterator[Rootfs]:
    with mounted(engine_image) as r:
        yield r


def _os_release(r: Rootfs) -> dict[str, str]:
    out = {}
    for line in r.read("/etc/os-release").splitlines():
        k, _, v = line.partition("=")
        out[k] = v.strip('"')
    return out


# --- both images ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["operator", "engine"])
def test_base_is_debian_bookworm_python311(which: str, request: pytest.FixtureRequest) -> None:
    r: Rootfs = request.getfixturevalue(f"{which}_rootfs")
    rel = _os_release(r)
    assert rel["ID"] == "debian" and rel["VERSION_CODENAME"] == "bookworm"
    py = "/opt/venv/bin/python" if which == "operator" else "/opt/engine/bin/python"
    p = r.run([py, "-c", "import sys; print(sys.version_info[:2], sys.base_prefix)"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "(3, 11) /usr"  # bookworm's python3.11, not a copied-in one


def _unchanged(*imgs: build.Image) -> None:
    """Skip when the sources changed during the session (a rebuild replaced the archive)."""
    for img in imgs:
        if build.image(img.name) != img:
            pytest.skip(f"{img.name}'s inputs changed during the session")


def test_a_second_build_with_unchanged_inputs_is_instant(
    operator_image: build.Image, engine_image: build.Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchanged inputs build nothing: no buildah, no build lock, the same archives."""
    _unchanged(operator_image, engine_image)
    before = {img.name: img.archive.stat().st_mtime_ns for img in (operator_image, engine_image)}

    def no_build(*args: object, **kw: object) -> None:
        raise AssertionError(f"a build step ran for unchanged inputs: {args}")

    for step in ("buildah", "require_tools", "locked"):
        monkeypatch.setattr(build, step, no_build)
    assert build.ensure_image("operator") == operator_image
    assert build.ensure_image("engine") == engine_image
    monkeypatch.undo()
    assert {img.name: img.archive.stat().st_mtime_ns
            for img in (operator_image, engine_image)} == before
    cli = subprocess.run(
        ["python3", str(build.ROOT / "tests/images/build.py"), "all", "--json", "--path-only"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert json.loads(cli.stdout)["engine"] == engine_image.as_dict()
    for img in (operator_image, engine_image):
        assert img.archive.is_file() and img.archive.parent == build.cache_dir()
        assert not str(img.archive).startswith(str(build.ROOT))  # outside the repository


def test_archives_are_docker_archives_with_the_reference(
    operator_image: build.Image, engine_image: build.Image
) -> None:
    """What `ctr images import` reads: manifest.json naming the image by its reference."""
    import tarfile

    _unchanged(operator_image, engine_image)
    for img in (operator_image, engine_image):
        with tarfile.open(img.archive) as tar:
            member = tar.getmember("manifest.json")
            f = tar.extractfile(member)
            assert f is not None
            (manifest,) = json.load(f)
        assert manifest["RepoTags"] == [img.ref]


# --- the operator image ----------------------------------------------------------------------


def test_operator_entrypoint_runs_as_65532_read_only(operator_rootfs: Rootfs) -> None:
    r = operator_rootfs
    assert r.config["User"] == "65532:65532"
    assert r.entrypoint == ["spyre-operator"]
    p = r.run([*r.entrypoint, "--help"])
    assert p.returncode == 0, p.stderr
    assert "spyre-operator" in p.stdout
    p = r.run([*r.entrypoint, "crd"])
    assert p.returncode == 0, p.stderr
    assert "kind: CustomResourceDefinition" in p.stdout


def test_operator_user_has_a_passwd_entry(operator_rootfs: Rootfs) -> None:
    """kopf's identity detection calls getpass.getuser(): KeyError without one (issue 10.1)."""
    p = operator_rootfs.run(
        ["python3", "-c", "import getpass, os; print(os.getuid(), getpass.getuser())"]
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["65532", "nonroot"]


def test_operator_image_has_no_torch(operator_rootfs: Rootfs) -> None:
    site = operator_rootfs.path / "opt/venv/lib/python3.11/site-packages"
    assert (site / "kopf").is_dir()
    assert not (site / "torch").exists() and not (site / "vllm").exists()
    assert not (operator_rootfs.path / "opt/venv/bin/spyre-engine").exists()


# --- the engine image ------------------------------------------------------------------------


def test_engine_env_leaves_the_flags_to_the_engine(engine_rootfs: Rootfs) -> None:
    env = engine_rootfs.env
    for name in FORBIDDEN_ENGINE_ENV:
        assert name not in env, f"{name}={env.get(name)} baked into the engine image"
    assert env["VLLM_PLUGINS"] == "sendnn_inference"
    assert env["FLEX_COMPUTE"] == "SENTIENT"
    assert "FLEX_DEVICE" not in env  # VF or PF: the operator sets it from the card resource


def test_engine_entrypoint_survives_a_failing_aiu_setup_on_a_read_only_root(
    engine_rootfs: Rootfs,
) -> None:
    """spyre-runtime's setup writes /tmp/etc (an emptyDir in the pods) and copies to /etc/aiu,
    which the read-only root refuses: the engine starts anyway, the setup's later steps ran,
    the failure is reported, and upstream's .senlib.json is linked into HOME (/tmp)."""
    r = engine_rootfs
    script = ("set -e; mkdir -p /tmp/etc; echo cfg > /tmp/etc/senlib_config.json; "
              "cp /tmp/etc/senlib_config.json /etc/aiu-senlib_config.json; export AFTER=1; "
              "cp /tmp/etc/senlib_config.json /etc/aiu-senlib_config.json")  # fmt: skip
    p = r.run(
        ["/bin/sh", "-c", f"echo '{script}' > /tmp/setup.sh && {r.entrypoint[0]} --help >/dev/null"
         " && readlink /tmp/.senlib.json && cat /tmp/etc/senlib_config.json"],
        user="1001:1001", env={"HOME": "/tmp", "SPYRE_AIU_SETUP": "/tmp/setup.sh"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["/home/engine/.senlib.json", "cfg"]
    assert "exited 1 (read-only root?)" in p.stderr
    senlib = json.loads(r.read("/home/engine/.senlib.json"))
    assert senlib["SNT_MCI"]["DCR"]["MCI_CTRL"]["ENABLE_RISCV"] == "0x0"


def test_engine_uid_1001_exists_once(engine_rootfs: Rootfs) -> None:
    from spyre_operator.desired.pod import ENGINE_UID

    entries = [
        line.split(":")
        for line in engine_rootfs.read("/etc/passwd").splitlines()
        if line.split(":")[2] == str(ENGINE_UID)
    ]
    assert len(entries) == 1, entries
    assert engine_rootfs.config["User"] == f"{ENGINE_UID}:{ENGINE_UID}"


def test_engine_entrypoint_runs_as_1001_read_only(engine_rootfs: Rootfs) -> None:
    """As the operator's pods run it: uid/gid 1001, read-only root, HOME=/tmp (an emptyDir)."""
    r = engine_rootfs
    p = r.run([*r.entrypoint, "--help"], user="1001:1001", env={"HOME": "/tmp"})
    assert p.returncode == 0, p.stderr
    assert "precompile" in p.stdout and "serve" in p.stdout


def test_engine_entrypoint_sources_the_aiu_setup_script(engine_rootfs: Rootfs) -> None:
    r = engine_rootfs
    script = "echo sourced > /tmp/marker; export SPYRE_TEST_SETUP=1"
    p = r.run(
        ["/bin/sh", "-c", f"echo '{script}' > /tmp/setup.sh && {r.entrypoint[0]} --help >/dev/null"
         " && cat /tmp/marker"],
        user="1001:1001", env={"HOME": "/tmp", "SPYRE_AIU_SETUP": "/tmp/setup.sh"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "sourced"


def test_engine_imports_vllm_and_the_plugin(engine_rootfs: Rootfs) -> None:
    p = engine_rootfs.run(
        ["python", "-c",
         "import vllm, sendnn_inference, spyre_engine, torch; "
         "print(vllm.__version__, torch.__version__, torch.cuda.is_available())"],
        user="1001:1001", env={"HOME": "/tmp"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    vllm_version, _torch_version, cuda = p.stdout.split()[-3:]
    assert vllm_version.startswith("0.") and cuda == "False"


def test_engine_image_has_the_locks_versions(engine_rootfs: Rootfs) -> None:
    """The CPU image is built against requirements.lock (make install's versions): every
    distribution in it that the lock names is at the lock's version, vLLM, torch and the
    plugin among them: the image runs what the engine tests ran in the venv."""
    import re

    p = engine_rootfs.run(
        ["python", "-c",
         "import json, sysconfig; from importlib.metadata import distributions as d; "
         "print(json.dumps({x.metadata['Name']: x.version "
         "for x in d(path=[sysconfig.get_paths()['purelib']])}))"],
        user="1001:1001", env={"HOME": "/tmp"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    installed = {norm(k): v for k, v in json.loads(p.stdout.splitlines()[-1]).items()}
    lock = {norm(m.group(1)): m.group(2) for m in re.finditer(
        r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", (build.ROOT / "requirements.lock").read_text(),
        re.MULTILINE)}  # fmt: skip
    for name in ("vllm", "torch", "sendnn-inference", "transformers"):
        assert name in installed and name in lock, name
    tools = {"pip", "uv", "setuptools", "wheel"}  # the venv's own and the build's, not run
    differ = {n: (installed[n], lock[n]) for n in installed.keys() & lock.keys() - tools
              if installed[n] != lock[n]}
    assert not differ, f"(image, lock) versions differ: {differ}"


def test_engine_compiles_with_inductor_on_cpu(engine_rootfs: Rootfs) -> None:
    """The CPU backend the tests use: inductor runs g++ on its kernels (the CPU base's layer)."""
    code = (
        "import torch\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1)\n"
        "x = torch.arange(8, dtype=torch.float32)\n"
        "assert torch.allclose(f(x), torch.sin(x) * 2 + 1)\n"
        "print('ok')\n"
    )
    p = engine_rootfs.run(
        ["python", "-c", code], user="1001:1001",
        env={"HOME": "/tmp", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("ok")


_SERVE_CHECK = r"""
import json, sys, time, urllib.request
url = sys.argv[1]
deadline = time.monotonic() + 900
last = None
while True:
    try:
        with urllib.request.urlopen(url + "/health/ready", timeout=5) as r:
            if r.status == 200:
                break
    except OSError as e:  # not listening yet, or 503 while it starts
        last = e
    if time.monotonic() > deadline:
        sys.exit(f"not ready after 900 s (last error: {last!r})")
    time.sleep(2)
req = urllib.request.Request(
    url + "/v1/completions",
    data=json.dumps({"model": "tiny", "prompt": "hello world", "max_tokens": 5,
                     "ignore_eos": True}).encode(),
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(req, timeout=120) as r:
    print(json.dumps(json.load(r)))
"""


def test_engine_precompiles_and_serves_a_tiny_model(engine_rootfs: Rootfs) -> None:
    """vLLM + the plugin for real in the image, as the operator's Job then Deployment run it
    on OpenShift (``--pod-user assigned``): read-only root, an arbitrary uid without a passwd
    entry in group 0 (what restricted-v2 assigns), HOME=/tmp; the artifact under /tmp (a claim
    in a pod). The pinned 1001:1001 of plain Kubernetes runs in the other tests here."""
    from tests.cluster.controlplane import free_ports

    (port,) = free_ports(1)
    r = engine_rootfs
    shape = "--max-model-len 512 --max-num-seqs 4 --max-num-batched-tokens 128 --backend eager"
    art = "--model /tmp/model --artifact-dir /tmp/artifact --artifact-key key-abc"
    script = f"""
set -e
python -c 'from spyre_engine.testing.tiny_model import build_tiny_model as b; b("/tmp/model")' \
  >/dev/null 2>&1
{r.entrypoint[0]} precompile {art} {shape} --reference-answers off \
  --termination-log /tmp/pre.json >/tmp/pre.log 2>&1 \
  || {{ tail -40 /tmp/pre.log >&2; exit 1; }}
{r.entrypoint[0]} serve {art} {shape} --served-name tiny --host 127.0.0.1 --port {port} \
  >/tmp/serve.log 2>&1 &
server=$!
cat > /tmp/check.py <<'PY'
{_SERVE_CHECK}
PY
rc=0
python /tmp/check.py http://127.0.0.1:{port} || rc=$?
kill -TERM $server; wait $server || true
[ $rc -eq 0 ] || {{ tail -60 /tmp/serve.log >&2; exit $rc; }}
"""
    p = r.run(["/bin/sh", "-c", script], user="1000680000:0", env={"HOME": "/tmp"},
              timeout=1500)
    assert p.returncode == 0, p.stderr[-5000:]
    body = json.loads(p.stdout.strip().splitlines()[-1])
    assert body["usage"]["completion_tokens"] == 5
    assert isinstance(body["choices"][0]["text"], str)


def _engine_user_step() -> str:
    """The engine Containerfile's RUN that creates uid 1001, as the shell runs it."""
    text = re.sub(r"\\\n", " ", (build.ROOT / "engine/Containerfile").read_text())
    (step,) = [line.strip()[4:] for line in text.splitlines()
               if line.startswith("RUN ") and "getent passwd 1001" in line]  # fmt: skip
    return step


@pytest.mark.parametrize("ubi_like", [False, True], ids=["debian", "base-with-uid-1001"])
def test_engine_user_step_works_whether_the_base_has_uid_1001(ubi_like: bool) -> None:
    """Failure 2 of issue 10: UBI9 python-311 has uid 1001 (`default`, gid 0) already."""
    ref = build.ensure_base()
    ctr = build.buildah("from", "--pull=never", ref, capture=True)
    try:
        root = Path(build.buildah("mount", ctr, capture=True))

        def sh(cmd: str) -> subprocess.CompletedProcess[str]:
            return build.run_in(ctr, ["sh", "-c", cmd], timeout=120)

        def users_with_uid_1001() -> list[str]:
            # Read from the container's root, not from a command's output: a 2x-slow run of
            # 41f7a0c once got exit 0 and no stdout from `buildah run ... getent passwd 1001`
            # after the step had worked (see build.run_in).
            lines = (root / "etc/passwd").read_text().splitlines()
            return [f[0] for f in (ln.split(":") for ln in lines) if len(f) >= 7 and f[2] == "1001"]

        if ubi_like:
            made = sh("useradd --uid 1001 --gid 0 --home-dir /opt/app-root/src -m default")
            assert made.returncode == 0, made.stderr
            assert users_with_uid_1001() == ["default"]
            # what engine/Containerfile did before: fails on such a base (uid not unique)
            bare = sh("useradd --uid 1001 --gid 0 --home-dir /home/engine --create-home engine")
            assert bare.returncode != 0 and "not unique" in bare.stderr, bare
            assert users_with_uid_1001() == ["default"]
        p = sh(_engine_user_step())
        assert p.returncode == 0, p.stderr
        assert users_with_uid_1001() == ["default" if ubi_like else "engine"]
        owners = {d: (root / d).stat() for d in ("home/engine", "artifacts", "hf-cache")}
        assert {d: (s.st_uid, s.st_gid) for d, s in owners.items()} == {
            d: (1001, 0) for d in owners
        }
    finally:
        subprocess.run([*build.buildah_cmd(), "umount", ctr], capture_output=True)
        subprocess.run([*build.buildah_cmd(), "rm", ctr], capture_output=True)
