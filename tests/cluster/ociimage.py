"""Tiny OCI images built from Debian's ``busybox-static``, without a registry or a builder.

The real node needs two images that exist only on this machine:

* the sandbox ("pause") image containerd starts for every pod: busybox ``sleep`` forever
  (containerd stops sandboxes with SIGKILL, so it needs no signal handling);
* a test image with a shell and the usual tools (``sh``, ``wget`` for plain HTTP, ``nc``,
  ``ip``, ...) plus ``/bin/https-get`` (``httpsget/main.go``, a static Go HTTPS client:
  busybox's TLS shares no cipher suite with the Go API server).

Both share one layer: ``/bin/busybox`` plus one symlink per applet; the test image has a
second one with ``https-get``. The archives are written
in the OCI image layout (``index.json``, ``oci-layout``, ``blobs/sha256``) with the
``io.containerd.image.name`` annotation, so ``ctr images import`` names them, and they are
byte-for-byte reproducible (fixed mtimes, sorted entries): the same busybox gives the same
digests. They are cached next to the binaries, keyed by busybox's package version.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

BUSYBOX = Path("/bin/busybox")


def busybox_version() -> str:
    """Debian version of busybox-static, usable as an image tag (``1.35.0-4-deb12u1-b1``)."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "busybox-static"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    tag = out.split(":", 1)[-1]
    return "".join(c if c.isalnum() or c in "._" else "-" for c in tag)


HTTPSGET_SRC = Path(__file__).resolve().parent / "httpsget" / "main.go"


def _tar_adder(tar: tarfile.TarFile):  # type: ignore[no-untyped-def]
    def add(name: str, kind: bytes, mode: int, payload: bytes = b"", link: str = "") -> None:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.mtime, ti.uid, ti.gid = kind, mode, 0, 0, 0
        ti.uname = ti.gname = ""
        if link:
            ti.linkname = link
        ti.size = len(payload)
        tar.addfile(ti, io.BytesIO(payload) if payload else None)

    return add


def _tools_layer(cache_dir: Path) -> bytes:
    """An uncompressed tar with /bin/https-get, built from httpsget/main.go (static, ~1 s)."""
    binary = cache_dir / f"https-get-{_tools_hash()}"
    if not binary.exists():
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
        subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp),
                        str(HTTPSGET_SRC)], check=True, env=env, cwd=str(cache_dir))
        os.replace(tmp, binary)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add = _tar_adder(tar)
        add("bin", tarfile.DIRTYPE, 0o755)
        add("bin/https-get", tarfile.REGTYPE, 0o755, binary.read_bytes())
    return buf.getvalue()


def _tools_hash() -> str:
    return hashlib.sha256(HTTPSGET_SRC.read_bytes()).hexdigest()[:8]


def _busybox_layer() -> bytes:
    """An uncompressed tar: /bin/busybox, applet symlinks, /tmp, /etc/{passwd,group}."""
    data = BUSYBOX.read_bytes()
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add = _tar_adder(tar)

        for d in ("bin", "etc", "tmp"):
            add(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755)
        add("bin/busybox", tarfile.REGTYPE, 0o755, data)
        for a in sorted(set(applets) - {"busybox"}):
            add(f"bin/{a}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65532:65532:nobody:/tmp:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\nnobody:x:65532:\n")
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_oci_archive(
    path: Path, name: str, layer_tar: bytes | list[bytes], entrypoint: list[str],
    cmd: list[str] | None = None,
) -> Path:
    """Write a linux/amd64 image (one layer per uncompressed tar) as an OCI layout tar."""
    blobs: dict[str, bytes] = {}
    tars = layer_tar if isinstance(layer_tar, list) else [layer_tar]
    layers = [_blob(blobs, gzip.compress(t, compresslevel=6, mtime=0),
                    "application/vnd.oci.image.layer.v1.tar+gzip") for t in tars]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "Env": ["PATH=/bin"],
            "WorkingDir": "/",
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(t).hexdigest() for t in tars],
        },
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/cluster/ociimage.py"}],
    }
    cfg = _blob(blobs, json.dumps(config, sort_keys=True).encode(),
                "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg, "layers": layers}
    man = _blob(blobs, json.dumps(manifest, sort_keys=True).encode(),
                "application/vnd.oci.image.manifest.v1+json")
    man["platform"] = {"architecture": "amd64", "os": "linux"}
    man["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
    }
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [man]}
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":", 1)[1]] = data
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")  # several sessions may build at once
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(ti)
        for fname in sorted(files):
            ti = tarfile.TarInfo(fname)
            ti.size, ti.mode, ti.mtime = len(files[fname]), 0o644, 0
            tar.addfile(ti, io.BytesIO(files[fname]))
    os.replace(tmp, path)
    return path


def busybox_images(cache_dir: Path) -> dict[str, Path]:
    """Build (or reuse) the pause and busybox archives; returns {image name: archive path}."""
    images = {
        pause_image(): (["/bin/sleep", "infinity"], False),
        busybox_image(): (["/bin/sh"], True),
    }
    out: dict[str, Path] = {}
    layer: bytes | None = None
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name, (entrypoint, tools) in images.items():
        path = cache_dir / (name.split("/", 1)[1].replace(":", "_") + ".oci.tar")
        if not path.exists():
            layer = layer if layer is not None else _busybox_layer()
            layers = [layer, _tools_layer(cache_dir)] if tools else [layer]
            write_oci_archive(path, name, layers, entrypoint)
        out[name] = path
    return out


def pause_image() -> str:
    return f"spyre.local/pause:{busybox_version()}"


def busybox_image() -> str:
    """The test image: busybox + /bin/https-get (its tag carries both versions)."""
    return f"spyre.local/busybox:{busybox_version()}-{_tools_hash()}"
