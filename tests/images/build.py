#!/usr/bin/env python3
"""Build (or reuse) the operator and engine images here: no Docker daemon, no registry.

    python3 tests/images/build.py operator        # prints the archive path (builds if needed)
    python3 tests/images/build.py engine --ref    # prints the image reference instead
    python3 tests/images/build.py all --json      # {"operator": {...}, "engine": {...}}
    python3 tests/images/build.py engine --path-only   # the path, without building
    python3 tests/images/build.py prune          # drop old archives and buildah's storage
    python3 tests/images/build.py platforms      # the operator for every other architecture

1. A Debian bookworm base with bookworm's python3.11, made by ``debootstrap --variant=minbase``
   and imported with buildah (``localhost/spyre-base:<hash>``); the CPU engine gets one more
   layer with g++ (torch inductor compiles C++ at run time on CPU).
2. ``operator/Containerfile`` and ``engine/Containerfile`` built by buildah (``--isolation
   chroot``) with the base as a build argument, from a staged context that holds exactly the
   hashed inputs.
3. Each image written as a docker-archive tar (uncompressed layers, one tag in its
   manifest.json) that ``ctr images import`` and ``podman load`` read:
   ``$SPYRE_IMAGE_CACHE`` or ``~/.cache/spyre-model-operator/images/<name>-<hash>.tar``.

The hash covers the Containerfile, the base's recipe, pyproject.toml and the package sources,
so a second call with unchanged inputs only stats a file. Builds use a buildah storage of their
own (``.../spyre-model-operator/buildah``) so that cleaning up never touches anyone else's
images; only the newest image of each name is kept there, for the tests to run it.

Only the standard library: runs with the system python3 before the .venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Bump when this script changes what it produces (forces every image to rebuild).
RECIPE_VERSION = "1"
#: The date of every file in a reproducible image's own layers and of the image itself
#: (buildah's --timestamp, and SOURCE_DATE_EPOCH in its RUN steps): a constant, so that its
#: layers are a function of its inputs alone and a rebuild gives the same digest
#: (tests/integration/test_reproducible.py). 1980-01-01: the earliest date a zip (the
#: operator's wheel) holds. A release re-dates its images with their commit (release.labelled).
SOURCE_DATE_EPOCH = 315532800

#: The base: what debootstrap installs. Part of every image's hash.
BASE_RECIPE: dict[str, object] = {
    "suite": "bookworm",
    "mirror": "http://deb.debian.org/debian",
    "variant": "minbase",
    # python3 is bookworm's 3.11; python3-venv brings ensurepip; libgomp1/libnuma1 for torch CPU.
    "include": ["python3", "python3-venv", "ca-certificates", "libgomp1", "libnuma1"],
}
#: The CPU engine's extra layer: torch inductor (the CPU compile backend) runs g++ on its
#: generated kernels, which include <omp.h> and <Python.h>; the Spyre base (production) does
#: not need it.
ENGINE_CPU_PACKAGES = ["g++", "libpython3.11-dev"]

#: engine/Containerfile's build arguments for the CPU image (see SPECS["engine"]).
ENGINE_CPU_BUILD_ARGS: tuple[tuple[str, str], ...] = (
    ("TORCH_INDEX", ""), ("VLLM_TARGET", ""),
    # the project's lock (make install's versions), not upstream's (made for spyre-runtime)
    ("UPSTREAM_CONSTRAINTS", "/src/requirements.lock"), ("UPSTREAM_OVERRIDES", ""),
)

OPERATOR_REPO = "localhost/spyre-model-operator"
ENGINE_REPO = "localhost/spyre-engine"


@dataclass(frozen=True)
class ImageSpec:
    name: str
    repo: str
    containerfile: str
    inputs: tuple[str, ...]
    base_arg: str
    base: str  # "base" or "engine-cpu"
    extra_hashed: tuple[str, ...] = ()
    #: --build-arg NAME=VALUE besides the base (hashed: a change rebuilds the image).
    build_args: tuple[tuple[str, str], ...] = ()
    #: Built bit for bit: dated SOURCE_DATE_EPOCH (buildah --timestamp and the build argument).
    reproducible: bool = False


SPECS: dict[str, ImageSpec] = {
    "operator": ImageSpec(
        name="operator",
        repo=OPERATOR_REPO,
        containerfile="operator/Containerfile",
        inputs=("pyproject.toml", "operator/requirements.lock", "operator/spyre_operator",
                "engine/spyre_contract"),
        base_arg="PYTHON_IMAGE",
        base="base",
        extra_hashed=("operator/Containerfile.dockerignore",),
        reproducible=True,
    ),
    "engine": ImageSpec(
        name="engine",
        repo=ENGINE_REPO,
        containerfile="engine/Containerfile",
        inputs=(
            "pyproject.toml",
            "requirements.lock",
            "engine/spyre_engine",
            "engine/spyre_contract",
            "engine/senlib.json",
            "engine/entrypoint.sh",
            # copied by the production and the CPU build alike, used by production only
            "engine/upstream-constraints.txt",
            "engine/upstream-overrides.txt",
            "engine/lock_pick.py",  # picks uv's pin and hashes from requirements.lock
        ),
        base_arg="BASE",
        base="engine-cpu",
        # The CPU variant of the production Containerfile: no spyre-runtime base, so no
        # torch_sendnn whose torch to match (TORCH_INDEX empty: the torch vLLM's wheel pins)
        # and PyPI's vLLM wheel instead of building it with VLLM_TARGET_DEVICE=empty.
        build_args=ENGINE_CPU_BUILD_ARGS,
    ),
}


#: Files the build needs but whose content does not matter: staged (and hashed) as a stub. The
#: package metadata names README.md as its readme; with the real one every README edit rebuilt
#: the 9 GB engine image and re-imported it into the node.
STUB_FILES: dict[str, bytes] = {
    "README.md": b"# spyre-model-operator\n\nSee the repository's README.md.\n",
}


@dataclass(frozen=True)
class Image:
    name: str
    ref: str  # e.g. localhost/spyre-engine:3f2a...; the tag inside the archive
    archive: Path  # docker-archive tar

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "ref": self.ref, "archive": str(self.archive)}


def log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


# --- locations -----------------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("SPYRE_IMAGE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "spyre-model-operator" / "images"


def storage_root() -> Path:
    return Path(os.environ.get("SPYRE_BUILDAH_ROOT") or cache_dir().parent / "buildah")


def buildah_cmd() -> list[str]:
    root = storage_root()
    return ["buildah", "--root", str(root / "storage"), "--runroot", str(root / "run"),
            "--storage-driver", "overlay"]  # fmt: skip


# --- hashing -------------------------------------------------------------------------------


def _files(rel: str) -> Iterator[Path]:
    p = ROOT / rel
    if p.is_file():
        yield p
        return
    for dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for f in sorted(filenames):
            if not f.endswith((".pyc", ".pyo")):
                yield Path(dirpath) / f


def _hash_update(h: hashlib._Hash, label: str, data: bytes) -> None:  # type: ignore[name-defined]
    h.update(f"{label}\0{len(data)}\0".encode())
    h.update(data)


#: Platforms the operator image is released for (one manifest list). The host's is built
#: natively, the others under qemu-user-static (binfmt_misc), from Debian's packages: a release
#: runs from an x86, Z, Power or Arm host alike (issue 46, 1).
OPERATOR_PLATFORMS = ("amd64", "arm64", "ppc64le", "s390x")
#: The kernel's machine name (uname -m) -> its OCI architecture.
MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
                "ppc64le": "ppc64le", "s390x": "s390x"}


def host_arch(machine: str | None = None) -> str:
    """The OCI architecture of this machine (``machine``: uname -m), or its own name when it is
    none the operator is released for (nothing is then built natively for a release)."""
    import platform

    m = (machine or platform.machine()).lower()
    return MACHINE_ARCH.get(m, m)


HOST_ARCH = host_arch()
#: OCI architecture -> qemu's name (its binfmt_misc entry and /usr/lib/binfmt.d file).
QEMU_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x"}
#: OCI architecture -> Debian's, where they differ (debootstrap --arch).
DEBIAN_ARCH = {"ppc64le": "ppc64el"}


def base_key(arch: str = HOST_ARCH) -> str:
    h = hashlib.sha256()
    _hash_update(h, "recipe", json.dumps([RECIPE_VERSION, BASE_RECIPE], sort_keys=True).encode())
    if arch != HOST_ARCH:
        _hash_update(h, "arch", arch.encode())
    return h.hexdigest()[:16]


def base_ref(arch: str = HOST_ARCH) -> str:
    suffix = "" if arch == HOST_ARCH else f"-{arch}"
    return f"localhost/spyre-base{suffix}:{base_key(arch)}"


def engine_cpu_key() -> str:
    h = hashlib.sha256()
    _hash_update(h, "base", base_key().encode())
    _hash_update(h, "packages", json.dumps(ENGINE_CPU_PACKAGES).encode())
    return h.hexdigest()[:16]


def _base_of(spec: ImageSpec) -> tuple[str, str]:
    """(key, image reference) of the base ``spec`` is built on."""
    if spec.base == "engine-cpu":
        k = engine_cpu_key()
        return k, f"localhost/spyre-base-engine-cpu:{k}"
    k = base_key()
    return k, f"localhost/spyre-base:{k}"


def image_key(name: str, arch: str = HOST_ARCH) -> str:
    spec = SPECS[name]
    h = hashlib.sha256()
    _hash_update(h, "version", RECIPE_VERSION.encode())
    _hash_update(h, "base", (_base_of(spec)[0] if arch == HOST_ARCH else base_key(arch)).encode())
    for rel in (spec.containerfile, *spec.extra_hashed):
        _hash_update(h, rel, (ROOT / rel).read_bytes())
    if spec.build_args:
        _hash_update(h, "build-args", json.dumps(spec.build_args).encode())
    if spec.reproducible:
        _hash_update(h, "dated", str(SOURCE_DATE_EPOCH).encode())
    for rel in spec.inputs:
        for f in _files(rel):
            mode = "x" if os.access(f, os.X_OK) else "-"
            _hash_update(h, f"{f.relative_to(ROOT)}:{mode}", f.read_bytes())
    for rel, content in sorted(STUB_FILES.items()):
        _hash_update(h, f"stub:{rel}", content)
    return h.hexdigest()[:16]


#: What decides whether the operator image builds and starts on every platform: its recipe,
#: the dependencies it installs (operator/requirements.lock), each platform's base. Not the
#: operator's own code (pure Python, the same bytes on every architecture). The
#: four-architecture release test (tests/integration/test_release_platforms.py) runs once per
#: value of this key.
PLATFORM_INPUTS = ("operator/Containerfile", "operator/Containerfile.dockerignore",
                   "pyproject.toml", "operator/requirements.lock", "operator/scripts/release.py",
                   "tests/images/build.py")


def platforms_key() -> str:
    """The key of :data:`PLATFORM_INPUTS` and every platform's base."""
    h = hashlib.sha256()
    _hash_update(h, "version", RECIPE_VERSION.encode())
    for arch in OPERATOR_PLATFORMS:
        _hash_update(h, f"base:{arch}", base_key(arch).encode())
    for rel in PLATFORM_INPUTS:
        _hash_update(h, rel, (ROOT / rel).read_bytes())
    return h.hexdigest()[:16]


def proofs_dir() -> Path:
    """Where a test that passed for a key leaves its record (beside the images' cache)."""
    return cache_dir().parent / "proofs"


def image(name: str, arch: str = HOST_ARCH) -> Image:
    """Where ``name``'s image is (or will be) for ``arch``: no build, no buildah call. Another
    architecture than the host's has its own repository and archive (``operator.s390x-...``)."""
    spec = SPECS[name]
    key = image_key(name, arch)
    if arch == HOST_ARCH:
        return Image(name, f"{spec.repo}:{key}", cache_dir() / f"{name}-{key}.tar")
    return Image(f"{name}.{arch}", f"{spec.repo}-{arch}:{key}",
                 cache_dir() / f"{name}.{arch}-{key}.tar")


# --- running -------------------------------------------------------------------------------


def run(argv: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """``argv``, checked; its output goes to stderr (stdout carries only what main prints)."""
    kw.setdefault("stdout", sys.stderr)
    return subprocess.run(list(argv), check=True, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def buildah(*args: str, capture: bool = False, **kw: object) -> str:
    if capture:
        kw["stdout"] = subprocess.PIPE
    out = run([*buildah_cmd(), *args], **kw)
    return (out.stdout or "").strip() if capture else ""


def run_in(
    ctr: str, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``argv`` in working container ``ctr`` (chroot isolation), its output read from files.

    buildah 1.28's chroot isolation copies a child's output through pipes and once lost all of
    a quick command's stdout (exit 0, nothing printed: a 2x-slow run of 41f7a0c); the command
    here writes its stdout and stderr to a host directory mounted into the container instead.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="buildah-run-") as out:
        os.chmod(out, 0o777)
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        script = 'exec "$@" >/.spyre-run-out/stdout 2>/.spyre-run-out/stderr'
        ran = subprocess.run(
            [*buildah_cmd(), "run", "--isolation", "chroot", *flags,
             "--volume", f"{out}:/.spyre-run-out:rw", ctr, "--",
             "/bin/sh", "-c", script, "sh", *argv],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        got = {n: (Path(out) / n) for n in ("stdout", "stderr")}
        text = {n: f.read_text() if f.exists() else "" for n, f in got.items()}
        return subprocess.CompletedProcess(
            ran.args, ran.returncode, text["stdout"], text["stderr"] + ran.stderr
        )


def has_image(ref: str) -> bool:
    r = subprocess.run([*buildah_cmd(), "inspect", "--type", "image", ref],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return r.returncode == 0


def require_tools() -> None:
    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t) is None]
    if missing:
        raise SystemExit(
            f"missing {' '.join(missing)}: apt-get install -y buildah debootstrap (Debian)"
        )


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _tmp() -> Path:
    t = cache_dir() / "tmp"
    t.mkdir(parents=True, exist_ok=True)
    return t


# --- the base ------------------------------------------------------------------------------

_NODOC = """\
# Keep the image small: no documentation, no man pages, no translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
"""


def ensure_binfmt(arch: str) -> None:
    """Let this kernel run ``arch``'s binaries: qemu-user-static (Debian's package) registered
    with binfmt_misc, with the F flag (the interpreter is opened once, so it works inside
    chroots and containers). Global to the machine, like the kernel: left registered."""
    qarch = QEMU_ARCH[arch]
    misc = Path("/proc/sys/fs/binfmt_misc")
    if (misc / f"qemu-{qarch}").exists():
        return
    if not (misc / "register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(misc)])
    conf = Path(f"/usr/lib/binfmt.d/qemu-{qarch}.conf")
    if not conf.exists():
        run([str(ROOT / "tests" / "cluster" / "apt-install.sh"), "qemu-user-static"])
    with contextlib.suppress(FileExistsError):  # registered meanwhile by another build
        (misc / "register").write_text(conf.read_text().strip() + "\n")
    if not (misc / f"qemu-{qarch}").exists():
        raise SystemExit(f"could not register qemu-{qarch} with binfmt_misc")


def _debootstrap(dest: Path, arch: str = HOST_ARCH) -> None:
    r = BASE_RECIPE
    include = ",".join(r["include"])  # type: ignore[call-overload]
    if arch == HOST_ARCH:
        run(["debootstrap", f"--variant={r['variant']}", f"--include={include}",
             str(r["suite"]), str(dest), str(r["mirror"])])  # fmt: skip
    else:
        # Unpacked natively, configured under emulation (the second stage runs arch's dpkg).
        ensure_binfmt(arch)
        run(["debootstrap", "--foreign", f"--arch={DEBIAN_ARCH.get(arch, arch)}",
             f"--variant={r['variant']}",
             f"--include={include}", str(r["suite"]), str(dest), str(r["mirror"])])  # fmt: skip
        run(["chroot", str(dest), "/debootstrap/debootstrap", "--second-stage"])
    (dest / "etc/dpkg/dpkg.cfg.d/01-nodoc").write_text(_NODOC)
    (dest / "etc/apt/apt.conf.d/01-norecommends").write_text(
        'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
    )
    suite = r["suite"]
    (dest / "etc/apt/sources.list").write_text(
        f"deb {r['mirror']} {suite} main\n"
        f"deb {r['mirror']} {suite}-updates main\n"
        f"deb http://deb.debian.org/debian-security {suite}-security main\n"
    )
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                "usr/share/info", "usr/share/locale", "var/log", "var/cache/debconf"):
        d = dest / rel
        if not d.is_dir():
            continue
        for child in d.iterdir():
            if rel == "usr/share/doc" and child.is_dir():
                # keep the copyright files (the licences of what the image ships)
                for f in child.iterdir():
                    if f.name != "copyright":
                        shutil.rmtree(f) if f.is_dir() and not f.is_symlink() else f.unlink()
                continue
            if child.name in ("partial", "lock"):
                continue
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    # Python's bytecode for the standard library is compiled by the python3.11 postinst already.


def ensure_base(arch: str = HOST_ARCH) -> str:
    """The debootstrapped base (for ``arch``) in buildah's storage; returns its reference."""
    ref = base_ref(arch)
    if has_image(ref):
        return ref
    with locked(f"base-{arch}" if arch != HOST_ARCH else "base"):
        return _make_base(arch)


def _make_base(arch: str = HOST_ARCH) -> str:
    key = base_key(arch)
    ref = base_ref(arch)
    if has_image(ref):
        return ref
    rootfs_tar = cache_dir() / f"base-rootfs-{key}.tar"
    if not rootfs_tar.exists():
        start = time.monotonic()
        work = _tmp() / f"rootfs-{key}"
        if work.exists():
            _rmtree_rootfs(work)
        log(f"debootstrap {BASE_RECIPE['suite']} ({BASE_RECIPE['variant']}, {arch}) into {work}")
        _debootstrap(work, arch)
        partial = rootfs_tar.with_suffix(".partial")
        run(["tar", "--numeric-owner", "--xattrs", "-C", str(work), "-cf", str(partial), "."])
        os.replace(partial, rootfs_tar)
        _rmtree_rootfs(work)
        log(f"base rootfs {rootfs_tar} in {time.monotonic() - start:.0f}s")
    ctr = buildah("from", "scratch", capture=True)
    try:
        mnt = buildah("mount", ctr, capture=True)
        run(["tar", "--numeric-owner", "--xattrs", "-C", mnt, "-xf", str(rootfs_tar)])
        buildah("umount", ctr)
        buildah("config", "--os", "linux", "--arch", arch,
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8", "--cmd", "/bin/bash",
                "--label", "org.opencontainers.image.title=spyre-base",
                "--label", f"org.opencontainers.image.description=Debian {BASE_RECIPE['suite']} "
                f"minbase + python3.11 (debootstrap, {arch})", ctr)  # fmt: skip
        buildah("commit", "--quiet", ctr, ref, stdout=subprocess.DEVNULL)
    finally:
        subprocess.run([*buildah_cmd(), "rm", ctr], stdout=subprocess.DEVNULL)
    return ref


def _rmtree_rootfs(path: Path) -> None:
    # debootstrap mounts proc/sys inside; never follow them.
    for sub in ("proc", "sys", "dev/pts"):
        subprocess.run(["umount", "-l", str(path / sub)], stderr=subprocess.DEVNULL)
    run(["rm", "-rf", "--one-file-system", str(path)])


def ensure_engine_cpu_base() -> str:
    base = ensure_base()
    key = engine_cpu_key()
    ref = f"localhost/spyre-base-engine-cpu:{key}"
    if has_image(ref):
        return ref
    with locked("engine-cpu-base"):
        if has_image(ref):
            return ref
        _make_engine_cpu_base(base, ref)
    return ref


def _make_engine_cpu_base(base: str, ref: str) -> None:
    log(f"engine CPU base: {' '.join(ENGINE_CPU_PACKAGES)} on {base}")
    ctr = buildah("from", "--pull=never", base, capture=True)
    try:
        buildah("run", "--isolation", "chroot", ctr, "--", "sh", "-ec",
                "apt-get update -qq"
                " && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
                + " ".join(ENGINE_CPU_PACKAGES)
                + " >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/*")
        buildah("commit", "--quiet", ctr, ref, stdout=subprocess.DEVNULL)
    finally:
        subprocess.run([*buildah_cmd(), "rm", ctr], stdout=subprocess.DEVNULL)


# --- the images ----------------------------------------------------------------------------


def stage_context(spec: ImageSpec, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    for rel in (spec.containerfile, *spec.extra_hashed, *spec.inputs):
        for f in _files(rel):
            target = dest / f.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    for rel, content in STUB_FILES.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(content)


#: The host's CA bundle, mounted over the image's in RUN steps only: builds behind a
#: TLS-inspecting proxy (whose CA only the host trusts) can reach PyPI; the image keeps its own.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _build_volumes(spec: ImageSpec) -> list[str]:
    """Host files mounted into RUN steps (never part of a layer): CA bundle, download caches."""
    out: list[str] = []
    if HOST_CA_BUNDLE.is_file():
        out += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    if spec.name != "engine":
        return out
    uv_cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
    uv_cache.mkdir(parents=True, exist_ok=True)
    return [*out, "--volume", f"{uv_cache}:/var/cache/uv", "--build-arg", "UV_CACHE=/var/cache/uv"]


def build_args(spec: ImageSpec, base: str, arch: str, ctx: Path, ref: str,
               cache: bool = True) -> list[str]:
    """``buildah build``'s arguments for ``spec`` on ``base`` from the staged context ``ctx``
    (:func:`stage_context`) as ``ref``; ``cache=False``: no layer reused (a clean rebuild)."""
    dated = ["--timestamp", str(SOURCE_DATE_EPOCH),
             "--build-arg", f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}"] if spec.reproducible else []
    return [
        "build", "--isolation", "chroot", "--pull=never", "--force-rm",
        "--layers", *([] if cache else ["--no-cache"]), "--arch", arch, *dated,
        "--build-arg", f"{spec.base_arg}={base}", *_build_volumes(spec),
        *(a for k, v in spec.build_args for a in ("--build-arg", f"{k}={v}")),
        "-f", str(ctx / spec.containerfile), "-t", ref, str(ctx),
    ]  # fmt: skip


def ensure_image(name: str, *, keep_in_storage: bool = True, arch: str = HOST_ARCH) -> Image:
    """Build ``name`` (for ``arch``: the operator only, under qemu) unless its archive exists;
    returns where it is."""
    img = image(name, arch)
    if img.archive.exists():
        return img
    require_tools()
    spec = SPECS[name]
    if arch != HOST_ARCH and (spec.base != "base" or arch not in QEMU_ARCH):
        raise SystemExit(f"{name} is built for {HOST_ARCH} only here, not {arch}")
    with locked("build"):
        if img.archive.exists():
            return img
        start = time.monotonic()
        _drop_interrupted_build_containers()
        if arch != HOST_ARCH:
            ensure_binfmt(arch)
        base = ensure_engine_cpu_base() if spec.base == "engine-cpu" else ensure_base(arch)
        ctx = _tmp() / f"ctx-{img.name}"
        stage_context(spec, ctx)
        log(f"building {img.ref} from {spec.containerfile} on {base}")
        t0 = time.monotonic()
        try:
            buildah(*build_args(spec, base, arch, ctx, img.ref))
        finally:
            shutil.rmtree(ctx, ignore_errors=True)
        t1 = time.monotonic()
        partial = img.archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        buildah("push", "--quiet", img.ref, f"docker-archive:{partial}:{img.ref}")
        os.replace(partial, img.archive)
        t2 = time.monotonic()
        size = img.archive.stat().st_size / 2**20
        log(f"{img.archive} ({size:.0f} MiB): build {t1 - t0:.0f}s, archive {t2 - t1:.0f}s, "
            f"total {t2 - start:.0f}s")  # fmt: skip
        _cleanup(spec, keep=img.ref if keep_in_storage else None,
                 repo=img.ref.rsplit(":", 1)[0])
        _drop_old_archives(img.name, keep=img.archive)
    return img


def _cleanup(spec: ImageSpec, keep: str | None, repo: str | None = None) -> None:
    """Leave no build container, no dangling layer, and one image per name in storage."""
    repo = repo or spec.repo
    current_bases = {*(base_ref(a) for a in OPERATOR_PLATFORMS),
                     f"localhost/spyre-base-engine-cpu:{engine_cpu_key()}"}  # fmt: skip
    out = buildah("images", "--format", "{{.Name}}:{{.Tag}}", "--noheading", capture=True)
    for ref in out.splitlines():
        outdated_base = ref.startswith("localhost/spyre-base") and ref not in current_bases
        if (ref.startswith(repo + ":") and ref != keep) or outdated_base:
            subprocess.run([*buildah_cmd(), "rmi", ref], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    # Dangling = untagged and no child: the old image's own layers go, one level per pass; the
    # layer cache (intermediate images with children, e.g. the engine's dependencies) stays.
    for _ in range(30):
        r = subprocess.run([*buildah_cmd(), "rmi", "--prune"], capture_output=True, text=True)
        if r.returncode != 0 or not r.stdout.strip():
            break


def _drop_interrupted_build_containers() -> None:
    """Intermediate containers that a killed `buildah build` left (each holds a rootfs)."""
    out = buildah("containers", "--format", "{{.ContainerName}}", "--noheading", capture=True)
    for name in out.splitlines():
        if re.fullmatch(r"[0-9a-f]{12}-working-container", name):
            subprocess.run([*buildah_cmd(), "rm", name], stdout=subprocess.DEVNULL)


def _drop_old_archives(name: str, keep: Path) -> None:
    for old in cache_dir().glob(f"{name}-*.tar"):
        if old != keep:
            log(f"removing the outdated {old.name}")
            old.unlink()


def in_storage(img: Image) -> str:
    """``img`` in buildah's storage (loaded from its archive if it was dropped); its ref."""
    if not has_image(img.ref):
        buildah("pull", "--quiet", f"docker-archive:{img.archive}", stdout=subprocess.DEVNULL)
    return img.ref


def prune() -> None:
    """Remove buildah's storage and every archive of ours but the current ones."""
    current = {image(n).archive for n in SPECS} | {
        image("operator", a).archive for a in OPERATOR_PLATFORMS}
    for n in SPECS:
        for f in [*cache_dir().glob(f"{n}-*.tar"), *cache_dir().glob(f"{n}.*-*.tar")]:
            if f not in current:
                f.unlink()
    for f in cache_dir().glob("base-rootfs-*.tar"):
        if f.name not in {f"base-rootfs-{base_key(a)}.tar" for a in OPERATOR_PLATFORMS}:
            f.unlink()
    root = storage_root()
    if root.exists():
        subprocess.run([*buildah_cmd(), "rm", "--all"], stdout=subprocess.DEVNULL)
        subprocess.run([*buildah_cmd(), "rmi", "--all", "--force"], stdout=subprocess.DEVNULL)
        subprocess.run(["umount", "-R", str(root / "storage" / "overlay")],
                       stderr=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("what", choices=[*SPECS, "all", "base", "prune", "platforms"])
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--ref", action="store_true", help="print the image reference")
    out.add_argument("--json", action="store_true", help="print name, ref and archive as JSON")
    ap.add_argument("--arch", default=HOST_ARCH, choices=OPERATOR_PLATFORMS,
                    help="the operator for another architecture (built under qemu-user-static)")
    ap.add_argument("--path-only", action="store_true",
                    help="print where the archive is or will be; build nothing")  # fmt: skip
    args = ap.parse_args(argv)
    if args.what == "prune":
        prune()
        return 0
    if args.what == "base":
        require_tools()
        print(ensure_base())
        return 0
    if args.what == "platforms":  # the operator for the release's other architectures
        builds = [("operator", a) for a in OPERATOR_PLATFORMS if a != HOST_ARCH]
    else:
        builds = [(n, args.arch) for n in (list(SPECS) if args.what == "all" else [args.what])]
    imgs = [image(n, a) if args.path_only else ensure_image(n, arch=a) for n, a in builds]
    if args.json:
        print(json.dumps({i.name: i.as_dict() for i in imgs}, indent=2))
    else:
        for i in imgs:
            print(i.ref if args.ref else i.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
