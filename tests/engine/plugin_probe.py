"""Run the Spyre plugin's own configuration and catalog code on CPU; print what it decided.

``python plugin_probe.py CASES.json`` (a fresh process: the plugin keeps state in env vars and
class attributes). Each case is ``{"args": [vllm serve args], "env": {...}, "catalogs":
[catalog, ...]}``. For each, vLLM's own ``vllm serve`` parser (with the plugin's
``pre_register_and_update`` defaults) builds the VllmConfig, which runs the plugin's
``check_and_update_config`` (caps, model registry, VLLM_DT_* env); then the plugin's
``match_from_pre_compile_catalog`` is asked about each catalog. Prints one JSON list.
torch_sendnn is never imported (the sendnn backend only needs it in the workers).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

PLUGIN_ENV = ("VLLM_DT_CHUNK_LEN", "VLLM_DT_MAX_CONTEXT_LEN", "VLLM_DT_MAX_BATCH_SIZE")
RESET = (
    *PLUGIN_ENV,
    "VLLM_DT_MAX_BATCH_TKV_LIMIT",
    "SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG",
    # set by the plugin's handle_disable_compilation (decoders with REQUIRE_PRECOMPILED_DECODERS)
    "DISABLE_COMPILATION",
    "SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS",
    "SENDNN_INFERENCE_WARMUP_PROMPT_LENS",
    "SENDNN_INFERENCE_WARMUP_BATCH_SIZES",
    "TORCH_SENDNN_CACHE_ENABLE",
    "TORCH_SENDNN_CACHE_DIR",
)


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())
    os.environ["VLLM_PLUGINS"] = "sendnn_inference"
    os.environ.setdefault("SENDNN_INFERENCE_DYNAMO_BACKEND", "sendnn")
    from sendnn_inference import envs as envs_spyre
    from sendnn_inference.compilation_utils import match_from_pre_compile_catalog
    from sendnn_inference.platform import SpyrePlatform
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    results = []
    for case in cases:
        for key in RESET:
            os.environ.pop(key, None)
        os.environ.update(case.get("env", {}))
        envs_spyre.clear_env_cache()
        SpyrePlatform._warmup_shapes = None
        SpyrePlatform._max_batch_tkv_limit = 0
        out: dict[str, object] = {}
        try:
            parser = make_arg_parser(FlexibleArgumentParser())
            args = parser.parse_args(case["args"])
            config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
            out["max_model_len"] = config.model_config.max_model_len
            out["max_num_seqs"] = config.scheduler_config.max_num_seqs
            out["max_num_batched_tokens"] = config.scheduler_config.max_num_batched_tokens
            out["num_gpu_blocks_override"] = config.cache_config.num_gpu_blocks_override
            out["env"] = {k: os.environ.get(k) for k in RESET}
            out["matches"] = [
                match_from_pre_compile_catalog(catalog, config) for catalog in case["catalogs"]
            ]
        except Exception as exc:  # reported, the test decides
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc()[-2000:]
        results.append(out)
    print("PROBE-RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
