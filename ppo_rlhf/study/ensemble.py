"""A proxy ensemble (Coste et al. 2024): several reward models scored together and combined conservatively.

Members are reward models trained like the proxy they stand beside, on the same pairs, with other seeds (their LoRA
and score-head starts and their batch order differ). Where they agree, the policy may trust them; where a reply
makes them disagree, it is off the data they learned from, and a conservative combination does not reward it:

    min        the worst case: the lowest member score (Coste et al.'s WCO)
    mean-std   the mean minus lambda times the members' standard deviation (uncertainty-weighted)
    mean-var   the mean minus lambda times their variance (Coste et al.'s UWO penalises the variance)

Each member's raw score is first put in start-policy standard deviations, (score - mean) / std over the start
policy's replies (the held-out pairs' distinct replies): members trained from other starts have other offsets and
scales, and a minimum over raw scores would mostly pick the member with the lowest offset. The standard deviations are
population ones (over the members, ddof 0).

An ensemble is a folder: ensemble.json (the members' folders, their norms, the rule, lambda, where to load them) and
reward.py, whose `ensemble_reward` is the ensemble as a reward function in TRL's convention, so that a PPO run
names it like any user's function ('FOLDER/reward.py:ensemble_reward'); the evaluation scores with it as the judge
'ensemble:FOLDER' (judges.make_judge). Both load the members on first use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppo_rlhf.errors import require
from ppo_rlhf.utils.files import atomic_write_text

RULES = ("min", "mean-std", "mean-var")
ENSEMBLE_FILE = "ensemble.json"
REWARD_FILE = "reward.py"
REWARD_FUNCTION = "ensemble_reward"
# the reward function's module, as the ensemble folder holds it: the folder is the ensemble
SHIM = f'''"""The proxy ensemble of this folder ({ENSEMBLE_FILE}) as a reward function: ppo_rlhf.study.ensemble."""

from pathlib import Path

from ppo_rlhf.study.ensemble import EnsembleReward

{REWARD_FUNCTION} = EnsembleReward(Path(__file__).resolve().parent)
'''


def check_rule(rule: str, lam: float) -> None:
    require(rule in RULES, f"ensemble rule must be one of {', '.join(RULES)}, got {rule!r}")
    require(lam >= 0, f"ensemble lambda must be >= 0, got {lam}")


def combine(scores: np.ndarray, rule: str, lam: float = 1.0) -> np.ndarray:
    """The ensemble's score of each reply from its members' standardised scores `scores[member, reply]`."""
    check_rule(rule, lam)
    x = np.asarray(scores, dtype=np.float64)
    require(x.ndim == 2 and x.shape[0] >= 1, f"need [members, replies] scores, got shape {x.shape}")
    if rule == "min":
        return x.min(axis=0)
    spread = x.std(axis=0) if rule == "mean-std" else x.var(axis=0)
    return x.mean(axis=0) - lam * spread


def standardised(raw: np.ndarray, norms: list[dict[str, float]]) -> np.ndarray:
    """`raw[member, reply]` in each member's start-policy standard deviations (a zero std leaves the scale at 1)."""
    means = np.array([n["mean"] for n in norms])[:, None]
    stds = np.array([n["std"] if n["std"] > 0 else 1.0 for n in norms])[:, None]
    return (np.asarray(raw, dtype=np.float64) - means) / stds


def write_ensemble(folder: Path, members: Sequence[str | Path], norms: list[dict[str, float]], rule: str, lam: float,
                   load: dict[str, Any]) -> Path:
    """The ensemble folder: ensemble.json and reward.py. `load`: {"dtype", "device", "batch_size"} of its members."""
    check_rule(rule, lam)
    require(len(members) == len(norms) >= 2, f"an ensemble needs two members or more with a norm each, got "
                                             f"{len(members)} members and {len(norms)} norms")
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"members": [str(Path(m).resolve()) for m in members], "norms": norms, "rule": rule, "lambda": lam,
            **load}
    atomic_write_text(folder / ENSEMBLE_FILE, json.dumps(spec, indent=1) + "\n")
    atomic_write_text(folder / REWARD_FILE, SHIM)
    return folder


def reward_spec(folder: Path) -> str:
    """The reward spec a PPO run names the ensemble by."""
    return f"{Path(folder).resolve() / REWARD_FILE}:{REWARD_FUNCTION}"


def load_members(folders: list[str], load: dict[str, Any], device: str | None = None) -> list:
    """The members as `rewards.ModelReward`s, in the dtype and on the device of `load` (or `device`)."""
    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.rewards import resolve_reward_funcs
    from ppo_rlhf.utils.device import resolve_device

    target = resolve_device(device or load.get("device", "auto"))
    dtype = resolve_dtype(load.get("dtype", "float32"), target)
    return resolve_reward_funcs(folders, dtype=dtype, device=target, batch_size=int(load.get("batch_size", 16)))


def member_norms(folders: Sequence[str | Path], prompts: list[str], replies: list[str], load: dict[str, Any]
                 ) -> list[dict[str, float]]:
    """Each member's {"mean", "std"} over the start policy's `replies` to `prompts` (population std)."""
    require(len(replies) >= 2, f"the members' norms need two start-policy replies or more, got {len(replies)}")
    norms = []
    for member in load_members([str(f) for f in folders], load):
        raw = member.scores(prompts, replies).double().numpy()
        norms.append({"mean": float(raw.mean()), "std": float(raw.std())})
    return norms


class Ensemble:
    """The members of an ensemble folder, loaded, and the rule that combines them."""

    def __init__(self, folder: str | Path, device: str | None = None):
        self.folder = Path(folder)
        spec = json.loads((self.folder / ENSEMBLE_FILE).read_text())
        self.rule, self.lam, self.norms = spec["rule"], float(spec["lambda"]), spec["norms"]
        self.members = load_members(spec["members"], spec, device)

    def member_scores(self, prompts: list, completions: list) -> np.ndarray:
        """[member, reply] standardised scores."""
        raw = np.stack([member.scores(prompts, completions).double().numpy() for member in self.members])
        return standardised(raw, self.norms)

    def scores(self, prompts: list, completions: list) -> list[float]:
        if not completions:
            return []
        return combine(self.member_scores(prompts, completions), self.rule, self.lam).tolist()


class EnsembleReward:
    """The ensemble of `folder` as a reward function (TRL's keywords); its members load on the first call."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.ensemble: Ensemble | None = None

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, **columns: Any
                 ) -> list[float]:
        if self.ensemble is None:
            self.ensemble = Ensemble(self.folder)
        return self.ensemble.scores(prompts, completions)


class EnsembleJudge:
    """The ensemble as a judge (`judges.make_judge("ensemble:FOLDER")`): the evaluation's proxy of an ensemble run."""

    def __init__(self, folder: str | Path, device: str | None = None):
        self.name = f"ensemble:{folder}"
        self.ensemble = Ensemble(folder, device)

    def score(self, prompts: list[str], replies: list[str]) -> list[float]:
        return self.ensemble.scores(prompts, replies)
