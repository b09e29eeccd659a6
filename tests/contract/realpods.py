"""Helpers for the contract and real-pod tests, on top of ``tests/realpods/support.py``.

The operator runs as a local process (as in the integration tests) against the local control
plane; the precompile Jobs and serving Deployments it writes run on ``spyre-real-0`` with the
engine image built by ``tests/images`` (real vLLM + the Spyre plugin, CPU backend ``eager``).

- :class:`RealEnv` / :func:`real_env_fixture`: a module's PodSecurity-restricted namespace, the
  engine image imported, the ``models`` claim (``pvc://models/tiny`` and a weightless
  ``pvc://models/no-weights``), an operator watching only that namespace, and a client pod.
- :func:`model_spec`: support's tiny-model spec with small resource requests (two engine pods
  fit on the node's 2 CPUs) and ``maxSurge: 1``.
- :class:`Client`: ``client.py`` run in the client pod (``kubectl exec``): Service names
  resolve (cluster DNS) and route through kube-proxy from there (the host is outside the
  node's network).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.node import RealNode
from tests.integration.conftest import CRD_FILE, Kube, OperatorProcess
from tests.realpods import support

CLIENT_SRC = (Path(__file__).resolve().parent / "client.py").read_text()
MODEL_CLAIM = support.MODEL_CLAIM
MODEL_PATH = support.MODEL_PATH
#: A model directory with config and tokenizer but no weights: the precompile really fails.
NO_WEIGHTS_PATH = "no-weights"
SERVED_NAME = support.SERVED_NAME
#: Job or pod start-up on 2 shared cores (image in containerd): vLLM boots in 30 s - 3 min.
READY_TIMEOUT = 900.0
#: Small requests: the node has 2 CPUs; with maxSurge 1 two engine pods run at once.
SMALL = {"requests": {"cpu": "100m", "memory": "512Mi"}}
#: A listed model id (its shape resolves without config.json) for pods that never download.
HF_MODEL = "hf://ibm-granite/granite-3.3-8b-instruct"
#: A local image name no registry serves: the real kubelet's pull fails, nothing leaves.
MISSING_IMAGE = "localhost/spyre-engine:does-not-exist"
#: No automatic retry of a failed compile during a test (it would reset the failure).
TEST_OPERATOR_ENV = {"SPYRE_COMPILE_RETRY_BASE_SECONDS": "900"}


def start_operator(cp: ControlPlane, namespace: str, env: dict[str, str] | None = None,
                   args: list[str] | None = None) -> OperatorProcess:
    """The operator (and its CRD) as a local process, watching only ``namespace``; ``env``
    adds to its environment, ``args`` to its command line."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cp.wait_established("spyremodels.serving.spyre.dev")
    op = OperatorProcess(
        cp.kubeconfig, cp.root / ".cluster" / "logs",
        # Its own namespace only, so no leader election: the Lease is one per cluster, and
        # operators of other namespaces (other modules, a demo) would block this one.
        # The namespace emulates OpenShift's restricted-v2 (support.ensure_namespace): the
        # platform assigns every pod's uid, as the chart's podUser: assigned asks.
        args=["--namespace", namespace, "--no-leader-elect", "--pod-user", "assigned",
              *(args or [])],
        env={**TEST_OPERATOR_ENV, **(env or {})},
    )
    op.start()
    return op


def _no_weights_dir() -> Path:
    src = support.tiny_model_dir()
    dest = src.parent / f"{src.name}-{NO_WEIGHTS_PATH}"
    if not dest.exists():
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
        os.replace(tmp, dest)
    return dest


def model_spec(image: str, path: str = MODEL_PATH, **override: Any) -> dict[str, Any]:
    """A SpyreModel spec for the real node (support's), small requests, ``maxSurge: 1``,
    a 10 s drain; ``override`` is deep-merged last."""
    return support.tiny_model_spec(
        image, f"pvc://{MODEL_CLAIM}/{path}",
        shape={"maxModelLen": 256, "maxNumSeqs": 2, "maxNumBatchedTokens": 128},
        override=support.deep_merge({
            "serving": {"resources": SMALL, "rollout": {"maxSurge": 1, "maxUnavailable": 0}},
            "precompile": {"resources": SMALL, "backoffLimit": 0},
        }, override),
    )  # fmt: skip


def completion_body(max_tokens: int = 8, stream: bool = False, prompt: str = "hello world") -> str:
    return json.dumps({"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": stream})  # fmt: skip


class Client:
    """``client.py`` in the namespace's client pod (support.ensure_client_pod)."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.ns = cp, namespace
        self.base = [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig),
                     "exec", "-n", namespace]  # fmt: skip

    def _argv(self, *args: str, stdin: bool = False) -> list[str]:
        return [*self.base, *(["-i"] if stdin else []), support.CLIENT_POD, "--",
                "python3", "-c", CLIENT_SRC, *args]  # fmt: skip

    def run(self, *args: str, timeout: float = 300) -> dict[str, Any]:
        r = subprocess.run(self._argv(*args), capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"client failed ({r.returncode}): {r.stderr[-2000:]}"
        return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def complete(self, url: str, max_tokens: int = 8) -> dict[str, Any]:
        return self.run("once", f"{url}/v1/completions", completion_body(max_tokens))

    def wait_routed(self, url: str, timeout: float = 60) -> None:
        """Until a completion through the Service at ``url`` answers 200. Ready says a serving
        pod is Ready; the node's kube-proxy routes the Service a moment later (it follows the
        EndpointSlice, syncing at most once a second), and a connection before then is refused.
        Load of which every request must succeed starts after this (a full run once saw six
        requests refused in the first 150 ms)."""
        def answered() -> bool:
            r = self.complete(url, max_tokens=1)
            if r["status"] != 200:
                raise ConnectionError(f"{url}: {r}")  # not yet (wait_until names the last one)
            return True

        wait_until(answered, timeout, f"{url} answering through its Service", interval=0.5)

    def start(self, *args: str) -> subprocess.Popen[str]:
        """A long-running client; it stops when its stdin is closed."""
        return subprocess.Popen(self._argv(*args, stdin=True), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stream(self, url: str, max_tokens: int) -> StreamCall:
        return StreamCall(self, url, max_tokens)


class StreamCall:
    """One streaming completion in the background; :meth:`result` waits for its end."""

    def __init__(self, client: Client, url: str, max_tokens: int) -> None:
        self.proc = client.start("stream", f"{url}/v1/completions",
                                 completion_body(max_tokens, stream=True))  # fmt: skip
        self.started = threading.Event()
        self.lines: list[str] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("started"):
                self.started.set()
            else:
                self.lines.append(line)

    def result(self, timeout: float = 300) -> dict[str, Any]:
        self.t.join(timeout)
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        assert self.lines, f"no result from the stream client: {self.proc.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        return json.loads(self.lines[-1])  # type: ignore[no-any-return]


def _pod_line(pod: dict[str, Any]) -> str:
    md, st = pod.get("metadata") or {}, pod.get("status") or {}
    ready = next((c.get("status") for c in st.get("conditions") or []
                  if c.get("type") == "Ready"), "?")  # fmt: skip
    states = ",".join(next(iter(c.get("state") or {"?": 0}))
                      for c in st.get("containerStatuses") or [])  # fmt: skip
    gone = " deleting" if md.get("deletionTimestamp") else ""
    return (f"pod {md.get('name')} ip={st.get('podIP')} {st.get('phase')} ready={ready} "
            f"containers={states or '-'}{gone}")


def _slice_line(es: dict[str, Any]) -> str:
    eps = []
    for ep in es.get("endpoints") or []:
        c = ep.get("conditions") or {}
        flags = "".join(f for f, k in (("R", "ready"), ("S", "serving"), ("T", "terminating"))
                        if c.get(k))  # fmt: skip
        eps.append(f"{','.join(ep.get('addresses') or [])}[{flags or '-'}]"
                   f"({(ep.get('targetRef') or {}).get('name')})")
    svc = ((es.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name")
    return f"slice of {svc}: {' '.join(eps) or 'no endpoints'}"


class Timeline:
    """What the control plane said about a namespace's pods and EndpointSlices, with the
    time each change arrived (``kubectl get -w``): a request that failed during a roll is
    explained by the endpoints and pods of the seconds around it (:meth:`around`)."""

    KINDS = {"pods": _pod_line, "endpointslices": _slice_line, "services": lambda s: (
        f"service {s['metadata']['name']} clusterIP={(s.get('spec') or {}).get('clusterIP')}")}

    #: every watch still running, killed at exit if a test never stopped its Timeline
    live: set[subprocess.Popen[str]] = set()
    #: the running Timelines by (kubeconfig, namespace) (:meth:`shared`): several Steadys at
    #: once on one namespace (the autoscaling tests) share one set of watches instead of
    #: starting three kubectl processes each.
    _shared: dict[tuple[str, str], Timeline] = {}  # noqa: RUF012 - shared on purpose

    @classmethod
    def shared(cls, cp: ControlPlane, namespace: str) -> Timeline:
        """The namespace's running Timeline, or a new one; each call needs a :meth:`stop`."""
        key = (str(cp.kubeconfig), namespace)
        timeline = cls._shared.get(key)
        if timeline is None:
            timeline = cls._shared[key] = cls(cp, namespace)
            timeline._key = key
        timeline._users += 1
        return timeline

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self._key: tuple[str, str] | None = None  # set by shared()
        self._users = 0
        self.events: list[tuple[float, str]] = []
        self.procs: list[subprocess.Popen[str]] = []
        for kind, line in self.KINDS.items():
            proc = subprocess.Popen(
                [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), "get", kind,
                 "-n", namespace, "-w", "--output-watch-events", "-o", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
            self.procs.append(proc)
            Timeline.live.add(proc)
            threading.Thread(target=self._read, args=(proc, line), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str], line: Callable[[dict[str, Any]], str]) -> None:
        decoder, buf = json.JSONDecoder(), ""
        assert proc.stdout is not None
        for chunk in proc.stdout:
            buf += chunk
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break  # an event split across lines: read on
                buf = buf.lstrip()[end:]
                with contextlib.suppress(Exception):
                    self.events.append(
                        (time.time(), f"{event.get('type')} {line(event.get('object') or {})}"))

    def around(self, t0: float, t1: float, before: float = 15.0, after: float = 3.0) -> str:
        return "\n".join(f"  {t - t0:+7.2f}s {what}" for t, what in list(self.events)
                         if t0 - before <= t <= t1 + after)  # fmt: skip

    def stop(self) -> None:
        """Stop the watches (of a shared Timeline: once its last user stopped it)."""
        if self._key is not None:
            self._users -= 1
            if self._users > 0:
                return
            Timeline._shared.pop(self._key, None)
        for proc in self.procs:
            proc.kill()
            proc.wait(10)
            Timeline.live.discard(proc)

    @staticmethod
    def _kill_live() -> None:
        for proc in list(Timeline.live):
            proc.kill()


atexit.register(Timeline._kill_live)


def _in_node_net(cp: ControlPlane, *argv: str) -> subprocess.CompletedProcess[str] | None:
    """``argv`` in the real node's network namespace (None: the node is not running)."""
    pid = cp.node.pid()
    if pid is None:
        return None
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def node_network(cp: ControlPlane, service: str) -> str:
    """The real node's view, for a request that failed to connect: the pod bridge's neighbour
    table (a FAILED entry is an address nothing answered for), the Service's NAT rules
    (kube-proxy's endpoints), the conntrack entries not closed cleanly and kube-proxy's last
    log lines."""
    from tests.cluster.node import BRIDGE

    pid = cp.node.pid()
    if pid is None:
        return "(the node is not running)"
    net = ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]
    out = []
    for what, argv in (("neighbours", [*net, "ip", "neigh", "show", "dev", BRIDGE]),
                       ("NAT rules", [*net, "iptables-save", "-t", "nat"])):  # fmt: skip
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        lines = r.stdout.splitlines()
        if what == "NAT rules":  # the Service's chains only (its name is in their comments)
            lines = [ln for ln in lines if service in ln]
        out.append(f"{what}:\n  " + "\n  ".join(lines[-40:] or [r.stderr.strip()]))
    listed = _in_node_net(cp, "conntrack", "-L", "-p", "tcp")
    if listed is not None:  # entries not closed cleanly: where a reused source port would go
        lines = [ln for ln in listed.stdout.splitlines()
                 if "TIME_WAIT" not in ln and ("UNREPLIED" in ln or "ESTABLISHED" in ln
                                               or "SYN_SENT" in ln)]  # fmt: skip
        out.append("conntrack (not closed):\n  " + "\n  ".join(lines[-30:] or ["(none)"]))
    log = cp.logs / "node-kube-proxy.log"
    if log.exists():
        out.append("kube-proxy:\n  " + "\n  ".join(log.read_text(errors="replace")
                                                   .splitlines()[-15:]))  # fmt: skip
    return "\n".join(out)


class Steady:
    """A client sending completions through a Service one after another, the whole time;
    a :class:`Timeline` of the namespace beside it explains a failed request (:meth:`explain`)."""

    def __init__(self, client: Client, url: str, max_tokens: int = 4, pause: float = 0.1) -> None:
        self.cp, self.service = client.cp, urlsplit(url).hostname.split(".")[0]  # type: ignore[union-attr]
        self.timeline = Timeline.shared(client.cp, client.ns)
        self._timeline_stopped = False
        self.proc = client.start("steady", f"{url}/v1/completions", completion_body(max_tokens),
                                 "--timeout", "60", "--pause", str(pause))  # fmt: skip
        self._results: list[dict[str, Any]] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip().startswith("{"):
                self._results.append(json.loads(line))

    def results(self) -> list[dict[str, Any]]:
        return list(self._results)

    def wait_successes(self, n: int, timeout: float = 120) -> None:
        def answered() -> bool:
            assert self.proc.poll() is None, f"steady client died: {self.proc.stderr.read()}"  # type: ignore[union-attr]
            return sum(r.get("status") == 200 for r in self._results) >= n

        try:
            wait_until(answered, timeout, f"{n} answers", interval=0.5)
        except TimeoutError as e:
            raise AssertionError(f"{e}: {self._results}") from None

    def stop(self) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.t.join(10)
        retried = [r for r in self._results if "connect_retry" in r]
        if retried:  # answered after all, but the first connect found no host: say what was seen
            print(f"[steady] {len(retried)} request(s) connected only at the second attempt:\n"
                  f"{self.explain(retried, limit=2)}", file=sys.stderr)  # fmt: skip
        if not self._timeline_stopped:  # a shared Timeline counts its users' stops
            self._timeline_stopped = True
            self.timeline.stop()
        return self.results()

    def explain(self, bad: list[dict[str, Any]], limit: int = 3) -> str:
        """The first failed requests, each with the namespace's timeline around it (times
        relative to the request's start)."""
        out = []
        for r in bad[:limit]:
            out.append(f"{json.dumps({k: v for k, v in r.items() if k != 'body'})[:600]}\n"
                       f"{self.timeline.around(r['t0'], r.get('t1', r['t0']))}")
        if any(r.get("error") or r.get("connect_error") for r in bad):  # what the node saw
            out.append(node_network(self.cp, self.service))
        return "\n".join(out)


def failures(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("status") != 200]


def connect_retries(results: list[dict[str, Any]]) -> int:
    """How many requests connected only at the second attempt (client.py's connect_retry)."""
    return sum("connect_retry" in r for r in results)


def longest_gap(results: list[dict[str, Any]]) -> float:
    """The longest time without a successful answer (between two successes' ends)."""
    ok = sorted(r["t1"] for r in results if r.get("status") == 200)
    return max((b - a for a, b in zip(ok, ok[1:], strict=False)), default=0.0)


def server_pods(kube: Kube, model: str) -> list[dict[str, Any]]:
    return support.server_pods(kube.cp, kube.ns, model)


def wait_ready(kube: Kube, model: str, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    """Wait for Ready=True (support's poll: fails early on a fatal reason, with diagnostics)."""
    return support.wait_model_ready(kube.cp, kube.ns, model, timeout=timeout)


def describe_pods(kube: Kube) -> str:
    out = []
    for p in kube.items("pods"):
        st = [{k: c.get(k) for k in ("ready", "restartCount", "state", "lastState")}
              for c in p.get("status", {}).get("containerStatuses") or []]  # fmt: skip
        out.append(f"{p['metadata']['name']} {p['status'].get('phase')} {json.dumps(st)[:600]}")
    return "\n".join(out)


def claim_host_dir(cp: ControlPlane, kube: Kube, claim: str) -> Path:
    pvc = kube.get("pvc", claim)
    assert pvc and pvc["spec"].get("volumeName"), f"claim {claim} not bound"
    pv = cp.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
    return Path(pv["spec"]["hostPath"]["path"])


def artifact_host_dir(cp: ControlPlane, kube: Kube, model: dict[str, Any]) -> Path:
    """The artifact's directory on the cache claim's PV, from ``status.artifact``."""
    art = model["status"]["artifact"]
    path = art["path"]
    assert path.startswith("/cache/"), path
    return claim_host_dir(cp, kube, art["claim"]) / path[len("/cache/"):]


def cache_files(path: Path, skip: tuple[str, ...] = ("locks",)) -> set[str]:
    """The files under ``path`` (relative), ``skip``'s directories left out."""
    out: set[str] = set()
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        out.update(os.path.relpath(os.path.join(root, f), path) for f in files)
    return out


def assert_inductor_served_without_compiling(cp: ControlPlane, ns: str, pod: dict[str, Any],
                                             art: Path) -> None:
    """An inductor artifact on the claim (``art``, on the host) holds the compile's graphs,
    and its serving pod ran inductor on a private copy in its /tmp (the claim is read-only
    there) to which it added nothing: a cache miss (a compile at start-up or on a request)
    would have added graphs or kernels to that copy. Nothing was added to the artifact
    after its Job's manifest either."""
    from spyre_engine import manifest

    compiled = cache_files(art / "inductor")
    assert compiled, f"no inductor cache in {art}"
    found = cp.kubectl(
        "exec", "-n", ns, pod["metadata"]["name"], "--", "sh", "-c",
        "cd /tmp && for d in spyre-engine-inductor-*/inductor; do "
        "(cd $d && find . -type f -not -path './locks/*'); done",
    ).stdout  # fmt: skip
    copy = {ln.removeprefix("./") for ln in found.split()}
    assert copy, "no private inductor cache in the pod's /tmp"
    added = copy - compiled
    assert not added, f"serve compiled at start-up: {sorted(added)[:10]}"
    assert not manifest.compare(art, manifest.verify(art)).unlisted
    # Inductor's precompiled C++ header (150 MB), which inductor checks for in every process
    # that loads a kernel: the compile left it in the artifact, and the pod's private /tmp links
    # it instead of rebuilding it (4.5 s of a 41 s start when its TMPDIR was empty).
    assert list(art.glob("tmp/torchinductor_*/precompiled_headers/*.gch")), f"no header in {art}"
    headers = cp.kubectl(
        "exec", "-n", ns, pod["metadata"]["name"], "--", "sh", "-c",
        "cd /tmp && for h in spyre-engine-inductor-*/tmp/torchinductor_*/precompiled_headers/"
        "*.gch; do if [ -L \"$h\" ]; then echo \"link $h\"; else echo \"file $h\"; fi; done",
    ).stdout.split("\n")  # fmt: skip
    headers = [h for h in headers if h and not h.endswith("*.gch")]
    assert headers, "the pod's private TMPDIR lacks the artifact's precompiled header"
    assert all(h.startswith("link ") for h in headers), f"serve rebuilt the header: {headers}"


class ChartOperator:
    """The operator as a site runs it: installed by the Helm chart (its image, its RBAC, its
    restricted pod on the real node) into ``<namespace>-op``, watching only ``namespace``,
    with ``podUser: assigned`` in namespaces that emulate OpenShift's restricted-v2 SCC.
    ``env`` becomes ``operator.extraEnv``; :meth:`upgrade` is a ``helm upgrade`` with more
    values (e.g. ``defaults.engineImage``), as a site changes its settings."""

    def __init__(self, cp: ControlPlane, namespace: str, env: dict[str, str] | None = None,
                 values: dict[str, Any] | None = None) -> None:
        self.cp, self.namespace = cp, namespace
        self.release_namespace = f"{namespace[:60]}-op"
        self.env = {**TEST_OPERATOR_ENV, **(env or {})}
        self.values: dict[str, Any] = dict(values or {})
        self.pod: dict[str, Any] | None = None

    def start(self) -> None:
        image = support.ensure_images(self.cp.node, ("operator",))["operator"]
        values = support.deep_merge({"operator": {"extraEnv": [
            {"name": k, "value": v} for k, v in sorted(self.env.items())]}}, self.values)
        self.pod = support.install_operator(
            self.cp, self.release_namespace, image, watch_namespaces=[self.namespace],
            values=values, timeout=300)

    def upgrade(self, values: dict[str, Any]) -> None:
        """``helm upgrade`` with ``values`` merged in; returns once the new pod is Ready."""
        self.values = support.deep_merge(self.values, values)
        self.start()

    def restart(self) -> dict[str, Any]:
        """Delete the operator pod (as an eviction or a node drain does); returns its Ready
        successor (a new process: it decides from what the cluster says)."""
        old = {p["metadata"]["name"]
               for p in support.operator_pods(self.cp, self.release_namespace)}
        self.cp.kubectl("delete", "pod", "-n", self.release_namespace, *sorted(old),
                        "--wait=false")

        def successor() -> dict[str, Any] | None:
            pod = support.wait_operator_ready(self.cp, self.release_namespace, timeout=300)
            return pod if pod["metadata"]["name"] not in old else None

        self.pod = wait_until(successor, 300, "the operator's new pod Ready")
        return self.pod

    def stop(self) -> None:
        support.uninstall_operator(self.cp, self.release_namespace)

    def close(self) -> None:
        self.stop()
        self.cp.kubectl("delete", "namespace", self.release_namespace, "--wait=false",
                        "--ignore-not-found", check=False, timeout=30)

    def log_tail(self, n: int = 40) -> str:
        return support.operator_logs(self.cp, self.release_namespace, tail=n)


class RealEnv:
    """One namespace with its operator, the model claim and a client pod.

    The namespace emulates OpenShift's restricted-v2 SCC (support.ensure_namespace). The
    operator is the chart-installed one (:class:`ChartOperator`), so every real-node test
    module exercises the chart's RBAC and its restricted pod, with ``operator_values`` added to
    the chart's values; with ``operator_args`` (the benchmark: its cold-start responder on the
    host) a local process instead."""

    def __init__(self, cp: ControlPlane, node: RealNode, prefix: str,
                 operator_env: dict[str, str] | None = None,
                 operator_args: Callable[[str], list[str]] | None = None,
                 operator_values: dict[str, Any] | None = None) -> None:
        self.cp, self.node = cp, node
        t0 = time.monotonic()
        self.image = support.ensure_images(node, ("engine",))["engine"]
        cp.recycle_pvs()
        self.ns = f"t-{prefix}-{uuid.uuid4().hex[:6]}"
        support.ensure_namespace(cp, self.ns, labels={"spyre.dev/test-namespace": "true"})
        self.kube = Kube(cp, self.ns)
        support.create_model_pvc(cp, self.ns)
        support.create_model_pvc(cp, self.ns, path=NO_WEIGHTS_PATH, model_dir=_no_weights_dir())
        self.op: OperatorProcess | ChartOperator
        if operator_args is not None:
            self.op = start_operator(cp, self.ns, operator_env, operator_args(self.ns))
        else:
            self.op = ChartOperator(cp, self.ns, operator_env, operator_values)
            self.op.start()
        support.ensure_client_pod(cp, self.ns, self.image)
        self.client = Client(cp, self.ns)
        print(f"[{prefix}] namespace {self.ns} ready in {time.monotonic() - t0:.1f}s")

    def close(self) -> None:
        if isinstance(self.op, ChartOperator):
            self.op.close()
        else:
            self.op.stop()
        if os.environ.get("SPYRE_KEEP_REALPODS"):
            print(f"namespace {self.ns} kept (SPYRE_KEEP_REALPODS)")
            return
        self.cp.kubectl("delete", "namespace", self.ns, "--wait=false", "--ignore-not-found",
                        check=False, timeout=30)  # fmt: skip


def real_env_fixture(prefix: str, operator_env: dict[str, str] | None = None) -> Any:
    """A module-scoped ``env`` fixture (:class:`RealEnv`) for a test module; ``operator_env``
    adds to the operator's environment."""
    import pytest

    @pytest.fixture(scope="module", name="env")
    def _env(control_plane: ControlPlane, kubeconfig: Path, real_node: RealNode) -> Any:
        env = RealEnv(control_plane, real_node, prefix, operator_env)
        yield env
        env.close()

    return _env
