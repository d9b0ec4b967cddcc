"""What the benchmarks share: the prompts every timed comparison uses, the models they run on (SmolLM2 offline, or
random weights of a given shape saved once under bench/.cache/), peak memory, and the FLOP counts of one PPO iteration
that MFUs are computed from (bench/limit.py's docstring derives them). Imports no torch at the top: TRL's side of
bench/peer_trl.py runs in its own venv (bench/.venv-trl)."""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / ".cache"
PROMPTS = [
    "Tell me a story about a cat.", "What is the capital of France?", "Give me three tips for sleeping well.",
    "Write a haiku about rain.", "Explain photosynthesis briefly.", "How do I boil an egg?", "What is 17 times 3?",
    "Name a famous painter and one of their works.", "Why is the sky blue?", "Suggest a name for a pet turtle.",
    "What should I pack for a weekend trip?", "Describe the taste of a lemon.", "How many legs does a spider have?",
    "Write one sentence about the sea.", "What is a good breakfast?", "Translate 'thank you' into French.",
]
QWEN_SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN_1_5B_SHAPE = {**QWEN_SHAPE, "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                   "intermediate_size": 8960}
# random models: name -> (folder under bench/.cache, Qwen2 config, or None for SmolLM2's own config: its exact shape);
# "qwen-tiny" is bench/gpu_check.py --dry-run's. Random weights almost never sample EOS: every reply runs to the cap.
RANDOM_SHAPES = {"qwen-shape": ("qwen2.5-0.5b-shape-random", QWEN_SHAPE),
                 "qwen1.5b-shape": ("qwen2.5-1.5b-shape-random", QWEN_1_5B_SHAPE),
                 "smollm2-shape": ("smollm2-135m-shape-random", None),
                 "qwen-tiny": ("qwen2-tiny-random", {**QWEN_SHAPE, "hidden_size": 64, "num_hidden_layers": 2,
                                                     "num_attention_heads": 4, "intermediate_size": 128})}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# ------------------------------------------------------------------------------------------ preparation
def prepare_model(name: str, tokenizer_folder: str | None = None, cache: Path = CACHE) -> str:
    """A local folder for `name` (run in our venv). The random models take their tokenizer from the folder
    `tokenizer_folder` (default: SmolLM2's; bench/gpu_check.py carries SmolLM2's tokenizer files alone to a GPU machine,
    and its --dry-run a tiny one) and are saved once under `cache`."""
    sys.path.insert(0, str(ROOT))
    from ppo_rlhf.models.loading import resolve_model_path

    if name == "smollm2":
        return resolve_model_path("smollm2")
    if name not in RANDOM_SHAPES:
        raise SystemExit(f"unknown model {name!r}")
    folder = cache / RANDOM_SHAPES[name][0]
    if not (folder / "config.json").is_file():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2Config

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder or resolve_model_path("smollm2"))
        shape = RANDOM_SHAPES[name][1]
        config = (AutoConfig.from_pretrained(resolve_model_path("smollm2")) if shape is None else
                  Qwen2Config(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process (a second test worker) saved it first: keep theirs
            if not (folder / "config.json").is_file():
                raise
            shutil.rmtree(tmp)
    return str(folder)


def peak_gpu_gb() -> float | None:
    """The most GPU memory torch's allocator held at once (None without CUDA)."""
    import torch

    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None


# ------------------------------------------------------------------------------------------------ FLOPs
def chunk_tokens(rollout, rows_per_chunk: int, first: int | None = None) -> tuple[int, int]:
    """(positions the body computes, positions the LM head computes) when a rollout is run in row chunks, each
    trimmed to its own longest row; the head starts at `first` (the batch's) or at each chunk's own first reply."""
    from ppo_rlhf.models.logprobs import first_reply_position
    from ppo_rlhf.ppo.trainer import row_chunks

    body = head = 0
    for rows in row_chunks(len(rollout.prompts), rows_per_chunk):
        part = rollout.select(rows)
        width = part.input_ids.shape[1]
        start = first_reply_position(part.prompt_ids) if first is None else first
        body += len(rows) * width
        head += len(rows) * (width - 1 - start)
    return body, head


def model_sizes(trainer) -> dict[str, int]:
    """N (the policy's body without embedding and LoRA), H (its LM head) and the value model's body."""
    from ppo_rlhf.models.loading import backbone_and_head
    from ppo_rlhf.models.logprobs import body_and_lm_head

    body, head = body_and_lm_head(trainer.policy)
    vbody, _ = backbone_and_head(trainer.value_model)

    def count(module) -> int:
        return sum(p.numel() for name, p in module.named_parameters()
                   if "embed_tokens" not in name and "lora_" not in name)

    return {"n_body": count(body), "n_head": head.weight.numel(), "n_vbody": count(vbody)}


def iteration_flops(rollout, micro: int, epochs: int, minibatch: int, sizes: dict[str, int],
                    reward_model: bool = True) -> dict[str, float]:
    """The FLOPs of one iteration's phases (bench/limit.py's docstring derives the counts) from the rollout it ran;
    `reward_model`: whether scoring runs a reward model (a reward function, as a verifiable task's, costs no FLOPs
    here)."""
    from ppo_rlhf.models.logprobs import first_reply_position

    n_body, n_head, n_vbody = sizes["n_body"], sizes["n_head"], sizes["n_vbody"]
    B = len(rollout.prompts)
    prompt_width = max(len(p) for p in rollout.prompt_ids)
    steps = int(rollout.reply_lengths.max())
    scored, scored_head = chunk_tokens(rollout, micro, first_reply_position(rollout.prompt_ids))
    # generation: prefill of the left-padded prompts, then `steps` decoding steps for every row
    gen = B * (prompt_width + steps) * 2 * (n_body + n_head)
    # scoring: policy (with logits), reference (with logits), value model; reward model ~ one more body pass
    score = scored * 2 * n_body * 2 + scored_head * 2 * n_head * 2 + scored * 2 * n_vbody * (1 + reward_model)
    # update: every epoch, every micro-batch; per token 6N model FLOPs for policy and value bodies, + LM head
    # (the minibatches are random rows; contiguous ones are used here, close enough for the count)
    update_tokens = update_head = 0
    for _ in range(epochs):
        for start in range(0, B, minibatch):
            body_pos, head_pos = chunk_tokens(rollout.select(list(range(start, min(B, start + minibatch)))), micro)
            update_tokens, update_head = update_tokens + body_pos, update_head + head_pos
    return {"gen": gen, "score": score,
            "update_6N": update_tokens * 6 * (n_body + n_vbody) + update_head * 6 * n_head,
            "update_4N": update_tokens * 4 * (n_body + n_vbody) + update_head * 6 * n_head,
            "reply_tokens": int(rollout.reply_lengths.sum()), "decode_steps": steps, "scored_positions": scored,
            "update_positions": update_tokens}
