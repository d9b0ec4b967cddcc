"""Multi-turn episodes as a rollout generator: the same `sync(policy)` and `generate(prompts, columns) -> Rollout` as
the single-turn backends (models/generation.py), so that the PPO loop samples an episode per prompt as it samples a
reply. Each turn is sampled from the wrapped HF generator's model (the policy, or its merged copy), log-probs
recorded; the rollout carries its episodes (`Rollout.episodes`: turns, tool calls and errors, which tokens are the
policy's) for the dashboard and `ppo-rlhf check`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch import nn

from ppo_rlhf.data import Prompt
from ppo_rlhf.models.generation import HFGenerator
from ppo_rlhf.models.rollout import Rollout, sample_replies
from ppo_rlhf.multiturn.episodes import EpisodeLimits, cut_call_warning, run_episodes


class EpisodeGenerator:
    """One episode per prompt (multiturn/episodes.py), every turn sampled through `turns`' model and settings.
    `tools` by name, `environment_factory` (None: tools alone), `names` how the user named their code (config.yaml's),
    for the line that stops the run when it fails; `says_warnings` whether this process prints the warning about tool
    calls cut off by the cap (once a run)."""

    def __init__(self, turns: HFGenerator, eos: list[int], limits: EpisodeLimits, tools: dict[str, Callable],
                 environment_factory: Callable | None, names: dict[str, str], says_warnings: bool = True):
        self.turns, self.eos, self.limits = turns, eos, limits
        self.tools, self.environment_factory, self.names = tools, environment_factory, names
        self.warn_cut_calls = says_warnings  # off once said

    def sync(self, policy: nn.Module) -> None:
        self.turns.sync(policy)

    def generate(self, prompts: list[Prompt], columns: list[dict[str, Any]] | None = None) -> Rollout:
        """The episodes of `prompts`, the environment's reset seeing each row's `columns` (None: none)."""
        turns = self.turns

        def sample(trajectories: list[list[int]], cap: int):
            return sample_replies(turns.policy, turns.tokenizer, trajectories, cap, turns.temperature,
                                  turns.batch_size, turns.top_p, record_logprobs=True,
                                  drop_finished=turns.drop_finished)

        rollout, episodes = run_episodes(sample, turns.tokenizer, prompts, columns or [{} for _ in prompts], self.eos,
                                         self.limits, self.tools, self.environment_factory, self.names)
        rollout.episodes = episodes
        warning = cut_call_warning(episodes, self.limits.max_new_tokens)
        if warning and self.warn_cut_calls:
            print(f"warning: {warning}", file=sys.stderr)
            self.warn_cut_calls = False
        return rollout
