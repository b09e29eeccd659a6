"""Who may read the operator's /metrics (issue 45, 4): metrics_auth.MetricsAuth's decisions and
the HTTPS endpoint, in process. The reviews here come from a stand-in client that answers as
the API server would; the real API server and the chart's RBAC decide in
tests/integration/test_chart.py (kwok) and tests/integration/test_chart_pod.py (the real pod).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube import ApiError
from lightkube.models.authentication_v1 import TokenReviewStatus, UserInfo
from lightkube.models.authorization_v1 import SubjectAccessReviewStatus
from lightkube.models.meta_v1 import Status
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.authorization_v1 import SubjectAccessReview
from spyre_engine.testing.process import free_port
from spyre_operator.runtime import metrics, metrics_auth
from spyre_operator.runtime.metrics_auth import MAX_WAITING, MetricsAuth, bearer_token

READER, STRANGER = "reader-token.abc", "stranger-token.def"


class Reviewer:
    """Answers TokenReviews and SubjectAccessReviews as the API server would for two tokens:
    READER's user may get /metrics, STRANGER's may not; any other token is not valid."""

    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.fail: str | None = None
        self.gate: asyncio.Event | None = None

    async def create(self, obj: Any) -> Any:
        self.asked.append(obj)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail and type(obj).__name__ == self.fail:
            raise ApiError(status=Status(code=403, message="tokenreviews is forbidden"))
        if isinstance(obj, TokenReview):
            users = {READER: "system:serviceaccount:mon:prometheus",
                     STRANGER: "system:serviceaccount:team:app"}  # fmt: skip
            name = users.get(obj.spec.token)
            obj.status = TokenReviewStatus(
                authenticated=name is not None,
                user=UserInfo(username=name, uid="u-1", groups=["system:serviceaccounts"],
                              extra={"authentication.kubernetes.io/pod-name": ["p"]})
                if name else None)  # fmt: skip
            return obj
        assert isinstance(obj, SubjectAccessReview)
        attrs = obj.spec.nonResourceAttributes
        obj.status = SubjectAccessReviewStatus(
            allowed=obj.spec.user.endswith(":prometheus") and attrs.path == "/metrics"
            and attrs.verb == "get")  # fmt: skip
        return obj


def _auth(reviewer: Reviewer, clock: list[float] | None = None) -> MetricsAuth:
    now = clock if clock is not None else [0.0]
    return MetricsAuth(reviewer, clock=lambda: now[0])  # type: ignore[arg-type]


@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "bearer  ", "Bearer a b",
    "Bearer tok\u00e9n", "Bearer " + "a" * (metrics_auth.MAX_TOKEN_CHARS + 1), "Bearer ===",
])  # fmt: skip
def test_what_cannot_be_a_bearer_token_is_refused_without_asking(header: str | None) -> None:
    r = Reviewer()
    d = asyncio.run(_auth(r).decide(header))
    assert d.status == 401 and not r.asked, d


@given(st.text(max_size=300))
def test_any_header_parses_to_a_token_or_none(header: str) -> None:
    token = bearer_token(header)
    assert token is None or (metrics_auth._TOKEN.fullmatch(token) and token in header)


def test_a_reader_is_allowed_a_stranger_forbidden_and_a_made_up_token_unauthenticated() -> None:
    r = Reviewer()
    auth = _auth(r)
    assert asyncio.run(auth.decide(f"Bearer {READER}")).status == 200
    stranger = asyncio.run(auth.decide(f"bearer {STRANGER}"))
    assert stranger.status == 403 and "system:serviceaccount:team:app" in stranger.reason
    assert asyncio.run(auth.decide("Bearer made.up")).status == 401
    # the access review asks about the token's user, as the API server reported it
    sar = next(o for o in r.asked if isinstance(o, SubjectAccessReview))
    assert sar.spec.user == "system:serviceaccount:mon:prometheus"
    assert sar.spec.groups == ["system:serviceaccounts"] and sar.spec.uid == "u-1"
    assert sar.spec.extra == {"authentication.kubernetes.io/pod-name": ["p"]}
    assert (sar.spec.nonResourceAttributes.path, sar.spec.nonResourceAttributes.verb) == (
        "/metrics", "get")
    assert sar.spec.resourceAttributes is None


def test_decisions_are_cached_by_token_for_their_ttl() -> None:
    r, clock = Reviewer(), [100.0]
    auth = _auth(r, clock)

    async def scrapes() -> list[int]:
        return [(await auth.decide(f"Bearer {t}")).status for t in (READER, STRANGER) * 3]

    assert asyncio.run(scrapes()) == [200, 403] * 3
    assert len(r.asked) == 4  # one token review and one access review per token
    assert sum(isinstance(o, TokenReview) for o in r.asked) == 2
    clock[0] += metrics_auth.DENIED_TTL + 1  # the refusal is asked again, the grant is not
    asyncio.run(scrapes())
    assert sum(isinstance(o, TokenReview) for o in r.asked) == 3
    clock[0] += metrics_auth.ALLOWED_TTL
    asyncio.run(scrapes())
    assert sum(isinstance(o, TokenReview) for o in r.asked) == 5
    assert READER not in str(auth._cache) and STRANGER not in str(auth._cache)  # digests only


@pytest.mark.parametrize("failing", ["TokenReview", "SubjectAccessReview"])
def test_an_api_server_that_cannot_answer_is_503_and_not_remembered(failing: str) -> None:
    r = Reviewer()
    r.fail = failing
    auth = _auth(r)
    assert asyncio.run(auth.decide(f"Bearer {READER}")).status == 503
    r.fail = None
    assert asyncio.run(auth.decide(f"Bearer {READER}")).status == 200


def test_a_flood_of_new_tokens_is_answered_429_past_the_queue() -> None:
    r = Reviewer()
    auth = _auth(r)

    async def flood() -> list[int]:
        r.gate = asyncio.Event()
        tasks = [asyncio.create_task(auth.decide(f"Bearer made.up{i}"))
                 for i in range(MAX_WAITING + 5)]  # fmt: skip
        await asyncio.sleep(0)
        done = [t for t in tasks if t.done()]
        r.gate.set()
        out = [t.result().status for t in done] + [(await t).status for t in tasks
                                                   if t not in done]  # fmt: skip
        return out

    statuses = asyncio.run(flood())
    assert statuses.count(429) == 5 and statuses.count(401) == MAX_WAITING, statuses
    assert len(r.asked) == MAX_WAITING  # nothing asked for the ones turned away


# ------------------------------------------------------------------ the endpoint, over TLS


class _Controller:
    class instruments:  # noqa: N801 - what start_metrics_server reads
        @staticmethod
        def render() -> bytes:
            return b"spyre_operator_up 1\n"


def _cert(d: Path, cn: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", f"/CN={cn}",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "tls.key.new"),
                    "-out", str(d / "tls.crt.new")], check=True, capture_output=True)  # fmt: skip
    (d / "tls.key.new").replace(d / "tls.key")
    (d / "tls.crt.new").replace(d / "tls.crt")


def _get(url: str, ca: Path | None, token: str | None = None) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode() + str(e.headers.get("WWW-Authenticate"))


def _peer_cn(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der
    out = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-subject"],
                         input=der, capture_output=True, check=True).stdout.decode()
    return out.strip().rsplit("=", 1)[-1].strip()


def test_metrics_over_https_with_a_token_and_a_renewed_certificate_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "TLS_RELOAD_SECONDS", 0.05)
    certs = tmp_path / "tls"
    _cert(certs, "first")
    port = free_port()
    url = f"https://127.0.0.1:{port}/metrics"

    async def run() -> None:
        server = await metrics.start_metrics_server(
            _Controller(), port, auth=_auth(Reviewer()), tls_dir=str(certs), host="127.0.0.1")  # type: ignore[arg-type]
        try:
            call = asyncio.to_thread
            status, body = await call(_get, url, certs / "tls.crt")
            assert status == 401 and 'Bearer realm="spyre-operator"' in body, body
            assert await call(_get, url, certs / "tls.crt", STRANGER) == (
                403, "system:serviceaccount:team:app may not get /metrics\nNone")
            assert await call(_get, url, certs / "tls.crt", READER) == (
                200, "spyre_operator_up 1\n")
            with pytest.raises(OSError):  # plain HTTP is not served
                await call(_get, f"http://127.0.0.1:{port}/metrics", None, READER)
            assert await call(_peer_cn, port) == "first"
            _cert(certs, "second")  # a Secret's rotation: the files change in place
            for _ in range(200):
                if await call(_peer_cn, port) == "second":
                    break
                await asyncio.sleep(0.05)
            assert await call(_peer_cn, port) == "second"
            assert (await call(_get, url, certs / "tls.crt", READER))[0] == 200
        finally:
            await server.cleanup()

    asyncio.run(run())


def test_a_missing_certificate_stops_the_start_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        metrics.tls_context(str(tmp_path))
