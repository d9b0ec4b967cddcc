"""The study's optimisation arms: what each PPO run of the demo maximises.

    proxy   the reward model trained on gold-labelled pairs (Gao et al.'s setting: what a learned reward buys)
    gold    the gold judge itself: meant as the ceiling, how far gold can move on held-out prompts at each KL
    length  word counts, signed as the training pairs prefer: the "length detector" baseline (the proxy's
            margin correlates with length, and word counts rank held-out pairs about as well as it does)

Every arm has the same prompts, reward normalisation, PPO settings and value-model start (the proxy reward model's
weights, which the proxy arm's critic starts from anyway): the arms differ in their reward alone. The gold and length
rewards are module-level functions named by 'module:function' reward specs, so each arm's reward goes through the
library's own `reward_funcs` like any user's.
"""

from __future__ import annotations

from functools import cache
from typing import Any

ARMS = ("proxy", "gold", "length")
MAIN_ARM = "proxy"  # the arm the study is about; only it gets several seeds
# the gold judges that are plain functions of the text (an rm: gold judge is a reward model: a folder spec)
TEXT_JUDGES = ("gold", "vader", "nontoxic")


def parse_arms(text: str) -> list[str]:
    """The arms of a comma list, checked: known, none twice, at least one."""
    from ppo_rlhf.errors import require

    arms = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [arm for arm in arms if arm not in ARMS]
    require(bool(arms) and not unknown, f"arms must be a comma list of {', '.join(ARMS)}; got {text!r}")
    require(len(set(arms)) == len(arms), f"arms must differ from each other, got {text!r}")
    return arms


def beta_name(beta: float) -> str:
    return "nokl" if beta == 0 else "beta" + f"{beta:g}".replace(".", "").replace("-", "m")


def run_label(arm: str, beta: float, seed: int) -> str:
    """A run's folder name: arm, KL coefficient and seed, e.g. proxy_nokl_s1."""
    return f"{arm}_{beta_name(beta)}_s{seed}"


# ---------------------------------------------------------------- reward functions (TRL's convention, rewards.py)


@cache
def _judge(name: str):
    from ppo_rlhf.study.judges import make_judge  # lazy: VADER and profanity-check load with the arm that uses them

    return make_judge(name)


def _texts(completions: list) -> list[str]:
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def _judge_reward(name: str, completions: list) -> list[float]:
    texts = _texts(completions)
    return _judge(name).score([""] * len(texts), texts)  # these judges ignore the prompt


def gold_reward(completions: list, **columns: Any) -> list[float]:
    """The default gold judge's score of each reply (study/judges.py's GoldJudge)."""
    return _judge_reward("gold", completions)


def vader_reward(completions: list, **columns: Any) -> list[float]:
    """VADER's compound sentiment of each reply (the gold judge `vader`)."""
    return _judge_reward("vader", completions)


def nontoxic_reward(completions: list, **columns: Any) -> list[float]:
    """1 - P(offensive) of each reply (the gold judge `nontoxic`)."""
    return _judge_reward("nontoxic", completions)


def word_count(text: str) -> int:
    """Whitespace-separated words: the length the length arm and the evaluation's length score count."""
    return len(text.split())


def more_words(completions: list, **columns: Any) -> list[float]:
    """Each reply's word count: the length arm when the training pairs prefer longer replies."""
    return [float(word_count(text)) for text in _texts(completions)]


def fewer_words(completions: list, **columns: Any) -> list[float]:
    """Minus each reply's word count: the length arm when the training pairs prefer shorter replies."""
    return [-float(word_count(text)) for text in _texts(completions)]


def length_sign(pairs: list[dict[str, Any]]) -> int:
    """+1 when the gold-chosen reply has more words than the rejected one in at least as many training pairs as it
    has fewer, else -1: a one-feature length detector fitted on the pairs the proxy learned from (ties say nothing)."""
    longer = sum(word_count(p["chosen"]) > word_count(p["rejected"]) for p in pairs)
    shorter = sum(word_count(p["chosen"]) < word_count(p["rejected"]) for p in pairs)
    return 1 if longer >= shorter else -1


def arm_reward(arm: str, reward_dir: str, gold: str, sign: int) -> dict[str, Any]:
    """The TrainConfig fields that give `arm` its reward. The value model starts from the proxy reward model in every
    arm, so that the arms differ in their reward alone: the proxy arm's by default (value_model null: its one reward
    model, whose weights the critic then shares with the reward, adapter off; naming it would load a second copy),
    the other arms' by `value_model`."""
    gold_spec = f"{__name__}:{gold}_reward" if gold in TEXT_JUDGES else gold.removeprefix("rm:")
    # the reward-hacking monitor (ppo/monitor.py) scores each batch with the judges the arm does not optimise, so the
    # dashboard shows the gold beside the proxy's reward (and the proxy beside the gold's) as the run goes
    if arm == "proxy":
        return {"reward_model": reward_dir, "reward_funcs": [], "value_model": None, "monitor_judges": [gold_spec]}
    if arm == "gold":
        return {"reward_model": None, "reward_funcs": [gold_spec], "value_model": reward_dir,
                "monitor_judges": [reward_dir]}
    function = "more_words" if sign > 0 else "fewer_words"
    return {"reward_model": None, "reward_funcs": [f"{__name__}:{function}"], "value_model": reward_dir,
            "monitor_judges": [gold_spec, reward_dir]}
