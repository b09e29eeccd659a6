"""Third-party CRDs the tests install into the real API server, from their projects' releases.

``tests/cluster/crds.sh`` fetches them from each project's Go module (versions pinned in
``versions.env``) into a cache outside the repository; :func:`installed_crd` applies one for
the duration of a ``with`` block and removes it afterwards (waiting until the API server no
longer serves the resource, so a test after it sees the cluster without the API again).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.cluster.controlplane import ControlPlane, wait_until

HERE = Path(__file__).resolve().parent

INFERENCE_POOL_CRD = "inference.networking.k8s.io_inferencepools.yaml"
POD_MONITOR_CRD = "monitoring.coreos.com_podmonitors.yaml"
SERVICE_MONITOR_CRD = "monitoring.coreos.com_servicemonitors.yaml"


def crd_dir() -> Path:
    """The cache directory holding the pinned third-party CRDs (fetched on first use)."""
    out = subprocess.run(
        [str(HERE / "crds.sh")], check=True, capture_output=True, text=True, timeout=600
    )
    return Path(out.stdout.strip().splitlines()[-1])


def crd_file(filename: str) -> Path:
    """Path of one pinned CRD YAML (e.g. :data:`INFERENCE_POOL_CRD`)."""
    return crd_dir() / filename


def crd_name(filename: str) -> str:
    """metadata.name of the CRD in ``filename``."""
    return str(yaml.safe_load(crd_file(filename).read_text())["metadata"]["name"])


def _served(cp: ControlPlane, name: str) -> bool:
    group = name.split(".", 1)[1]
    plural = name.split(".", 1)[0]
    out = cp.kubectl("api-resources", f"--api-group={group}", "-o", "name", check=False)
    return out.returncode == 0 and f"{plural}.{group}" in out.stdout.split()


def install_crd(cp: ControlPlane, filename: str) -> str:
    """Apply the CRD and wait until it is Established; returns its name."""
    name = crd_name(filename)
    cp.kubectl("apply", "--server-side", "-f", str(crd_file(filename)))
    cp.wait_established(name)  # (`kubectl wait` fails outright on a null conditions list)
    wait_until(lambda: _served(cp, name), 60, f"{name} served")
    return name


def remove_crd(cp: ControlPlane, filename: str) -> None:
    """Delete the CRD (and its objects) and wait until the API is no longer served."""
    name = crd_name(filename)
    cp.kubectl("delete", "crd", name, "--ignore-not-found", "--wait=true", "--timeout=120s")
    wait_until(lambda: not _served(cp, name), 60, f"{name} no longer served")


@contextmanager
def installed_crd(cp: ControlPlane, filename: str) -> Iterator[str]:
    """The CRD installed for the duration of the block (removed afterwards if it was not
    there before)."""
    name = crd_name(filename)
    existed = cp.kubectl("get", "crd", name, check=False).returncode == 0
    install_crd(cp, filename)
    try:
        yield name
    finally:
        if not existed:
            remove_crd(cp, filename)
