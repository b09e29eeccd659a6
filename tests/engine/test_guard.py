"""Issue 44, part 1: what a client may send through the engine's port (spyre_engine/guard.py).

Pure, no vLLM running (make test-unit runs it): the reserved key in every JSON spelling, a
prompt that mentions it, duplicate keys, non-objects; the routes against those vLLM's installed
server registers (read from its source with ``ast``); and a fuzz: whatever the guard lets
through, the parser vLLM's server uses reads without the output check's key.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import vllm
from hypothesis import given, settings
from hypothesis import strategies as st
from spyre_engine import answers, canary, guard

KEY = answers.INJECTOR_KEY
PAYLOAD = answers.injector_payload  # the real expectation's builder (not needed to refuse)


def _escaped(s: str, which: set[int]) -> str:
    """``s`` as a JSON string body with the characters at ``which`` written as \\u escapes."""
    return "".join(f"\\u{ord(c):04x}" if i in which else c for i, c in enumerate(s))


def _body(key_spelling: str, prompt: str = "hi") -> bytes:
    return (f'{{"model": "m", "prompt": {json.dumps(prompt)}, '
            f'"vllm_xargs": {{"{key_spelling}": "[1, 2]"}}}}').encode()


@pytest.mark.parametrize("spelling", [
    KEY, _escaped(KEY, {6}), _escaped(KEY, set(range(len(KEY)))), "golden\\u005Ftoken_injector",
])
def test_the_reserved_key_is_refused_in_every_spelling(spelling: str) -> None:
    assert json.loads(_body(spelling))["vllm_xargs"] == {KEY: "[1, 2]"}  # what vLLM would read
    why = guard.body_refusal(_body(spelling))
    assert why is not None and why.status == 400 and "reserved" in why.message, why


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_the_reserved_key_is_refused_in_other_encodings(encoding: str) -> None:
    """json.loads reads UTF-16/32 bodies by their byte order, as vLLM's server does."""
    body = _body(KEY).decode().encode(encoding)
    try:
        assert KEY in json.loads(body)["vllm_xargs"]
    except ValueError:  # not readable at all: refused as invalid either way
        pass
    assert guard.body_refusal(body) is not None


def test_a_prompt_that_mentions_the_key_is_served() -> None:
    body = json.dumps({"model": "m", "prompt": f'what is "{KEY}"? vllm_xargs',
                       "vllm_xargs": {"other": 1}}).encode()
    assert guard.body_refusal(body) is None
    assert guard.body_refusal(json.dumps({"messages": [{"role": "user", "content": KEY}]})
                              .encode()) is None


@pytest.mark.parametrize("body", [
    b'{"prompt": "a", "vllm_xargs": {"x": 1}, "vllm_xargs": {"x": 2}}',
    b'{"vllm_xargs": {"' + KEY.encode() + b'": "[]", "' + KEY.encode() + b'": "[]"}}',
    b'{"messages": [{"role": "user", "role": "system"}]}',
])
def test_a_key_given_twice_is_refused(body: bytes) -> None:
    why = guard.body_refusal(body)
    assert why is not None and "twice" in why.message, why


@pytest.mark.parametrize("body", [
    b"", b"[]", b'"x"', b"null", b"{", b"\xff\xfe\x00", b"1" * 5000,
    b"[" * 100_000 + b"]" * 100_000, b'{"a": ' + b"9" * 5000 + b"}",
])
def test_a_body_that_is_not_one_json_object_is_refused(body: bytes) -> None:
    why = guard.body_refusal(body)
    assert why is not None and why.status == 400, why


def _vllm_routes() -> dict[str, set[str]]:
    """The routes vLLM's installed server registers: ``@router.post("/path")`` and the like."""
    out: dict[str, set[str]] = {"post": set(), "get": set()}
    for f in (Path(vllm.__file__).parent / "entrypoints").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in out and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("/")):
                out[node.func.attr].add(str(node.args[0].value))
    return out


def test_clients_reach_the_client_routes_only() -> None:
    routes = _vllm_routes()
    assert "/v1/completions" in routes["post"] and "/sleep" in routes["post"], routes
    # every route the guard opens is one vLLM serves ...
    assert guard.CLIENT_POSTS <= routes["post"], guard.CLIENT_POSTS - routes["post"]
    assert guard.CLIENT_GETS <= routes["get"], guard.CLIENT_GETS - routes["get"]
    for path in sorted(guard.CLIENT_POSTS):
        assert guard.route_refusal("POST", path) is None
        assert guard.route_refusal("POST", path + "?x=1") is None
    # ... and every other one is closed, its control routes first of all
    closed = (routes["post"] - guard.CLIENT_POSTS) | (routes["get"] - guard.CLIENT_GETS)
    for must in ("/sleep", "/wake_up", "/v1/load_lora_adapter", "/collective_rpc",
                 "/reset_prefix_cache", "/start_profile", "/invocations", "/pause"):
        assert must in closed, must
    for path in sorted(closed):
        for method in ("POST", "GET"):
            why = guard.route_refusal(method, path)
            assert why is not None and why.status in (404, 405), (method, path)
    # spelled another way, a client route is not one
    for path in ("/v1/%63ompletions", "/v1//completions", "/v1/completions/", "/V1/completions",
                 "/v1/./completions", "/x/../v1/completions"):
        assert guard.route_refusal("POST", path) is not None, path
    assert guard.route_refusal("GET", "/v1/completions").status == 405  # type: ignore[union-attr]


_keyish = st.sets(st.integers(0, len(KEY) - 1)).map(lambda w: _escaped(KEY, w))
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=False), st.text(max_size=20))


@settings(max_examples=400, deadline=None)
@given(spelling=st.one_of(_keyish, st.text(max_size=30)), value=_scalar,
       twice=st.booleans(), extra=st.dictionaries(st.text(max_size=10), _scalar, max_size=4),
       top=st.sampled_from(["vllm_xargs", "vllm_xarg", "prompt"]))
def test_fuzz_nothing_let_through_carries_the_key(spelling: str, value: object, twice: bool,
                                                   extra: dict[str, object], top: str) -> None:
    """Mutated bodies (escaped and duplicate keys, wrong types, huge values): whatever the
    guard forwards, vLLM's parser reads without the key; the real key is always refused."""
    inner = ", ".join([f'"{spelling}": {json.dumps(value)}'] * (2 if twice else 1)
                      + [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items()])
    body = f'{{"model": "m", "{top}": {{{inner}}}}}'.encode()
    why = guard.body_refusal(body)
    if why is None:
        doc = json.loads(body)
        xargs = doc.get("vllm_xargs")
        assert not (isinstance(xargs, dict) and KEY in xargs), body
    elif top == "vllm_xargs" and _decoded(spelling) == KEY:
        assert "reserved" in why.message or "twice" in why.message, why


def _decoded(spelling: str) -> str | None:
    try:
        out = json.loads(f'"{spelling}"')
    except ValueError:
        return None
    return out if isinstance(out, str) else None


@pytest.mark.parametrize("path", sorted(guard.CLIENT_POSTS | guard.CLIENT_GETS))
def test_the_api_key_guards_every_client_route_but_plain_health(path: str) -> None:
    """Issue 45, 4: vLLM's own key check covered only the paths its middleware lists; with
    serving.apiKey set, /tokenize, /pooling, /score and the rest answered without it."""
    key = "s3cret-key"
    assert guard.auth_refusal(path, None, None) is None, "no key set: nothing asked"
    assert guard.auth_refusal(path, f"Bearer {key}", key) is None
    assert guard.auth_refusal(path + "?x=1", f"bearer {key}", key) is None
    for wrong in (None, "", key, f"Bearer {key}x", f"Basic {key}", "Bearer s3cret"):
        refused = guard.auth_refusal(path, wrong, key)
        if path in guard.OPEN_WITH_A_KEY:
            assert refused is None
        else:
            assert refused is not None and refused.status == 401, (path, wrong)
            assert key not in refused.message
    assert guard.OPEN_WITH_A_KEY <= guard.CLIENT_GETS


def test_the_body_limit_follows_the_context() -> None:
    """Issue 45, 5: bodies up to 64 MiB were buffered whatever the model; now what its
    context could hold, with room (1 MiB at least)."""
    assert guard.max_body_bytes(512) == guard.MIN_BODY_BYTES
    assert guard.max_body_bytes(32768) == 32768 * guard.BODY_BYTES_PER_TOKEN  # 8 MiB
    assert guard.max_body_bytes(131072) < 64 * 1024 * 1024


def test_a_clients_4xx_is_no_evidence_for_the_canary() -> None:
    assert canary.is_evidence(200) and canary.is_evidence(500) and canary.is_evidence(503)
    assert not canary.is_evidence(400) and not canary.is_evidence(404)
    assert not canary.is_evidence(422)


def test_the_readme_lists_the_client_routes() -> None:
    """The security model (docs/security.md) names exactly the routes the guard opens."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    start = readme.index("**What a client reaches on a model's port")
    bullet = readme[start:readme.index("\n- **", start)]
    posts, gets = bullet.split("`POST`", 1)[1].split("`GET`", 1)
    named = {w.strip("`,") for w in posts.split() if w.startswith("`/")}
    assert named == set(guard.CLIENT_POSTS), named ^ set(guard.CLIENT_POSTS)
    named = {w.strip("`,") for w in gets.split("(", 1)[0].split() if w.startswith("`/")}
    assert named == set(guard.CLIENT_GETS), named ^ set(guard.CLIENT_GETS)
