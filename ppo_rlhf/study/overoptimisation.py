"""`ppo-rlhf demo --overoptimisation`: the over-optimisation turn, predicted before it is seen (Gao et al. 2022).

Gold rises, then falls, as PPO pushes a policy against a proxy reward model without a KL penalty; the turn comes
sooner with a weaker proxy. On the demo's pool (its prompts, pairs and gold judge) this study trains

  proxies     of decreasing strength from the same pool (--proxies PAIRS:LABEL_NOISE): a seeded subset of the
              demo's training pairs with a seeded share of their labels flipped (pairs.pair_subset, flip_labels),
              each a reward-model stage of its own keyed by its pairs count and noise (all:0 is the demo's proxy)
  ensemble    --ensemble-members reward models on one proxy's pairs, other seeds, combined by --ensemble-rule
              (Coste et al. 2024; study/ensemble.py)

and optimises each with beta 0, --seeds seeds, long enough to pass --max-kl nats; the evaluation scores gold and the
group's own proxy at checkpoints spaced by KL (kl_spacing.py) on the held-out prompts.

It runs in two invocations, so that the prediction exists before what it predicts:

  1. --predict-only: the first seed of every group, its checkpoints evaluated up to half of --max-kl only; Gao's
     R(d) = d(alpha - beta log d) fitted to them (gao.py), the predicted peak KL with a bootstrap interval written to
     --prediction (commit it). The first seed's runs do go on to the end (PPO cannot stop at a KL), but nothing past
     half the range is evaluated before the prediction is written: its history's monitor column, the training
     batches' gold, is the one thing to leave unread.
  2. without it: the other seeds, every checkpoint (KL targets made denser around each predicted peak), and
     gao_turn.json beside the prediction: per group and seed the observed peak, the fall (gold at the last
     checkpoint within --max-kl minus gold at the peak, 95% interval) and the prediction; the curves pooled over
     prompts and seeds; the ensemble's fall against its single proxy's; the goal, checked.

The prediction file records the key of what it was made from; the second invocation refuses a prediction made from
other runs or settings, and records the commit that holds it (git), or says it has none.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.ppo.kl_spacing import LAST, parse_targets
from ppo_rlhf.study.pairs import flip_labels, pair_subset, read_pairs
from ppo_rlhf.study.prompts import write_jsonl
from ppo_rlhf.utils.files import atomic_write_text

if TYPE_CHECKING:
    from ppo_rlhf.study.demo import DataStages, DemoConfig, Stages

GOAL = ("for at least one proxy, the gold peaks and then falls, the fall below zero with a 95% interval at no more "
        "than MAX_KL nats in at least 2 of 3 seeds; the predicted peak within 30% of the observed one in d = "
        "sqrt(KL); the ensemble's fall smaller at the same KL")
PREDICTION_TOLERANCE = 0.3  # of the observed peak's d
N_BOOT = 10000


# ---------------------------------------------------------------- the proxies


@dataclass(frozen=True)
class Proxy:
    """A proxy's recipe: `pairs` of the pool's training pairs (None: all), `label_noise` of their labels flipped."""

    pairs: int | None
    label_noise: float

    @property
    def name(self) -> str:
        """e.g. all_n0, p250_n25."""
        size = "all" if self.pairs is None else f"p{self.pairs}"
        return f"{size}_n{round(self.label_noise * 100):g}"


def parse_proxy(text: str) -> Proxy:
    """One PAIRS:LABEL_NOISE recipe (PAIRS a positive count or all; LABEL_NOISE in [0, 1))."""
    size, colon, noise = text.strip().partition(":")
    usage = f"a proxy is PAIRS:LABEL_NOISE, e.g. 1000:0.25 or all:0; got {text.strip()!r}"
    require(bool(colon), usage)
    try:
        pairs = None if size == "all" else int(size)
        label_noise = float(noise)
    except ValueError:
        raise UsageError(usage) from None
    require(pairs is None or pairs >= 1, f"a proxy's pairs must be >= 1 or all; got {text.strip()!r}")
    require(0 <= label_noise < 1, f"a proxy's label noise must be in [0, 1); got {text.strip()!r}")
    return Proxy(pairs, label_noise)


def parse_proxies(text: str) -> list[Proxy]:
    proxies = [parse_proxy(part) for part in text.split(",") if part.strip()]
    require(bool(proxies), f"--proxies needs at least one PAIRS:LABEL_NOISE, got {text!r}")
    require(len({p.name for p in proxies}) == len(proxies), f"--proxies must differ from each other, got {text!r}")
    return proxies


def ensembled_proxy(cfg: DemoConfig) -> Proxy | None:
    """The proxy whose ensemble is optimised, or None ("none")."""
    return None if cfg.ensemble.strip() == "none" else parse_proxy(cfg.ensemble)


def check_settings(cfg: DemoConfig) -> None:
    """What --overoptimisation needs of the demo's settings, before any stage runs."""
    proxies = parse_proxies(cfg.proxies)
    ensembled = ensembled_proxy(cfg)
    require(ensembled is None or ensembled in proxies,
            f"--ensemble {cfg.ensemble} must be one of --proxies ({cfg.proxies}) or none: its fall is compared with "
            "that proxy's")
    require(cfg.betas.strip() in ("0", "0.0"), f"--overoptimisation runs beta 0 alone (Gao et al.'s runs without a KL "
                                               f"penalty); got --betas {cfg.betas}")
    first_half = [t for t in parse_targets(cfg.kl_targets) if t <= cfg.max_kl / 2]
    require(len(first_half) >= 2, f"--kl-targets needs two targets up to half of --max-kl ({cfg.max_kl / 2:g} "
                                  f"nats) for the prediction's fit; got {cfg.kl_targets}")
    path = prediction_path(cfg)
    require(cfg.predict_only or path.is_file(),
            f"no prediction at {path}: run with --predict-only first (and commit what it writes)")


def prediction_path(cfg: DemoConfig) -> Path:
    """--prediction, or OUT/gao_prediction.json."""
    return Path(cfg.prediction or Path(cfg.out) / "gao_prediction.json").resolve()


@dataclass
class Group:
    """What one set of runs optimises: a proxy or the ensemble, its reward, its judge for the evaluation, and the
    key of the stage that made it."""

    name: str
    kind: str  # "proxy" or "ensemble"
    proxy: Proxy
    reward: dict[str, Any]  # TrainConfig fields
    judge: str  # the evaluation's proxy judge
    key: str
    about: dict[str, Any] = field(default_factory=dict)  # the ensemble's members, rule and lambda


def proxy_stage(cfg: DemoConfig, stages: Stages, data: DataStages, out: Path, proxy: Proxy, rm_seed: int
                ) -> tuple[Path, str]:
    """The reward model of `proxy` trained with `rm_seed` (its folder and its stage's key). all:0 at the demo's seed
    is the demo's own proxy stage."""
    from ppo_rlhf.study.demo import data_seed, reward_model_training, stage_settings
    from ppo_rlhf.study.reward_model import summary_line, train_reward_model

    if proxy == Proxy(None, 0.0) and rm_seed == cfg.seed:
        return data.reward_dir, data.reward_key
    folder = out / "proxies" / (proxy.name if rm_seed == cfg.seed else f"{proxy.name}_s{rm_seed}")
    reward_dir = folder / "reward_model"

    def train(_: bool) -> None:
        # the subset and the flipped labels are drawn with the data seed: every seed's model of a proxy learns the
        # same pairs, so its members differ only in their training seed
        rows = flip_labels(pair_subset(read_pairs(data.pairs), proxy.pairs, data_seed(cfg)), proxy.label_noise,
                           data_seed(cfg))
        write_jsonl(folder / "pairs.jsonl", rows)
        info = train_reward_model(folder / "pairs.jsonl", out_dir=reward_dir,
                                  training=reward_model_training(cfg, rm_seed), heldout_source=data.heldout_pairs)
        flipped = sum(bool(row.get("flipped")) for row in rows)
        print(f"proxy {folder.name}: {len(rows)} pairs, {flipped} labels flipped; {summary_line(info)}")

    settings = stage_settings(cfg, "reward model") | {"seed": rm_seed, "proxy_pairs": proxy.pairs,
                                                      "label_noise": proxy.label_noise}
    return reward_dir, stages.run(f"proxy {folder.name}", settings, [data.reward_key], reward_dir / "rm_info.json",
                                  train)


def ensemble_stage(cfg: DemoConfig, stages: Stages, data: DataStages, out: Path, members: list[tuple[Path, str]],
                   proxy: Proxy) -> tuple[Path, str]:
    """The ensemble folder of the members (each (folder, key)): their norms over the start policy's replies of the
    held-out pairs, and the rule; its key."""
    from ppo_rlhf.study.ensemble import ENSEMBLE_FILE, member_norms, write_ensemble

    folder = out / "ensembles" / f"{proxy.name}_{cfg.ensemble_rule}"
    # the members load on the device PPO and the evaluation run on ("auto"), in the demo's dtype
    load = {"dtype": cfg.dtype, "device": "auto", "batch_size": 16}

    def build(_: bool) -> None:
        pairs = read_pairs(data.heldout_pairs)
        replies = list(dict.fromkeys((p["prompt"], p[side]) for p in pairs for side in ("chosen", "rejected")))
        dirs = [d for d, _ in members]
        norms = member_norms(dirs, [prompt for prompt, _ in replies], [reply for _, reply in replies], load)
        write_ensemble(folder, dirs, norms, cfg.ensemble_rule, cfg.ensemble_lambda, load)
        print(f"ensemble {folder.name}: {len(dirs)} members, rule {cfg.ensemble_rule}"
              + ("" if cfg.ensemble_rule == "min" else f" (lambda {cfg.ensemble_lambda:g})")
              + f", each standardised on {len(replies)} start-policy replies")

    settings = {"rule": cfg.ensemble_rule, "lambda": cfg.ensemble_lambda, "dtype": cfg.dtype}
    return folder, stages.run(f"ensemble {folder.name}", settings, [key for _, key in members],
                              folder / ENSEMBLE_FILE, build)


def groups(cfg: DemoConfig, stages: Stages, data: DataStages, out: Path, sign: int) -> list[Group]:
    """Every proxy's group, and the ensemble's last (its first member is its proxy's reward model)."""
    from ppo_rlhf.study.arms import arm_reward
    from ppo_rlhf.study.ensemble import reward_spec

    made = []
    for proxy in parse_proxies(cfg.proxies):
        folder, key = proxy_stage(cfg, stages, data, out, proxy, cfg.seed)
        made.append(Group(proxy.name, "proxy", proxy, arm_reward("proxy", str(folder), cfg.gold, sign),
                          f"rm:{folder}", key))
    ensembled = ensembled_proxy(cfg)
    if ensembled is not None:
        members = [proxy_stage(cfg, stages, data, out, ensembled, cfg.seed + k) for k in range(cfg.ensemble_members)]
        folder, key = ensemble_stage(cfg, stages, data, out, members, ensembled)
        first = str(members[0][0])
        gold = arm_reward("gold", first, cfg.gold, sign)["reward_funcs"]
        # the critic starts from the first member (the proxy's own model), as the proxy's runs' does; the monitor
        # shows the gold and that single proxy beside the ensemble's reward
        reward = {"reward_model": None, "reward_funcs": [reward_spec(folder)], "value_model": first,
                  "monitor_judges": [*gold, first]}
        about = {"of": ensembled.name, "members": [str(d) for d, _ in members], "rule": cfg.ensemble_rule,
                 "lambda": cfg.ensemble_lambda}
        made.append(Group(f"ensemble_{ensembled.name}", "ensemble", ensembled, reward, f"ensemble:{folder}", key,
                          about))
    return made


# ---------------------------------------------------------------- runs and evaluations


def run_dir(out: Path, group: Group, seed: int) -> Path:
    return out / "runs" / f"gao_{group.name}_s{seed}"


def group_runs(cfg: DemoConfig, stages: Stages, data: DataStages, out: Path, group: Group, seeds: list[int]
               ) -> list[tuple[Path, str]]:
    """The group's PPO runs (beta 0), each a stage of its own: (run folder, key) per seed."""
    from ppo_rlhf.study.demo import ppo_stage

    runs = []
    for seed in seeds:
        folder = run_dir(out, group, seed)
        settings = {"beta": 0.0, "run_seed": seed, "arm": group.kind, "proxy": group.name}
        runs.append((folder, ppo_stage(cfg, stages, folder, group.reward, settings, [group.key], data.ppo_prompts)))
    return runs


def first_half_iterations(folder: Path, targets: list[float], max_kl: float) -> list[int]:
    """The checkpoints of a run that the first half of the KL range picks: per target up to max_kl / 2 the first
    whose training KL reached it (never the last checkpoint for its own sake: it lies past the half)."""
    from ppo_rlhf.ppo.checkpoint import list_checkpoints
    from ppo_rlhf.ppo.kl_spacing import pick_by_kl, read_kls

    iterations = [iteration for iteration, _ in list_checkpoints(folder)]
    picked = pick_by_kl(read_kls(folder), iterations, [t for t in targets if t <= max_kl / 2])
    return [iteration for iteration, stands_for in picked.items() if stands_for != [LAST]]


def evaluation(cfg: DemoConfig, stages: Stages, group: Group, runs: list[tuple[Path, str]], eval_prompts: Path,
               checkpoints: str, sign: int, eval_dir: Path, name: str) -> dict[str, Any]:
    """The group's runs evaluated at `checkpoints` with its own proxy and the gold judge (evaluation.json)."""
    from ppo_rlhf.study.demo import stage_settings
    from ppo_rlhf.study.evaluate import evaluate_runs

    def evaluate(_: bool) -> None:
        model_keys = {None: group.key} | {folder.name: key for folder, key in runs}
        evaluate_runs([folder for folder, _ in runs], eval_prompts, eval_dir, proxy=group.judge, gold=cfg.gold,
                      replies_per_prompt=cfg.replies_per_prompt, seed=cfg.seed, device=cfg.device,
                      batch_size=cfg.sample_batch, model_keys=model_keys, checkpoints=checkpoints, length_sign=sign)

    settings = stage_settings(cfg, "evaluation") | {"checkpoints": checkpoints}
    stages.run(name, settings, [key for _, key in runs], eval_dir / "evaluation.json", evaluate)
    return json.loads((eval_dir / "evaluation.json").read_text())


def targets_near(targets: list[float], peak_kl: float | None, max_kl: float) -> list[float]:
    """`targets` and, where a peak is predicted, four more around it (0.8, 0.9, 1.1 and 1.2 times its KL, within
    max_kl): the checkpoints are densest where the fall should start."""
    extra = [] if peak_kl is None else [round(peak_kl * f, 1) for f in (0.8, 0.9, 1.1, 1.2)]
    return sorted({t for t in targets} | {t for t in extra if 0 < t <= max_kl})


# ---------------------------------------------------------------- what the evaluation says (pure)


def seed_arrays(evaluation: dict[str, Any], run: str, iterations: list[int] | None = None
                ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(iterations, mean KL [C], KL [C, P, R], gold change [C, P, R], proxy change [C, P, R]) of a run's evaluated
    checkpoints (those of `iterations` only, when given), the start model first as iteration 0 at KL 0 and change 0:
    the peak may be the start itself, when the gold never rose."""
    start = {(r["prompt_index"], r["reply_index"]): r for r in evaluation["records"] if r["run"] is None}
    prompts = 1 + max(p for p, _ in start)
    replies = 1 + max(r for _, r in start)
    rows = sorted((s for s in evaluation["summary"] if s["run"] == run), key=lambda s: s["iteration"])
    rows = [s for s in rows if iterations is None or s["iteration"] in iterations]
    require(bool(rows), f"no evaluated checkpoint of run {run}")
    shape = (1 + len(rows), prompts, replies)
    kl, gold, proxy = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    index = {row["iteration"]: c for c, row in enumerate(rows, start=1)}
    for record in evaluation["records"]:
        c = index.get(record["iteration"]) if record["run"] == run else None
        if c is not None:
            cell = (c, record["prompt_index"], record["reply_index"])
            before = start[cell[1:]]
            kl[cell] = record["kl"]
            gold[cell] = record["gold"] - before["gold"]
            proxy[cell] = record["proxy"] - before["proxy"]
    return [0, *index], kl.mean(axis=(1, 2)), kl, gold, proxy


def prediction_entry(group: Group, evaluation: dict[str, Any], run: str, iterations: list[int], max_kl: float,
                     seed: int) -> dict[str, Any]:
    """The group's prediction from the first seed's first-half checkpoints: the fit (gao.predict_peak; "points": how
    many it fitted) and the checkpoints' mean KL and gold change (the start model first)."""
    from ppo_rlhf.study.gao import predict_peak

    found, kls, kl, gold, _ = seed_arrays(evaluation, run, iterations)
    fitted = predict_peak(kl, gold, within_kl=max_kl, n_boot=2000, seed=seed)
    checkpoints = [{"iteration": i, "kl": float(k), "gold": float(g)}
                   for i, k, g in zip(found, kls, gold.mean(axis=(1, 2)))]
    return {"name": group.name, "kind": group.kind, "pairs": group.proxy.pairs, "label_noise": group.proxy.label_noise,
            **group.about, "run": run, "fit_on": f"checkpoints up to {max_kl / 2:g} nats", "checkpoints": checkpoints,
            **fitted}


def peak_close(predicted: float | None, observed: float) -> bool | None:
    """Whether the predicted peak lies within PREDICTION_TOLERANCE of the observed one in d = sqrt(KL) (None: no
    peak was predicted, or the observed one is the start)."""
    if predicted is None or observed <= 0:
        return None
    return abs(math.sqrt(predicted) - math.sqrt(observed)) <= PREDICTION_TOLERANCE * math.sqrt(observed)


def examples(evaluation: dict[str, Any], run: str, iterations: list[int], n_prompts: int = 3) -> list[dict]:
    """Reply 0 of the first prompts at each of `iterations` (0: the start model), with its gold and proxy."""
    shown = []
    for record in evaluation["records"]:
        at_start = record["run"] is None and 0 in iterations
        if (at_start or (record["run"] == run and record["iteration"] in iterations)) \
                and record["reply_index"] == 0 and record["prompt_index"] < n_prompts:
            shown.append({"iteration": record["iteration"] or 0, "prompt": record["prompt"], "reply": record["reply"],
                          "gold": record["gold"], "proxy": record["proxy"], "kl": record["kl"]})
    return sorted(shown, key=lambda e: (e["prompt"], e["iteration"]))


def seed_entry(evaluation: dict[str, Any], run: str, seed: int, predicted_peak_kl: float | None, max_kl: float,
               n_boot: int = N_BOOT) -> dict[str, Any]:
    """One seed of gao_turn.json: its observed peak, its fall with a 95% interval, the prediction beside them, its
    curve, and what the policy wrote at the peak and at the later checkpoint."""
    from ppo_rlhf.study.gao import fall

    found, kls, _, gold, proxy = seed_arrays(evaluation, run)
    measured = fall(gold, kls, max_kl, n_boot=n_boot, seed=seed)
    peak = measured["peak_index"]
    return {
        "seed": seed, "run": run,
        "peak_kl": measured["peak_kl"], "peak_gold": float(gold[peak].mean()), "peak_iteration": found[peak],
        "predicted_peak_kl": predicted_peak_kl,
        "prediction_within_30pct_of_d": peak_close(predicted_peak_kl, measured["peak_kl"]),
        "fall": {"kl": measured["kl"], "diff": measured["diff"], "ci95": measured["ci95"],
                 "iteration": found[measured["later_index"]], "resampled": measured["resampled"]},
        "curve": [{"iteration": i, "kl": float(k), "gold": float(g), "proxy": float(p)}
                  for i, k, g, p in zip(found, kls, gold.mean(axis=(1, 2)), proxy.mean(axis=(1, 2)))],
        "examples": examples(evaluation, run, [found[peak], found[measured["later_index"]]]),
    }


def fall_changes(evaluation: dict[str, Any], entries: list[dict[str, Any]]) -> np.ndarray:
    """[seeds, prompts, replies]: each seed's gold at its later checkpoint minus at its peak (seed_entry's)."""
    changes = []
    for entry in entries:
        found, _, _, gold, _ = seed_arrays(evaluation, entry["run"])
        changes.append(gold[found.index(entry["fall"]["iteration"])] - gold[found.index(entry["peak_iteration"])])
    return np.stack(changes)


def fall_difference(ensemble: tuple[dict, list[dict]], single: tuple[dict, list[dict]], n_boot: int = N_BOOT,
                    seed: int = 0) -> dict[str, Any]:
    """The ensemble's fall minus its single proxy's, each (evaluation, seed entries): seed k of one against seed k of
    the other, each at its own peak and later checkpoint taken as observed (not chosen again per resample), pooled
    over prompts and seeds (stats.pooled_bootstrap); above 0 when the ensemble falls less. Both evaluations answer
    the same prompts, with the same start replies."""
    from ppo_rlhf.study.stats import pooled_bootstrap

    require(len(ensemble[1]) == len(single[1]), "the ensemble and its proxy need as many seeds to compare their falls")
    mean, lo, hi = pooled_bootstrap(fall_changes(*ensemble) - fall_changes(*single), n_boot=n_boot, seed=seed)
    return {"diff": mean, "ci95": [lo, hi], "ensemble_kl": [e["fall"]["kl"] for e in ensemble[1]],
            "single_kl": [e["fall"]["kl"] for e in single[1]],
            "resampled": "prompts and seeds; each seed's peak and later checkpoint as observed"}


def proxy_goal(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal's parts for one group: how many seeds fell (95% interval below 0), and in how many of those the
    predicted peak lay within 30% of the observed one in d."""
    fell = [e for e in entries if e["fall"]["ci95"][1] < 0]
    return {"seeds_that_fell": [e["seed"] for e in fell], "fell": 3 * len(fell) >= 2 * len(entries),
            "prediction_close": [e["seed"] for e in fell if e["prediction_within_30pct_of_d"]]}


def goal_words(proxies: list[dict[str, Any]], ensemble: dict[str, Any] | None) -> list[str]:
    """The goal, part by part, in words from the numbers."""
    fell = [p for p in proxies if p["goal"]["fell"]]
    if fell:
        counts = [f"{p['name']} in {len(p['goal']['seeds_that_fell'])} of {len(p['seeds'])} seeds" for p in fell]
        lines = ["fall: gold fell (95% interval below 0) for " + ", ".join(counts)]
    else:
        lines = ["fall: no proxy's gold fell with a 95% interval below 0 in 2 of 3 seeds"]
    close = [p["name"] for p in fell if p["goal"]["prediction_close"] == p["goal"]["seeds_that_fell"]]
    lines.append("prediction: within 30% of the observed peak in d for " + ", ".join(close) if close else
                 "prediction: no proxy that fell had its peak predicted within 30% in d in every seed that fell")
    if ensemble is not None:
        compared = ensemble["fall_vs_single"]
        lo, hi = compared["ci95"]
        verdict = "smaller" if lo > 0 else "larger" if hi < 0 else "not measurably different"
        lines.append(f"ensemble: its fall minus {ensemble['of']}'s {compared['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                     f"start-model sd: {verdict}")
    return lines


def prediction_commit(path: Path) -> str | None:
    """The last commit that holds the prediction file as it is now (None: not in git, not committed, or changed
    since)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(path.parent), *args], capture_output=True, text=True, check=False)

    try:
        commit = git("log", "-n", "1", "--format=%H", "--", path.name).stdout.strip()
        unchanged = git("diff", "--quiet", "HEAD", "--", path.name).returncode == 0
    except OSError:  # no git
        return None
    return commit if commit and unchanged else None


# ---------------------------------------------------------------- the two invocations


def overoptimisation_stages(cfg: DemoConfig, stages: Stages, data: DataStages, out: Path) -> Path:
    """The study after the demo's data stages (see the module docstring); returns the file it wrote last: the
    prediction (--predict-only) or gao_turn.json."""
    from ppo_rlhf.study.arms import length_sign
    from ppo_rlhf.study.demo import stage_key, stage_settings, write_eval_prompts

    sign = length_sign(read_pairs(data.pairs))
    made = groups(cfg, stages, data, out, sign)
    seeds = [cfg.seed + k for k in range(cfg.seeds)]
    eval_prompts = write_eval_prompts(cfg, data.prompts_dir)
    path = prediction_path(cfg)

    # 1. the first seed of every group, its first half evaluated, the fit: the prediction
    first_runs = {g.name: group_runs(cfg, stages, data, out, g, seeds[:1]) for g in made}
    key = stage_key(stage_settings(cfg, "evaluation") | {"max_kl": cfg.max_kl, "reply_cap": cfg.reply_cap},
                    [k for runs in first_runs.values() for _, k in runs])
    if cfg.predict_only:
        return write_prediction(cfg, stages, made, first_runs, eval_prompts, sign, key, out / "gao", path)

    # 2. the rest, against the prediction made before it
    predicted, commit = read_prediction(path, key)
    all_runs = {g.name: first_runs[g.name] + group_runs(cfg, stages, data, out, g, seeds[1:]) for g in made}
    results = {g.name: evaluate_group(cfg, stages, g, all_runs[g.name], eval_prompts, sign, out / "gao",
                                      predicted[g.name]["peak_kl"], seeds) for g in made}
    turn = gao_turn(cfg, made, results, predicted, commit, path, seeds)
    turn_path = path.parent / "gao_turn.json"
    atomic_write_text(turn_path, json.dumps(turn, indent=1, ensure_ascii=False) + "\n")
    for line in turn["goal"]["words"]:
        print(line)
    print(f"gao_turn.json: {turn_path}")
    return turn_path


def write_prediction(cfg: DemoConfig, stages: Stages, made: list[Group], first_runs: dict[str, list[tuple[Path, str]]],
                     eval_prompts: Path, sign: int, key: str, gao_dir: Path, path: Path) -> Path:
    """--predict-only: each group's first-seed run evaluated at its first-half checkpoints and its peak fitted on
    them (prediction_entry), written to `path` under `key` before any later run exists, so that the prediction is
    committed before what it predicts is seen; returns `path`."""
    targets = parse_targets(cfg.kl_targets)
    entries = []
    for g in made:
        [(folder, _)] = first_runs[g.name]
        iterations = first_half_iterations(folder, targets, cfg.max_kl)
        require(len(iterations) >= 2, f"run {folder.name} reached {len(iterations)} KL target(s) up to "
                                      f"{cfg.max_kl / 2:g} nats; the fit needs two (more --iterations?)")
        evaluated = evaluation(cfg, stages, g, first_runs[g.name], eval_prompts, ",".join(map(str, iterations)), sign,
                               gao_dir / f"eval_{g.name}_first_half", f"evaluation gao {g.name} first half")
        entries.append(prediction_entry(g, evaluated, folder.name, iterations, cfg.max_kl, cfg.seed))
    prediction = {"key": key, "max_kl": cfg.max_kl, "seed": cfg.seed,
                  "fit": "R(d) = d (alpha - beta log d), d = sqrt(KL), least squares on the first seed's "
                         f"checkpoints up to {cfg.max_kl / 2:g} nats (KL and gold change on the held-out replies)",
                  "groups": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(prediction, indent=1) + "\n")
    for entry in entries:
        print(f"prediction {entry['name']}: {entry['words']}")
    print(f"prediction written to {path}: commit it, then run the same command without --predict-only")
    return path


def read_prediction(path: Path, key: str) -> tuple[dict[str, dict], str | None]:
    """({group name: its prediction entry}, the commit that holds the file) of the prediction at `path`, refused
    unless it was made from the same first runs and settings (`key`): a prediction of other runs tests nothing."""
    prediction = json.loads(path.read_text())
    require(prediction.get("key") == key, f"the prediction at {path} was made from other runs or settings; run with "
                                          "--predict-only again")
    commit = prediction_commit(path)
    if commit is None:
        print(f"note: {path} is not committed as it is (gao_turn.json's prediction_commit is null)")
    return {entry["name"]: entry for entry in prediction["groups"]}, commit


def evaluate_group(cfg: DemoConfig, stages: Stages, group: Group, runs: list[tuple[Path, str]], eval_prompts: Path,
                   sign: int, gao_dir: Path, peak_kl: float | None, seeds: list[int]) -> tuple[dict, list[dict]]:
    """(the evaluation of every seed's run of the group, each seed's entry): checkpoints at KL targets dense around
    the predicted peak (targets_near), where the fall is decided; the first half's evaluation is copied in first, so
    that its models' records are reused (their keys are unchanged)."""
    eval_dir = gao_dir / f"eval_{group.name}"
    half = gao_dir / f"eval_{group.name}_first_half" / "evaluation.json"
    if not (eval_dir / "evaluation.json").exists() and half.is_file():
        eval_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(half, eval_dir / "evaluation.json")
    dense = targets_near(parse_targets(cfg.kl_targets), peak_kl, cfg.max_kl)
    checkpoints = "kl:" + ",".join(f"{t:g}" for t in dense)
    evaluated = evaluation(cfg, stages, group, runs, eval_prompts, checkpoints, sign, eval_dir,
                           f"evaluation gao {group.name}")
    return evaluated, [seed_entry(evaluated, folder.name, seed, peak_kl, cfg.max_kl)
                       for (folder, _), seed in zip(runs, seeds)]


def gao_turn(cfg: DemoConfig, made: list[Group], results: dict[str, tuple[dict, list[dict]]],
             predicted: dict[str, dict], commit: str | None, path: Path, seeds: list[int]) -> dict[str, Any]:
    """gao_turn.json: per proxy and the ensemble, the prediction, each seed's peak and fall, the curves pooled over
    prompts and seeds (curves.arm_curves), the goal."""
    from ppo_rlhf.study.curves import arm_curves

    entries: dict[str, dict[str, Any]] = {}
    for g in made:
        evaluated, seed_entries = results[g.name]
        arms = {entry["run"]: {"arm": g.name, "beta": 0.0, "seed": entry["seed"]} for entry in seed_entries}
        entries[g.name] = {"name": g.name, "pairs": g.proxy.pairs, "label_noise": g.proxy.label_noise, **g.about,
                           "prediction": predicted[g.name], "seeds": seed_entries,
                           "curve": arm_curves(evaluated["records"], evaluated["summary"], arms, seed=seeds[0]),
                           "goal": proxy_goal(seed_entries)}
    proxies = [entries[g.name] for g in made if g.kind == "proxy"]
    ensemble = next((entries[g.name] for g in made if g.kind == "ensemble"), None)
    if ensemble is not None:
        single = next(g.name for g in made if g.kind == "proxy" and g.proxy.name == ensemble["of"])
        ensemble["fall_vs_single"] = fall_difference(results[ensemble["name"]], results[single], seed=seeds[0])
    return {"prediction_commit": commit, "prediction": str(path), "max_kl": cfg.max_kl,
            "goal_stated": GOAL.replace("MAX_KL", f"{cfg.max_kl:g}"),
            "proxies": proxies, "ensemble": ensemble,
            "goal": {"words": goal_words(proxies, ensemble)}}


def run(args: argparse.Namespace) -> int:
    """`ppo-rlhf demo --overoptimisation` (the CLI hands the demo command here when the flag is given): the demo's
    stages before PPO, then this study's (`overoptimisation_stages`), OUT locked meanwhile."""
    from ppo_rlhf.config import build_config, to_yaml
    from ppo_rlhf.study.demo import (
        OVEROPTIMISATION,
        DemoConfig,
        Stages,
        data_stages,
        given_settings,
        import_stage_modules,
    )
    from ppo_rlhf.utils.lock import hold

    given = given_settings(args)
    require("arms" not in given,
            "--arms does not apply to --overoptimisation: its runs optimise the proxies of --proxies and --ensemble")
    require(not (given.get("quick") or given.get("full")), "choose one preset: --quick, --full or --overoptimisation")
    cfg = build_config(DemoConfig, OVEROPTIMISATION, given)
    check_settings(cfg)
    with hold(cfg.out, "demo folder"):
        import_stage_modules()
        out = Path(cfg.out).resolve()
        stages = Stages(out, to_yaml(cfg))
        overoptimisation_stages(cfg, stages, data_stages(cfg, stages, out), out)
    return 0
