"""Observation (``Controller.observer``): one model's observed state (reconcile.Observed) from
the caches, and the few pods and Events read from the API server. Its state: those reads,
cached a few seconds (or, for a finished Job's pods, until the Job is gone)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp
from lightkube import ApiError
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.discovery_v1 import EndpointSlice

from ..decide import (
    API_UNKNOWN,
    MAX_REPORT_BYTES,
    REPORT_PATH,
    REPORT_TIMEOUT_SECONDS,
    SERVED_PATH,
    CanaryReport,
    Observed,
    ServedReport,
    parse_report,
    parse_served,
)
from ..decide import jobs as job_status
from ..desired import names
from ..desired.inference_pool import inference_pool_name
from ..desired.plan import ModelPlan
from ..desired.scaletozero import SLICE_SERVICE_NAME, wants_scale_to_zero
from .base import ControllerParts
from .common import (
    JOB_MESSAGES_MIN_LIMIT,
    NOT_READY_RECHECK_SECONDS,
    SERVER_PODS_TTL,
    ModelKey,
    compact_pod,
    foreign_owner,
)

log = logging.getLogger("spyre_operator.control.controller")  # the controller's
T = TypeVar("T")

#: A same-named mirror EndpointSlice of someone else is looked at again this often.
FOREIGN_RECHECK_SECONDS = 60.0


class Observer:
    """Observation of the caches (and of the pods and Events no watch covers)."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: model -> (when listed, its serving pods): see recent_server_pods.
        self._server_pods: dict[ModelKey, tuple[float, list[dict[str, Any]]]] = {}
        #: Terminal Job uid -> its pods (their termination messages): see job_pods.
        self.job_messages: dict[str, list[dict[str, Any]]] = {}
        #: Running Job uid -> (when read, its pods, its Events): see precompile.
        self._starting_jobs: dict[str, tuple[float, list[Any], list[Any]]] = {}
        self._job_messages_limit = JOB_MESSAGES_MIN_LIMIT

    def forget(self, key: ModelKey) -> None:
        """The model is gone: its pods' listing is dropped."""
        self._server_pods.pop(key, None)

    def observe(
        self,
        model: Mapping[str, Any],
        plan_claim: str,
        key: str,
        job_name: str,
        model_claim: str | None,
    ) -> Observed:
        """Gather the observed state of one model from the caches."""
        ns, name = model["metadata"]["namespace"], model["metadata"]["name"]
        job = self.c.caches.one("jobs", (ns, job_name))
        if job is not None and job["metadata"].get("uid") in self.c.writer.deleted_jobs:
            job = None  # we deleted it; the watch has not caught up yet
        users = sorted(
            self.c.caches.all("claim_users", (ns, plan_claim)),
            key=lambda u: (u.created, u.owner.name),
        )
        obs = Observed(
            cache_pvc=self.c.caches.one("pvcs", (ns, plan_claim)),
            model_pvc_exists=model_claim is None
            or self.c.caches.one("pvcs", (ns, model_claim)) is not None,
            job=job,
            deployment=self.c.caches.one("deployments", (ns, names.server_name(name))),
            canary_deployment=self.c.caches.one("deployments", (ns, names.canary_name(name))),
            service=self.c.caches.one("services", (ns, names.server_name(name))),
            pdb=self.c.caches.one("pdbs", (ns, names.server_name(name))),
            hpa=self.c.caches.one("hpas", (ns, names.server_name(name))),
            network_policy=self.c.caches.one("networkpolicies", (ns, names.server_name(name))),
            verified_configmap=self.c.caches.one("configmaps", (ns, names.verified_name(name))),
            job_owners=sorted(
                {o for o in self.c.caches.all("artifact_users", (ns, plan_claim, key))},
                key=lambda o: (o.name, o.uid),
            ),
            cache_users=[(u.owner, u.volume) for u in users if u.volume is not None],
            claim_name_users=[u.owner for u in users if u.volume is None],
            claim_artifact_bytes=self.c.gc.reports.claim_artifact_bytes(ns, plan_claim, users),
            claim_measured=self.c.gc.reports.claim_measured(ns, plan_claim),
        )
        if obs.canary_deployment is not None:
            obs.canary_foreign = foreign_owner("Deployment", obs.canary_deployment, name)
            if obs.canary_foreign:
                obs.canary_deployment = None  # not ours: neither written nor read as ours
        self._observe_inference_pool(obs, ns, name)
        self._observe_scale_to_zero(obs, ns, name)
        self._observe_jobs(obs, ns, name, plan_claim, job_name)
        for kind, attr in (
            ("Deployment", "deployment"),
            ("Service", "service"),
            ("PodDisruptionBudget", "pdb"),
            ("HorizontalPodAutoscaler", "hpa"),
            ("NetworkPolicy", "network_policy"),
            ("ConfigMap", "verified_configmap"),
        ):
            live = getattr(obs, attr)
            why = foreign_owner(kind, live, name) if live is not None else None
            if why:
                obs.foreign[kind] = why
                setattr(obs, attr, None)  # not ours: neither written nor read as ours
        return obs

    def _observe_inference_pool(self, obs: Observed, ns: str, name: str) -> None:
        """The model's InferencePool from the optional watch (no API request)."""
        watch = self.c.inference_pools
        if watch is None:
            obs.inference_pool_api = API_UNKNOWN
            return
        obs.inference_pool_api, obs.inference_pool_api_message = watch.state, watch.message
        live = watch.get(ns, inference_pool_name(name))
        why = foreign_owner("InferencePool", live, name) if live is not None else None
        if why:
            obs.foreign_inference_pool = why
        else:
            obs.inference_pool = live

    def _observe_scale_to_zero(self, obs: Observed, ns: str, name: str) -> None:
        """KEDA's objects, the engine/cold-start Services and the mirror, from the caches.

        A same-named object that is not the operator's is never read as ours nor written over:
        the model reports it (ScaleToZeroUnavailable) and writes none of them.
        """
        cfg = obs.keda = self.c.scale_to_zero
        server = names.server_name(name)
        foreign: list[str] = []

        def ours(kind: str, live: dict[str, Any] | None) -> dict[str, Any] | None:
            why = foreign_owner(kind, live, name) if live is not None else None
            if why:
                foreign.append(why)
                return None
            return live

        for watch, state, message, attr, kind in (
            (self.c.scaled_objects, "scaled_object_api", "scaled_object_api_message",
             "scaled_object", "ScaledObject"),
            (self.c.http_scaled_objects, "http_scaled_object_api",
             "http_scaled_object_api_message", "http_scaled_object", "HTTPScaledObject"),
        ):  # fmt: skip
            if watch is None:
                continue
            setattr(obs, state, watch.state)
            setattr(obs, message, watch.message)
            setattr(obs, attr, ours(kind, watch.get(ns, server)))
        obs.engine_service = ours(
            "Service", self.c.caches.one("services", (ns, names.engine_service_name(name)))
        )
        obs.coldstart_service = ours(
            "Service", self.c.caches.one("services", (ns, names.coldstart_service_name(name)))
        )
        mirror = self.c.caches.one("endpointslices", (ns, names.mirror_slice_name(name)))
        obs.mirror_slice = ours("EndpointSlice", mirror)
        obs.foreign_scale_to_zero = "; ".join(foreign) or None
        if self.c.interceptor_slices is not None:
            obs.interceptor_slices = [
                body
                for (slice_ns, _), body in self.c.interceptor_slices.cache.items()
                if slice_ns == cfg.interceptor_namespace
                and ((body.get("metadata") or {}).get("labels") or {}).get(SLICE_SERVICE_NAME)
                == cfg.interceptor_service
            ]

    async def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        pods = []
        labels: dict[str, Any] = dict(selector)
        async for p in self.c.client.list(Pod, namespace=namespace, labels=labels):
            pods.append(compact_pod(p.to_dict()))
        return pods

    async def recent_server_pods(self, key: ModelKey) -> list[dict[str, Any]]:
        """The model's serving pods, listed at most every SERVER_PODS_TTL seconds.

        Only needed to explain a rollout that does not become available (crash loops, engine
        exits); while hundreds of Deployments roll out, listing on every Deployment event
        made a LIST per reconcile.
        """
        now = time.monotonic()
        cached = self._server_pods.get(key)
        if cached is not None and now - cached[0] < SERVER_PODS_TTL:
            return cached[1]
        pods = await self.pods(key[0], names.server_selector(key[1]))
        self._server_pods[key] = (now, pods)
        return pods

    async def canary_reports(
        self, pods: list[dict[str, Any]], short_key: str, port: int
    ) -> dict[str, CanaryReport | str]:
        """What each Ready canary pod of artifact ``short_key`` says it judged (its engine's
        ``/health/canary`` on the serving port), or why it could not be read; read in
        parallel, each within REPORT_TIMEOUT_SECONDS."""
        mine = [p for p in pods if p.get("canary") and p.get("artifact") == short_key]
        return await _read_ready(mine, port, read_report)

    async def served_reports(
        self, pods: list[dict[str, Any]], port: int
    ) -> dict[str, ServedReport | str]:
        """What each Ready serving pod (the canary's and the previous artifact's: the
        baseline) served since Ready, or why it could not be read; in parallel."""
        return await _read_ready(pods, port, read_served)

    async def mirror_slice(self, obs: Observed, plan: ModelPlan) -> None:
        """The mirror EndpointSlice, asked of the API server by name while the cache has none
        for a model that may go to zero (before the operator makes it, and while someone
        else's is in the way). The cache holds only the operator's slices (a label-selected
        watch: every Service has slices), so a same-named slice of another owner was invisible
        and written over. Another's is reported (foreign_scale_to_zero: decide() writes no
        scale-to-zero object) and looked at again after FOREIGN_RECHECK_SECONDS, as no watch
        tells when it goes; one of the operator's the cache has not shown yet is read as ours.
        A ``list`` by name: the chart grants list, not get."""
        if (
            obs.mirror_slice is not None
            or not obs.keda.enabled
            or not wants_scale_to_zero(plan)
            or self.c.client is None
        ):
            return
        name = names.mirror_slice_name(plan.name)
        try:
            found = [
                s.to_dict()
                async for s in self.c.client.list(
                    EndpointSlice, namespace=plan.namespace, fields={"metadata.name": name}
                )
            ]
        except ApiError as e:
            if e.status.code == 403:  # the EndpointSlice watch reports missing RBAC itself
                return
            raise
        if not found:
            return
        why = foreign_owner("EndpointSlice", found[0], plan.name)
        if why is None:
            obs.mirror_slice = found[0]
            return
        obs.foreign_scale_to_zero = "; ".join(filter(None, [obs.foreign_scale_to_zero, why]))
        obs.recheck_after = FOREIGN_RECHECK_SECONDS

    def _observe_jobs(
        self, obs: Observed, ns: str, name: str, claim: str, job_name: str
    ) -> None:
        """The precompile Jobs the model owns besides its own, and which of them some model
        needs; the artifacts the claim's other users recorded (a Job is removed after a
        while: what one of them compiled on this claim is not compiled again)."""
        for job in self.c.caches.all("owned_jobs", (ns, name)):
            meta = job.get("metadata") or {}
            if meta.get("uid") in self.c.writer.deleted_jobs or meta.get("name") == job_name:
                continue
            obs.owned_jobs.append(job)
            job_claim = (meta.get("labels") or {}).get(names.CLAIM_LABEL)
            job_key = (meta.get("annotations") or {}).get(names.ARTIFACT_KEY_ANNOTATION)
            if self.c.caches.all("artifact_users", (ns, job_claim, job_key)):
                obs.needed_jobs.add((str(job_claim), str(job_key)))
        for user in self.c.caches.all("claim_users", (ns, claim)):
            if user.owner.name == name:
                continue
            m = self.c.caches.one("models", (ns, user.owner.name)) or {}
            for a in ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []:
                if a.get("claim") == claim:
                    obs.claim_artifacts.append(a)

    async def precompile(self, key: ModelKey, obs: Observed) -> None:
        """The precompile Job's pods: a finished Job's termination messages (read once), and
        while the Job runs but none of its pods does, what holds it up (unschedulable, image,
        Secret; with no pod at all its FailedCreate Events). The scheduler and the kubelet
        write only the pod, which is not watched: look again every NOT_READY_RECHECK_SECONDS
        until it runs (a Job whose pod is ready makes progress; it is not read)."""
        job = obs.job
        if job is None:
            return
        if job_status.finished(job):
            obs.job_pods = await self.job_pods(key[0], job)
            return
        if ((job.get("status") or {}).get("ready") or 0) > 0:
            return
        now = time.monotonic()
        for uid, (t, _, _) in list(self._starting_jobs.items()):
            if now - t >= SERVER_PODS_TTL:
                del self._starting_jobs[uid]  # bounded: only reads of the last seconds stay
        uid = job["metadata"]["uid"]
        if uid not in self._starting_jobs:
            pods = await self.pods(key[0], {"batch.kubernetes.io/controller-uid": uid})
            live = [p for p in pods if not p.get("terminated")]
            events = [] if live else await self._job_events(key[0], uid)
            self._starting_jobs[uid] = (now, pods, events)
        _, obs.job_pods, obs.job_events = self._starting_jobs[uid]
        self.c.queue.add_after(key, NOT_READY_RECHECK_SECONDS)

    async def _job_events(self, ns: str, uid: str) -> list[dict[str, Any]]:
        """Warning Events of a Job (the Job controller's FailedCreate when a pod is refused)."""
        out = []
        try:
            async for e in self.c.client.list(
                Event, namespace=ns, fields={"involvedObject.uid": uid, "type": "Warning"}
            ):
                d = e.to_dict()
                out.append({k: d.get(k) for k in ("reason", "message", "lastTimestamp")})
        except ApiError as err:
            if err.status.code != 403:
                raise
            log.warning("cannot list Events in %s (grant list on events): %s", ns, err)
        return out

    async def job_pods(self, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Pods of a finished Job (read once per Job: their termination messages)."""
        uid = job["metadata"]["uid"]
        if not job_status.finished(job):
            return []
        if uid not in self.job_messages:
            pods = await self.pods(ns, {"batch.kubernetes.io/controller-uid": uid})
            self._forget_gone_job_messages()
            self.job_messages[uid] = pods
        return self.job_messages[uid]

    def _forget_gone_job_messages(self) -> None:
        """Bound ``_job_messages``: drop the Jobs that are gone (TTL, deleted, superseded);
        a uid is never seen again. Checked when the map doubled, so amortised O(1)."""
        if len(self.job_messages) < self._job_messages_limit:
            return
        live = {j["metadata"].get("uid") for j in self.c.caches.values("jobs").values()}
        for uid in [u for u in self.job_messages if u not in live]:
            del self.job_messages[uid]
        self._job_messages_limit = max(JOB_MESSAGES_MIN_LIMIT, 2 * len(self.job_messages))


async def _read_ready(
    pods: list[dict[str, Any]],
    port: int,
    read: Callable[[aiohttp.ClientSession, str, int], Awaitable[T | str]],
) -> dict[str, T | str]:
    """``read`` of each Ready pod with an address, by pod name, in parallel."""
    ready = [p for p in pods if p.get("ready") and p.get("podIP")]
    if not ready:
        return {}
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(read(session, str(p["podIP"]), port) for p in ready))
    return {str(p["name"]): a for p, a in zip(ready, answers, strict=True)}


async def read_report(session: aiohttp.ClientSession, ip: str, port: int) -> CanaryReport | str:
    """One canary pod's report, or why it could not be read (the message status shows)."""
    return await _read_pod(session, ip, port, REPORT_PATH, parse_report)


async def read_served(session: aiohttp.ClientSession, ip: str, port: int) -> ServedReport | str:
    """What one serving pod served since Ready, or why it could not be read."""
    return await _read_pod(session, ip, port, SERVED_PATH, parse_served)


async def _read_pod(
    session: aiohttp.ClientSession, ip: str, port: int, path: str, parse: Callable[[bytes], T]
) -> T | str:
    """A pod's answer on ``path``, parsed as hostile (at most MAX_REPORT_BYTES, within
    REPORT_TIMEOUT_SECONDS), or why it could not be read."""
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}{path}"
    try:
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=REPORT_TIMEOUT_SECONDS),
            allow_redirects=False,
        ) as resp:
            body = await resp.content.read(MAX_REPORT_BYTES + 1)
            if resp.status != 200:
                return f"{url} answered HTTP {resp.status}"
            return parse(body)
    except ValueError as e:
        return f"{url}: {e}"
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return f"{url}: {type(e).__name__}: {e}"[:300]
