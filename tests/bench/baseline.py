"""The API server's limit for the operator benchmark: the same objects, one efficient client.

Run by ``bench_operator.py`` in place of the operator (same namespace set-up, same
``kubectl create`` of N SpyreModels, same watch-based timing), this process writes what the
operator would write for each model and nothing else:

- the objects come from the operator's own pure code (``reconcile.decide`` with the
  operator's builders), so the cache PVC, precompile Job, Deployment, Service and every
  status are byte-for-byte what the operator would apply;
- one lightkube ``AsyncClient`` over HTTP/2, server-side apply, at most ``--workers``
  models in flight (the operator's default is 32 as well);
- per model it writes the Job once, the Service once, the Deployment once the Job is
  Complete, and the status each time ``decide`` says it changed; the shared cache PVC is
  applied by one coalescing task (its owner list grows with every model); it reads the
  finished Job's pods once (the termination message the status carries), like the operator;
- no Events, no leader election, no GET of absent children, no serving-pod LISTs, no
  re-applies: what the operator adds to this is its own overhead.

Watches run on a second client and are not counted (the operator does not count kopf's
watches either). ``/metrics`` uses the operator's metric names, so the benchmark reads both
the same way; ``/healthz`` answers once it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from aiohttp import web
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from spyre_operator import FIELD_MANAGER, GROUP, KIND, VERSION  # noqa: E402
from spyre_operator.api.v1alpha1 import SpyreModelSpec  # noqa: E402
from spyre_operator.control.controller import compact_pod  # noqa: E402
from spyre_operator.decide import Observed, decide  # noqa: E402
from spyre_operator.decide import conditions as C  # noqa: E402
from spyre_operator.desired import names  # noqa: E402
from spyre_operator.desired.plan import plan_model  # noqa: E402
from spyre_operator.kube.apply import Applier, SpyreModelResource  # noqa: E402
from spyre_operator.runtime.metrics import counting_client  # noqa: E402

log = logging.getLogger("baseline")


def _digest(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


class Baseline:
    def __init__(self, kubeconfig: str, namespace: str, workers: int, events: str = "none") -> None:
        cfg = KubeConfig.from_file(kubeconfig)
        self.ns = namespace
        self.workers = workers
        self.requests: Counter[tuple[str, str]] = Counter()
        self.client = counting_client(self.requests, config=cfg, field_manager=FIELD_MANAGER,
                                      timeout=30, http2=True)
        self.watch_client = AsyncClient(cfg, timeout=None, http2=True)
        self.writes: Counter[str] = Counter()
        self.reconciles = 0
        self.models: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.pvcs: dict[str, dict[str, Any]] = {}
        self.written_status: dict[str, dict[str, Any]] = {}
        self.applied: dict[tuple[str, str], str] = {}  # (kind, name) -> digest last applied
        self.job_pods: dict[str, list[dict[str, Any]]] = {}  # Job uid -> compact pods
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.queued: set[str] = set()
        self.active: set[str] = set()
        self.dirty: set[str] = set()
        self.pvc_desired: Any = None
        self.pvc_wake = asyncio.Event()
        #: Events: "none" (the baseline), "each" (one per transition, as the operator posts
        #: them) or "per-write" (one per status write, listing its transitions).
        self.events_mode = events
        self.applier = Applier(self.client)
        self.event_slots = asyncio.Semaphore(8)
        self.pending: set[asyncio.Task[None]] = set()
        #: Transitions decide() reports (what the operator turns into Events), by kind.
        self.transitions: Counter[str] = Counter()

    # ------------------------------------------------------------------ queue

    def add(self, name: str) -> None:
        if name in self.active:
            self.dirty.add(name)
        elif name not in self.queued:
            self.queued.add(name)
            self.queue.put_nowait(name)

    async def worker(self) -> None:
        while True:
            name = await self.queue.get()
            self.queued.discard(name)
            self.active.add(name)
            try:
                await self.reconcile(name)
            except Exception as e:  # noqa: BLE001
                log.warning("reconcile %s: %s: %s", name, type(e).__name__, e)
                asyncio.get_running_loop().call_later(1.0, self.add, name)
            finally:
                self.active.discard(name)
                if name in self.dirty:
                    self.dirty.discard(name)
                    self.add(name)

    # ------------------------------------------------------------------ watches

    async def watch(self, kind: str, res: Any, store: dict[str, dict[str, Any]]) -> None:
        while True:
            try:
                async for typ, obj in self.watch_client.watch(res, namespace=self.ns):
                    d = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
                    name = d["metadata"]["name"]
                    if typ == "DELETED":
                        store.pop(name, None)
                    else:
                        store[name] = d
                    self.route(kind, d)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - re-watch
                log.warning("watch %s: %s", kind, e)
                await asyncio.sleep(0.5)

    def route(self, kind: str, d: dict[str, Any]) -> None:
        if kind == "models":
            self.add(d["metadata"]["name"])
        elif kind == "pvcs":
            for m in list(self.models):  # the claim's phase is in every user's status
                self.add(m)
        else:
            for ref in d["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == KIND:
                    self.add(ref["name"])

    # ------------------------------------------------------------------ reconcile

    def users(self, claim: str) -> list[tuple[Any, Any]]:
        out = []
        for m in self.models.values():
            try:
                spec = SpyreModelSpec.model_validate(m.get("spec") or {})
            except Exception:  # noqa: BLE001
                continue
            p = plan_model(m["metadata"]["name"], self.ns, m["metadata"].get("uid", ""), spec)
            if p.claim == claim and p.claim_managed and p.volume is not None:
                out.append((m["metadata"].get("creationTimestamp") or "", p.owner, p.volume))
        out.sort(key=lambda u: (u[0], u[1].name))
        return [(o, v) for _, o, v in out]

    async def reconcile(self, name: str) -> None:
        model = self.models.get(name)
        if model is None:
            return
        self.reconciles += 1
        if name in self.written_status:
            model = {**model, "status": self.written_status[name]}
        spec = SpyreModelSpec.model_validate(model.get("spec") or {})
        plan = plan_model(name, self.ns, model["metadata"].get("uid", ""), spec)
        job = self.jobs.get(plan.job_name)
        obs = Observed(
            cache_pvc=self.pvcs.get(plan.claim),
            job=job,
            deployment=self.deployments.get(names.server_name(name)),
            job_owners=[plan.owner],
            cache_users=self.users(plan.claim),
        )
        if job is not None and any(
            c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
            for c in (job.get("status") or {}).get("conditions") or []
        ):
            uid = job["metadata"]["uid"]
            if uid not in self.job_pods:
                sel = {"batch.kubernetes.io/controller-uid": uid}
                self.job_pods[uid] = [
                    compact_pod(p.to_dict())
                    async for p in self.client.list(Pod, namespace=self.ns, labels=sel)
                ]
            obs.job_pods = self.job_pods[uid]
        d = decide(model, obs, C.now_rfc3339())
        writes = []
        if d.job is not None and job is None and ("Job", plan.job_name) not in self.applied:
            self.applied[("Job", plan.job_name)] = "created"
            writes.append(self.apply(d.job, "Job"))
        for obj in d.apply:
            if obj.kind == "PersistentVolumeClaim":
                self.pvc_desired = obj
                self.pvc_wake.set()
                continue
            writes.append(self.apply_once(obj))
        await asyncio.gather(*writes)
        if d.status != model.get("status"):
            st = SpyreModelResource.Status(
                apiVersion=f"{GROUP}/{VERSION}", kind=KIND,
                metadata={"name": name, "namespace": self.ns}, status=d.status,
            )  # fmt: skip
            await self.client.apply(st, field_manager=FIELD_MANAGER, force=True)
            self.writes["apply SpyreModel/status"] += 1
            self.written_status[name] = d.status
            self.post_events(model, d.events)

    def post_events(self, model: dict[str, Any], events: list[tuple[str, str, str]]) -> None:
        """Count the transitions; post them as Events if asked (in the background, 8 at once)."""
        initial = not (model.get("status") or {}).get("conditions")
        for _, reason, _ in events:
            self.transitions[f"{'initial' if initial else 'later'} {reason}"] += 1
        if not events or self.events_mode == "none":
            return
        if self.events_mode == "per-write":
            type_ = "Warning" if any(t == "Warning" for t, _, _ in events) else "Normal"
            reason = next((r for t, r, _ in events if t == type_), events[0][1])
            events = [(type_, reason, "; ".join(m for _, _, m in events))]
        for type_, reason, message in events:
            task = asyncio.create_task(self._event(model, type_, reason, message))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def _event(self, model: dict[str, Any], type_: str, reason: str, message: str) -> None:
        async with self.event_slots:
            await self.applier.event(model, type_, reason, message)  # counts "create Event"

    async def apply(self, obj: Any, kind: str) -> None:
        await self.client.apply(obj, field_manager=FIELD_MANAGER, force=True)
        self.writes[f"apply {kind}"] += 1

    async def apply_once(self, obj: Any) -> None:
        key = (obj.kind, obj.metadata.name)
        h = _digest(obj.to_dict())
        if self.applied.get(key) == h:
            return
        self.applied[key] = h
        await self.apply(obj, obj.kind)

    async def pvc_writer(self) -> None:
        """One apply of the shared cache PVC per batch of new users (coalesced)."""
        while True:
            await self.pvc_wake.wait()
            self.pvc_wake.clear()
            obj = self.pvc_desired
            if obj is not None:
                try:
                    await self.apply_once(obj)
                except Exception as e:  # noqa: BLE001
                    log.warning("pvc: %s", e)
                    self.applied.pop((obj.kind, obj.metadata.name), None)
                    self.pvc_wake.set()
                    await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ metrics

    def render(self) -> str:
        lines = [f"spyre_operator_reconciles_total {self.reconciles}"]
        for k, n in sorted(self.transitions.items()):
            when, reason = k.split(" ", 1)
            lines.append(f'baseline_transitions_total{{when="{when}",reason="{reason}"}} {n}')
        for k, n in sorted((self.writes + self.applier.writes).items()):
            verb, kind = k.split(" ", 1)
            lines.append(f'spyre_operator_writes_total{{verb="{verb}",kind="{kind}"}} {n}')
        for (verb, res), n in sorted(self.requests.items()):
            lines.append(f'spyre_operator_api_requests_total{{verb="{verb}",resource="{res}"}} {n}')
        return "\n".join(lines) + "\n"

    async def serve(self, metrics_port: int, health_port: int) -> None:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.render(), content_type="text/plain")

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        routes = ((metrics_port, "/metrics", metrics), (health_port, "/healthz", healthz))
        for port, path, fn in routes:
            app = web.Application()
            app.router.add_get(path, fn)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()

    async def run(self, metrics_port: int, health_port: int) -> None:
        tasks = [
            asyncio.create_task(self.watch("models", SpyreModelResource, self.models)),
            asyncio.create_task(self.watch("jobs", Job, self.jobs)),
            asyncio.create_task(self.watch("deployments", Deployment, self.deployments)),
            asyncio.create_task(self.watch("pvcs", PersistentVolumeClaim, self.pvcs)),
            asyncio.create_task(self.pvc_writer()),
            *(asyncio.create_task(self.worker()) for _ in range(self.workers)),
        ]
        await self.serve(metrics_port, health_port)
        await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--liveness", required=True, help="http://127.0.0.1:PORT/healthz")
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--kubeconfig", default=None)
    ap.add_argument("--events", choices=("none", "each", "per-write"), default="none")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    import os

    kubeconfig = args.kubeconfig or os.environ["KUBECONFIG"]
    b = Baseline(kubeconfig, args.namespace, args.workers, args.events)
    asyncio.run(b.run(args.metrics_port, urlparse(args.liveness).port or 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
