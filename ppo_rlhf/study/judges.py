"""Text judges: anything that gives each (prompt, reply) a number, higher = better.

The offline study needs a *gold* judge that is cheap, deterministic and independent of the proxy reward
model we train. None of the offline-usable scorers is a real preference model, so the default gold is a
composite of two classic text classifiers:

    gold = (VADER compound + (1 - 2 * P(offensive))) / 2        in [-1, 1]

"friendly and clean": VADER's compound sentiment of the reply in [-1, 1], and profanity-check's
probability that the reply is offensive, mapped to [-1, 1] so that both halves weigh the same.
Any Hugging Face sequence-classification reward model (e.g. Skywork/Skywork-Reward-V2-Qwen3-0.6B) or a
reward-model folder we trained can be a judge too: `make_judge("rm:NAME")`. A model without a trained score head (a
plain causal LM) is refused there; `rm-init-head:NAME` accepts it with a random head (its scores are noise: for tests
of the machinery only).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

import torch

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.models.loading import NoScoreHead, load_reward_model, load_tokenizer
from ppo_rlhf.models.scores import score_texts
from ppo_rlhf.study.judge_specs import ENSEMBLE_PREFIX, INIT_HEAD_PREFIX, JUDGE_SPECS
from ppo_rlhf.utils.paths import function_spec


class Judge(Protocol):
    name: str

    def score(self, prompts: list[str], replies: list[str]) -> list[float]:
        """One score per reply, higher = better."""
        ...


def check_finite(judge_name: str, texts: list[str], scores: list[float]) -> list[float]:
    """Return `scores` as floats, or fail loudly on the first NaN/inf: a silent NaN would poison a whole
    PPO batch (whitening spreads it to every token) or a reward-model label."""
    require(len(scores) == len(texts), f"judge {judge_name} returned {len(scores)} scores for {len(texts)} texts")
    scores = [float(s) for s in scores]
    for text, value in zip(texts, scores):
        if not math.isfinite(value):
            quoted = text if len(text) <= 80 else text[:77] + "..."
            raise UsageError(f"judge {judge_name} gave a non-finite score ({value}) to the reply {quoted!r}")
    return scores


class VaderJudge:
    """VADER compound sentiment of the reply, in [-1, 1] (the prompt is ignored)."""

    name = "vader"

    def __init__(self) -> None:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer  # lazy: optional, only this judge

        self.analyzer = SentimentIntensityAnalyzer()

    def score(self, prompts: list[str], replies: list[str]) -> list[float]:
        scores = [self.analyzer.polarity_scores(reply)["compound"] for reply in replies]
        return check_finite(self.name, replies, scores)


class NonToxicJudge:
    """1 - P(offensive) of the reply from profanity-check, in [0, 1] (the prompt is ignored)."""

    name = "nontoxic"

    def score(self, prompts: list[str], replies: list[str]) -> list[float]:
        from profanity_check import predict_prob  # lazy: optional, only this judge

        if not replies:  # predict_prob rejects an empty batch
            return []
        scores = (1.0 - predict_prob(replies)).tolist()
        return check_finite(self.name, replies, scores)


class GoldJudge:
    """The offline default gold: mean of VADER compound and 1 - 2 * P(offensive), in [-1, 1]."""

    name = "gold"

    def __init__(self) -> None:
        self.vader = VaderJudge()
        self.nontoxic = NonToxicJudge()

    def score(self, prompts: list[str], replies: list[str]) -> list[float]:
        sentiment = self.vader.score(prompts, replies)
        clean = self.nontoxic.score(prompts, replies)
        scores = [(s + (2.0 * c - 1.0)) / 2.0 for s, c in zip(sentiment, clean)]
        return check_finite(self.name, replies, scores)


class RewardModelJudge:
    """A sequence-classification reward model (our trained folder or a hub id), with its own tokenizer and
    chat template; each (prompt, reply) is scored at the reply's closing EOS, as during training. A model without a
    trained score head is refused unless `init_score_head` (spec rm-init-head:)."""

    def __init__(self, model_name_or_folder: str, batch_size: int = 16, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, init_score_head: bool = False) -> None:
        self.name = f"{INIT_HEAD_PREFIX if init_score_head else 'rm:'}{model_name_or_folder}"
        self.batch_size = batch_size
        self.device = device
        self.tokenizer = load_tokenizer(model_name_or_folder)
        try:
            self.model = load_reward_model(model_name_or_folder, dtype, init_score_head=init_score_head).to(device)
        except NoScoreHead as error:
            raise NoScoreHead(f"judge {self.name}: {error} (the judge {INIT_HEAD_PREFIX}{model_name_or_folder} starts "
                              "from a random head on purpose)") from None

    @property
    def models(self) -> list[torch.nn.Module]:
        """The models it scores with (whose context a prompt must fit)."""
        return [self.model]

    def score(self, prompts: list[str], replies: list[str]) -> list[float]:
        require(len(prompts) == len(replies), f"{len(prompts)} prompts but {len(replies)} replies")
        if not replies:
            return []
        scores = score_texts(self.model, self.tokenizer, prompts, replies, batch_size=self.batch_size)
        return check_finite(self.name, replies, scores.tolist())


class RewardFunctionsJudge:
    """Rewards as `train` takes them (rewards.py: "file.py:function", "module:function", reward-model folders or hub
    ids), weighted and summed as in training (`CombinedReward`). Its functions are called as the trainer calls them:
    with each reply's token ids (`completion_ids`) and its prompt's other dataset columns, which `score` takes."""

    def __init__(self, specs: list[str], weights: list[float] | None = None, batch_size: int = 16,
                 device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        from ppo_rlhf.rewards import CombinedReward, ModelReward, resolve_reward_funcs

        funcs = resolve_reward_funcs(specs, dtype=dtype, device=device, batch_size=batch_size)
        self.rewards = CombinedReward(funcs, weights)
        self.name = " + ".join(func.name if weight == 1.0 else f"{weight:g} * {func.name}"
                               for func, weight in zip(funcs, self.rewards.weights))
        self.models = [func.model for func in funcs if isinstance(func, ModelReward)]

    def score(self, prompts: list[str], replies: list[str], completion_ids: list[list[int]] | None = None,
              columns: list[dict[str, Any]] | None = None) -> list[float]:
        """One score per reply: the weighted sum of the rewards; `completion_ids` (the policy's tokens of each reply)
        and `columns` (its prompt's other dataset columns) are passed to the functions as in training."""
        require(completion_ids is not None and len(completion_ids) == len(replies),
                f"judge {self.name} needs each reply's token ids (completion_ids)")
        assert completion_ids is not None  # (for mypy: require raised otherwise)
        if not replies:
            return []
        rows = columns if columns is not None else [{} for _ in replies]
        totals = self.rewards.scores(list(prompts), list(replies), completion_ids, rows).total
        return check_finite(self.name, replies, totals.tolist())


def make_judge(spec: str | dict[str, Any], batch_size: int = 16, device: str = "cpu",
               dtype: torch.dtype = torch.float32) -> Judge:
    """A judge from its name: "vader", "nontoxic", "gold", "rm:PATH_OR_ID", or a reward-model folder (whose frozen
    weights are stored in `dtype`: the evaluation scores with the proxy in the dtype PPO trained against);
    "rm-init-head:PATH_OR_ID" accepts a model without a trained score head (random scores); "ensemble:FOLDER" a
    proxy ensemble (study/ensemble.py: its members in the dtype its folder names, as PPO scored with them). A reward
    function, "file.py:function" or "module:function", or a run's rewards as its config.yaml records them,
    {"reward_funcs": [...], "reward_weights": [...] or None}, make a `RewardFunctionsJudge`."""
    if isinstance(spec, dict):
        return RewardFunctionsJudge(spec["reward_funcs"], spec["reward_weights"], batch_size, device, dtype)
    if spec == "vader":
        return VaderJudge()
    if spec == "nontoxic":
        return NonToxicJudge()
    if spec == "gold":
        return GoldJudge()
    if spec.startswith("rm:"):
        require(len(spec) > 3, "judge rm: needs a reward-model folder or hub id, e.g. rm:runs/rm")
        return RewardModelJudge(spec[3:], batch_size=batch_size, device=device, dtype=dtype)
    if spec.startswith(INIT_HEAD_PREFIX):
        name = spec.removeprefix(INIT_HEAD_PREFIX)
        require(bool(name), f"judge {INIT_HEAD_PREFIX} needs a model folder or hub id, e.g. {INIT_HEAD_PREFIX}smollm2")
        return RewardModelJudge(name, batch_size=batch_size, device=device, dtype=dtype, init_score_head=True)
    if spec.startswith(ENSEMBLE_PREFIX):
        from ppo_rlhf.study.ensemble import ENSEMBLE_FILE, EnsembleJudge

        folder = spec.removeprefix(ENSEMBLE_PREFIX)
        require((Path(folder) / ENSEMBLE_FILE).is_file(), f"judge {spec}: no {ENSEMBLE_FILE} in {folder!r}")
        return EnsembleJudge(folder, device)
    if Path(spec).expanduser().is_dir():
        return RewardModelJudge(spec, batch_size=batch_size, device=device, dtype=dtype)
    if ":" in spec and function_spec(spec) is not None:
        return RewardFunctionsJudge([spec], None, batch_size, device, dtype)
    raise UsageError(f"unknown judge {spec!r}; choose from {JUDGE_SPECS}")
