"""Run a container spec the operator wrote as a local process, the way a kubelet would start it.

The project's virtualenv stands in for the engine image (``/opt/engine`` in
``engine/Containerfile``); each volume mount becomes a directory under a scratch root and every
path in ``args`` and ``env`` is rewritten to it; ``terminationMessagePath`` becomes a file the
test reads back like the kubelet does. Two things a pod has that a local process has not are
emulated, not substituted:

- its own network namespace: each ``containerPort`` (and the image's fixed ``MASTER_PORT``) is
  mapped to a free port on 127.0.0.1, like a port-forward (:func:`map_pod_ports`);
- its mounts: where the kernel lets us (root, ``unshare``), the process runs in a private mount
  namespace in which ``readOnly`` volumes and, with ``readOnlyRootFilesystem``, the root
  filesystem are really read-only; the emptyDir mounted at ``/tmp`` is mounted over ``/tmp``
  as in the pod. Otherwise read-only volumes are only ``chmod a-w`` (enough for a non-root
  user).

The one substitution of the engine itself — the CPU backend for ``sendnn`` — is made in
:func:`substitute_cpu_backend` and nowhere else.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from spyre_engine.testing.process import EngineProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "engine" / "Containerfile"
#: Where the image installs its virtualenv (engine/Containerfile); our .venv stands in for it.
IMAGE_VENV = "/opt/engine"
#: PATH of the UBI base image before the Containerfile prepends the venv.
BASE_IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Image env values that are loopback ports inside the pod's own network namespace.
POD_LOOPBACK_PORT_ENV = ("MASTER_PORT",)

#: The compile backend the Spyre cards use, and what stands in for it on a machine without them.
SPYRE_BACKEND = "sendnn"
#: What the precompile Job compiles sendnn artifacts with (on a CPU node, but torch_sendnn).
SPYRE_COMPILE_ONLY_BACKEND = "sendnn_compile_only"
CPU_BACKEND = "eager"
CPU_BACKENDS = frozenset({"eager", "inductor"})


# --------------------------------------------------------------------------- the image


@dataclass(frozen=True)
class ImageConfig:
    """The final stage of a Containerfile: what a container starts with before the pod spec."""

    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    workdir: str
    user: str


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.partition(" ")
        yield word.upper(), rest.strip()
        logical = ""


def _exec_form(value: str) -> list[str]:
    import json

    if value.startswith("["):
        return [str(v) for v in json.loads(value)]
    return ["/bin/sh", "-c", value]


def _expand(value: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), value)


def parse_containerfile(path: Path = CONTAINERFILE) -> ImageConfig:
    """ENTRYPOINT, CMD, ENV, WORKDIR and USER of the last stage of ``path``."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {"PATH": BASE_IMAGE_PATH}
    workdir, user = "/", "0"
    for word, rest in _instructions(path.read_text()):
        if word == "FROM":  # a new stage starts from its base image
            entrypoint, cmd, env, workdir, user = [], [], {"PATH": BASE_IMAGE_PATH}, "/", "0"
        elif word == "ENV":
            for token in shlex.split(rest):
                key, sep, value = token.partition("=")
                if not sep:
                    raise ValueError(f"ENV {rest!r}: only KEY=VALUE form is supported")
                env[key] = _expand(value, env)
        elif word == "ENTRYPOINT":
            entrypoint = _exec_form(rest)
        elif word == "CMD":
            cmd = _exec_form(rest)
        elif word == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / _expand(rest, env))
        elif word == "USER":
            user = rest
    return ImageConfig(entrypoint, cmd, env, workdir, user)


def container_argv(image: ImageConfig, container: Mapping[str, Any]) -> list[str]:
    """What the runtime executes: Kubernetes' command/args over the image's ENTRYPOINT/CMD."""
    command = container.get("command")
    args = container.get("args")
    if command:
        return [*command, *(args or [])]
    return [*image.entrypoint, *(args if args is not None else image.cmd)]


# --------------------------------------------------------------------------- the one substitution


def substitute_cpu_backend(
    args: list[str], env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """THE substitution: the CPU backend stands in for ``sendnn`` (no Spyre cards here).

    Replaces ``--backend sendnn`` (serving) or ``sendnn_compile_only`` (the precompile Job) and
    the same ``SENDNN_INFERENCE_DYNAMO_BACKEND`` (image or pod env): both need torch_sendnn.
    A spec that already selects a CPU backend (``inductor``, ``eager``) runs as written.
    Everything else the container gets is exactly what the operator wrote.
    """
    out = list(args)
    positions = [i for i, a in enumerate(out[:-1]) if a == "--backend"]
    assert len(positions) == 1, f"expected one --backend flag in {args}"
    backend = out[positions[0] + 1]
    new_env = dict(env)
    if backend in CPU_BACKENDS:
        assert new_env.get("SENDNN_INFERENCE_DYNAMO_BACKEND") == backend, new_env
        return out, new_env
    spyre = (SPYRE_BACKEND, SPYRE_COMPILE_ONLY_BACKEND)
    assert backend in spyre, f"the spec selects {backend}, which nothing here can run"
    out[positions[0] + 1] = CPU_BACKEND
    if new_env.get("SENDNN_INFERENCE_DYNAMO_BACKEND") in spyre:
        new_env["SENDNN_INFERENCE_DYNAMO_BACKEND"] = CPU_BACKEND
    return out, new_env


# --------------------------------------------------------------------------- the pod's network


def map_pod_ports(
    container: Mapping[str, Any], args: list[str], env: dict[str, str]
) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """Emulate the pod's network namespace: container ports and loopback ports -> free ports.

    Returns the rewritten args and env and ``{port name or number: local port}`` for probes.
    ``--port N`` is rewritten only when N is a declared containerPort, so a spec whose
    ``--port`` and ``containerPort`` disagree still fails its probes here.
    """
    ports: dict[str, int] = {}
    by_number: dict[int, int] = {}
    for p in container.get("ports") or []:
        local = free_port()
        by_number[int(p["containerPort"])] = local
        ports[str(p["containerPort"])] = local
        if p.get("name"):
            ports[p["name"]] = local
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a == "--port" and out[i + 1].isdigit() and int(out[i + 1]) in by_number:
            out[i + 1] = str(by_number[int(out[i + 1])])
    new_env = dict(env)
    for name in POD_LOOPBACK_PORT_ENV:
        if new_env.get(name, "").isdigit():
            new_env[name] = str(free_port())
    return out, new_env, ports


# --------------------------------------------------------------------------- env


def _field(obj: Mapping[str, Any], path: str) -> str:
    """A downward-API fieldPath (``metadata.name``, ``metadata.labels['k']``) of ``obj``."""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str(obj["metadata"].get(m.group(1), {})[m.group(2)])
    value: Any = obj
    for part in path.split("."):
        value = value[part]
    return str(value)


def resolve_env(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """``env`` of ``container`` with ``valueFrom.fieldRef`` resolved against the real ``pod``."""
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            out[e["name"]] = _expand_k8s(e["value"], out)
        elif "fieldRef" in (e.get("valueFrom") or {}):
            out[e["name"]] = _field(pod, e["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            raise AssertionError(f"env {e['name']}: unsupported source {e.get('valueFrom')}")
    return out


def _expand_k8s(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion of earlier env entries."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value
    )


# --------------------------------------------------------------------------- mounts


@dataclass
class Mount:
    """One volume mount of the container and the host directory that plays it."""

    mount_path: str
    host: Path
    read_only: bool


@dataclass
class LocalPod:
    """The host side of one container: its mounts, rewrites and termination-message file."""

    root: Path
    mounts: list[Mount] = field(default_factory=list)
    termination_log: Path | None = None
    workdir: Path | None = None

    def host_path(self, value: str) -> str | None:
        """``value`` rewritten to the host when it is a path the container can see."""
        if not value.startswith("/"):
            return None
        best: Mount | None = None
        for m in self.mounts:
            if value == m.mount_path or value.startswith(m.mount_path.rstrip("/") + "/"):
                if best is None or len(m.mount_path) > len(best.mount_path):
                    best = m
        if best is not None:
            return str(best.host) + value[len(best.mount_path.rstrip("/")) :]
        return None


def rewrite_paths(
    pod: LocalPod, args: list[str], env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """Rewrite container paths in args (``X`` and ``--flag=X``) and env values to the host.

    A path no mount, image dir or termination file explains is an error: the container would
    reference something that does not exist in the pod.
    """

    def one(value: str, where: str) -> str:
        if not value.startswith("/"):
            return value
        host = pod.host_path(value)
        if host is None:
            raise AssertionError(f"{where}: {value} is not under any volume mount of the pod")
        return host

    new_args = []
    for a in args:
        if a.startswith("--") and "=" in a:
            flag, _, value = a.partition("=")
            new_args.append(f"{flag}={one(value, a)}")
        else:
            new_args.append(one(a, "args"))
    new_env = {k: (v if k == "PATH" else one(v, f"env {k}")) for k, v in env.items()}
    return new_args, new_env


def make_readonly(path: Path) -> None:
    """chmod a-w recursively (the fallback when no mount namespace is available)."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            p = Path(root) / name
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def make_writable(path: Path) -> None:
    """Undo :func:`make_readonly`."""
    path.chmod(path.stat().st_mode | stat.S_IWUSR)
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def mount_namespace_available() -> bool:
    """Whether we may run a child in its own mount namespace with bind mounts (root + unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "--bind", "/", "/mnt"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return probe.returncode == 0


def tmp_mount_covers_tmp(pod: LocalPod) -> bool:
    """Whether the pod's /tmp emptyDir can be mounted over /tmp without hiding a volume."""
    hosts = [str(m.host) for m in pod.mounts] + [str(pod.termination_log)]
    hosts.append(sys.prefix)  # the venv standing in for the image, and the editable sources
    hosts.append(str(Path(__file__).resolve().parents[2]))
    return not any(h.startswith("/tmp/") for h in hosts)


def mount_namespace_prefix(pod: LocalPod, read_only_root: bool) -> list[str]:
    """``unshare … sh -c`` that sets up the pod's mounts, then execs the container's argv.

    Every writable volume is bound onto itself (so it stays writable), every readOnly volume is
    bound and remounted read-only, the root filesystem is remounted read-only when the container
    asks for it, and the emptyDir at ``/tmp`` is mounted over ``/tmp`` as in the pod.
    """
    steps = []
    writable = [m for m in pod.mounts if not m.read_only and m.mount_path != "/dev/shm"]
    for m in writable:
        steps.append(f"mount --bind {shlex.quote(str(m.host))} {shlex.quote(str(m.host))}")
    if pod.termination_log is not None:
        t = shlex.quote(str(pod.termination_log))
        steps.append(f"mount --bind {t} {t}")
    for m in pod.mounts:
        if m.read_only:
            h = shlex.quote(str(m.host))
            steps.append(f"mount --bind {h} {h} && mount -o remount,bind,ro {h}")
    if read_only_root:
        steps.append("mount -o remount,bind,ro /")
    for m in writable:
        # (Not when a volume's directory is itself under /tmp: the mount would hide it.)
        if m.mount_path == "/tmp" and tmp_mount_covers_tmp(pod):
            steps.append(f"mount --bind {shlex.quote(str(m.host))} /tmp")
    script = " && ".join(steps) + ' && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "pod"]


# --------------------------------------------------------------------------- the process


class ContainerProcess(EngineProcess):
    """A container of a pod spec as a local process group (kill and probe from EngineProcess)."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        ports: Mapping[str, int],
        termination_log: Path | None,
    ) -> None:
        self.argv = argv
        self.local: LocalPod | None = None
        self.ports = dict(ports)
        self.port = next(iter(self.ports.values()), None)
        self.termination_log = termination_log
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def termination_message(self) -> str:
        """What the kubelet would put in ``state.terminated.message`` (FallbackToLogsOnError)."""
        text = ""
        if self.termination_log is not None and self.termination_log.exists():
            text = self.termination_log.read_text()
        if not text.strip() and self.proc.returncode not in (None, 0):
            text = self.log_tail(80)
        return text[-4096:]

    def http_get(self, probe: Mapping[str, Any], timeout: float | None = None) -> int:
        """Call an ``httpGet`` probe as the kubelet does: named port resolved, its timeout."""
        get = probe["httpGet"]
        port = self.ports[str(get["port"])]
        scheme = (get.get("scheme") or "HTTP").lower()
        url = f"{scheme}://127.0.0.1:{port}{get.get('path', '/')}"
        t = timeout if timeout is not None else float(probe.get("timeoutSeconds", 1))
        try:
            with urllib.request.urlopen(url, timeout=t) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            return 0

    def wait_probe(self, probe: Mapping[str, Any], budget: float, period: float = 0.5) -> float:
        """Poll ``probe`` until it passes (kubelet: 200–399); seconds waited, raise with the log.

        The kubelet's own budget is ``failureThreshold × periodSeconds``; ``budget`` caps it so
        a test cannot hang, and polling is faster than ``periodSeconds`` to save time.
        """
        kubelet_budget = int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10))
        deadline = time.monotonic() + min(budget, kubelet_budget)
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"container exited with {self.proc.returncode} before "
                    f"{probe['httpGet']['path']} passed:\n{self.log_tail()}"
                )
            if 200 <= self.http_get(probe) < 400:
                return time.monotonic() - t0
            time.sleep(period)
        raise AssertionError(
            f"{probe['httpGet']['path']} did not pass within {min(budget, kubelet_budget):.0f}s:"
            f"\n{self.log_tail()}"
        )

    def sigterm(self) -> float:
        """SIGTERM to the container's PID 1 only, as the kubelet's runtime does."""
        self.proc.send_signal(signal.SIGTERM)
        return time.monotonic()


def run_to_completion(proc: ContainerProcess, timeout: float) -> int:
    """Wait for a run-to-completion container (a Job's); kill it on timeout."""
    try:
        return proc.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(
            f"container did not finish in {timeout:.0f}s:\n{proc.log_tail()}"
        ) from None
    finally:
        if not proc._log.closed:
            proc._log.close()


def start_container(
    *,
    image: ImageConfig,
    pod: Mapping[str, Any],
    container_name: str,
    volume_hosts: Mapping[str, Path],
    scratch: Path,
    log_path: Path,
    use_mount_namespace: bool,
) -> ContainerProcess:
    """Start ``container_name`` of the real ``pod`` (spec from the API server) locally.

    ``volume_hosts`` maps each pod volume name to the host directory that plays it.
    """
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == container_name)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    local = LocalPod(root=scratch)
    for vm in container.get("volumeMounts") or []:
        vol = volumes[vm["name"]]
        ro = bool(vm.get("readOnly")) or bool(
            (vol.get("persistentVolumeClaim") or {}).get("readOnly")
        )
        host = volume_hosts[vm["name"]]
        if vm.get("subPath"):
            host = host / vm["subPath"]
        local.mounts.append(Mount(vm["mountPath"], host, ro))
    # The kubelet bind-mounts a fresh file at terminationMessagePath.
    term_path = container.get("terminationMessagePath") or "/dev/termination-log"
    local.termination_log = scratch / "termination-log"
    local.termination_log.write_text("")
    local.mounts.append(Mount(term_path, local.termination_log, False))
    # The image: our virtualenv plays /opt/engine; the image's WORKDIR is part of its root fs.
    local.mounts.append(Mount(IMAGE_VENV, Path(sys.prefix), True))
    workdir = container.get("workingDir") or image.workdir
    rootfs = scratch / "rootfs"
    local.workdir = rootfs / workdir.lstrip("/")
    local.workdir.mkdir(parents=True, exist_ok=True)
    local.mounts.append(Mount(workdir, local.workdir, False))

    env = {**image.env, **resolve_env(container, pod)}
    argv = container_argv(image, container)
    argv, env = substitute_cpu_backend(argv, env)
    argv, env, ports = map_pod_ports(container, argv, env)
    argv, env = rewrite_paths(local, argv, env)
    # The runtime resolves argv[0] on the container's PATH (the image venv's bin first).
    exe = shutil.which(
        argv[0],
        path=":".join(local.host_path(p) or p for p in env.get("PATH", BASE_IMAGE_PATH).split(":")),
    )
    assert exe, f"{argv[0]} is not on the image's PATH {env.get('PATH')}"
    argv[0] = exe
    env["PATH"] = ":".join(local.host_path(p) or p for p in env["PATH"].split(":"))

    read_only_root = bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))
    # The image's root filesystem (and its WORKDIR) is read-only when the container says so;
    # the venv standing in for the image is never written by a well-behaved container.
    local.mounts = [
        m if m.host != local.workdir else Mount(m.mount_path, m.host, read_only_root)
        for m in local.mounts
    ]
    if use_mount_namespace and not tmp_mount_covers_tmp(local):
        # The checkout (or the venv) lives under /tmp, so the pod's /tmp emptyDir cannot be
        # mounted over /tmp without hiding it, and with a read-only root the engine (and the
        # plugin, which writes literal /tmp paths) could not write temporary files. Use the
        # permissions-only mode instead.
        use_mount_namespace = False
    if use_mount_namespace:
        argv = [*mount_namespace_prefix(local, read_only_root), *argv]
    else:
        # Permissions only: a claim another container mounted read-only is writable again here.
        for m in local.mounts:
            if m.host in (Path(sys.prefix), Path("/dev/shm")) or not m.host.is_dir():
                continue
            if m.read_only:
                make_readonly(m.host)
            else:
                make_writable(m.host)
    proc = ContainerProcess(
        argv,
        env=env,
        cwd=local.workdir,
        log_path=log_path,
        ports=ports,
        termination_log=local.termination_log,
    )
    proc.local = local
    #: Whether readOnly mounts were really read-only (mount namespace), not just chmod-ed.
    proc.read_only_enforced = use_mount_namespace
    return proc
