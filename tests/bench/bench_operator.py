"""Operator benchmark on the local control plane (`make bench`, issue 6).

For each N in ``--models`` (default 10,100,500) a fresh operator watches a fresh namespace,
N SpyreModels with distinct artifact keys (different ``maxModelLen``; one shared cache claim)
are created with one ``kubectl create``, and ``kubectl --watch`` subprocesses timestamp every
event on receipt (object timestamps have 1 s resolution). Per model:

  apply -> Job        the SpyreModel's ADDED event to its precompile Job's ADDED event
  Job done -> Deploy  the Job's Complete condition to the Deployment's ADDED event
  apply -> Ready      the SpyreModel's ADDED event to its Ready=True condition

plus the operator's API requests per model (its own ``spyre_operator_api_requests_total``; the
API server's ``apiserver_request_total`` carries no user agent), its writes during an idle
period, peak RSS (VmHWM) and CPU seconds (/proc/<pid>/stat). The table is printed, written as
JSON to ``bench-results/operator-<timestamp>.json`` and, with ``--markdown``, as a table to
``tests/bench/RESULTS.md``.

The bench adds fake Spyre nodes (kwok) with enough cards for N serving pods plus N
precompile pods, and removes them afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.cluster.controlplane import ControlPlane, wait_until  # noqa: E402
from tests.integration.conftest import CRD_FILE, OperatorProcess  # noqa: E402

BASELINE = Path(__file__).resolve().parent / "baseline.py"
#: What watches a namespace in one measurement: the operator, or tests/bench/baseline.py (the
#: same objects written directly by one client) without Events, with Events as the operator
#: posts them (one per transition), or with one Event per status write.
MODES = {
    "operator": None,
    "baseline": "none",
    "baseline+events": "each",
    "baseline+events-per-write": "per-write",
}


class BaselineProcess(OperatorProcess):
    """tests/bench/baseline.py as a child process, with the operator's metric names."""

    def __init__(self, *a: Any, events: str = "none", **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.events = events

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"baseline-{os.getpid()}-{self.starts}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, str(BASELINE), *self.args, "--events", self.events,
             "--metrics-port", str(self.metrics_port),
             "--liveness", f"http://127.0.0.1:{self.health_port}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        wait_until(self._healthy, timeout, "the baseline's health endpoint")

GROUP = "serving.spyre.dev"
BENCH_NODE_LABEL = "spyre.dev/bench-node"
CARDS_PER_NODE = 256
MARKDOWN = ROOT / "tests" / "bench" / "RESULTS.md"

# One line per watch event; kubectl (Go) does the JSON decoding, Python only splits.
JSONPATH = {
    "spyremodels": '{.type}|{.object.metadata.name}|'
    '{.object.status.conditions[?(@.type=="Ready")].status}{"\\n"}',
    "jobs": '{.type}|{.object.metadata.name}|{.object.metadata.ownerReferences[*].name}|'
    '{.object.status.conditions[?(@.type=="Complete")].status}{"\\n"}',
    "deployments": '{.type}|{.object.metadata.name}{"\\n"}',
}


@dataclass
class Timeline:
    """First-seen times (monotonic, on receipt) per model and per Job."""

    model_added: dict[str, float] = field(default_factory=dict)
    model_ready: dict[str, float] = field(default_factory=dict)
    job_added: dict[str, float] = field(default_factory=dict)
    job_done: dict[str, float] = field(default_factory=dict)
    job_owners: dict[str, list[str]] = field(default_factory=dict)
    deployment_added: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_line(self, kind: str, line: str, t: float) -> None:
        parts = line.rstrip("\n").split("|")
        if len(parts) < 2 or parts[0] == "DELETED":
            return
        with self.lock:
            if kind == "spyremodels":
                _, name, ready = (parts + [""])[:3]
                self.model_added.setdefault(name, t)
                if ready == "True":
                    self.model_ready.setdefault(name, t)
            elif kind == "jobs":
                _, name, owners, complete = (parts + ["", ""])[:4]
                self.job_added.setdefault(name, t)
                if owners:
                    self.job_owners[name] = owners.split()
                if complete == "True":
                    self.job_done.setdefault(name, t)
            elif kind == "deployments":
                self.deployment_added.setdefault(parts[1], t)


class Watcher:
    """`kubectl get --watch` for one kind, feeding a Timeline from a reader thread.

    kubectl exits when the API server ends the watch (it did, once, at 500 models); it is
    restarted, and the initial list of the new watch re-reports every object (the Timeline
    keeps first-seen times).
    """

    def __init__(self, cp: ControlPlane, kind: str, namespace: str, tl: Timeline,
                 log_dir: Path) -> None:
        self.argv = [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), "get",
                     kind, "-n", namespace, "--watch", "--output-watch-events",
                     "-o", f"jsonpath={JSONPATH[kind]}"]  # fmt: skip
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr = open(log_dir / f"watch-{namespace}-{kind}.log", "ab")  # noqa: SIM115
        self.restarts = -1
        self.stopped = threading.Event()
        self.proc: subprocess.Popen[str] | None = None
        self.thread = threading.Thread(target=self._run, args=(kind, tl), daemon=True)
        self.thread.start()

    def _run(self, kind: str, tl: Timeline) -> None:
        while not self.stopped.is_set():
            self.restarts += 1
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self.stderr,
                                         text=True, bufsize=1)  # fmt: skip
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                tl.on_line(kind, line, time.monotonic())
            self.proc.wait()
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopped.set()
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        self.thread.join(10)
        self.stderr.close()


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p95 and max (None when empty)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    v = sorted(values)
    p95 = v[min(len(v) - 1, math.ceil(0.95 * len(v)) - 1)]
    return {"n": len(v), "p50": statistics.median(v), "p95": p95, "max": v[-1]}


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user+system) and peak/current RSS of a live process."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    out = {"cpu_seconds": (int(stat[11]) + int(stat[12])) / tick}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            k, v = line.split(":", 1)
            out["peak_rss_mib" if k == "VmHWM" else "rss_mib"] = int(v.split()[0]) / 1024
    return out


def model_doc(name: str, i: int) -> dict[str, Any]:
    """A SpyreModel with its own artifact key (maxModelLen) on the namespace's default cache."""
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "SpyreModel",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
            # distinct keys by length, none a listed shape: the check is off (kwok plays pods)
            "compile": {"maxModelLen": 2048 + 64 * i, "requireKnownConfiguration": False},
            "precompile": {"backoffLimit": 0},
        },
    }


def bench_nodes(cp: ControlPlane, cards: int) -> list[str]:
    """Add fake Spyre nodes (kwok) with at least ``cards`` cards in total."""
    template = next(
        d for d in yaml.safe_load_all((ROOT / "tests/cluster/manifests/nodes.yaml").read_text())
        if d and d["metadata"]["name"] == "spyre-node-0"
    )
    count = max(1, math.ceil(cards / CARDS_PER_NODE))
    docs, names = [], []
    for i in range(count):
        node = json.loads(json.dumps(template))
        name = f"bench-spyre-node-{i}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["labels"][BENCH_NODE_LABEL] = "true"
        for section in ("allocatable", "capacity"):
            node["status"][section].update({
                "ibm.com/spyre_vf": str(CARDS_PER_NODE), "ibm.com/spyre_pf": str(CARDS_PER_NODE),
                "pods": str(2 * CARDS_PER_NODE + 10), "cpu": "1000", "memory": "4Ti",
            })  # fmt: skip
        node["status"]["addresses"][0]["address"] = f"10.241.0.{10 + i}"
        docs.append(node)
        names.append(name)
    cp.apply(docs, "--validate=false")

    def ready() -> bool:
        items = cp.kubectl_json("get", "nodes", "-l", f"{BENCH_NODE_LABEL}=true")["items"]
        return len(items) == count and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            and not any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get(
                "taints") or [])
            for n in items
        )

    wait_until(ready, 60, "the bench nodes to be Ready", interval=0.5)
    return names


def scrape(op: OperatorProcess) -> dict[str, float]:
    try:
        return op.metrics()
    except OSError:
        return {}


def sum_prefix(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def _event_time(e: dict[str, Any]) -> float:
    from datetime import datetime

    t = e.get("eventTime") or e.get("firstTimestamp") or e["metadata"]["creationTimestamp"]
    t = t.replace("Z", "+00:00")
    return datetime.fromisoformat(t).timestamp()


def coalesced(times: list[float], window: float) -> int:
    """Events left if each object's Events within ``window`` s of a group's first become one."""
    groups, start = 0, None
    for t in sorted(times):
        if start is None or t - start > window:
            groups, start = groups + 1, t
    return groups


def namespace_events(cp: ControlPlane, ns: str, path: Path) -> dict[str, Any]:
    """The Events on SpyreModels in ``ns``: by reason, and what aggregating them would leave.

    ``distinct``: what client-go's EventCorrelator would still create (it turns an Event
    identical in object, type, reason and message into a PATCH of the first one's count, which
    is still one request, and only combines >10 similar ones in 10 min). ``coalesced_Ns``:
    one Event per model per N-second window (timestamps have 1 s resolution).
    """
    try:
        items = cp.kubectl_json("get", "events", "-n", ns)["items"]
    except Exception as e:  # noqa: BLE001 - informational
        return {"error": str(e)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items))
    ours = [e for e in items if (e.get("involvedObject") or {}).get("kind") == "SpyreModel"]
    by_reason: dict[str, int] = {}
    per_model: dict[str, list[float]] = {}
    keys = set()
    for e in ours:
        by_reason[e.get("reason", "")] = by_reason.get(e.get("reason", ""), 0) + 1
        obj = e["involvedObject"]["name"]
        per_model.setdefault(obj, []).append(_event_time(e))
        keys.add((obj, e.get("type"), e.get("reason"), e.get("message")))
    return {
        "on_models": len(ours),
        "other": len(items) - len(ours),
        "by_reason": dict(sorted(by_reason.items(), key=lambda kv: -kv[1])),
        "distinct": len(keys),
        **{f"coalesced_{w}s": sum(coalesced(t, w) for t in per_model.values())
           for w in (1, 2, 5, 10)},
    }


def run_one(cp: ControlPlane, n: int, args: argparse.Namespace,
            mode: str = "operator") -> dict[str, Any]:
    """Benchmark N models in a fresh namespace with a fresh operator (or the baseline)."""
    ns = f"bench-{n}-{uuid.uuid4().hex[:5]}"
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_until(lambda: cp.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
               30, "the default ServiceAccount")
    op_args = ["--namespace", ns, "--workers", str(args.workers), "--log-level", "warning"]
    if MODES[mode] is None:
        # No compile or rollout budget: the baseline has none, and with one most of the N
        # models would wait their turn (2 more status writes and Events each; 2.3x the
        # baseline's writes at N=20 with the default budget of 4).
        op = OperatorProcess(cp.kubeconfig, cp.root / ".cluster" / "logs", args=[
            *op_args, "--max-concurrent-compiles", "0", "--max-concurrent-rollouts", "0"])
    else:
        op = BaselineProcess(cp.kubeconfig, cp.root / ".cluster" / "logs", args=op_args,
                             events=MODES[mode])
    op.start()
    assert op.proc is not None
    pid = op.proc.pid
    base = proc_stats(pid)
    components = {c: cp.pid(c) for c in ("kube-apiserver", "etcd", "kube-controller-manager",
                                          "kube-scheduler", "kwok")}
    cp_base = {c: proc_stats(p)["cpu_seconds"] for c, p in components.items() if p}
    m0 = scrape(op)
    spy = None
    if args.py_spy:  # sampling profile of the busy period (collapsed stacks)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        spy = subprocess.Popen([args.py_spy, "record", "-p", str(pid), "-r", "50", "-f", "raw",
                                "-o", f"{args.out}/profile-{n}.txt"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tl = Timeline()
    watchers = [Watcher(cp, kind, ns, tl, Path(args.out)) for kind in JSONPATH]
    time.sleep(1.0)  # the watches are established (their initial lists are empty)
    names = [f"m{i:04d}" for i in range(n)]
    docs = "\n---\n".join(yaml.safe_dump(model_doc(nm, i)) for i, nm in enumerate(names))
    t_start = time.monotonic()
    cp.kubectl("create", "-n", ns, "-f", "-", input=docs, timeout=600)
    t_created = time.monotonic()
    peak = dict(base)
    sampler_stop = threading.Event()

    def sample() -> None:  # VmHWM is already a peak; sampling keeps CPU/RSS of a live pid
        while not sampler_stop.wait(1.0):
            try:
                peak.update(proc_stats(pid))
            except OSError:
                return

    threading.Thread(target=sample, daemon=True).start()
    deadline = t_start + args.timeout
    while time.monotonic() < deadline:
        with tl.lock:
            if len(tl.model_ready) >= n:
                break
        time.sleep(0.2)
    t_all_ready = time.monotonic()
    with tl.lock:
        ready_count = len(tl.model_ready)
    time.sleep(args.settle)
    m_busy = scrape(op)
    t_busy = time.monotonic()
    busy = proc_stats(pid)
    cp_busy = {}
    for c, cpid in components.items():
        try:
            cp_busy[c] = round(proc_stats(cpid)["cpu_seconds"] - cp_base[c], 1) if cpid else None
        except (OSError, KeyError):
            cp_busy[c] = None
    if spy is not None:
        spy.send_signal(2)
        spy.wait(30)
    # idle period: nothing changes; a correct operator writes nothing
    time.sleep(args.idle)
    m_idle = scrape(op)
    idle = proc_stats(pid)
    sampler_stop.set()
    watch_restarts = {kind: w.restarts for kind, w in zip(JSONPATH, watchers, strict=True)}
    for w in watchers:
        w.stop()
    op.stop()

    owner_job = {o: j for j, owners in tl.job_owners.items() for o in owners}
    apply_to_job, done_to_dep, apply_to_ready = [], [], []
    for nm in names:
        t0 = tl.model_added.get(nm)
        job = owner_job.get(nm)
        if t0 is not None and job in tl.job_added:
            apply_to_job.append(tl.job_added[job] - t0)
        if job in tl.job_done and nm in tl.deployment_added:
            done_to_dep.append(tl.deployment_added[nm] - tl.job_done[job])
        if t0 is not None and nm in tl.model_ready:
            apply_to_ready.append(tl.model_ready[nm] - t0)
    first = min(tl.model_added.values(), default=t_start)
    last_ready = max(tl.model_ready.values(), default=t_all_ready)
    requests = sum_prefix(m_busy, "spyre_operator_api_requests_total") - sum_prefix(
        m0, "spyre_operator_api_requests_total")
    writes = sum_prefix(m_busy, "spyre_operator_writes_total") - sum_prefix(
        m0, "spyre_operator_writes_total")
    by_kind = {
        k[len("spyre_operator_api_requests_total"):]: v - m0.get(k, 0)
        for k, v in m_busy.items() if k.startswith("spyre_operator_api_requests_total")
    }
    lease = sum(v for k, v in by_kind.items() if 'resource="leases"' in k)
    transitions = {
        k[len("baseline_transitions_total"):]: v
        for k, v in m_busy.items() if k.startswith("baseline_transitions_total")
    }
    events = namespace_events(cp, ns, Path(args.out) / f"events-{mode}-{ns}.json")
    result = {
        "mode": mode,
        "models": n,
        "namespace": ns,
        "workers": args.workers,
        "ready": ready_count,
        "create_seconds": round(t_created - t_start, 2),
        "all_ready_seconds": round(last_ready - first, 2) if ready_count else None,
        "apply_to_job": percentiles(apply_to_job),
        "job_done_to_deployment": percentiles(done_to_dep),
        "apply_to_ready": percentiles(apply_to_ready),
        "api_requests": requests,
        "api_requests_per_model": round(requests / n, 2),
        "api_requests_by_kind": by_kind,
        "lease_requests": lease,
        "api_requests_ex_lease": requests - lease,
        "api_requests_ex_lease_per_model": round((requests - lease) / n, 2),
        "events": events,
        "transitions": transitions,
        "writes": writes,
        "writes_per_model": round(writes / n, 2),
        "writes_by_kind": {
            k[len("spyre_operator_writes_total"):]: v - m0.get(k, 0)
            for k, v in m_busy.items() if k.startswith("spyre_operator_writes_total")
        },
        "busy_seconds": round(t_busy - t_start, 2),
        "reconciles": m_busy.get("spyre_operator_reconciles_total", 0)
        - m0.get("spyre_operator_reconciles_total", 0),
        "reconcile_errors": m_busy.get("spyre_operator_reconcile_errors_total", 0),
        "idle_seconds": args.idle,
        "idle_writes": sum_prefix(m_idle, "spyre_operator_writes_total")
        - sum_prefix(m_busy, "spyre_operator_writes_total"),
        "idle_requests": sum_prefix(m_idle, "spyre_operator_api_requests_total")
        - sum_prefix(m_busy, "spyre_operator_api_requests_total"),
        "idle_cpu_seconds": round(idle["cpu_seconds"] - busy["cpu_seconds"], 2),
        "cpu_seconds": round(busy["cpu_seconds"] - base["cpu_seconds"], 2),
        "startup_rss_mib": round(base.get("rss_mib", 0), 1),
        "watch_restarts": watch_restarts,
        "control_plane_cpu_seconds": cp_busy,
        "peak_rss_mib": round(max(peak.get("peak_rss_mib", 0), idle.get("peak_rss_mib", 0)), 1),
    }
    cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return result


def fmt(v: float | None, unit: str = "s") -> str:
    return "–" if v is None else f"{v:.2f}{unit}" if unit == "s" else f"{v:.0f}{unit}"


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table of the results (one column per N)."""
    cols = [f"N={r['models']}" for r in results]
    rows: list[tuple[str, list[str]]] = []

    def pct(key: str, label: str) -> None:
        for p in ("p50", "p95", "max"):
            rows.append((f"{label} {p}", [fmt(r[key][p]) for r in results]))

    pct("apply_to_job", "apply → Job")
    pct("job_done_to_deployment", "Job complete → Deployment")
    pct("apply_to_ready", "apply → Ready")
    rows += [
        ("all Ready (first apply → last Ready)",
         [f"{fmt(r['all_ready_seconds'])} ({r['ready']}/{r['models']})" for r in results]),
        ("kubectl create of N models", [fmt(r["create_seconds"]) for r in results]),
        ("  = API server round trip per create",
         [fmt(r["create_seconds"] / r["models"]) for r in results]),
        ("operator API requests / model", [f"{r['api_requests_per_model']:.2f}" for r in results]),
        ("operator writes / model", [f"{r['writes_per_model']:.2f}" for r in results]),
        ("reconciles", [f"{r['reconciles']:.0f}" for r in results]),
        (f"idle writes ({results[0]['idle_seconds']:.0f} s)",
         [f"{r['idle_writes']:.0f}" for r in results]),
        ("idle requests", [f"{r['idle_requests']:.0f}" for r in results]),
        ("operator CPU seconds (to all Ready)", [f"{r['cpu_seconds']:.1f}" for r in results]),
        ("operator peak RSS", [f"{r['peak_rss_mib']:.0f} MiB" for r in results]),
        ("control-plane CPU seconds (same period)",
         [", ".join(f"{c.removeprefix('kube-')} {v:.0f}"
                    for c, v in r["control_plane_cpu_seconds"].items() if v is not None)
          for r in results]),
    ]  # fmt: skip
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {label} | " + " | ".join(vals) + " |" for label, vals in rows]
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def comparison(results: list[dict[str, Any]]) -> str:
    """Operator vs baseline (and Event variants) per N: medians over rounds, and ratios."""
    lines = [
        "| N | mode | runs | all Ready s | apply → Ready p50 s | requests / model (ex. Lease) "
        "| writes / model | Events / model | Lease requests | CPU s (process / apiserver) "
        "| load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for n in sorted({r["models"] for r in results}):
        rows = [r for r in results if r["models"] == n]
        med: dict[str, dict[str, float]] = {}
        for mode in MODES:
            rs = [r for r in rows if r["mode"] == mode]
            if not rs:
                continue
            m = {
                "ready": _median([r["all_ready_seconds"] or float("nan") for r in rs]),
                "p50": _median([r["apply_to_ready"]["p50"] or float("nan") for r in rs]),
                "req": _median([r["api_requests_ex_lease_per_model"] for r in rs]),
                "writes": _median([r["writes_per_model"] for r in rs]),
                "events": _median([(r["events"].get("on_models") or 0) / n for r in rs]),
                "lease": _median([r["lease_requests"] for r in rs]),
                "cpu": _median([r["cpu_seconds"] for r in rs]),
                "api": _median([r["control_plane_cpu_seconds"].get("kube-apiserver") or 0
                                for r in rs]),
            }
            med[mode] = m
            loads = ", ".join(f"{r['load_before']:.1f}" for r in rs)
            lines.append(
                f"| {n} | {mode} | {len(rs)} | {m['ready']:.1f} | {m['p50']:.1f} | "
                f"{m['req']:.2f} | {m['writes']:.2f} | {m['events']:.2f} | {m['lease']:.0f} | "
                f"{m['cpu']:.1f} / {m['api']:.0f} | {loads} |"
            )
        if "operator" in med and "baseline" in med:
            o, b = med["operator"], med["baseline"]
            per_round = []
            for rnd in sorted({r["round"] for r in rows}):
                ro = [r for r in rows if r["round"] == rnd and r["mode"] == "operator"]
                rb = [r for r in rows if r["round"] == rnd and r["mode"] == "baseline"]
                to, tb = (ro[0]["all_ready_seconds"] if ro else None,
                          rb[0]["all_ready_seconds"] if rb else None)
                if to and tb:
                    per_round.append(f"{to / tb:.2f}")
            ratios.append(
                f"| {n} | {o['ready'] / b['ready']:.2f}x ({', '.join(per_round)}) | "
                f"{o['req'] / b['req']:.2f}x | {o['writes'] / b['writes']:.2f}x | "
                f"{o['cpu'] / b['cpu']:.1f}x / {o['api'] / max(b['api'], 1e-9):.2f}x |"
            )
    if ratios:
        lines += [
            "",
            "| N | operator / baseline: all Ready time (per round) | requests (ex. Lease) "
            "| writes | CPU (process / apiserver) |",
            "|---|---|---|---|---|",
            *ratios,
        ]
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().split()[1]
    return (f"{os.cpu_count()} cores ({cpu}), {int(mem) / 2**20:.0f} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


BASELINE_SECTION = "Against the API server's limit: latest run"


def write_markdown(text: str, stamp: str, args: argparse.Namespace,
                   section: str = "Latest run") -> None:
    """Replace the "## <section>" of RESULTS.md (the analysis around it stays)."""
    title = section
    section = (
        f"## {title}\n\nRun {stamp} on {machine()}, operator `--workers {args.workers}`."
        + (f" {args.note}" if args.note else "")
        + "\n\n"
        + text
        + "\n"
    )
    old = MARKDOWN.read_text() if MARKDOWN.exists() else "# Operator benchmark results\n\n"
    if f"## {title}\n" in old:
        before, rest = old.split(f"## {title}\n", 1)
        after = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        MARKDOWN.write_text(before + section + ("\n" + after if after else ""))
    else:
        MARKDOWN.write_text(old.rstrip() + "\n\n" + section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="10,100,500", help="comma-separated N")
    parser.add_argument("--workers", type=int, default=32, help="operator --workers")
    parser.add_argument("--timeout", type=float, default=300, help="per N, apply → all Ready")
    parser.add_argument("--settle", type=float, default=5, help="before the idle period")
    parser.add_argument("--idle", type=float, default=30, help="idle period (seconds)")
    parser.add_argument("--py-spy", default=None, help="py-spy binary: profile the operator")
    parser.add_argument("--out", default=str(ROOT / "bench-results"))
    parser.add_argument("--markdown", action="store_true",
                        help=f"write the table to {MARKDOWN.relative_to(ROOT)}")
    parser.add_argument("--note", default="", help="a line for the markdown (what changed)")
    parser.add_argument("--modes", default="operator,baseline",
                        help=f"comma-separated, run side by side per N: {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat each N; the order of the modes alternates (ABBA)")
    args = parser.parse_args(argv)
    ns_list = [int(x) for x in args.models.split(",") if x.strip()]

    cp = ControlPlane()
    if not cp.healthy():
        print("the local control plane is not running: make cluster-up", file=sys.stderr)
        return 2
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cp.wait_established("spyremodels.serving.spyre.dev")
    cp.recycle_pvs()
    nodes = bench_nodes(cp, 2 * max(ns_list) + 16)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown --modes {sorted(unknown)}; known: {sorted(MODES)}")
    results = []
    runs = 0
    try:
        for n in ns_list:
            for rnd in range(args.rounds):
                # Alternate the order (ABBA...) so drifting machine load hits every mode alike.
                order = modes if runs % 2 == 0 else modes[::-1]
                runs += 1
                for mode in order:
                    print(f"--- {n} models, {mode}, round {rnd + 1}", flush=True)
                    load0 = os.getloadavg()[0]
                    r = run_one(cp, n, args, mode)
                    r["round"] = rnd + 1
                    r["load_before"] = round(load0, 2)
                    r["load_after"] = round(os.getloadavg()[0], 2)
                    results.append(r)
                    print(json.dumps(r, indent=1), flush=True)
                    cp.recycle_pvs()
    finally:
        cp.kubectl("delete", "node", *nodes, "--wait=false", check=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc = {"machine": machine(), "when": stamp, "note": args.note, "results": results}
    path = out / f"operator-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1))
    op_results = [r for r in results if r["mode"] == "operator"]
    text = table(op_results) if op_results else ""
    cmp_text = comparison(results)
    print(text)
    print()
    print(cmp_text)
    print(f"\nwritten to {path}")
    if args.markdown:
        if op_results:
            write_markdown(text, stamp, args)
        write_markdown(cmp_text, stamp, args, section=BASELINE_SECTION)
        print(f"and {MARKDOWN}")
    return 0 if all(r["ready"] == r["models"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
