"""Reference answers of an artifact, and the check of a serving engine's answers against them.

An artifact can load, pass every health check and still answer wrongly (a compiler or plugin
bug, a cache built by another stack, a shape the graph mishandles). When an artifact is built,
the precompile records how its engine answers a small prompt set: the token ids and logprobs
of a greedy generation (``spyre_reference_answers.json`` in the artifact, covered by the
manifest's checksums). Before a serving engine turns Ready it answers the same prompts, and the
answers are compared position by position.

The comparison is upstream's (sendnn-inference ``tests/output_util.py``): per position, the
probabilities of the expected token must be within ``tolerance`` (0.08; 0.17 for quantized
models); a different token is accepted only as a near-tie (its probability within tolerance of
the expected one's), and the comparison of that prompt stops there ("diverging"). The plugin's
``GoldenTokenInjector`` (a logits processor, ``--logits-processors``) keeps the generation on
the expected tokens, so every later position stays comparable; it decides nothing itself (it
only logs), so the verdict is made here from the response's raw logprobs, which vLLM computes
before any logits processor runs: the logprob of the expected token and the model's own argmax
(the top-1 entry), which shows a divergence the injection hid.

Prompts are sent as token ids (no tokenizer or chat template drift between the recording and
the check), greedy, with the penalties set explicitly (a model's generation_config would apply
its own) and ``ignore_eos`` at check time so both cover the same positions. The reference is
recorded one prompt at a time; the check asks the way static-shape graphs break
(:func:`shaped_prompts`, :func:`check`): the prompts together (a batch, decodes beside a
chunked prefill), one longer than a prefill chunk, and, once those are answered, one that
repeats that long prompt's first chunk (a prefix-cache hit when prefix caching is on).

Nothing here imports vLLM: the engine process only talks to it over HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The file beside the artifact's catalog (covered by the manifest's checksums).
REFERENCE_FILENAME = "spyre_reference_answers.json"
FORMAT = 1
#: The plugin's logits processor, as ``--logits-processors`` names it (module:qualname).
INJECTOR = "sendnn_inference.v1.sample.golden_token_injector:GoldenTokenInjector"
#: The key of ``SamplingParams.extra_args`` the injector reads (``vllm_xargs`` over HTTP).
INJECTOR_KEY = "golden_token_injector"
#: Upstream's tolerances on probabilities (its tests' ABS_TOL and QUANTIZED_ABS_TOL defaults).
DEFAULT_TOLERANCE = 0.08
QUANTIZED_TOLERANCE = 0.17
DEFAULT_MAX_TOKENS = 16
#: A default prompt set: short, varied, no two sharing a prefix.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "Twelve times eleven equals",
    "Once upon a time, in a small village by the sea,",
    "La photosynthèse est le processus par lequel",
    "Kubernetes schedules pods onto nodes by",
)

#: The Spyre plugin's KV block (tokens): a prompt that repeats another's first block or more
#: can hit the prefix cache, so the check asks it only after the other was answered.
PREFIX_BLOCK = 64
#: How far past the prefill chunk the long prompt goes (when the context allows it).
PAST_THE_CHUNK = 8

#: How an answer is asked for: a POST of a /v1/completions body, its JSON answer back.
Post = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class Answer:
    """One prompt's greedy generation: per position the token id, its logprob, and the
    model's own top-1 (id, logprob), which differs from the token where an injection forced
    the expected one."""

    prompt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Mismatch:
    """The first position where an answer left the reference."""

    prompt: int
    prompt_id: str
    position: int
    expected_id: int
    expected_logprob: float
    actual_id: int
    actual_logprob: float

    @property
    def prob_diff(self) -> float:
        return abs(math.exp(self.actual_logprob) - math.exp(self.expected_logprob))

    def message(self, tolerance: float) -> str:
        return (
            f"prompt {self.prompt} ({self.prompt_id}) position {self.position}: expected token "
            f"{self.expected_id} (p {math.exp(self.expected_logprob):.2f}), got "
            f"{self.actual_id} (p {math.exp(self.actual_logprob):.2f}); "
            f"|dp| {self.prob_diff:.2f} > {tolerance:.2f}"
        )


@dataclass
class Verdict:
    """The check of every prompt: ``ok`` when none left the reference."""

    checked: int
    tolerance: float
    max_prob_diff: float
    mismatches: list[Mismatch]
    diverging: int = 0  # prompts that stopped at a near-tie (accepted)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def message(self) -> str:
        if self.ok:
            return (
                f"{self.checked} prompts answered as the reference (max |dp| "
                f"{self.max_prob_diff:.3f} <= {self.tolerance:.2f}"
                + (f"; {self.diverging} stopped at a near-tie" if self.diverging else "")
                + ")"
            )
        first = self.mismatches[0]
        return (
            f"{first.message(self.tolerance)}; {len(self.mismatches)} of {self.checked} prompts "
            "left the artifact's reference answers"
        )

    def summary(self) -> dict[str, Any]:
        """What the termination message and the operator carry."""
        out: dict[str, Any] = {
            "checked": self.checked,
            "tolerance": self.tolerance,
            "maxProbDiff": round(self.max_prob_diff, 4),
        }
        if self.mismatches:
            m = self.mismatches[0]
            out["firstMismatch"] = {
                "prompt": m.prompt,
                "promptId": m.prompt_id,
                "position": m.position,
                "expected": {"id": m.expected_id, "logprob": round(m.expected_logprob, 4)},
                "actual": {"id": m.actual_id, "logprob": round(m.actual_logprob, 4)},
            }
            out["mismatches"] = len(self.mismatches)
        return out


# ------------------------------------------------------------------ the requests


def request_body(
    served_name: str,
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    expect: Answer | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    label: str | None = None,
) -> dict[str, Any]:
    """A /v1/completions body asking for a greedy generation with per-position logprobs and
    the top-1 alternative. With ``expect``: ``ignore_eos``, as many tokens as the reference,
    and the injector's expectation (a JSON string: vLLM's ``vllm_xargs`` refuses a nested
    object; the injector parses a string). Both lists have the same length: the injector
    reads ``expected_logprobs[pos]`` for every position it injects."""
    body: dict[str, Any] = {
        "model": served_name,
        "prompt": list(prompt_token_ids),
        "max_tokens": max_tokens,
        "temperature": 0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if expect is not None:
        body["max_tokens"] = len(expect.token_ids)
        body["ignore_eos"] = True
        body["vllm_xargs"] = {INJECTOR_KEY: injector_payload(expect, tolerance, label)}
    return body


def injector_payload(expect: Answer, tolerance: float, label: str | None = None) -> str:
    """The injector's expectation (``ExpectationState``'s arguments), as a JSON string. Both
    ``expected_logprobs`` and ``error_threshold`` are given (soft mode: it keeps the model's
    own logprob and stops injecting when the expected token is far off, rather than forcing
    every token and hiding the divergence)."""
    n = min(len(expect.token_ids), len(expect.logprobs))
    payload: dict[str, Any] = {
        "expected_token_ids": [int(t) for t in expect.token_ids[:n]],
        "expected_logprobs": [float(x) for x in expect.logprobs[:n]],
        "error_threshold": float(tolerance),
    }
    if label:
        payload["label"] = label
    return json.dumps(payload, separators=(",", ":"))


def _token_id(token: str) -> int | None:
    """``token_id:123`` (``return_tokens_as_token_ids``) -> 123."""
    if token.startswith("token_id:"):
        try:
            return int(token.split(":", 1)[1])
        except ValueError:
            return None
    return None


def parse_answer(prompt_id: str, prompt_token_ids: Sequence[int], resp: dict[str, Any]) -> Answer:
    """An Answer from a /v1/completions response (one choice). Raises ValueError when the
    response lacks the token ids or logprobs asked for."""
    try:
        choice = resp["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        lp = choice["logprobs"]
        logprobs = [float(x) if x is not None else -9999.0 for x in lp["token_logprobs"]]
        tops = lp.get("top_logprobs") or []
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(
            f"the answer lacks token ids or logprobs ({e!r}): {str(resp)[:300]}"
        ) from e
    top: list[tuple[int, float]] = []
    for i, entry in enumerate(tops[: len(token_ids)]):
        best = max((entry or {}).items(), key=lambda kv: kv[1], default=None)
        tid = _token_id(best[0]) if best is not None else None
        if best is None or tid is None:
            top.append((token_ids[i], logprobs[i]))
        else:
            top.append((tid, float(best[1])))
    if len(logprobs) < len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
    return Answer(prompt_id, list(prompt_token_ids), token_ids, logprobs[: len(token_ids)], top)


# ------------------------------------------------------------------ the comparison


def compare(prompt: int, ref: Answer, got: Answer, tolerance: float) -> tuple[Mismatch | None,
                                                                                float, bool]:
    """(the first mismatch or None, the largest |dp| seen, whether it stopped at a near-tie).

    Per position i, with e/lr the reference's token and logprob, a/la the answer's and t/lt
    the answer's own top-1:
    - a == e: the probabilities must agree within tolerance, and the model's own top-1 must
      not beat the expected token by more than it (the injection kept a real flip hidden);
    - a != e: a near-tie (the answer's token about as likely as the reference's was) is
      accepted and ends the comparison of this prompt; anything else is a mismatch.
    """
    worst = 0.0
    for i, e in enumerate(ref.token_ids):
        if i >= len(got.token_ids):
            # fewer tokens than asked for (ignore_eos): the answer stopped early
            return (Mismatch(prompt, ref.prompt_id, i, e, ref.logprobs[i], -1, -9999.0), 1.0,
                    False)  # fmt: skip
        lr, a, la = ref.logprobs[i], got.token_ids[i], got.logprobs[i]
        dp = abs(math.exp(la) - math.exp(lr))
        if a == e:
            worst = max(worst, dp)
            if dp > tolerance:
                return Mismatch(prompt, ref.prompt_id, i, e, lr, a, la), worst, False
            t, lt = got.top[i] if i < len(got.top) else (a, la)
            if t != e and math.exp(lt) - math.exp(la) > tolerance:
                return Mismatch(prompt, ref.prompt_id, i, e, lr, t, lt), max(worst, dp), False
            continue
        if dp <= tolerance:
            return None, max(worst, dp), True  # a near-tie: upstream's "diverging"
        return Mismatch(prompt, ref.prompt_id, i, e, lr, a, la), max(worst, dp), False
    return None, worst, False


def judge(refs: Sequence[Answer], got: Sequence[Answer], tolerance: float) -> Verdict:
    mismatches: list[Mismatch] = []
    worst, diverging = 0.0, 0
    for i, (ref, answer) in enumerate(zip(refs, got, strict=True)):
        m, w, tie = compare(i, ref, answer, tolerance)
        worst = max(worst, w)
        diverging += tie
        if m is not None:
            mismatches.append(m)
    return Verdict(len(refs), tolerance, worst, mismatches, diverging)


# ------------------------------------------------------------------ the prompts


def shaped_prompts(
    prompts: Sequence[tuple[str, list[int]]], chunk: int, max_model_len: int, max_tokens: int,
) -> list[tuple[str, list[int]]]:
    """``prompts`` and two that take the paths static-shape graphs break on: ``long``, longer
    than a prefill chunk (``chunk`` tokens: chunked prefill), made of the prompts' own tokens
    repeated; and ``prefix``, that prompt's first chunk followed by another ending (a
    prefix-cache hit when it is asked after ``long``). Left out when the context cannot hold a
    prompt past the chunk with ``max_tokens`` after it."""
    filler = [t for _, ids in prompts for t in ids]
    length = min(chunk + PAST_THE_CHUNK, max_model_len - max_tokens - 1)
    if not filler or length <= chunk:
        return list(prompts)
    long = (filler * (length // len(filler) + 1))[:length]
    ending = list(prompts[-1][1])
    prefix = long[:chunk] + ending[: max(1, max_model_len - max_tokens - 1 - chunk)]
    return [*prompts, ("long", long), ("prefix", prefix)]


def _waves(refs: Sequence[Answer]) -> list[list[int]]:
    """The indices of ``refs`` in the order the check asks them: together, except that a
    prompt repeating an earlier one's first block (a prefix-cache hit) waits for it."""
    first: list[int] = []
    later: list[int] = []
    for i, ref in enumerate(refs):
        head = ref.prompt_token_ids[:PREFIX_BLOCK]
        shares = len(head) == PREFIX_BLOCK and any(
            r.prompt_token_ids[:PREFIX_BLOCK] == head for r in refs[:i])
        (later if shares else first).append(i)
    return [w for w in (first, later) if w]


# ------------------------------------------------------------------ record and check


async def record(
    post: Post, served_name: str, prompts: Sequence[tuple[str, list[int]]],
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> list[Answer]:
    """The engine's own greedy answers to ``prompts`` ((id, token ids) each), one at a time."""
    out = []
    for pid, ids in prompts:
        resp = await post(request_body(served_name, ids, max_tokens))
        out.append(parse_answer(pid, ids, resp))
    return out


async def check(
    post: Post, served_name: str, refs: Sequence[Answer], tolerance: float,
    inject: bool = True,
) -> Verdict:
    """Ask every reference prompt again (with the injector's expectation when ``inject``), all
    at once (a batch) but for those that repeat an earlier one's prefix, asked after it
    (:func:`_waves`), and judge the answers."""

    async def ask(ref: Answer) -> Answer:
        body = request_body(served_name, ref.prompt_token_ids, len(ref.token_ids),
                            ref if inject else None, tolerance, label=ref.prompt_id)
        if not inject:
            body["ignore_eos"] = True
        return parse_answer(ref.prompt_id, ref.prompt_token_ids, await post(body))

    got: dict[int, Answer] = {}
    for wave in _waves(refs):
        for i, answer in zip(wave, await asyncio.gather(*(ask(refs[i]) for i in wave)),
                             strict=True):
            got[i] = answer
    return judge(refs, [got[i] for i in range(len(refs))], tolerance)


# ------------------------------------------------------------------ the file


def document(answers: Sequence[Answer], source: str, backend: str, versions: dict[str, str],
             tolerance: float, max_tokens: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "source": source,
        "recordedWith": {"backend": backend, "versions": dict(versions)},
        "sampling": {"temperature": 0, "maxTokens": max_tokens},
        "tolerance": tolerance,
        "prompts": [
            {"id": a.prompt_id, "promptTokenIds": a.prompt_token_ids, "tokenIds": a.token_ids,
             "logprobs": a.logprobs}
            for a in answers
        ],
    }


def _model_files(model_path: Path) -> list[Path]:
    """Every file under ``model_path``, in a fixed order (both fingerprints walk the same)."""
    return sorted(p for p in model_path.rglob("*") if p.is_file())


def weights_fingerprint(model_path: Path) -> str | None:
    """What identifies the model's files by their content: a sha256 over every file's path
    under ``model_path`` and the sha256 of its bytes. Weights changed under the same names
    change it, whatever their sizes and modification times say (a copy that keeps them, a
    clock set back). It reads every byte once, which the engine's load then finds in the page
    cache; only a serving pod told that its artifact passed before asks for it (the check it
    may skip costs more). None: not a directory."""
    if not model_path.is_dir():
        return None
    h = hashlib.sha256()
    for path in _model_files(model_path):
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        h.update(f"{path.relative_to(model_path)}\0{digest}\n".encode())
    return h.hexdigest()


def files_signature(model_path: Path) -> str | None:
    """A stat of every file under ``model_path`` (path, size, modification time): what tells,
    without reading them again, that the files changed while a precompile ran."""
    if not model_path.is_dir():
        return None
    h = hashlib.sha256()
    for path in _model_files(model_path):
        st = path.stat()
        h.update(f"{path.relative_to(model_path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def passed_before(doc: dict[str, Any], model_path: Path, verified: str | None) -> bool:
    """Whether a serving engine may skip the check: the operator says this artifact passed it
    before (``verified``, where), and the model's files are those the reference answers
    (``doc``) were recorded from. Logs which, and why."""
    if not verified:
        return False
    recorded = doc.get("weights")
    if isinstance(recorded, str) and recorded == weights_fingerprint(model_path):
        log.info("Output check skipped: %s, and the model's files are those its reference "
                 "answers were recorded from", verified)
        return True
    log.info("Output check runs although %s: the model's files are not those its reference "
             "answers were recorded from%s", verified,
             "" if isinstance(recorded, str) else " (the artifact does not say which)")
    return False


def write(artifact: Path, doc: dict[str, Any]) -> Path:
    path = artifact / REFERENCE_FILENAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)
    return path


def read(artifact: Path) -> tuple[list[Answer], dict[str, Any]] | None:
    """The artifact's reference answers and their document, or None if it has none (an
    artifact built before the check, or with recording off). Raises ValueError for a file
    that is not a reference document."""
    path = artifact / REFERENCE_FILENAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, this engine reads {FORMAT}")
        answers = [
            Answer(str(p["id"]), [int(t) for t in p["promptTokenIds"]],
                   [int(t) for t in p["tokenIds"]], [float(x) for x in p["logprobs"]])
            for p in doc["prompts"]
        ]
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a reference answers document: {e}") from e
    return answers, doc


def as_dict(a: Answer) -> dict[str, Any]:
    return asdict(a)
