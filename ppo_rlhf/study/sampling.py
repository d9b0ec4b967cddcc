"""Sampling a model's held-out replies for evaluation (`ppo-rlhf evaluate`, `ppo-rlhf task evaluate`): the same
prompts for every model, torch's RNG reset to the same seed before each samples, one record per reply with its
length, whether it finished, its KL to the start model and its entropy; the records' labels (`START`, `model_label`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from tqdm import tqdm

START = "start"
# what a record's "kl" is (see sample_records); the text and the report say it
KL_ESTIMATE = "k3 estimate of KL(model || start model), summed over each reply's tokens"


def model_label(run: str | None, iteration: int | None) -> str:
    """What a model's records are labelled: `START` for the start model, "RUN step N" for a run's checkpoint."""
    return START if run is None else f"{run} step {iteration}"


def sample_records(
    model,
    tokenizer,
    prompts: list[str],
    replies_per_prompt: int,
    settings: dict[str, Any],
    seed: int,
    batch_size: int,
    run: str | None,
    iteration: int | None,
    reference=None,
) -> tuple[list[dict], list[list[int]]]:
    """Sample replies_per_prompt replies per prompt: the records, with per-reply tokens, finished, KL and entropy
    sum, and each reply's token ids (what reward functions get as `completion_ids`; not kept in the records).

    The KL is `KL_ESTIMATE`: per token k3 = r - 1 - log r, r = pi_ref / pi, on the policy's own samples an unbiased
    estimate of KL(pi || pi_ref) that is never negative (k1, log pi - log pi_ref, is unbiased too but any single
    reply's sum can be negative, and a mean near zero then printed as "-0.0"), summed over the reply's tokens.
    The policy's log-probs and entropies are the ones generation computed anyway (`record_logprobs`): one forward
    pass per reply fewer. In bf16 they differ from a full forward's by float rounding (the run's `mismatch_kl` per
    token, about 0.002 nats in SmolLM2); the reference's log-probs come from a forward pass of the same tokens, through
    the policy with its adapter off, or through `reference` (the start model) for a policy without one (a full
    fine-tune).
    """
    # lazy, as in run(): `ppo-rlhf evaluate` checks its arguments and files before torch loads
    import torch

    from ppo_rlhf.models.rollout import generate_rollout
    from ppo_rlhf.ppo.objectives import masked_sum

    label = model_label(run, iteration)
    repeated = [p for p in prompts for _ in range(replies_per_prompt)]  # reply i of prompt j at j * R + i
    temperature = settings["temperature"]
    torch.manual_seed(seed)  # same seed for every model: differences come from the weights, not the dice
    # drop_finished: finished replies leave the batch (the same random stream as generate, fewer decode steps)
    rollout = generate_rollout(model, tokenizer, repeated, settings["max_new_tokens"], temperature, batch_size,
                               top_p=settings["top_p"], record_logprobs=True, drop_finished=True)
    entropy_sum = masked_sum(rollout.entropy, rollout.action_mask, dim=1)
    kl = reference_kl(model, rollout, temperature, batch_size, reference, label) if run is not None else \
        [0.0] * len(repeated)  # the start model is its own reference
    entropy_sum = entropy_sum.tolist()
    tokens = rollout.reply_lengths.tolist()
    finished = rollout.finished.tolist()
    records = [
        {
            "model": label,
            "run": run,
            "iteration": iteration,
            "prompt_index": k // replies_per_prompt,
            "reply_index": k % replies_per_prompt,
            "prompt": repeated[k],
            "reply": rollout.reply_texts[k],
            "tokens": int(tokens[k]),
            "finished": bool(finished[k]),
            "kl": float(kl[k]),
            "entropy_sum": float(entropy_sum[k]),
        }
        for k in range(len(repeated))
    ]
    return records, rollout.completion_ids


def reference_kl(model, rollout, temperature: float, batch_size: int, reference=None, label: str = "") -> list[float]:
    """`KL_ESTIMATE` of each row of a rollout sampled from `model` with its log-probs recorded, over its action mask
    (a multi-turn rollout's: the policy's tokens only). The reference's log-probs come from a forward pass of the same
    tokens through `model` with its adapter off, or through `reference` (the start model) for a model without one (a
    full fine-tune, which has no adapter to switch off)."""
    import torch

    from ppo_rlhf.models.logprobs import first_reply_position, token_logprobs
    from ppo_rlhf.ppo.objectives import kl_k3, masked_sum

    device = next(model.parameters()).device
    kls = []
    with torch.no_grad(), model.disable_adapter() if reference is None else contextlib.nullcontext():
        for start in tqdm(range(0, len(rollout.prompts), batch_size), desc=f"reference log-probs {label}",
                          leave=False):
            rows = slice(start, start + batch_size)
            part = rollout.select(rows)
            ids, att = part.input_ids.to(device), part.attention_mask.to(device)
            first = first_reply_position(part.prompt_ids)  # no LM head over prompt-only positions
            ref_logprobs = token_logprobs(model if reference is None else reference, ids, att, temperature,
                                          first=first).cpu()
            logprobs = rollout.logprobs[rows, : ref_logprobs.shape[1]]
            kls.append(masked_sum(kl_k3(ref_logprobs, logprobs), part.action_mask, dim=1))  # r = ref / pi
    return torch.cat(kls).tolist()
