"""The reference answers' comparison (spyre_engine.answers) and the request format, pinned to the
installed plugin's GoldenTokenInjector and to vLLM's /v1/completions request model."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from spyre_engine import answers as A


def lp(p: float) -> float:
    return math.log(p)


REF = A.Answer("p0", [5, 6, 7], [10, 11, 12], [lp(0.9), lp(0.6), lp(0.5)])


def got(tokens: list[int], probs: list[float], top: list[tuple[int, float]] | None = None
        ) -> A.Answer:
    logprobs = [lp(p) for p in probs]
    tops = [(t, lp(p)) for t, p in top] if top else list(zip(tokens, logprobs, strict=True))
    return A.Answer("p0", [5, 6, 7], tokens, logprobs, tops)


def test_the_same_answer_within_tolerance_passes() -> None:
    v = A.judge([REF], [got([10, 11, 12], [0.88, 0.65, 0.45])], 0.08)
    assert v.ok and v.checked == 1 and v.max_prob_diff == pytest.approx(0.05), v


def test_a_probability_off_by_more_than_the_tolerance_is_a_mismatch_at_its_position() -> None:
    v = A.judge([REF], [got([10, 11, 12], [0.9, 0.3, 0.5])], 0.08)
    assert not v.ok
    m = v.mismatches[0]
    assert (m.prompt, m.position, m.expected_id, m.actual_id) == (0, 1, 11, 11)
    assert "position 1" in v.message() and "1 of 1 prompts" in v.message()


def test_another_token_far_from_the_reference_is_a_mismatch() -> None:
    m, _, tie = A.compare(0, REF, got([10, 99, 12], [0.9, 0.2, 0.5]), 0.08)
    assert m is not None and (m.position, m.expected_id, m.actual_id) == (1, 11, 99) and not tie


def test_a_near_tie_is_accepted_and_ends_that_prompt() -> None:
    """Upstream's "DIVERGING": another token about as likely as the expected one was."""
    m, _, tie = A.compare(0, REF, got([10, 99, 1], [0.9, 0.58, 0.01]), 0.08)
    assert m is None and tie


def test_a_flip_the_injection_hid_is_seen_in_the_top_1() -> None:
    """The injector forced the expected token; the model's own argmax was another, far more
    likely: a mismatch, reported with the model's token."""
    answer = got([10, 11, 12], [0.9, 0.6, 0.5], top=[(10, 0.9), (42, 0.95), (12, 0.5)])
    # the expected token's probability itself is unchanged (0.6): only the top-1 tells
    m, _, _ = A.compare(0, REF, answer, 0.08)
    assert m is not None and (m.position, m.actual_id) == (1, 42)


def test_an_answer_that_stops_early_is_a_mismatch() -> None:
    m, _, _ = A.compare(0, REF, got([10], [0.9]), 0.08)
    assert m is not None and m.position == 1


def test_the_body_asks_greedy_logprobs_and_the_injection_as_a_json_string() -> None:
    body = A.request_body("m", [1, 2], 16, REF, 0.08, label="p0")
    assert (body["temperature"], body["logprobs"], body["max_tokens"], body["ignore_eos"]) == (
        0, 1, 3, True)
    payload = body["vllm_xargs"][A.INJECTOR_KEY]
    assert isinstance(payload, str)
    d = json.loads(payload)
    assert d["expected_token_ids"] == REF.token_ids
    assert len(d["expected_logprobs"]) == len(d["expected_token_ids"])


def test_the_payload_is_what_the_installed_injector_reads() -> None:
    """ExpectationState(**payload) as the plugin's add_req_states builds it, from the string."""
    gti = pytest.importorskip("sendnn_inference.v1.sample.golden_token_injector")
    params = inspect.signature(gti.ExpectationState.__init__).parameters
    payload = json.loads(A.injector_payload(REF, 0.08, "p0"))
    assert set(payload) <= set(params) - {"self", "output_token_ids"}, (payload, params)
    state = gti.ExpectationState(output_token_ids=[], **payload)
    assert state.token_ids == REF.token_ids and state.threshold == 0.08
    # soft mode (both set): the injector keeps the model's logprob, never forces blindly
    assert state.logprobs is not None and state.threshold is not None

    class Params:
        extra_args = {A.INJECTOR_KEY: A.injector_payload(REF, 0.08)}

    built = gti.GoldenTokenInjector.add_req_states(Params(), [5, 6, 7], [])  # type: ignore[arg-type]
    assert built is not None and built.token_ids == REF.token_ids
    module, qualname = A.INJECTOR.split(":")
    assert module == gti.__name__ and getattr(gti, qualname) is gti.GoldenTokenInjector


def test_vllms_completion_request_accepts_the_body() -> None:
    """vLLM's own request model: vllm_xargs takes the string (it refuses a nested object)."""
    protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
    body = A.request_body("m", [1, 2], 16, REF, 0.08)
    req = protocol.CompletionRequest.model_validate(body)
    params = req.to_sampling_params(max_tokens=3)
    assert params.extra_args[A.INJECTOR_KEY] == body["vllm_xargs"][A.INJECTOR_KEY]
    nested = {**body, "vllm_xargs": {A.INJECTOR_KEY: json.loads(body["vllm_xargs"][
        A.INJECTOR_KEY])}}
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        protocol.CompletionRequest.model_validate(nested)


def _response(tokens: list[int], probs: list[float], tops: list[tuple[int, float]]
              ) -> dict[str, Any]:
    return {"choices": [{"token_ids": tokens, "logprobs": {
        "tokens": [f"token_id:{t}" for t in tokens],
        "token_logprobs": [lp(p) for p in probs],
        "top_logprobs": [{f"token_id:{t}": lp(p), f"token_id:{a}": lp(q)}
                         for t, p, (a, q) in zip(tokens, probs, tops, strict=True)]}}]}


def test_record_then_check_through_a_post() -> None:
    sent: list[dict[str, Any]] = []

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        sent.append(body)
        n = body["max_tokens"]
        return _response([10, 11, 12][:n], [0.9, 0.6, 0.5][:n], [(1, 0.01)] * n)

    async def run() -> A.Verdict:
        refs = await A.record(post, "m", [("p0", [5, 6, 7])], max_tokens=3)
        assert refs[0].token_ids == [10, 11, 12] and refs[0].top[1] == (11, lp(0.6))
        return await A.check(post, "m", refs, 0.08)

    v = asyncio.run(run())
    assert v.ok, v.message()
    assert "vllm_xargs" not in sent[0] and A.INJECTOR_KEY in sent[1]["vllm_xargs"]


def test_the_file_round_trips_and_refuses_another_format(tmp_path: Path) -> None:
    doc = A.document([REF], "self", "inductor", {"sendnn-inference": "2.6.3"}, 0.08, 3)
    A.write(tmp_path, doc)
    refs, read = A.read(tmp_path) or ([], {})
    assert refs == [A.Answer("p0", [5, 6, 7], [10, 11, 12], REF.logprobs)]
    assert read["recordedWith"]["backend"] == "inductor"
    (tmp_path / A.REFERENCE_FILENAME).write_text(json.dumps({**doc, "format": 99}))
    with pytest.raises(ValueError, match="format 99"):
        A.read(tmp_path)
    assert A.read(tmp_path / "none") is None


def test_the_shaped_prompts_pass_the_chunk_and_repeat_its_prefix() -> None:
    """Issue 44, 6: besides the short prompts, one longer than a prefill chunk (chunked
    prefill) and one repeating that prompt's first chunk (a prefix-cache hit), within the
    context with the answer's tokens after them; neither when the context cannot hold them."""
    short = [(f"p{i}", [100 * i + j for j in range(1, 6)]) for i in range(6)]
    shaped = A.shaped_prompts(short, chunk=128, max_model_len=512, max_tokens=16)
    ids = dict(shaped)
    assert [p for p, _ in shaped] == [*[p for p, _ in short], "long", "prefix"]
    assert len(ids["long"]) == 128 + A.PAST_THE_CHUNK
    assert ids["prefix"][:128] == ids["long"][:128] and ids["prefix"] != ids["long"][
        :len(ids["prefix"])]
    # at the edge of the context: the long prompt still passes the chunk, answer included
    edge = dict(A.shaped_prompts(short, chunk=128, max_model_len=150, max_tokens=16))
    assert 128 < len(edge["long"]) and len(edge["long"]) + 16 < 150
    assert len(edge["prefix"]) + 16 < 150
    assert A.shaped_prompts(short, chunk=128, max_model_len=140, max_tokens=16) == short
    assert A.shaped_prompts(short, chunk=512, max_model_len=512, max_tokens=16) == short


def test_the_check_asks_together_and_the_prefix_repeat_after_its_prefix() -> None:
    """The reference is recorded one prompt at a time; the check asks the prompts at once (a
    batch: several in flight together) and the one repeating another's prefix only once that
    other was answered, so its prefix is cached."""
    short = [(f"p{i}", [100 * i + j for j in range(1, 6)]) for i in range(3)]
    prompts = A.shaped_prompts(short, chunk=64, max_model_len=256, max_tokens=2)
    in_flight, most, order = 0, 0, []

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)  # the others are sent meanwhile when asked together
        await asyncio.sleep(0)
        in_flight -= 1
        order.append(body["prompt"])
        n = body["max_tokens"]
        return _response([10, 11][:n], [0.9, 0.6][:n], [(1, 0.01)] * n)

    async def run() -> tuple[int, A.Verdict]:
        refs = await A.record(post, "m", prompts, max_tokens=2)
        recorded_most = most
        return recorded_most, await A.check(post, "m", refs, 0.08)

    recorded_most, v = asyncio.run(run())
    assert v.ok and v.checked == len(prompts), v.message()
    assert recorded_most == 1  # recorded one at a time
    assert most == len(prompts) - 1  # every prompt but the prefix repeat together
    ids = dict(prompts)
    checked = order[len(prompts):]
    assert checked.index(ids["prefix"]) > checked.index(ids["long"])
    assert checked[-1] == ids["prefix"]


def test_the_default_prompts_share_no_prefix() -> None:
    """Prefix caching would send a shared prefix down another prefill path."""
    words = [p.split()[0] for p in A.DEFAULT_PROMPTS]
    assert len(set(words)) == len(words)


def test_a_restart_skips_the_check_only_on_the_files_the_reference_was_recorded_from(
    tmp_path: Path,
) -> None:
    """Item 4: an artifact that passed before (the operator's word) is not checked again while
    the model's files are those its answers were recorded from; a file replaced under the same
    name (changed weights), an artifact that does not say, or no word: checked."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 64)
    doc = {"weights": A.weights_fingerprint(model)}
    said = "artifact abc passed the output check"
    assert A.passed_before(doc, model, said)
    assert not A.passed_before(doc, model, None) and not A.passed_before(doc, model, "")
    assert not A.passed_before({}, model, said)
    replaced = tmp_path / "new.safetensors"
    replaced.write_bytes(b"v" * 64)  # same size, another file renamed over the old one
    st = (model / "model.safetensors").stat()
    os.utime(replaced, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    os.replace(replaced, model / "model.safetensors")
    assert not A.passed_before(doc, model, said)
    # weights rewritten in place with the same size and modification time (a copy that keeps
    # them): by content, the check runs (by stat it was skipped)
    doc = {"weights": A.weights_fingerprint(model)}
    assert A.passed_before(doc, model, said)
    st = (model / "model.safetensors").stat()
    (model / "model.safetensors").write_bytes(b"u" * 64)
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert A.files_signature(model) is not None
    assert not A.passed_before(doc, model, said)
    assert A.weights_fingerprint(tmp_path / "absent") is None
    assert not A.passed_before({"weights": None}, tmp_path / "absent", said)
