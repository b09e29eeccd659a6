"""Who may read the operator's ``/metrics`` (issue 45, 4).

The operator's metrics name every model it watches, in every namespace, with its conditions:
with ``--metrics-auth=kubernetes`` (the chart's default) a scrape must carry a bearer token the
API server vouches for (a ``TokenReview``) whose user may ``get`` the non-resource URL
``/metrics`` (a ``SubjectAccessReview``), the way controller-runtime's secure metrics and
kube-rbac-proxy decide. The chart's ``<release>-metrics-reader`` ClusterRole grants that verb.

The two reviews are ``create`` calls that store nothing (the API server answers and forgets),
so they are made here rather than through the apply layer. A decision is cached by the token's
SHA-256 (never the token itself) for a minute when allowed and ten seconds when refused, so a
Prometheus scraping every 30 s costs one pair of reviews a minute. An answer the API server
could not give (it is down, or the operator lacks the right to ask) is ``503`` and is not
cached. Tokens that cannot be one (too long, not RFC 6750's characters) are refused without
asking, and at most :data:`MAX_REVIEWS_IN_FLIGHT` reviews run at once, with
:data:`MAX_WAITING` more queued: past that a scrape is answered ``429``, so a flood of made-up
tokens never becomes a flood of requests to the API server.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.models.authorization_v1 import NonResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.authorization_v1 import SubjectAccessReview

log = logging.getLogger(__name__)

MODES = ("none", "kubernetes")
PATH = "/metrics"
ALLOWED_TTL = 60.0
DENIED_TTL = 10.0
MAX_CACHED = 512
MAX_TOKEN_CHARS = 8192
MAX_REVIEWS_IN_FLIGHT = 4
MAX_WAITING = 16
#: RFC 6750's b64token.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@dataclass(frozen=True)
class Decision:
    """An HTTP status (200 allowed, 401 who are you, 403 not you, 429 busy, 503 cannot tell)
    and why, for the response body and the log."""

    status: int
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return token if _TOKEN.fullmatch(token) else None


class MetricsAuth:
    """Decides a scrape from its ``Authorization`` header (see the module's docstring)."""

    def __init__(self, client: AsyncClient, *, path: str = PATH,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._path = path
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._reviews = asyncio.Semaphore(MAX_REVIEWS_IN_FLIGHT)
        self._waiting = 0
        #: reviews asked of the API server (the tests and the benchmark read it)
        self.reviews = 0

    async def decide(self, authorization: str | None) -> Decision:
        token = bearer_token(authorization)
        if token is None:
            return Decision(401, "a bearer token is required (Authorization: Bearer <token>)")
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cached(digest)
        if cached is not None:
            return cached
        if self._waiting >= MAX_WAITING:
            return Decision(429, "too many scrapes waiting for their token's review")
        self._waiting += 1
        try:
            async with self._reviews:
                cached = self._cached(digest)  # a scrape with the same token got there first
                decision = cached or await self._review(token)
        finally:
            self._waiting -= 1
        if cached is None and decision.status in (200, 401, 403):
            self._remember(digest, decision)
        return decision

    def _cached(self, digest: str) -> Decision | None:
        hit = self._cache.get(digest)
        if hit is None:
            return None
        if hit[0] <= self._clock():
            del self._cache[digest]
            return None
        return hit[1]

    def _remember(self, digest: str, decision: Decision) -> None:
        ttl = ALLOWED_TTL if decision.allowed else DENIED_TTL
        self._cache[digest] = (self._clock() + ttl, decision)
        self._cache.move_to_end(digest)
        while len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)

    async def _review(self, token: str) -> Decision:
        self.reviews += 1
        try:
            tr = await self._client.create(TokenReview(spec=TokenReviewSpec(token=token)))
        except ApiError as e:
            log.warning("/metrics: the TokenReview failed: %s", e.status.message)
            return Decision(503, "the API server could not review the token")
        status = tr.status
        user = status.user if status is not None and status.authenticated else None
        if user is None or not user.username:
            return Decision(401, "the token is not valid")
        spec = SubjectAccessReviewSpec(
            user=user.username, uid=user.uid, groups=user.groups,
            extra=_extra(user.extra),
            nonResourceAttributes=NonResourceAttributes(path=self._path, verb="get"),
        )  # fmt: skip
        try:
            sar = await self._client.create(SubjectAccessReview(spec=spec))
        except ApiError as e:
            log.warning("/metrics: the SubjectAccessReview failed: %s", e.status.message)
            return Decision(503, "the API server could not review the access")
        if sar.status is not None and sar.status.allowed:
            return Decision(200, f"{user.username} may get {self._path}")
        log.info("/metrics refused to %s (no get on %s)", user.username, self._path)
        return Decision(403, f"{user.username} may not get {self._path}")


def _extra(extra: dict[str, Any] | None) -> dict[str, list[str]] | None:
    """A TokenReview's ``user.extra`` as a SubjectAccessReview takes it (lists of strings)."""
    if not extra:
        return None
    return {str(k): [str(x) for x in (v if isinstance(v, list) else [v])]
            for k, v in extra.items()}  # fmt: skip
