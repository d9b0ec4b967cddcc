"""`ppo-rlhf check --config CONFIG.yaml`: the invariants a correct PPO must satisfy, measured on the user's own
models (from the config) and a few of its prompts, before any training. One line per invariant, with its numbers:

  first-ratio     the first minibatch's ratio pi_new / pi_old is 1 and the KL to the reference 0 (to float rounding in
                  float32; bfloat16/float16 have a measured mismatch, held to a looser tolerance)
  reference       the reference (policy with its adapter off) gives the base model's log-probs, even after the
                  adapter has moved
  masks           the closing EOS of a finished reply is a trained action; padding (and the prompt) never is, nor, in
                  a multi-turn run, an observation (a tool's result, the environment's text) between the turns
  score-position  the score is added on the last reply token and nowhere else (multi-turn: with the environment's
                  reward of each turn on that turn's last token)
  micro-batches   the losses of a minibatch are the same in one pass and in micro-batches of one reply
  cap             some reply finishes within max_new_tokens (if none does, the EOS rule scores them all alike: no
                  signal); the finished share is reported and the prompts none of whose replies finished are named

Exit status: 0 when every invariant holds (or cannot be measured on this sample: "skip"), 1 when one fails,
2 for bad input (as every command).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ppo_rlhf.config import POSITIVE_INT, read_yaml
from ppo_rlhf.ppo.train_config import TrainConfig

if TYPE_CHECKING:
    import torch

    from ppo_rlhf.ppo.experience import Experience
    from ppo_rlhf.ppo.trainer import PPOLoop

# largest |ratio - 1|, |KL| or |log-prob difference| accepted per dtype; the low-precision ones are measured mismatches
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
# relative, micro-batches vs one pass: float32 sums in another order ~1e-6 measured; bf16 matmuls of other shapes
# round differently (1.2e-3 measured on the tiny test models, where the policy loss is ~1e-6 against the 1e-3 floor)
LOSS_TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}


@dataclass
class Result:
    name: str
    status: str  # "pass", "FAIL" or "skip" (not measurable on this sample)
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<14}  {self.detail}"


def verdict(name: str, ok: bool, detail: str) -> Result:
    return Result(name, "pass" if ok else "FAIL", detail)


def dtype_name(trainer: PPOLoop) -> str:
    """The dtype the frozen weights are stored in (`dtype: auto` resolved), e.g. "bfloat16"."""
    from ppo_rlhf.models.precision import dtype_name as name

    return name(trainer.dtype)


def reply_end(experience: Experience, row: int) -> int:
    """Position of the row's last reply token in input_ids (from the known lengths, never from the mask)."""
    return len(experience.prompt_ids[row]) + len(experience.reply_ids[row]) - 1


def policy_positions(trainer: PPOLoop, experience: Experience) -> torch.Tensor:
    """[B, L-1] 1 where the policy chose the next token, from what was sampled (never from the mask): every reply
    token; in a multi-turn run only the episode's own turns (`experience.episodes`)."""
    import torch

    expected = torch.zeros_like(experience.action_mask)
    for row, reply in enumerate(experience.reply_ids):
        flags = experience.episodes[row].policy if experience.episodes is not None else [1] * len(reply)
        start = len(experience.prompt_ids[row]) - 1
        expected[row, start : start + len(flags)] = torch.tensor(flags, dtype=expected.dtype)
    return expected


def first_ratio(trainer: PPOLoop, experience: Experience) -> Result:
    """Training-mode log-probs with gradients (as the first update computes them) against log pi_old."""
    import torch

    from ppo_rlhf.models.logprobs import first_reply_position

    act, tolerance = experience.action_mask.bool(), TOLERANCE[dtype_name(trainer)]
    trainer.set_training(True)
    with torch.enable_grad():
        new = trainer.actor.logprobs(experience.input_ids, experience.attention_mask,
                                     first_reply_position(experience.prompt_ids)).detach()
    trainer.set_training(False)
    ratio = float((new - experience.old_logprobs).exp().sub(1).abs()[act].max())
    kl = float(experience.kl.abs()[act].max())
    return verdict("first-ratio", ratio <= tolerance and kl <= tolerance,
                   f"max |ratio - 1| {ratio:.2e}, max |KL_t| {kl:.2e} (tolerance {tolerance:g}, {dtype_name(trainer)})")


def reference(trainer: PPOLoop, experience: Experience) -> Result:
    """Move the adapter, then compare the reference's log-probs with a freshly loaded base model's."""
    import torch

    from ppo_rlhf.models.loading import load_causal_lm
    from ppo_rlhf.models.logprobs import token_logprobs
    from ppo_rlhf.ppo.trainer import trainable_parameters

    cfg, act, tolerance = trainer.cfg, experience.action_mask.bool().cpu(), TOLERANCE[dtype_name(trainer)]
    ids, att = experience.input_ids.to(trainer.device), experience.attention_mask.to(trainer.device)
    base = load_causal_lm(cfg.policy_model, trainer.dtype, cfg.trust_remote_code).to(trainer.device)
    with torch.no_grad():
        expected = token_logprobs(base, ids, att, cfg.temperature).cpu()
        saved = [p.detach().clone() for p in trainable_parameters(trainer.policy)]
        for p in trainable_parameters(trainer.policy):  # as if training had moved the adapter
            p.add_(0.05 * torch.randn_like(p))
        moved = trainer.actor.logprobs(ids, att, 0).cpu()
        got = trainer.actor.reference_logprobs(ids, att, 0).cpu()
        for p, old in zip(trainable_parameters(trainer.policy), saved):
            p.copy_(old)
    del base
    gap, adapter = float((got - expected).abs()[act].max()), float((moved - expected).abs()[act].max())
    return verdict("reference", gap <= tolerance and adapter > tolerance,
                   f"max |log pi_ref - log pi_base| {gap:.2e} with the adapter moved (which moved the policy by "
                   f"{adapter:.2e}; tolerance {tolerance:g})")


def masks(trainer: PPOLoop, experience: Experience) -> Result:
    """The action mask is 1 exactly on the policy's tokens: EOS of a finished reply included, padding never, a
    multi-turn episode's observations never."""
    act = experience.action_mask
    expected = policy_positions(trainer, experience)
    eos_rows = [row for row in range(len(experience.prompts)) if bool(experience.finished[row])]
    eos_trained = sum(int(act[row, reply_end(experience, row) - 1]) for row in eos_rows)
    pad_trained = int(((act != 0) & (expected == 0)).sum())
    dropped = int(((act == 0) & (expected == 1)).sum())
    where = "padding/prompt/observation" if trainer.cfg.multi_turn else "padding/prompt"
    detail = (f"EOS trained in {eos_trained}/{len(eos_rows)} finished replies, {pad_trained} {where} positions "
              f"trained, {dropped} policy tokens untrained")
    if not eos_rows and pad_trained == dropped == 0:
        return Result("masks", "skip", detail + " (no reply finished: EOS not verified)")
    return verdict("masks", eos_trained == len(eos_rows) and pad_trained == dropped == 0, detail)


def score_position(trainer: PPOLoop, experience: Experience) -> Result:
    """Per-token rewards minus their KL part: the score on the last reply token, 0 on the others; in a multi-turn run
    each turn's environment reward on that turn's last token besides."""
    import torch

    act = experience.action_mask.bool()
    score_part = torch.where(act, experience.rewards + trainer.reward_beta * experience.kl, 0.0)
    expected = torch.zeros_like(score_part)
    for row in range(len(experience.prompts)):
        expected[row, reply_end(experience, row) - 1] = experience.scores[row]
        if experience.episodes is not None:  # the episode's per-turn rewards, where it recorded them
            start, turn_rewards = len(experience.prompt_ids[row]) - 1, experience.episodes[row].rewards
            expected[row, start : start + len(turn_rewards)] += torch.tensor(turn_rewards, dtype=expected.dtype)
    gap = float((score_part - expected).abs().max())
    return verdict("score-position", gap <= 1e-5, f"max |reward - KL part - score at the last reply token| {gap:.2e}")


def micro_batches(trainer: PPOLoop, experience: Experience) -> Result:
    """The minibatch's policy and value losses in one pass, and summed over micro-batches of one reply."""
    import torch

    from ppo_rlhf.ppo.trainer import row_chunks

    rows = list(range(len(experience.prompts)))
    tokens, count = trainer.global_counts(experience, rows)

    def losses(size: int) -> tuple[float, float]:
        policy = value = 0.0
        for micro in row_chunks(rows, size):
            part = experience.select(micro)
            share = float(part.action_mask.sum()) / tokens
            policy += float(trainer.policy_loss(part, count, share)[0])
            value += float(trainer.value_loss(part, count, share)[0]) if trainer.critic is not None else 0.0
        return policy, value

    trainer.set_training(True)
    with torch.no_grad():
        whole, split = losses(len(rows)), losses(1)
    trainer.set_training(False)
    gaps = [abs(a - b) / max(abs(a), 1e-3) for a, b in zip(whole, split)]
    return verdict("micro-batches", max(gaps) <= LOSS_TOLERANCE[dtype_name(trainer)],
                   f"policy loss {whole[0]:+.6f} vs {split[0]:+.6f}, value loss {whole[1]:.6f} vs {split[1]:.6f} "
                   f"(one pass vs micro-batches of 1; relative gap {max(gaps):.1e})")


def cap(trainer: PPOLoop, experience: Experience) -> Result:
    """Some replies finish within max_new_tokens; the prompts none of whose replies finished are named, and what the
    EOS rule does to the reward when fewer than half finish (`unfinished_warning`)."""
    finished: dict[Any, list[bool]] = {}
    for prompt, done in zip(experience.prompts, experience.finished.tolist()):
        finished.setdefault(prompt, []).append(bool(done))
    never = [prompt for prompt, done in finished.items() if not any(done)]
    share = float(experience.finished.float().mean())
    named = "; never finished: " + ", ".join(repr(p[:40]) for p in never[:5]) if never else ""
    warning = unfinished_warning(trainer.cfg, share, len(experience.prompts))
    return verdict("cap", share > 0, f"{share:.0%} of {len(experience.prompts)} replies finished within "
                                     f"max_new_tokens={trainer.cfg.max_new_tokens}{named}"
                                     + (f" ({warning})" if warning else ""))


def unfinished_warning(cfg: TrainConfig, finished_share: float, replies: int) -> str | None:
    """One sentence when fewer than half of `replies` start-policy replies finished within the cap under the EOS
    rule: most scores are then `unfinished_score` whatever the reward says (`check`'s cap line, and `train` at the
    start from the reward normalisation's replies); else None."""
    if not cfg.eos_rule or finished_share >= 0.5:
        return None
    return (f"only {finished_share:.0%} of {replies} start-policy replies finished within "
            f"max_new_tokens={cfg.max_new_tokens}: with eos_rule on, every unfinished reply scores "
            f"unfinished_score={cfg.unfinished_score:g} instead of its reward, so the reward barely reaches PPO; "
            "raise max_new_tokens, or set eos_rule false")


INVARIANTS = (first_ratio, reference, masks, score_position, micro_batches, cap)


def check_config(cfg: TrainConfig, replies: int) -> TrainConfig:
    """The user's config for one small batch: `replies` replies (whole groups), one minibatch, unwhitened rewards
    (so the score can be found in them), quiet."""
    replies = max(replies // cfg.group_size, 1) * cfg.group_size
    checked = dataclasses.replace(cfg, batch_size=replies, minibatch_size=replies, micro_batch_size=0,
                                  whiten_rewards=False, quiet=True, tensorboard=False)
    checked.validate()
    return checked


def run_checks(cfg: TrainConfig, replies: int = 8) -> list[Result]:
    """Load the config's models, sample and score one batch, and measure every invariant on it."""
    from ppo_rlhf.ppo.trainer import PPOLoop

    trainer = PPOLoop(check_config(cfg, replies))
    experience = trainer.score(trainer.rollout(trainer.next_prompts()))
    return [invariant(trainer, experience) for invariant in INVARIANTS]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the YAML config of a training run (its models and prompts)")
    parser.add_argument("--replies", type=POSITIVE_INT, default=8, help="replies sampled for the checks (default 8)")


def run(args: argparse.Namespace) -> int:
    from ppo_rlhf.config import build_config

    cfg = build_config(TrainConfig, read_yaml(args.config))
    cfg.check_files()
    results = run_checks(cfg, args.replies)
    for result in results:
        print(result.line())
    failed = [r.name for r in results if r.status == "FAIL"]
    print(f"{len(results) - len(failed)}/{len(results)} invariants hold" + (f"; failed: {', '.join(failed)}"
                                                                               if failed else ""))
    return 1 if failed else 0
