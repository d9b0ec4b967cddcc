"""Held-out accuracy on a verifiable task (ppo_rlhf.tasks.arithmetic): the start policy and a run's checkpoints answer
the same held-out problems, `replies_per_prompt` replies each, with torch's RNG reset to the same seed before each model
samples (as `ppo-rlhf evaluate` does, whose sampling this reuses: KL to the start model and lengths come with it).

A multi-turn task (calc-steps, `arithmetic.task_tools`) is answered in episodes with its tools, run as training
runs them (`multiturn.episodes.run_episodes`, the run's max_turns, max_tool_calls, max_episode_tokens and reply cap
per turn): the checker reads the last turn's text, a record also holds the episode's turns, tool calls and tool
errors and its whole transcript, and its KL and tokens are over the policy's tokens only. An environment task
(key-door-H, guess-T: `arithmetic.task_environment`) is played in episodes in its environment, each seeing its row's
columns: a record's "correct" is whether the environment says the episode succeeded, "formatted" whether every move
was valid, and it holds the episode's moves and valid moves (a model's "valid_moves" is the share of its moves that
were valid). Python's RNG is seeded with the sampling seed before each model's episodes, so an environment that draws
from it (guess-T's secrets) gives every model the same episodes.

Every reply is checked exactly (`tasks.exact_match`; `tasks.answer_format` for the format share). A model's accuracy
gets a 95% prompt-level (cluster) bootstrap interval, and its change from the start model a paired one: reply i of
problem j against the start model's reply i of problem j, whole problems resampled (`stats.bootstrap_mean`).

A checkpoint's policy is our PEFT adapter or a plain transformers model folder (`checkpoint_files.MODEL_FILES`: a full
fine-tune saved by another trainer, e.g. TRL's GRPOTrainer in bench/peer_grpo.py), whose KL is taken against the
start model loaded beside it.

`summarize_task` is pure (tested on made-up records); `task_records` and `evaluate_task_runs` sample (models needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ppo_rlhf.errors import require
from ppo_rlhf.ppo.run import read_run_config, select_checkpoints
from ppo_rlhf.study.evaluate import run_name
from ppo_rlhf.study.sampling import START
from ppo_rlhf.study.stats import bootstrap_mean, paired_bootstrap
from ppo_rlhf.tasks.arithmetic import Split, answer_format, exact_match, problems, task_environment, task_tools

# the episode counts a multi-turn record holds, and their means in a model's summary
EPISODE_COUNTS = ("turns", "tool_calls", "tool_errors")


def task_records(model, tokenizer, rows: list[dict], settings: dict[str, Any], replies_per_prompt: int, seed: int,
                 batch_size: int, run: str | None = None, iteration: int | None = None,
                 reference=None, tools: list | None = None, environment=None) -> list[dict]:
    """`evaluate`'s per-reply records (prompt/reply indices, reply, tokens, finished, kl) of one model on the task's
    rows ({"prompt", "answer"}), each with "correct" and "formatted" (1.0 or 0.0). `settings`: temperature,
    max_new_tokens, top_p of the run (with `tools` or `environment`, its episode limits too); `reference`: the start
    model, for a fully fine-tuned `model` (its KL); `tools`: answer in multi-turn episodes that may call them
    (`episode_records`); `environment`: an environment factory, play episodes in it (rows carry its columns; the
    environment checks them)."""
    from ppo_rlhf.study.sampling import sample_records  # lazy: imports torch

    if tools or environment is not None:
        records = episode_records(model, tokenizer, rows, settings, replies_per_prompt, seed, batch_size, tools or [],
                                  run, iteration, reference, environment)
        if environment is not None:
            return records  # the environment said which episodes succeeded
    else:
        records, _ = sample_records(model, tokenizer, [row["prompt"] for row in rows], replies_per_prompt, settings,
                                     seed, batch_size, run, iteration, reference)
    replies = [record["reply"] for record in records]
    answers = [rows[record["prompt_index"]]["answer"] for record in records]
    prompts = [record["prompt"] for record in records]
    for record, correct, formatted in zip(records, exact_match(prompts, replies, [], answers),
                                          answer_format(prompts, replies, [])):
        record.update(correct=correct, formatted=formatted)
    return records


def episode_records(model, tokenizer, rows: list[dict], settings: dict[str, Any], replies_per_prompt: int, seed: int,
                    batch_size: int, tools: list, run: str | None = None, iteration: int | None = None,
                    reference=None, environment=None) -> list[dict]:
    """One multi-turn episode per (problem, reply) with `tools` (or in `environment`'s episodes, each reset with its
    row's columns), sampled as `study.sampling.sample_records` samples single replies (torch's and Python's seeds
    reset first, `batch_size` rows at once): a record's "reply" is the last turn's text (what the checker reads),
    "transcript" everything after the prompt, "tokens" and "kl" (`study.sampling.KL_ESTIMATE`) over the policy's
    tokens only, "finished" whether the last turn ended with EOS, and the episode's EPISODE_COUNTS; in an environment
    also "correct" (its `success`), "formatted" (no invalid move), "moves" and "valid_moves"."""
    import random

    import torch

    from ppo_rlhf.models.rollout import eos_token_ids, sample_replies
    from ppo_rlhf.multiturn.calls import tool_name
    from ppo_rlhf.multiturn.episodes import EpisodeLimits, run_episodes
    from ppo_rlhf.study.sampling import model_label, reference_kl

    prompts = [row["prompt"] for row in rows for _ in range(replies_per_prompt)]  # reply i of problem j at j * R + i
    torch.manual_seed(seed)  # same seed for every model: differences come from the weights, not the dice
    random.seed(seed)  # and the same environments' draws (e.g. guess-T's secrets: each reset draws in turn)

    def sample(trajectories: list[list[int]], cap: int):
        return sample_replies(model, tokenizer, trajectories, cap, settings["temperature"], batch_size,
                              settings["top_p"], record_logprobs=True, drop_finished=True)

    limits = EpisodeLimits(settings["max_turns"], settings["max_tool_calls"], settings["max_new_tokens"],
                           settings["max_episode_tokens"], settings["tool_timeout"])
    columns = [{k: v for k, v in row.items() if k != "prompt"} if environment is not None else {}
               for row in rows for _ in range(replies_per_prompt)]
    rollout, episodes = run_episodes(sample, tokenizer, prompts, columns, eos_token_ids(model, tokenizer), limits,
                                     {tool_name(t): t for t in tools}, environment)
    label = model_label(run, iteration)
    kl = ([0.0] * len(prompts) if run is None  # the start model is its own reference
          else reference_kl(model, rollout, settings["temperature"], batch_size, reference, label))
    records = [{"model": label, "run": run, "iteration": iteration,
                "prompt_index": k // replies_per_prompt, "reply_index": k % replies_per_prompt, "prompt": prompts[k],
                "reply": e.answer, "transcript": tokenizer.decode(e.tokens), "tokens": sum(e.policy),
                "finished": e.ended_with_eos, "kl": float(kl[k]), **{name: getattr(e, name) for name in EPISODE_COUNTS}}
               for k, e in enumerate(episodes)]
    if environment is not None:
        for record, e in zip(records, episodes):
            record.update(correct=float(e.env.success), formatted=float(e.env.valid_moves == e.env.moves),
                          moves=e.env.moves, valid_moves=e.env.valid_moves)
    return records


def _interval(values: np.ndarray, prompts: list[int], n_boot: int, seed: int, paired: bool = False) -> dict:
    mean, lo, hi = (paired_bootstrap if paired else bootstrap_mean)(values, prompts, n_boot=n_boot, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi}


def summarize_task(records: list[dict], n_boot: int = 10000, seed: int = 0) -> list[dict[str, Any]]:
    """One summary per model, the start model first: accuracy and its change from the start (95% prompt-level
    intervals), format share, finished share, mean reply tokens, mean KL to the start model (nats per reply); for
    multi-turn records also the mean turns, tool calls and tool errors per episode and "tool_use", the share of
    episodes with a tool call; for an environment task's records "valid_moves", the share of all moves that were
    valid."""
    start = {(r["prompt_index"], r["reply_index"]): r for r in records if r["model"] == START}
    require(bool(start), "no start-model records to compare against")
    summaries = []
    for label in dict.fromkeys(r["model"] for r in records):  # in first-seen order
        rows = [r for r in records if r["model"] == label]
        keys = [(r["prompt_index"], r["reply_index"]) for r in rows]
        require(sorted(keys) == sorted(start), f"{label}: replies do not pair with the start model's")
        prompts = [prompt for prompt, _ in keys]
        correct = np.array([r["correct"] for r in rows], dtype=np.float64)
        change = correct - np.array([start[key]["correct"] for key in keys])
        summaries.append({
            "model": label, "run": rows[0]["run"], "iteration": rows[0]["iteration"], "replies": len(rows),
            "problems": len(set(prompts)),
            "accuracy": _interval(correct, prompts, n_boot, seed),
            "accuracy_change": _interval(change, prompts, n_boot, seed, paired=True),
            "formatted": float(np.mean([r["formatted"] for r in rows])),
            "finished": float(np.mean([r["finished"] for r in rows])),
            "tokens": float(np.mean([r["tokens"] for r in rows])),
            "kl": float(np.mean([r["kl"] for r in rows])),
        })
        if "turns" in rows[0]:
            summaries[-1] |= {name: float(np.mean([r[name] for r in rows])) for name in EPISODE_COUNTS}
            summaries[-1]["tool_use"] = float(np.mean([r["tool_calls"] > 0 for r in rows]))
        if "valid_moves" in rows[0]:  # an environment task: the share of every move that was valid
            summaries[-1]["valid_moves"] = sum(r["valid_moves"] for r in rows) / max(sum(r["moves"] for r in rows), 1)
    return summaries


# config keys every evaluated run must share (with the default for configs that lack them): one start, one sampler
SHARED = {"policy_model": None, "temperature": None, "max_new_tokens": None, "top_p": 1.0, "dtype": "float32"}
# and, for a multi-turn task, the episode limits (TrainConfig's defaults for configs that lack them)
EPISODE_SHARED = {"max_turns": 4, "max_tool_calls": 4, "max_episode_tokens": 512, "tool_timeout": 10.0}


def evaluate_task_runs(run_dirs: list[str | Path], level: str, n_heldout: int | None = 200,
                       replies_per_prompt: int = 1, checkpoints: str = "all", seed: int = 1234, batch_size: int = 32,
                       device: str = "auto", split: Split = "heldout", models: str = "all") -> dict[str, Any]:
    """The start policy and the chosen checkpoints of each run (e.g. PPO, RLOO and GRPO from one start) on
    `n_heldout` held-out problems of `level` (None: all), in the runs' dtype, temperature and reply cap (a multi-turn
    task: and episode limits), which they must share. Returns {"settings", "summary", "records"}; writes nothing.
    `split` "train": the first n_heldout training problems instead (a validation split: `tasks.screen`).
    `models` "start" or "checkpoints": only those records, and no summary (it pairs every model with the start's
    records: `summarize_task` over the parts put together; each model samples from the same seed, so the parts are
    the records one evaluation of them all would give)."""
    require(len(run_dirs) > 0, "give at least one run directory")
    require(models in ("all", "start", "checkpoints"), f"models must be all, start or checkpoints; got {models!r}")
    require(replies_per_prompt >= 1, f"replies_per_prompt must be >= 1, got {replies_per_prompt}")
    require(batch_size >= 1, f"batch_size must be >= 1, got {batch_size}")
    runs = {run_name(Path(d)): Path(d) for d in run_dirs}
    require(len(runs) == len(run_dirs), "two runs have the same folder name; give them different names")
    configs = {name: read_run_config(d) for name, d in runs.items()}
    tools, environment = task_tools(level), task_environment(level)
    settings: dict[str, Any] = {}
    for key, default in (SHARED | (EPISODE_SHARED if tools or environment else {})).items():
        values = {repr(config.get(key, default)) for config in configs.values()}
        require(len(values) == 1, f"the runs differ in {key} ({', '.join(sorted(values))}); evaluate them apart")
        settings[key] = next(iter(configs.values())).get(key, default)
    selected = ({} if models == "start" else
                {name: select_checkpoints(d, checkpoints, full_models=True) for name, d in runs.items()})
    rows = problems(level, split, n_heldout)  # all checked before torch and the models load

    from ppo_rlhf.models.loading import load_causal_lm, load_policy_adapter, load_tokenizer
    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.utils.device import resolve_device

    torch_device = resolve_device(device)
    dtype = resolve_dtype(settings["dtype"], torch_device)
    base = settings["policy_model"]
    tokenizer = load_tokenizer(base)
    records: list[dict] = []
    jobs: list[tuple[str | None, int | None, Path | None]] = [(None, None, None)] * (models != "checkpoints")
    jobs += [(name, i, folder) for name, found in selected.items() for i, folder in found]
    for name, iteration, folder in jobs:
        reference = None
        if folder is None:
            model = load_causal_lm(base, dtype)
        elif (folder / "policy" / "adapter_config.json").is_file():
            model = load_policy_adapter(base, folder / "policy", dtype)
        else:  # a plain model folder (a full fine-tune, e.g. TRL's): the start model beside it, for the KL
            model = load_causal_lm(str(folder / "policy"), dtype)
            reference = load_causal_lm(base, dtype).to(torch_device)
        records += task_records(model.to(torch_device), tokenizer, rows, settings, replies_per_prompt, seed,
                                batch_size, name, iteration, reference, tools, environment)
        del model, reference  # one policy (and its reference) in memory at a time
    return {"settings": {**settings, "level": level, "n_heldout": len(rows), "split": split,
                         "replies_per_prompt": replies_per_prompt, "seed": seed,
                         "runs": {name: str(d.resolve()) for name, d in runs.items()},
                         "checkpoints": checkpoints},
            "summary": summarize_task(records) if models == "all" else None, "records": records}
