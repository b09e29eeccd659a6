"""What a client may send through the engine's port to vLLM (issue 44, part 1).

The engine's port is the Service's: everything a client sends arrives here first. Two rules:

* **Client routes only** (an allow-list): the OpenAI API, tokenize/detokenize, the pooling
  routes, the model list and vLLM's plain health. vLLM's control routes (LoRA loading, sleep and
  wake-up, cache resets, profiling, whatever its next release adds) never face clients. The path
  is compared as it arrives (raw, before percent-decoding): a route spelled another way is not
  one of these, so nothing forwarded can be decoded into another route further on.
* **Bodies are parsed, never byte-matched.** A POST's body must be one JSON object, read by the
  same parser vLLM's server uses (Python's ``json.loads`` on the raw bytes, which also decodes
  ``\\u`` escapes, and UTF-16/32 by their byte order); a key given twice anywhere is refused (two
  parsers may keep different copies); ``vllm_xargs`` may not name the output check's key
  (:data:`spyre_engine.answers.INJECTOR_KEY`) in any spelling JSON allows. The plugin's
  golden-token injector raises inside vLLM's worker on an expectation it cannot read, and vLLM
  treats that as fatal to the engine: no client input reaches it. A prompt that merely mentions
  the key is an ordinary string and is served.

* **The API key guards every client route** but vLLM's plain ``/health``. vLLM's own check
  (``VLLM_API_KEY``) covers only the paths its middleware lists (``/v1``, ``/v2``, …), and
  ``/tokenize``, ``/pooling``, ``/score`` or ``/rerank`` answered without the key; the engine
  asks for ``Authorization: Bearer <key>`` on all of them itself (:func:`auth_refusal`).

Pure functions, no I/O: serve.py asks :func:`refusal` before forwarding.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

from . import answers

#: POST routes clients use (vLLM's OpenAI-compatible server; JSON bodies).
CLIENT_POSTS = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings",
    "/tokenize", "/detokenize",
    "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
})
#: GET routes clients use.
CLIENT_GETS = frozenset({"/v1/models", "/health", "/version"})
#: The request field vLLM copies into ``SamplingParams.extra_args``.
XARGS = "vllm_xargs"


@dataclass(frozen=True)
class Refusal:
    """An answer given instead of forwarding: status, OpenAI-style error type, message."""

    status: int
    type: str
    message: str


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def route_refusal(method: str, raw_path: str) -> Refusal | None:
    """None for a client route, else why not (404 unknown, 405 a known route's other method)."""
    path = raw_path.split("?", 1)[0]
    if (method == "POST" and path in CLIENT_POSTS) or (
            method in ("GET", "HEAD") and path in CLIENT_GETS):
        return None
    if path in CLIENT_POSTS or path in CLIENT_GETS:
        return Refusal(405, "MethodNotAllowed", f"{method} is not served on {path}")
    return Refusal(404, "NotFoundError", f"{path[:200]!r} is not a route this server exposes")


#: A request body the engine reads at most, per token of the model's context: JSON of text
#: (escapes, chat turns, token-id lists) with room to spare; never under MIN_BODY_BYTES.
BODY_BYTES_PER_TOKEN = 256
MIN_BODY_BYTES = 1024 * 1024


def max_body_bytes(max_model_len: int) -> int:
    """The largest request body worth reading for a model of ``max_model_len`` tokens: a larger
    one cannot fit its context, and was buffered whole (up to 64 MiB) before vLLM refused it.
    Refused at once with 413."""
    return max(MIN_BODY_BYTES, max_model_len * BODY_BYTES_PER_TOKEN)


#: Forwarded without the API key: a liveness answer that says nothing about the model.
OPEN_WITH_A_KEY = frozenset({"/health"})


def auth_refusal(raw_path: str, authorization: str | None, key: str | None) -> Refusal | None:
    """None when no key is set, the route is open (:data:`OPEN_WITH_A_KEY`), or the request
    carries ``Authorization: Bearer <key>`` (compared in constant time); else 401."""
    if not key or raw_path.split("?", 1)[0] in OPEN_WITH_A_KEY:
        return None
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode()):
        return None
    return Refusal(401, "Unauthorized", "this model requires an API key: "
                                        "Authorization: Bearer <key>")


def body_refusal(body: bytes, reserved: str = answers.INJECTOR_KEY) -> Refusal | None:
    """None for a body that may be forwarded, else why not (400)."""
    try:
        doc = json.loads(body, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        return Refusal(400, "BadRequestError",
                       f"the key {str(e)[:100]!r} appears twice in one JSON object")
    except (ValueError, RecursionError) as e:  # JSON, encoding, numbers too long, nesting
        return Refusal(400, "BadRequestError", f"the body is not valid JSON: {str(e)[:200]}")
    if not isinstance(doc, dict):
        return Refusal(400, "BadRequestError", "the body must be a JSON object")
    xargs = doc.get(XARGS)
    if isinstance(xargs, dict) and reserved in xargs:
        return Refusal(400, "BadRequestError",
                       f"{XARGS}.{reserved} is reserved for the engine's output check")
    return None


def refusal(method: str, raw_path: str, body: bytes) -> Refusal | None:
    """Why this request is not forwarded to vLLM, or None."""
    why = route_refusal(method, raw_path)
    if why is None and method == "POST":
        why = body_refusal(body)
    return why
