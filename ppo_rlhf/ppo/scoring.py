"""The reward pipeline of a PPO run (section 8.6's step 2, the score): each reply's combined reward (`raw_scores`,
each function's values kept in `batch_rewards`), put on the scale of start-policy replies' scores (`normalised`,
detail 1, statistics from `measure_reward_norm`), the critic's values on the same scale (`normalised_values`, by
`critic_scale`), and beside the rewards the reward-hacking monitor (`monitor_stats`, its baseline checkpointed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ppo_rlhf.errors import require
from ppo_rlhf.models.rollout import Rollout
from ppo_rlhf.parallel.distributed import Dist
from ppo_rlhf.ppo.build import Models, rng_untouched, score_size
from ppo_rlhf.ppo.experience import Experience, per_token_in_chunks, row_chunks
from ppo_rlhf.ppo.monitor import HackingMonitor
from ppo_rlhf.ppo.objectives import last_token_index
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.rewards import BatchRewards, ModelReward, RewardFunctionError, scored_means


class Scoring:
    """The rewards and the monitor's judges of `models`, the normalisation statistics (set by the run from
    `measure_reward_norm`, or its saved norm.json) and the last batch's rewards by function."""

    def __init__(self, cfg: TrainConfig, dist: Dist, device: torch.device, models: Models):
        self.cfg, self.dist, self.device = cfg, dist, device
        self.rewards, self.judges = models.rewards, models.judges
        self.critic, self.critic_source = models.critic, models.critic_source
        self.monitor = HackingMonitor()  # its baseline: the start policy's replies (measure_reward_norm)
        self.batch_rewards: BatchRewards | None = None  # the last batch's rewards, by function
        self.reward_mean, self.reward_std = 0.0, 1.0
        # the critic's own start mean and std when it is not the reward model (`critic_scale`), else None: the
        # reward's. A cold critic's zero head starts every value at 0, so its own statistics are the identity.
        self.value_norm: tuple[float, float] | None = (0.0, 1.0) if self.critic_scale == "identity" else None

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs (the normalisation statistics are the run's norm.json)."""
        return {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state.get("monitor"))  # (None: a checkpoint from before the monitor)

    def raw_scores(self, rollout: Rollout) -> torch.Tensor:
        """The combined reward of each reply [B] (float32, CPU), the reward functions seeing the rollout's columns;
        each function's values are kept in `batch_rewards`."""
        if self.rewards is None:  # the environment's rewards alone, added per turn by the loop's `score`
            self.batch_rewards = BatchRewards(torch.zeros(len(rollout.prompts)), {})
        else:
            self.batch_rewards = self.rewards.scores(rollout.prompts, rollout.reply_texts, rollout.completion_ids,
                                                     rollout.columns, self.trajectory_ids(rollout))
        return self.batch_rewards.total

    def trajectory_ids(self, rollout: Rollout) -> list[list[int]] | None:
        """A multi-turn run's `trajectory_ids` for the reward functions (every turn and observation after the
        prompt); None in a single-turn run, whose functions get no such keyword."""
        return rollout.reply_ids if self.cfg.multi_turn else None

    def normalised(self, raw: torch.Tensor) -> torch.Tensor:
        """Reward-model outputs (scores or values) on the scale of start-policy replies' scores (detail 1)."""
        return (raw - self.reward_mean) / self.reward_std

    def normalised_values(self, raw: torch.Tensor) -> torch.Tensor:
        """The critic's outputs on the normalised reward scale: by the reward's start statistics when the critic
        starts from the reward model (its raw scale is the reward's), else by its own (`critic_scale`)."""
        if self.value_norm is None:
            return self.normalised(raw)
        mean, std = self.value_norm
        return (raw - mean) / std

    @property
    def critic_scale(self) -> str | None:
        """How the critic's raw values are put on the normalised reward scale (`normalised_values`): None without a
        critic; "reward" when it starts from the reward model (its raw scale is the reward's); "own" for a value model
        named by value_model, trained on some other reward (a proxy reward model in the study's gold and length arms)
        or none, whose start values are measured; "identity" for a cold critic, whose zero head starts every value at
        0. Read with the reward's statistics, either of the last two starts off the scores' scale: a critic from a
        reward model scoring 4.3 on average starts +11 sd above a gold judge's normalised scores (the study's first
        three-arm run, docs/study.md), and a cold critic at -mean/std (-15.6 for a reward 3 + 0.1 x length of mean
        3.37 and std 0.216), so that every reply's advantages ramp with position until the critic learns the
        constant."""
        if self.critic is None:
            return None
        if self.cfg.value_model is not None:
            return "own"
        return "identity" if self.critic_source is None else "reward"

    @torch.no_grad()
    def last_token_values(self, rollout: Rollout) -> torch.Tensor:
        """The critic's raw value at each reply's last policy token, where a reward model reads its score."""
        assert self.critic is not None
        critic = self.critic
        (values,) = per_token_in_chunks(lambda ids, att: (critic.values(ids, att),), rollout, score_size(self.cfg))
        last = last_token_index(rollout.action_mask.to(values.device))  # where the score goes in shape_rewards
        return values.gather(1, last[:, None]).squeeze(1).float().cpu()

    def measure_reward_norm(self, sample: Callable[[list[int]], Rollout], n_prompts: int) -> dict[str, float]:
        """Mean and std of the reward model's scores of start-policy replies to training prompts (detail 1);
        `sample(rows)` the rollout of the dataset's rows `rows`, of `n_prompts`."""
        n = self.cfg.reward_norm_samples
        rng = np.random.default_rng(self.cfg.seed + 1)
        picks = rng.choice(n_prompts, size=n, replace=n > n_prompts).tolist()
        picks = self.dist.shard(picks)  # this process's share (all of them in one process)
        scores, finished, lengths, values = [], [], [], []
        for rows in tqdm(row_chunks(len(picks), self.cfg.batch_size), desc="reward normalisation",
                         disable=self.cfg.quiet or None, leave=False):  # (None: off a terminal, none)
            rollout = sample([picks[i] for i in rows])
            scores.append(self.raw_scores(rollout))
            finished.append(rollout.finished)
            lengths.append(rollout.reply_lengths)
            if self.critic_scale == "own":
                values.append(self.last_token_values(rollout))
        scores, finished = self.dist.gather_1d(torch.cat(scores)), self.dist.gather_1d(torch.cat(finished))
        require(bool(torch.isfinite(scores).all()), "the reward model gave non-finite scores to start-policy replies")
        self.monitor.start(scores.tolist(), self.dist.gather_1d(torch.cat(lengths)).tolist())
        std = float(scores.std()) if n > 1 else 1.0
        only_models = self.rewards is not None and all(isinstance(f, ModelReward) for f in self.rewards.funcs)
        require(std > 0 or not only_models,
                "the reward model gave every start-policy reply the same score: it cannot be normalised")
        # std 0 (e.g. an exact-match reward no start-policy reply earns) is kept as measured: the scores are then
        # shifted, not scaled (run.start_or_resume)
        norm = {"mean": float(scores.mean()), "std": std, "n": n, "finished": float(finished.float().mean())}
        if values:  # the critic's raw scale is not the reward's: put its start values on the same footing
            start_values = self.dist.gather_1d(torch.cat(values))
            value_std = float(start_values.std()) if n > 1 else 1.0
            norm |= {"value_mean": float(start_values.mean()), "value_std": value_std if value_std > 0 else 1.0}
        elif self.critic_scale == "identity":  # written down, so that a resumed run reads its values the same way
            norm |= {"value_mean": 0.0, "value_std": 1.0}
        return norm

    def reward_means(self) -> dict[str, float]:
        """Each reward's mean over the last batch's replies it scored ("reward/<name>"; nan where it scored none),
        averaged over processes."""
        return self.process_means("reward", self.batch_rewards.by_function if self.batch_rewards is not None else {})

    def process_means(self, prefix: str, values: dict[str, list[float | None]]) -> dict[str, float]:
        """`rewards.scored_means` of this process's values, averaged over processes."""
        means = scored_means(prefix, values)
        return {key: value / self.dist.world_size for key, value in self.dist.sum_dict(means).items()}

    def monitor_stats(self, index: int, experience: Experience) -> dict[str, float | None]:
        """The reward-hacking monitor of the batch over every process's replies (monitor.py): reward_length_corr,
        length_share (the baseline: the first batch's, unless the normalisation samples gave one) and each monitor
        judge's mean raw score, "monitor/<name>"."""
        rewards = self.dist.gather_1d(experience.raw_scores.float().cpu()).tolist()
        lengths = self.dist.gather_1d(experience.reply_lengths).tolist()
        if index == 0 and self.monitor.baseline is None:
            self.monitor.start(rewards, lengths)
        if self.judges is None:
            return self.monitor.stats(rewards, lengths)
        with rng_untouched(self.device):  # a judge that draws random numbers must not change the run's
            try:
                judged = self.judges.function_values(experience.prompts, experience.reply_texts,
                                                     experience.completion_ids, experience.columns,
                                                     self.trajectory_ids(experience))
            except RewardFunctionError as error:
                raise RewardFunctionError(f"monitor_judges: {error}") from None
        return {**self.monitor.stats(rewards, lengths), **self.process_means("monitor", judged)}
