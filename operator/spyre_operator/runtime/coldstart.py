"""The cold-start responder: what a client gets when a held request passes its wait bound.

The HTTP add-on v0.12.0 answers a request held past ``conditionWait`` with a bare 502. Every
scale-to-zero model's HTTPScaledObject names a failover Service (``<model>-coldstart``, an
ExternalName to this responder), and the interceptor forwards the held request here instead
(H/interceptor/proxy_handlers.go:111-112 adds ``X-KEDA-HTTP-Cold-Start-Ref-Name`` and
``-Namespace``: the SpyreModel). The answer is ``503`` + ``Retry-After`` and an OpenAI-style
JSON error saying the model is starting, or that no Spyre card is available when the model's
status says a replica cannot be scheduled (Progressing=True InsufficientCapacity). It reads
the model from the controller's watch cache: no API request per answer.

It also answers KEDA's ``metrics-api`` trigger of every scale-to-zero model's ScaledObject
(``names.starting_path``): ``{"starting": 1}`` while the model is on its way up (:func:`starting`).
The add-on's request-rate signal counts a held request once, when it arrives, so without this
KEDA's cooldown took a woken model back to zero before a load longer than the rate window plus
``idleSeconds`` finished, and its held requests were never answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from ..decide import conditions as C
from ..desired import names

NAME_HEADER = "X-KEDA-HTTP-Cold-Start-Ref-Name"
NAMESPACE_HEADER = "X-KEDA-HTTP-Cold-Start-Ref-Namespace"

#: Seconds a client should wait before trying again: a model load takes minutes; a client
#: retrying after this finds the request held again (or served).
RETRY_AFTER_STARTING = 10
#: No card: retrying soon is pointless, but capacity may free up.
RETRY_AFTER_NO_CAPACITY = 60

ModelLookup = Callable[[str, str], Mapping[str, Any] | None]


def answer(
    namespace: str | None, name: str | None, model: Mapping[str, Any] | None
) -> web.Response:
    """The 503 for one held request (pure: a model's body in, the response out)."""
    who = f"{namespace}/{name}" if name and namespace else (name or "the model")
    conds = ((model or {}).get("status") or {}).get("conditions")
    progressing = C.find(conds, C.PROGRESSING)
    if progressing is not None and progressing.get("reason") in C.NO_CARD_REASONS:
        # Not the scheduler's message: it describes the cluster's nodes, which a client of
        # the model has no business reading (status has it for the model's owners).
        kind, retry = "insufficient_capacity", RETRY_AFTER_NO_CAPACITY
        message = (
            f"model {who} is scaled to zero and cannot start: no Spyre card is available"
        )
    elif model is None and name:
        kind, retry = "model_not_found", RETRY_AFTER_STARTING
        message = f"model {who} is not known to the operator"
    else:
        kind, retry = "model_starting", RETRY_AFTER_STARTING
        message = f"model {who} is starting (scaled up from zero); retry in {retry}s"
    body = {"error": {"message": message, "type": kind, "code": 503}}
    return web.Response(
        status=503,
        text=json.dumps(body),
        content_type="application/json",
        headers={"Retry-After": str(retry)},
    )


def starting(model: Mapping[str, Any]) -> bool:
    """Whether a scale-to-zero model is on its way up (pure: a model's body in).

    It was asked for replicas (KEDA's wake-up, or a new model's first start), none is Ready yet,
    and nothing says the start cannot finish: not deleted, not Progressing
    ``InsufficientCapacity`` (no card for its replica: KEDA takes it back to zero and the next
    held request is told so), not Degraded (a failed compile, engine or rollout).
    """
    if (model.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if int((model.get("spec") or {}).get("replicas", 1)) < 1:
        return False
    status = model.get("status") or {}
    if int(status.get("readyReplicas") or 0) > 0:
        return False
    conds = status.get("conditions")
    progressing = C.find(conds, C.PROGRESSING)
    if progressing is not None and progressing.get("reason") in C.NO_CARD_REASONS:
        return False
    degraded = C.find(conds, C.DEGRADED)
    return not (degraded is not None and degraded.get("status") == C.TRUE)


def allows_zero(model: Mapping[str, Any]) -> bool:
    """A model that may scale to zero (autoscaling.minReplicas 0): the only ones the
    interceptor forwards here, and so the only ones the responder says anything about."""
    autoscaling = (model.get("spec") or {}).get("autoscaling") or {}
    return isinstance(autoscaling, Mapping) and autoscaling.get("minReplicas") == 0


def make_app(lookup: ModelLookup) -> web.Application:
    """Every method and path answers (the held request is forwarded as it came). Anyone who
    reaches the port may send the interceptor's headers: the responder answers only about
    models that may scale to zero (any other is unknown to it), and nothing of the cluster
    beyond whether the model is starting or has no card."""

    def find(namespace: str | None, name: str | None) -> Mapping[str, Any] | None:
        model = lookup(namespace, name) if name and namespace else None  # type: ignore[arg-type]
        return model if model is not None and allows_zero(model) else None

    async def handle(request: web.Request) -> web.Response:
        name = request.headers.get(NAME_HEADER)
        namespace = request.headers.get(NAMESPACE_HEADER)
        return answer(namespace, name, find(namespace, name))

    async def is_starting(request: web.Request) -> web.Response:
        if NAME_HEADER in request.headers:  # a held request forwarded here, whatever its path
            return await handle(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        model = find(namespace, name)
        if model is None:  # KEDA's trigger errs: it neither wakes nor idles the model on it
            return web.json_response(
                {"error": f"model {namespace}/{name} is not known to the operator"}, status=404
            )
        return web.json_response({names.STARTING_FIELD: int(starting(model))})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get(names.STARTING_PATH + "/{namespace}/{name}", is_starting)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def start_coldstart_server(lookup: ModelLookup, port: int) -> web.AppRunner:
    """Serve the responder on ``port`` (every operator replica answers; the cache is local)."""
    runner = web.AppRunner(make_app(lookup), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
