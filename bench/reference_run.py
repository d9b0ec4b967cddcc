"""Guard rail for refactors: a 3-iteration tiny run per configuration, its full history (timings dropped) and the
weights after it, saved to a folder, or compared bitwise with a folder saved before the change.

    python bench/reference_run.py save /tmp/ref         # on the code before a refactor
    python bench/reference_run.py compare /tmp/ref      # after it: exit 1 on any difference

fp32 (pinned: `dtype: auto` is bf16 on a CPU with AVX512-BF16), one process, CPU: a behaviour-preserving refactor
gives identical histories and weights, bit for bit. History keys the reference lacks (numbers added since) are
listed, not counted as differences; every key it has must be equal.

It prints one line per configuration ("NAME: identical (N iterations, ...)" or what differs) and last "IDENTICAL" or
"K DIFFERENCES". Run it around every change that could touch the chapter's fp32 run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ppo_rlhf.config import build_config  # noqa: E402
from ppo_rlhf.ppo.train_config import TrainConfig  # noqa: E402
from ppo_rlhf.train import train  # noqa: E402

import tiny  # noqa: E402

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time",
           "I love this day", "The quick brown fox", "This is terrible", "A cat in a house"]
TIME_KEYS = {"time_gen", "time_score", "time_update", "time_total", "gen_tokens_per_s"}
RUNS = {
    "gae": {},
    "rloo": {"advantage_estimator": "rloo", "group_size": 2},
    "grpo": {"advantage_estimator": "grpo", "group_size": 2},
    # every optional loss term, accumulation and a schedule
    "gae_extras": {"entropy_coef": 0.01, "micro_batch_size": 1, "ptx_coef": 0.1, "lr_schedule": "cosine",
                   "warmup_iterations": 1, "adaptive_kl": True, "whiten_rewards": True},
    "rloo_sequence": {"advantage_estimator": "rloo", "group_size": 2, "loss_aggregation": "sequence",
                      "entropy_coef": 0.01, "micro_batch_size": 1},
}


def run_all(root: Path) -> dict[str, dict]:
    tokenizer = tiny.tiny_tokenizer()
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    ptx = root / "ptx.txt"
    ptx.write_text("\n".join(tiny.CORPUS) + "\n")
    results = {}
    for name, overrides in RUNS.items():
        values = dict(policy_model=str(policy), reward_model=str(reward), prompts=str(prompts), out=str(root / name),
                      iterations=3, batch_size=4, minibatch_size=2, epochs=2, max_new_tokens=6, reward_norm_samples=8,
                      lora_rank=4, checkpoint_every=3, tensorboard=False, quiet=True, policy_lr=1e-3, value_lr=1e-3,
                      ptx_data=str(ptx), ptx_batch_size=2, sample_every=1, dtype="float32")
        values.update(overrides)
        run_dir = train(build_config(TrainConfig, values))
        history = [{k: v for k, v in json.loads(line).items() if k not in TIME_KEYS}
                   for line in (run_dir / "history.jsonl").read_text().splitlines()]
        last = run_dir / "checkpoints" / "iter_000003"
        weights = {f"{folder.name}/{key}": tensor for folder in sorted(p for p in last.iterdir() if p.is_dir())
                   for f in folder.glob("*.safetensors") for key, tensor in load_file(f).items()}
        table = json.loads((run_dir / "token_table.json").read_text())
        samples = (run_dir / "samples.jsonl").read_text()
        results[name] = {"history": history, "weights": weights, "token_table": table, "samples": samples}
    return results


def main(argv: list[str]) -> int:
    mode, folder = argv[0], Path(argv[1])
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_all(Path(tmp))
    if mode == "save":
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(results, folder / "reference.pt")
        print(f"saved {len(results)} runs to {folder}")
        return 0
    reference = torch.load(folder / "reference.pt", weights_only=False)
    bad = 0
    for name, ref in reference.items():
        if name not in results:
            print(f"{name}: missing")
            bad += 1
            continue
        new = results[name]
        added = sorted({k for row in new["history"] for k in row} - {k for row in ref["history"] for k in row})
        if added:
            print(f"{name}: history keys added since the reference (not compared): {', '.join(added)}")
            new = {**new, "history": [{k: v for k, v in row.items() if k not in added} for row in new["history"]]}
        for key in ("history", "token_table", "samples"):
            if json.dumps(ref[key], sort_keys=True) != json.dumps(new[key], sort_keys=True):
                bad += 1
                print(f"{name}: {key} differs")
                if key == "history":
                    for i, (a, b) in enumerate(zip(ref[key], new[key])):
                        diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
                        if diff:
                            print(f"   iteration {i}: {diff}")
        if set(ref["weights"]) != set(new["weights"]):
            bad += 1
            print(f"{name}: weight names differ")
        else:
            differing = [k for k in ref["weights"] if not torch.equal(ref["weights"][k], new["weights"][k])]
            if differing:
                bad += 1
                print(f"{name}: {len(differing)} of {len(ref['weights'])} weight tensors differ, e.g. {differing[0]}")
        print(f"{name}: {'identical' if not bad else 'checked'} ({len(ref['history'])} iterations, "
              f"{len(ref['weights'])} weight tensors)")
    print("IDENTICAL" if bad == 0 else f"{bad} DIFFERENCES")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
