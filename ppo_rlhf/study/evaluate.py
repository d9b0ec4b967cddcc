"""Held-out evaluation of checkpoints (`ppo-rlhf evaluate`, spec 8.10 and 8.11).

The start model (the base without adapter) and every selected checkpoint of every run answer the same
held-out prompts, several replies each, with torch's RNG reset to the same seed before each model samples.
Each reply is scored by two judges, the proxy (the reward model PPO optimised) and the gold (an independent
judge), and by its length (word count, signed as the reward model's training pairs prefer: what the study's length
arm maximises). All are put in start-model standard deviations: (score - mean) / std of the start model's replies
on these prompts, per judge. Reply i of prompt j of a checkpoint is paired with reply i of prompt j of the
start model, and the mean paired change gets a 95% cluster bootstrap interval: the replies to one prompt share
that prompt's effect, so whole prompts are resampled (stats.bootstrap_mean).

The work is split in two: `evaluate_runs` samples and scores (models needed), and the pure functions
`standardize_records`, `summarize`, `before_after` and `format_evaluation` turn per-reply records into the
summary and the text, so that they can be tested on made-up records.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ppo_rlhf.config import NON_NEGATIVE_INT, POSITIVE_INT, SEED, add_threads_argument
from ppo_rlhf.errors import require
from ppo_rlhf.ppo.run import checkpoint_targets, read_run_config, select_checkpoints
from ppo_rlhf.study.judge_specs import check_judge_spec, check_run_rewards
from ppo_rlhf.study.prompts import read_prompts
from ppo_rlhf.study.sampling import KL_ESTIMATE, START, model_label, sample_records
from ppo_rlhf.study.stats import distinct_n, paired_bootstrap, pearson, standardize
from ppo_rlhf.utils.device import resolve_device

JUDGES = ("proxy", "gold", "length")


# ---------------------------------------------------------------- runs and checkpoints


def run_name(run_dir: Path) -> str:
    return Path(run_dir).resolve().name


# ---------------------------------------------------------------- pure aggregation


def scored_judges(records: list[dict]) -> list[str]:
    """The JUDGES whose raw scores the records hold (evaluations written before the length score lack it)."""
    return [judge for judge in JUDGES if all(f"{judge}_raw" in r for r in records)]


def standardize_records(records: list[dict], unfinished_score: float = -1.0) -> dict[str, dict[str, float]]:
    """Add each judge's score in start-model standard deviations ("proxy", "gold", "length") and with the EOS rule
    ("proxy_eos", ...) to every record, in place.

    The mean and std per judge come from the start model's replies. "<judge>_eos" is the judge with the EOS
    rule of training: a reply that never ended gets `unfinished_score`, whatever it says (what an arm that
    maximises that judge saw). Returns the {"proxy": {"mean", "std"}, "gold": {...}, ...} used.
    """
    start = [r for r in records if r["model"] == START]
    require(bool(start), "no start-model records to standardise against")
    norms = {}
    for judge in scored_judges(records):
        reference = np.array([r[f"{judge}_raw"] for r in start], dtype=np.float64)
        norms[judge] = {"mean": float(reference.mean()), "std": float(reference.std())}
        values = standardize([r[f"{judge}_raw"] for r in records], norms[judge]["mean"], norms[judge]["std"])
        for record, value in zip(records, values):
            record[judge] = float(value)
    for record in records:
        for judge in norms:
            record[f"{judge}_eos"] = record[judge] if record["finished"] else unfinished_score
    return norms


def _interval(values: np.ndarray, prompts: list[int], n_boot: int, seed: int) -> dict[str, float]:
    mean, lo, hi = paired_bootstrap(values, prompts, n_boot=n_boot, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi}


def summarize_model(records: list[dict], start: list[dict], n_boot: int = 10000, seed: int = 0) -> dict[str, Any]:
    """The summary of one model's standardised records, paired with the start model's records."""
    by_key = {(r["prompt_index"], r["reply_index"]): r for r in start}
    keys = [(r["prompt_index"], r["reply_index"]) for r in records]
    require(sorted(keys) == sorted(by_key), f"{records[0]['model']}: replies do not pair with the start model's")
    tokens = np.array([r["tokens"] for r in records], dtype=np.float64)
    finished = np.array([r["finished"] for r in records], dtype=bool)
    proxy = np.array([r["proxy"] for r in records])
    summary: dict[str, Any] = {
        "model": records[0]["model"],
        "run": records[0]["run"],
        "iteration": records[0]["iteration"],
        "replies": len(records),
    }
    prompts = [prompt for prompt, _ in keys]
    # each judge's change, and that of what PPO maximised: the proxy can fall while the proxy with the EOS rule rises,
    # when the policy learns to finish its replies
    judges = scored_judges(records)
    for score in (*judges, *(f"{judge}_eos" for judge in judges)):
        diffs = np.array([r[score] - by_key[k][score] for r, k in zip(records, keys)])
        summary[f"{score}_change"] = _interval(diffs, prompts, n_boot, seed)
    for judge in judges:
        summary[judge] = float(np.mean([r[judge] for r in records]))
        summary[f"{judge}_raw"] = float(np.mean([r[f"{judge}_raw"] for r in records]))
    summary.update(
        proxy_eos=float(np.mean([r["proxy_eos"] for r in records])),
        finished=float(finished.mean()),
        tokens=float(tokens.mean()),
        kl=float(np.mean([r["kl"] for r in records])),
        distinct_2=distinct_n([r["reply"] for r in records], n=2),
        # per token over all replies, as the training dashboard's ent
        entropy=float(np.sum([r["entropy_sum"] for r in records]) / max(tokens.sum(), 1.0)),
        length_corr=pearson(proxy[finished], tokens[finished]),
    )
    return summary


def summarize(records: list[dict], n_boot: int = 10000, seed: int = 0) -> list[dict[str, Any]]:
    """One summary per model, in the order models first appear (the start model first)."""
    models: dict[str, list[dict]] = {}
    for record in records:
        models.setdefault(record["model"], []).append(record)
    require(START in models, "no start-model records")
    order = [START] + [name for name in models if name != START]
    return [summarize_model(models[name], models[START], n_boot, seed) for name in order]


def before_after(records: list[dict], n_prompts: int = 3) -> list[dict[str, Any]]:
    """Reply 0 of the first `n_prompts` prompts from the start model and from each run's last checkpoint."""
    last: dict[str, int] = {}
    for record in records:
        if record["run"] is not None:
            last[record["run"]] = max(last.get(record["run"], record["iteration"]), record["iteration"])
    shown = {START} | {model_label(run, iteration) for run, iteration in last.items()}
    examples: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["model"] in shown and record["reply_index"] == 0 and record["prompt_index"] < n_prompts:
            j = record["prompt_index"]
            example = examples.setdefault(j, {"prompt_index": j, "prompt": record["prompt"], "replies": []})
            example["replies"].append(
                {key: record[key] for key in ("model", "run", "iteration", "proxy", "gold", "tokens", "reply")}
            )
    return [examples[i] for i in sorted(examples)]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_reply(reply: str, limit: int | None = None) -> str:
    """A reply as evaluation.txt quotes it (repr, clipped to `limit` characters) or the report shows it (whole, as
    is); an empty one says so, rather than leave a blank."""
    if not reply.strip():
        return f"(empty reply{': only whitespace' if reply else ''})"
    return repr(_clip(reply, limit)) if limit is not None else reply


def _signed(value: float, digits: int = 3) -> str:
    return "nan" if np.isnan(value) else f"{value:+.{digits}f}"


def length_correlation(s: dict[str, Any]) -> str:
    """A summary's length correlation, or why it has none (a correlation needs two finished replies that differ)."""
    if not np.isnan(s["length_corr"]):
        return _signed(s["length_corr"], 2)
    finished = round(s["finished"] * s["replies"])
    if finished < 2:
        return f"n/a (only {finished} finished {'reply' if finished == 1 else 'replies'}; it needs 2)"
    return "n/a (the finished replies all have the same length or the same proxy score)"


def format_evaluation(summary: list[dict], examples: list[dict], replies_per_checkpoint: int) -> str:
    """The text of spec 8.10: one result line per checkpoint, the diversity and length lines, the examples."""
    start = summary[0]
    checkpoints = summary[1:]
    name_width = max([len(s["run"]) for s in checkpoints] + [len(START)])
    step_width = max([len(str(s["iteration"])) for s in checkpoints] + [1])

    def head(s: dict) -> str:
        if s["run"] is None:
            return f"{START:<{name_width}}  {'':{step_width + 5}}:"
        return f"{s['run']:<{name_width}}  step {s['iteration']:>{step_width}}:"

    def change(s: dict, judge: str) -> str:
        c = s[f"{judge}_change"]
        return f"{judge} change {_signed(c['mean'])} [{_signed(c['lo'])}, {_signed(c['hi'])}]"

    lines = [f"{replies_per_checkpoint} held-out replies per checkpoint (same prompts, same sampling seed); "
             f"KL: the {KL_ESTIMATE}"]
    for s in checkpoints:
        lines.append(
            f"{head(s)} {change(s, 'proxy')}  {change(s, 'gold')}  "
            + (f"{change(s, 'length')}  " if "length_change" in s else "")
            + f"proxy with EOS rule {_signed(s['proxy_eos'])} (start {_signed(start['proxy_eos'])})  "
            f"finished {s['finished']:.2f} (start {start['finished']:.2f})  "
            f"tokens {s['tokens']:.1f} (start {start['tokens']:.1f})  KL {s['kl']:.2f}"
        )
    lines += ["", "Diversity, entropy and length bias (length correlation: proxy vs tokens, finished replies)"]
    for s in summary:
        lines.append(
            f"{head(s)} distinct-2 {s['distinct_2']:.3f}  entropy {s['entropy']:.3f}  "
            f"length correlation {length_correlation(s)}"
        )
    if examples:
        lines += ["", "Before and after (proxy and gold in start-model standard deviations)"]
        label_width = max(len(r["model"]) for e in examples for r in e["replies"])
        for example in examples:
            lines += ["", f"PROMPT: {_clip(example['prompt'], 200)!r}"]
            for r in example["replies"]:
                lines.append(
                    f"  [{r['model']:<{label_width}}] proxy {_signed(r['proxy'], 2)} gold {_signed(r['gold'], 2)} "
                    f"tokens {r['tokens']:>3} {shown_reply(r['reply'], 400)}"
                )
    return "\n".join(lines) + "\n"


# config keys all runs must share (with the default for configs that lack them): one start model, one sampler
SHARED_SETTINGS = {
    "policy_model": None,
    "temperature": None,
    "max_new_tokens": None,
    "top_p": 1.0,
    "unfinished_score": -1.0,
    "dtype": "float32",
}


def run_rewards(config: dict[str, Any]) -> dict[str, Any]:
    """A run's own rewards as its config.yaml records them, in the order reward_weights follows: reward_model (if
    set), then each of reward_funcs."""
    specs = [*([config["reward_model"]] if config.get("reward_model") else []), *(config.get("reward_funcs") or [])]
    return {"reward_funcs": specs, "reward_weights": config.get("reward_weights")}


def own_proxy(configs: dict[str, dict[str, Any]], run_dirs: dict[str, Path]) -> str | dict[str, Any]:
    """The proxy by default: the runs' own rewards, combined as in training. A reward model alone (weight 1) is the
    judge "rm:MODEL"; anything else the {"reward_funcs", "reward_weights"} of `judges.RewardFunctionsJudge`."""
    by_run = {name: run_rewards(config) for name, config in configs.items()}
    require(len({json.dumps(rewards) for rewards in by_run.values()}) == 1,
            "runs were trained with different rewards; choose one proxy with --proxy (file.py:function, rm:FOLDER, "
            "...)")
    name, rewards = next(iter(by_run.items()))
    require(bool(rewards["reward_funcs"]), f"{run_dirs[name]}: the run config names no reward_model or reward_funcs "
            "(an environment's rewards cannot be recomputed); give --proxy file.py:function or rm:FOLDER")
    check_run_rewards(run_dirs[name], rewards)
    only_model = rewards["reward_funcs"] == [configs[name].get("reward_model")]
    if only_model and rewards["reward_weights"] in (None, [1.0]):
        return f"rm:{rewards['reward_funcs'][0]}"
    return rewards


def _common_settings(configs: dict[str, dict[str, Any]], proxy: str | None,
                     run_dirs: dict[str, Path]) -> dict[str, Any]:
    """Sampling settings and the proxy shared by all runs: they must have the same start model to compare."""
    settings = {}
    for key, default in SHARED_SETTINGS.items():
        values = {json.dumps(config.get(key, default)) for config in configs.values()}
        require(len(values) == 1, f"runs differ in {key} ({', '.join(sorted(values))}); evaluate them separately")
        settings[key] = next(iter(configs.values())).get(key, default)
    settings["proxy"] = own_proxy(configs, run_dirs) if proxy is None else proxy
    return settings


def stored_records(out_dir: Path, record_settings: dict[str, Any], prompts: list[str],
                   model_keys: dict[str | None, str]) -> dict[str, list[dict]]:
    """The records in out_dir/evaluation.json of each model whose stored key equals its run's in `model_keys` (None:
    the start model's), when they were made with `record_settings` and answer exactly `prompts`, every reply of
    each: {model label: records}."""
    path = out_dir / "evaluation.json"
    if not model_keys or not path.is_file():
        return {}
    try:
        previous = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}  # a damaged file is evaluated anew, not reused
    made_with = previous.get("settings", {})
    if any(made_with.get(key) != value for key, value in json.loads(json.dumps(record_settings)).items()):
        return {}
    by_model: dict[str, list[dict]] = {}
    for record in previous.get("records", []):
        by_model.setdefault(record["model"], []).append(record)
    complete = [(j, i) for j in range(len(prompts)) for i in range(record_settings["replies_per_prompt"])]
    return {label: records for label, records in by_model.items()
            if model_keys.get(records[0]["run"]) is not None
            and [(r["prompt_index"], r["reply_index"]) for r in records] == complete
            and all(r.get("key") == model_keys[r["run"]] and r["prompt"] == prompts[r["prompt_index"]]
                    for r in records)}


def _release_memory() -> None:
    import torch  # lazy, as in run()

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def read_run_configs(run_dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """{run name: its config.yaml}, each checked; two runs of one name are refused."""
    configs = {}
    for run_dir in run_dirs:
        name = run_name(run_dir)
        config = read_run_config(run_dir)
        require(name not in configs, f"two runs are named {name!r}; give their folders different names")
        configs[name] = config
    return configs


def score_models(pending: list[tuple[str | None, int | None, Path | None]], settings: dict[str, Any], gold: str,
                 prompts: list, prompts_path: str | Path, device: str, batch_size: int, replies_per_prompt: int,
                 seed: int, length_sign: int, model_keys: dict[str | None, str]) -> dict[str, list[dict]]:
    """{model label: its records}: each pending (run, iteration, checkpoint folder) model, one in memory at a time,
    samples its replies, which the proxy and the gold judge score; the length score and the model's key added."""
    # lazy: every argument and file is checked (evaluate_runs) before torch, transformers and the models load
    import torch

    from ppo_rlhf.data import load_prompt_rows
    from ppo_rlhf.models.loading import load_causal_lm, load_policy_adapter, load_tokenizer
    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.ppo.trainer import check_prompt_lengths
    from ppo_rlhf.study.arms import word_count
    from ppo_rlhf.study.judges import RewardFunctionsJudge, make_judge

    new_records: dict[str, list[dict]] = {}
    dtype = resolve_dtype(settings["dtype"], torch.device(device))  # the runs' own setting: "auto" resolves here
    base = settings["policy_model"]
    tokenizer = load_tokenizer(base)
    # the proxy in the runs' dtype: the scores PPO maximised (and bf16 forwards are ~2x faster than fp32 here)
    judges = {"proxy": make_judge(settings["proxy"], batch_size, device, dtype),
              "gold": make_judge(gold, batch_size, device)}
    sample: dict[str, Any] = dict(prompts=prompts, replies_per_prompt=replies_per_prompt, settings=settings,
                                  seed=seed)

    def load(folder: Path | None) -> torch.nn.Module:
        """The start model (no folder) or a checkpoint's policy, on the device."""
        if folder is None:
            return load_causal_lm(base, dtype).to(device)
        return load_policy_adapter(base, folder / "policy", dtype).to(device)

    model = load(pending[0][2])
    rows = load_prompt_rows(str(prompts_path))
    # as train does: a prompt beyond a model's context would be cut, and its replies would mean nothing
    judge_models = [judge_model for judge in judges.values() for judge_model in getattr(judge, "models", [])]
    check_prompt_lengths(rows, tokenizer, [model, *judge_models], settings["max_new_tokens"])
    for k, (run, iteration, folder) in enumerate(tqdm(pending, desc="models", unit="model")):
        model = model if k == 0 else load(folder)
        new, completion_ids = sample_records(model, tokenizer, batch_size=batch_size, run=run, iteration=iteration,
                                              **sample)
        del model  # one policy in memory at a time
        _release_memory()
        texts_prompts, texts = [r["prompt"] for r in new], [r["reply"] for r in new]
        columns = [rows[r["prompt_index"]].columns for r in new]  # each reply's prompt's other columns, as in training
        for judge_name, judge in judges.items():
            scores = judge.score(texts_prompts, texts, completion_ids, columns) \
                if isinstance(judge, RewardFunctionsJudge) else judge.score(texts_prompts, texts)
            for record, score in zip(new, scores):
                record[f"{judge_name}_raw"] = score
        for record in new:
            record["length_raw"] = float(length_sign * word_count(record["reply"]))
            record["key"] = model_keys.get(run)
        new_records[model_label(run, iteration)] = new
    return new_records


def mark_kl_targets(summary: list[dict], selected: dict[str, list[tuple[int, Path]]], run_dirs: dict[str, Path],
                    checkpoints: str) -> None:
    """Each checkpoint's summary row names the KL targets it was picked for ("kl_targets")."""
    for row in summary[1:]:
        # picking again among the picked checkpoints gives each the targets it was picked for
        found = [iteration for iteration, _ in selected[row["run"]]]
        row["kl_targets"] = checkpoint_targets(run_dirs[row["run"]], checkpoints, found)[row["iteration"]]


def evaluate_runs(
    run_dirs: Sequence[str | Path],
    prompts_path: str | Path,
    out_dir: str | Path,
    proxy: str | None = None,
    gold: str = "gold",
    replies_per_prompt: int = 2,
    seed: int = 1234,
    checkpoints: str = "all",
    batch_size: int = 16,
    n_examples: int = 3,
    device: str = "auto",
    model_keys: dict[str | None, str] | None = None,
    length_sign: int = 1,
) -> dict[str, Any]:
    """Evaluate the start model and the chosen checkpoints of each run; write evaluation.json and .txt.

    `model_keys` (the demo's): a key per run name, and under None one for the start model, that changes whenever
    the run's checkpoints (or the start model) or the proxy change. A model whose key equals the one stored with its
    records in out_dir/evaluation.json, made with the same settings on the same prompts, keeps those records instead
    of being sampled and scored again: torch's RNG is reset to `seed` before each model samples, so a model's records
    do not depend on which models are evaluated with it, and the result is the one a full evaluation gives.
    `length_sign`: the length score is this times the reply's word count (the demo's: as the length arm's reward).
    With `checkpoints` "kl:..." every summary row of a checkpoint names the KL targets it was picked for
    ("kl_targets"; kl_spacing.py).
    """
    dirs, configs, prompts = checked_inputs(run_dirs, prompts_path, (proxy, gold), replies_per_prompt, batch_size,
                                            length_sign)
    by_name = {run_name(d): d for d in dirs}
    settings = _common_settings(configs, proxy, by_name)
    selected = {name: select_checkpoints(d, checkpoints) for name, d in by_name.items()}
    device = str(resolve_device(device))
    # what a record depends on besides its model: records made otherwise are never reused
    record_settings = {**settings, "gold": gold, "replies_per_prompt": replies_per_prompt, "seed": seed,
                       "batch_size": batch_size, "device": device, "kl": KL_ESTIMATE, "judges": list(JUDGES),
                       "length_sign": length_sign}
    score = functools.partial(score_models, settings=settings, gold=gold, prompts=prompts, prompts_path=prompts_path,
                              device=device, batch_size=batch_size, replies_per_prompt=replies_per_prompt, seed=seed,
                              length_sign=length_sign, model_keys=model_keys or {})
    records = model_records(selected, Path(out_dir), record_settings, prompts, model_keys or {}, score)

    norms = standardize_records(records, settings["unfinished_score"])
    summary = summarize(records)
    if checkpoints.startswith("kl:"):
        mark_kl_targets(summary, selected, by_name, checkpoints)
    examples = before_after(records, n_examples)
    result = {
        "settings": {**record_settings, "prompts": str(Path(prompts_path).resolve()),  # absolute, like every saved path
                     "n_prompts": len(prompts), "checkpoints": checkpoints,
                     "runs": {name: str(d.resolve()) for name, d in zip(configs, dirs)}},
        "norms": norms, "summary": summary, "examples": examples, "records": records,
    }
    write_evaluation(Path(out_dir), result, len(prompts) * replies_per_prompt)
    return result


def checked_inputs(run_dirs: Sequence[str | Path], prompts_path: str | Path, judges: tuple[str | None, ...],
                   replies_per_prompt: int, batch_size: int, length_sign: int
                   ) -> tuple[list[Path], dict[str, dict[str, Any]], list]:
    """(the run folders, their configs, the prompts): every argument, file and judge checked before the slow imports
    and model loads, so that bad input stops in one line before minutes of loading."""
    require(len(run_dirs) > 0, "give at least one run directory")
    require(replies_per_prompt >= 1, f"--replies-per-prompt must be >= 1, got {replies_per_prompt}")
    require(batch_size >= 1, f"--batch-size must be >= 1, got {batch_size}")
    require(length_sign in (1, -1), f"length_sign must be 1 or -1, got {length_sign}")
    dirs = [Path(d) for d in run_dirs]
    configs = read_run_configs(dirs)
    prompts = read_prompts(prompts_path)
    for judge in judges:
        if judge is not None:
            check_judge_spec(judge, rewards=True)
    return dirs, configs, prompts


def model_records(selected: dict[str, list[tuple[int, Path]]], out_dir: Path, record_settings: dict[str, Any],
                  prompts: list, model_keys: dict[str | None, str],
                  score: Callable[[list[tuple[str | None, int | None, Path | None]]], dict[str, list[dict]]]
                  ) -> list[dict]:
    """The records of the start model, then of each selected checkpoint in order: a model's stored ones in out_dir
    where its key is unchanged (stored_records: sampling again would give the same), the others' from `score`."""
    jobs: list[tuple[str | None, int | None, Path | None]] = [(None, None, None)]
    jobs += [(run, i, folder) for run, found in selected.items() for i, folder in found]
    stored = stored_records(out_dir, record_settings, prompts, model_keys)
    reused = [model_label(run, iteration) for run, iteration, _ in jobs if model_label(run, iteration) in stored]
    if reused:
        print(f"reusing the stored records of {len(reused)} of {len(jobs)} models (keys unchanged): "
              + ", ".join(reused))
    pending = [job for job in jobs if model_label(job[0], job[1]) not in stored]
    by_label = stored | (score(pending) if pending else {})
    return [record for run, iteration, _ in jobs for record in by_label[model_label(run, iteration)]]


def write_evaluation(out_dir: Path, result: dict[str, Any], n_replies: int) -> None:
    """out_dir/evaluation.json (everything, the records included: a later run reuses them) and evaluation.txt (the
    summary and examples in words)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "evaluation.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    (out_dir / "evaluation.txt").write_text(format_evaluation(result["summary"], result["examples"], n_replies))


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="training run folders (ppo-rlhf train --out)")
    parser.add_argument("--prompts", "--eval-prompts", dest="prompts", required=True, metavar="FILE",
                        help='held-out prompts, a {"prompt": ...} JSONL file; its other columns (e.g. "answer") are '
                        "passed to reward functions, as in training")
    parser.add_argument("--proxy", default=None, help="the proxy judge: a reward as train's --reward-funcs takes it "
                        "(file.py:function, module:function, a reward-model folder or rm:PATH_OR_ID) or a --gold "
                        "judge (default: the runs' own rewards as their config.yaml records them, reward_model and "
                        "reward_funcs weighted by reward_weights, as in training)")
    add_threads_argument(parser)
    parser.add_argument("--gold", default="gold", help="the gold judge: gold, vader, nontoxic, rm:PATH_OR_ID, or a "
                        "reward function (file.py:function, module:function)")
    parser.add_argument("--replies-per-prompt", type=POSITIVE_INT, default=2, metavar="N",
                        help="replies sampled per held-out prompt and model (default 2)")
    parser.add_argument("--seed", type=SEED, default=1234, help="sampling seed, the same for every model")
    parser.add_argument("--checkpoints", default="all", help="all, latest, iterations like 10,20, or KL targets like "
                        "kl:1,2,4 (per target the first checkpoint whose training KL reached it, and the last)")
    parser.add_argument("--out", required=True, help="folder for evaluation.json and evaluation.txt")
    parser.add_argument("--batch-size", type=POSITIVE_INT, default=16, help="replies generated and scored at once")
    parser.add_argument("--examples", type=NON_NEGATIVE_INT, default=3, help="prompts shown before/after")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")


def run(args: argparse.Namespace) -> int:
    evaluate_runs(
        args.run_dirs,
        args.prompts,
        args.out,
        proxy=args.proxy,
        gold=args.gold,
        replies_per_prompt=args.replies_per_prompt,
        seed=args.seed,
        checkpoints=args.checkpoints,
        batch_size=args.batch_size,
        n_examples=args.examples,
        device=args.device,
    )
    print((Path(args.out) / "evaluation.txt").read_text(), end="")
    return 0
