"""Build a tiny random-weight LLM offline (no hub): enough for vLLM + the Spyre plugin on CPU.

Granite or Llama, 2 layers, hidden 128, 4 heads / 2 KV heads, a ~1k byte-level BPE vocabulary
trained on a few KB of text. The weights are random, so outputs are gibberish, but every code path
(tokenizer, chat template, prefill chunks, decode, pooling) is exercised.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

Arch = Literal["granite", "llama"]

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|start_of_role|>", "<|end_of_role|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|start_of_role|>{{ message['role'] }}<|end_of_role|>{{ message['content'] }}<|endoftext|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
)


def _corpus() -> list[str]:
    """A few KB of varied English-like text to train the BPE merges on."""
    words = (
        "the quick brown fox jumps over a lazy dog while spyre accelerators serve large "
        "language models with vllm on kubernetes clusters operators reconcile custom resources "
        "and precompile graphs into artifacts so that servers start fast and never compile on "
        "the serving path tokens prompts completions streams drain gracefully on shutdown "
        "metrics probes readiness liveness startup cache prefix hits queries numbers 0 1 2 3 4 "
        "5 6 7 8 9 hello world what is the capital of france paris is a city in europe"
    ).split()
    lines = []
    for i in range(400):
        n = 6 + i % 11
        lines.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(n)) + ".")
    return lines


def _build_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|pad|>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    # Some transformers versions keep the template only in chat_template.jinja; write both.
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("chat_template", CHAT_TEMPLATE)
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _build_model(path: Path, arch: Arch, vocab_size: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import (
        GraniteConfig,
        GraniteForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model: Any
    config: Any
    if arch == "granite":
        config = GraniteConfig(**common)
        model = GraniteForCausalLM(config)
    elif arch == "llama":
        config = LlamaConfig(**common)
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(f"unknown arch {arch!r}")
    model = model.to(torch.float32).eval()
    model.save_pretrained(str(path), safe_serialization=True)
    gen = path / "generation_config.json"
    if gen.exists():
        data = json.loads(gen.read_text())
        data.update({"eos_token_id": eos_id, "pad_token_id": pad_id, "bos_token_id": eos_id})
        gen.write_text(json.dumps(data, indent=2))


def build_tiny_model(path: Path | str, arch: Arch = "granite", pooling: bool = False) -> Path:
    """Write a tiny model to ``path`` (idempotent: reused if complete) and return ``path``.

    ``pooling=True`` marks the config for embedding use (vLLM pools it with ``--runner pooling
    --convert embed``); the weights are the same decoder.
    """
    path = Path(path)
    marker = path / ".tiny-model-complete"
    if marker.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=path.parent if path.parent.exists() else None))
    try:
        _build_tokenizer(tmp)
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(str(tmp))
        _build_model(tmp, arch, len(tok), tok.eos_token_id, tok.pad_token_id)
        if pooling:
            cfg = json.loads((tmp / "config.json").read_text())
            cfg["spyre_engine_pooling"] = True
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        (tmp / ".tiny-model-complete").write_text(arch + "\n")
        os.chmod(tmp, 0o755)
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


if __name__ == "__main__":
    import sys

    out = build_tiny_model(
        sys.argv[1],
        sys.argv[2] if len(sys.argv) > 2 else "granite",  # type: ignore[arg-type]
    )
    print(out)
