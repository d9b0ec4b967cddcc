"""The names a judge is given by (`--gold`, `--proxy`), checked without loading torch or a model: an unknown one is
refused before the slow imports (the judges themselves: judges.py)."""

from __future__ import annotations

from pathlib import Path

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.paths import check_model_name

NAMED_JUDGES = ("vader", "nontoxic", "gold")
JUDGE_SPECS = ("vader, nontoxic, gold, rm:PATH_OR_HUB_ID (or a reward-model folder), rm-init-head:PATH_OR_HUB_ID, "
               "ensemble:FOLDER")
MODEL_PREFIX = "rm:"
INIT_HEAD_PREFIX = "rm-init-head:"  # a model without a trained score head, given a random one on purpose
ENSEMBLE_PREFIX = "ensemble:"  # a proxy ensemble's folder (study/ensemble.py)


def check_judge_spec(spec: str) -> None:
    """`spec` names a judge `judges.make_judge` makes: one of NAMED_JUDGES, "rm:NAME" or "rm-init-head:NAME" (NAME
    checked as `check_model_name` does), "ensemble:FOLDER", or a reward-model folder."""
    if spec in NAMED_JUDGES:
        return
    if spec.startswith(ENSEMBLE_PREFIX):
        folder = Path(spec.removeprefix(ENSEMBLE_PREFIX)).expanduser()
        require(folder.is_dir(), f"judge {spec}: no ensemble folder {folder} (study/ensemble.py writes one)")
        return
    prefix = next((known for known in (MODEL_PREFIX, INIT_HEAD_PREFIX) if spec.startswith(known)), None)
    if prefix is not None:
        name = spec.removeprefix(prefix)
        require(bool(name), f"judge {prefix} needs a reward-model folder or hub id, e.g. {prefix}runs/rm")
        check_model_name(name)
    elif not Path(spec).expanduser().is_dir():
        raise UsageError(f"unknown judge {spec!r}; choose from {JUDGE_SPECS}")
