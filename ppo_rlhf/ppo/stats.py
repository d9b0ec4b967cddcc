"""The batch's numbers on the dashboard and in history.jsonl (docs/DESIGN.md's table says where each comes from):
means over every process's replies, or over every process's reply tokens, and a multi-turn batch's episode counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from ppo_rlhf.parallel.distributed import Dist
from ppo_rlhf.ppo.experience import Experience
from ppo_rlhf.ppo.objectives import explained_variance, kl_k3, masked_sum

# a multi-turn run's batch means: the environment's reward summed over an episode's turns (the rewards that are not
# in "score", which holds the reward functions' and models'), turns, tool calls and tool errors per episode, the share
# of the trajectory's tokens after the prompt that are observations (masked)
EPISODE_STATS = ("env_reward", "turns", "tool_calls", "tool_errors", "masked_share")
# the order of an iteration's numbers in history.jsonl; "phase" is "critic-warmup" or "policy", "kl_used" names the
# estimator and placement of "kl" (mean over replies of the summed per-token estimate at pi_old), e.g. "k1 in reward"
HISTORY_ORDER = ("iteration", "phase", "score", "rm_raw", "kl", "kl_used", "len", "fin", *EPISODE_STATS, "ent",
                 "clipfrac", "approx_kl", "v_loss", "ev", "ev_gate", "vclipfrac", "mismatch_kl", "ratio_spread",
                 "pg_loss", "grad_norm_policy", "grad_norm_value", "ptx_loss", "lr", "beta", "skipped_steps",
                 "time_gen", "time_score", "time_update", "time_total", "gen_tokens_per_s")



def batch_stats(experience: Experience, dist: Dist, has_critic: bool) -> dict[str, float]:
    """The batch's numbers, means over every process's replies (equal counts each); "ev" nan without a critic."""
    act = experience.action_mask
    means = {"score": float(experience.scores.mean()), "rm_raw": float(experience.raw_scores.mean()),
             "kl": float(masked_sum(experience.kl, act, dim=1).mean()),
             "len": float(experience.reply_lengths.float().mean()),
             "fin": float(experience.finished.float().mean())}
    means = {key: value / dist.world_size for key, value in dist.sum_dict(means).items()}
    # means over reply tokens, summed and counted over every process (their counts differ): the entropy, and the
    # k3 estimate of KL(generate's recorded log-probs || the trainer's log pi_old) of the same tokens
    recorded = experience.logprobs
    mismatch = float("nan") if recorded is None else masked_sum(kl_k3(experience.old_logprobs, recorded), act)
    sums = dist.sum_dict({"ent": float(masked_sum(experience.entropy, act)), "mismatch_kl": float(mismatch),
                          "tokens": float(act.sum())})
    means |= {key: sums[key] / sums["tokens"] for key in ("ent", "mismatch_kl")}
    if experience.episodes is not None:
        means |= episode_means(experience.episodes, experience, dist)
    # over the policy's tokens only (in a multi-turn run the observations are off the action mask)
    ev = explained_variance(experience.old_values, experience.returns, act) if has_critic else float("nan")
    return {**means, "ev": ev}


def episode_means(episodes: list[Any], experience: Experience, dist: Dist) -> dict[str, float]:
    """EPISODE_STATS of a multi-turn batch (`episodes`: its multiturn.episodes.Episode rows), means over every
    process's episodes."""
    after_prompt = experience.reply_lengths.float()
    masked = after_prompt - experience.action_mask.sum(1).cpu()
    means = {"env_reward": float(np.mean([sum(e.rewards) for e in episodes])),
             "turns": float(np.mean([e.turns for e in episodes])),
             "tool_calls": float(np.mean([e.tool_calls for e in episodes])),
             "tool_errors": float(np.mean([e.tool_errors for e in episodes])),
             "masked_share": float(masked.sum() / after_prompt.sum())}
    return {key: value / dist.world_size for key, value in dist.sum_dict(means).items()}
