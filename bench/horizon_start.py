"""Whether the start policy can play the environment tasks with a horizon knob (key-door-H, guess-T), per horizon:
its success and valid-move rate on a seeded draw of TRAINING instances (never held-out ones: the prompts were
chosen on these), with the task preset's sampler and episode limits.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python bench/horizon_start.py                  # both tasks, H 2,4,8,16
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python bench/horizon_start.py --tasks key-door --horizons 2,8 -n 16

One episode per instance, sampled as `ppo-rlhf task evaluate` samples (`tasks.evaluate.episode_records`: torch's and
Python's RNGs seeded with --seed first), in the preset's dtype. Prints a table and writes --out (JSON: the settings,
one summary per task and horizon, and every episode's transcript).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from ppo_rlhf.config import read_yaml
from ppo_rlhf.tasks.arithmetic import problems, task_environment
from ppo_rlhf.tasks.horizon import FAMILIES, task_name

PRESETS = {"key-door": "configs/smollm2_key_door.yaml", "guess": "configs/smollm2_guess.yaml"}
SETTINGS = ("temperature", "max_new_tokens", "top_p", "max_turns", "max_tool_calls", "max_episode_tokens",
            "tool_timeout")
TAKEN = re.compile(r"You take the (\w+) key")
DEFAULTS = {"top_p": 1.0, "max_tool_calls": 4, "tool_timeout": 10.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(FAMILIES), help="task families, comma-separated")
    parser.add_argument("--horizons", default="2,4,8,16", help="horizons, comma-separated")
    parser.add_argument("-n", type=int, default=32, help="training instances per horizon (one episode each)")
    parser.add_argument("--draw-seed", type=int, default=0, help="seed of the draw of training instances")
    parser.add_argument("--seed", type=int, default=1234, help="sampling seed (task evaluate's default)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="bench/results/horizon_start.json")
    args = parser.parse_args()

    import torch

    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer
    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.tasks.evaluate import episode_records

    results, records = [], []
    for family in args.tasks.split(","):
        preset = read_yaml(Path(PRESETS[family]))
        settings = {key: preset.get(key, DEFAULTS.get(key)) for key in SETTINGS}
        dtype = resolve_dtype(preset.get("dtype", "auto"), torch.device("cpu"))
        tokenizer = load_tokenizer(preset["policy_model"])
        model = load_causal_lm(preset["policy_model"], dtype).eval()
        for horizon in (int(h) for h in args.horizons.split(",")):
            name = task_name(family, horizon)
            rows = problems(name, "train", args.n, seed=args.draw_seed)
            start = time.perf_counter()
            found = episode_records(model, tokenizer, rows, settings, 1, args.seed, args.batch_size, [],
                                    environment=task_environment(name))
            seconds = time.perf_counter() - start
            moves = sum(r["moves"] for r in found)
            summary = {"task": name, "episodes": len(found), "success": sum(r["correct"] for r in found) / len(found),
                       "valid_moves": sum(r["valid_moves"] for r in found) / max(moves, 1),
                       "no_invalid_move": sum(r["formatted"] for r in found) / len(found),
                       "turns": sum(r["turns"] for r in found) / len(found),
                       "policy_tokens": sum(r["tokens"] for r in found) / len(found),
                       "prompt_tokens": len(tokenizer.apply_chat_template(rows[0]["prompt"], tokenize=True,
                                                                          add_generation_prompt=True,
                                                                          return_dict=True)["input_ids"]),
                       "episode_tokens_max": max(len(tokenizer.encode(r["transcript"])) for r in found),
                       "seconds": seconds}
            if family == "key-door":  # the turn-1 choice alone: the right key among the episodes that took one
                taken = [(TAKEN.search(r["transcript"]), rows[r["prompt_index"]]["right"]) for r in found]
                taken = [(m.group(1), right) for m, right in taken if m]
                summary["right_key_taken"] = sum(key == right for key, right in taken) / max(len(taken), 1)
            print(f"{name:12s} success {summary['success']:6.1%}  valid moves {summary['valid_moves']:6.1%}  "
                  f"no invalid move {summary['no_invalid_move']:6.1%}  turns {summary['turns']:5.2f}  "
                  f"policy tokens {summary['policy_tokens']:5.1f}  prompt tokens {summary['prompt_tokens']}  "
                  f"longest episode {summary['episode_tokens_max']} tokens  "
                  f"right key {summary.get('right_key_taken', float('nan')):.0%}  "
                  f"{seconds:5.0f} s", flush=True)
            results.append(summary)
            records += [{"task": name, **{k: r[k] for k in ("prompt_index", "correct", "moves", "valid_moves",
                                                             "turns", "transcript")}} for r in found]
            write(Path(args.out), {"settings": vars(args), "threads": torch.get_num_threads(), "summary": results,
                                   "records": records})  # after each horizon: a stopped run keeps what it measured
        del model
    print(f"wrote {args.out}")


def write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
