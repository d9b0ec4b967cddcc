"""Our PPO trainer and TRL's PPO trainer, the same configuration, side by side, alternating (bench/HISTORY.md).

    .venv/bin/python bench/peer_trl.py                      # both models, the default (small) configuration
    .venv/bin/python bench/peer_trl.py --models smollm2 --batch 32 --minibatch 16 --max-new-tokens 48

The parent process (our .venv) prepares the models and prompts, then runs each side as a subprocess: ours in .venv,
TRL's (trl.experimental.ppo, TRL 1.12.0, the last release that ships it) in bench/.venv-trl. Order alternates
(ours, trl, trl, ours, ...) so that load from the other engineers on this machine hits both sides alike. Each
subprocess runs `--warmup` iterations untimed, then `--iterations` timed ones, and prints one RESULT line:
seconds per iteration split into generation / scoring / update, mean reply length, and peak RSS (getrusage).

Models: "smollm2" (SmolLM2-135M-Instruct, offline) and "qwen-shape" (random weights with Qwen2.5-0.5B's exact
shape, built from a config offline and saved once under bench/.cache/, with SmolLM2's tokenizer); "qwen1.5b-shape"
and "smollm2-shape" likewise (Qwen2.5-1.5B's shape; SmolLM2-135M's own config), for bench/scaling.py. The reward model
and the value model's start are the same base with a fresh one-output score head (random; fine for timing).

Precision: ours in `--dtype` (bfloat16, its default on a CPU with AVX512-BF16); TRL in every setting of `--trl`
(fp32; bf16 = its `bf16=True`, mixed precision over fp32 weights; bf16-weights = that and the models loaded in bf16).
Ours is compared with the fastest TRL setting of the run: each side at its best.

Allocator (`--malloc`, the same for both sides): glibc's default, `hugetlb` (transparent huge pages, as `make demo`)
or `tuned` (and large freed blocks returned to the OS: lower peaks, slower SmolLM2 fwd+bwd). `--micro-batch` splits
each minibatch's forward+backward into smaller passes on both sides (TRL's per_device_train_batch_size), which trades
speed for activation memory; `--logprob-chunk-mb` is ours only (TRL forms the whole [B, L, V] logits).

Last run (bench/HISTORY.md, ninth session), 2026-12-04 09:24-09:39 UTC, quiet machine:

    .venv/bin/python bench/peer_trl.py --models qwen-shape --batch 32 --minibatch 16 --micro-batch 8 \
        --max-new-tokens 48 --warmup 0 --iterations 1 --rounds 2 --trl bf16-weights --tuned-malloc

    ours 160.18 s/iteration (159.64, 160.72), TRL 256.16 (247.61, 264.70): ours/TRL 0.63 in time (generation 0.34,
    scoring 0.75, update 0.70), peak RSS 4.22 / 11.47 GB = 0.37
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when a test loads this file by path
from common import PROMPTS, RANDOM_SHAPES, ROOT, peak_gpu_gb, peak_rss_gb, prepare_model  # noqa: E402

OURS_PY = ROOT / ".venv" / "bin" / "python"
TRL_PY = ROOT / "bench" / ".venv-trl" / "bin" / "python"
TRL_VERSION = "1.12.0"
TRL_MODES = ("fp32", "bf16", "bf16-weights")
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# glibc allocator settings, the same for both sides: "hugetlb" is what `make demo` sets (transparent huge pages);
# "tuned" adds returning large freed blocks to the OS (lower peak memory, slower SmolLM2 fwd+bwd: bench/HISTORY.md)
MALLOC_SETTINGS = {"default": {}, "hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
                   "tuned": {"MALLOC_MMAP_THRESHOLD_": "131072", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}


# ------------------------------------------------------------------------------------------------ ours
def ours_settings(args, work: Path) -> dict:
    """Our side's TrainConfig settings (tests/ppo/test_from_trl.py checks that TRL's side, converted, gives them)."""
    return dict(
        policy_model=args.model_path, reward_model=args.model_path, prompts=str(work / "prompts.jsonl"),
        init_score_head=True,  # the policy as reward model, with a random head: a speed comparison
        out=str(work / "run"), iterations=args.warmup + args.iterations, batch_size=args.batch,
        minibatch_size=args.minibatch, micro_batch_size=args.micro_batch, epochs=args.epochs,
        max_new_tokens=args.max_new_tokens,
        score_batch_size=args.batch,  # scoring passes over the whole batch, as TRL's local_rollout_forward_batch_size
        temperature=args.temperature, lora_rank=16, lora_alpha=32.0, beta=0.05, policy_lr=2e-5, value_lr=2e-5,
        old_logprobs=args.old_logprobs, tensorboard=False, quiet=True, seed=args.seed, device=args.device,
        dtype=args.dtype, logprob_chunk_mb=args.logprob_chunk_mb, padding_free=args.padding_free,
        generation_drop_finished=not args.keep_finished)


def ours_trainer(args):
    """Our PPOLoop at the configuration held equal with TRL's (bench/HISTORY.md)."""
    sys.path.insert(0, str(ROOT))
    from ppo_rlhf.config import build_config
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop

    work = Path(tempfile.mkdtemp(prefix="peer_ours_"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    cfg = build_config(TrainConfig, ours_settings(args, work))
    trainer = PPOLoop(cfg)
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0  # TRL has no score normalisation; skip measuring it
    return trainer


def run_ours(args) -> dict:
    """Our side; each timed row also holds the FLOPs of its phases (common.iteration_flops), for an MFU."""
    import torch
    from common import iteration_flops, model_sizes

    trainer = ours_trainer(args)
    rss_loaded = peak_rss_gb()
    sizes = model_sizes(trainer)
    rows = []
    for index in range(args.warmup + args.iterations):
        stats, rollout = trainer.iteration(index)
        if index >= args.warmup:
            rows.append({"gen": stats["time_gen"], "score": stats["time_score"], "update": stats["time_update"],
                         "total": stats["time_total"], "len": stats["len"],
                         "tokens": int(rollout.attention_mask.sum()),
                         "flops": iteration_flops(rollout, trainer.micro_size, args.epochs, args.minibatch, sizes)})
    return {"rows": rows, "rss_loaded_gb": rss_loaded, "peak_rss_gb": peak_rss_gb(), "threads": torch.get_num_threads(),
            "peak_gpu_gb": peak_gpu_gb(), "dtype": str(next(trainer.policy.parameters()).dtype),
            "device": str(trainer.device)}


# ------------------------------------------------------------------------------------------------- TRL
def trl_settings(args, work: str) -> dict:
    """TRL's PPOConfig settings: the same run as `ours_settings` (ppo_rlhf.ppo.from_trl converts them into it)."""
    # TRL's rollout batch = micro-batch x accumulation steps; its minibatch = that / num_mini_batches
    micro = args.micro_batch or args.minibatch
    return dict(
        output_dir=work, report_to=[], save_strategy="no", logging_steps=10**6, num_sample_generations=0,
        use_cpu=args.device == "cpu", bf16=args.trl_mode != "fp32", fp16=False, seed=args.seed, learning_rate=2e-5,
        per_device_train_batch_size=micro, gradient_accumulation_steps=args.batch // micro,
        num_mini_batches=args.batch // args.minibatch, num_ppo_epochs=args.epochs,
        total_episodes=args.batch * (args.warmup + args.iterations),
        local_rollout_forward_batch_size=args.batch, response_length=args.max_new_tokens,
        temperature=args.temperature, stop_token="eos", missing_eos_penalty=1.0, kl_coef=0.05, cliprange=0.2,
        cliprange_value=0.2, vf_coef=1.0, gamma=1.0, lam=0.95, disable_tqdm=True, dataloader_num_workers=0,
    )


def run_trl(args) -> dict:
    import datasets
    import torch
    import trl
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as module

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_path, padding_side="left")
    lora = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_MODULES)
    # TRL's precision settings: "fp32"; "bf16" = bf16=True in its config (accelerate's mixed precision: fp32 weights,
    # forwards under autocast); "bf16-weights" = that and the models loaded in bf16, the usual GPU recipe
    weights = torch.bfloat16 if args.trl_mode == "bf16-weights" else torch.float32
    policy = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=weights)
    reward = AutoModelForSequenceClassification.from_pretrained(args.model_path, num_labels=1, dtype=weights)
    value = AutoModelForSequenceClassification.from_pretrained(args.model_path, num_labels=1, dtype=weights)
    for model in (reward, value):
        model.config.pad_token_id = tokenizer.pad_token_id
    value.load_state_dict(reward.state_dict())  # the value model starts as the reward model
    reward.requires_grad_(False)
    # The value model: LoRA + trained score head, like ours. The LoRA layers are injected in place, so TRL gets the
    # inner sequence classifier (it reads `.model` and `.score` off it).
    value = get_peft_model(value, LoraConfig(task_type=TaskType.SEQ_CLS, modules_to_save=["score"],
                                             **lora)).base_model.model

    chat = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                          return_dict=True)["input_ids"] for p in PROMPTS]
    n = args.batch * (args.warmup + args.iterations)
    train = datasets.Dataset.from_dict({"input_ids": [chat[i % len(chat)] for i in range(max(n, len(chat)))]})
    work = tempfile.mkdtemp(prefix="peer_trl_")
    config = PPOConfig(**trl_settings(args, work))
    trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=None, reward_model=reward,
                         train_dataset=train, eval_dataset=train.select(range(args.batch)), value_model=value,
                         peft_config=LoraConfig(task_type=TaskType.CAUSAL_LM, **lora))

    # Phase marks: batch_generation = generation; from its end to the first forward through the policy+value wrapper
    # = scoring; from there to on_step_end = update.
    marks: list[dict] = []
    state = {"last_end": None}
    original_generation, original_forward = module.batch_generation, module.forward
    eos = tokenizer.eos_token_id

    def timed_generation(model, queries, *rest, **kw):
        start = time.perf_counter()
        out = original_generation(model, queries, *rest, **kw)
        responses = out[0][:, queries.shape[1]:]
        hit = (responses == eos).int()
        lengths = torch.where(hit.any(1), hit.argmax(1) + 1, torch.full_like(hit[:, 0], responses.shape[1]))
        marks.append({"start": state["last_end"] or start, "gen_start": start, "gen_end": time.perf_counter(),
                      "update_start": None, "len": float(lengths.float().mean()),
                      "tokens": int(queries.ne(tokenizer.pad_token_id).sum() + lengths.sum())})
        return out

    def timed_forward(model, query_responses, pad_token_id):
        if marks and marks[-1]["update_start"] is None and torch.is_grad_enabled():
            marks[-1]["update_start"] = time.perf_counter()
        return original_forward(model, query_responses, pad_token_id)

    module.batch_generation, module.forward = timed_generation, timed_forward

    class StepEnd(TrainerCallback):
        def on_step_end(self, *a, **k):
            marks[-1]["end"] = state["last_end"] = time.perf_counter()

    trainer.add_callback(StepEnd())
    rss_loaded = peak_rss_gb()
    trainer.train()
    rows = [{"gen": m["gen_end"] - m["gen_start"], "score": m["update_start"] - m["gen_end"],
             "update": m["end"] - m["update_start"], "total": m["end"] - m["gen_start"], "len": m["len"],
             "tokens": m["tokens"]} for m in marks[args.warmup:]]
    return {"rows": rows, "rss_loaded_gb": rss_loaded, "peak_rss_gb": peak_rss_gb(), "threads": torch.get_num_threads(),
            "trl": trl.__version__, "peak_gpu_gb": peak_gpu_gb()}


# ---------------------------------------------------------------------------------------------- parent
def summarise(result: dict) -> dict:
    rows = result["rows"]
    mean = {k: statistics.mean(r[k] for r in rows) for k in ("gen", "score", "update", "total", "len", "tokens")}
    return {**mean, "peak_rss_gb": result["peak_rss_gb"], "rss_loaded_gb": result["rss_loaded_gb"], "n": len(rows)}


def side_flags(side: str, args: argparse.Namespace) -> list[str]:
    """The flags of one side's process: "trl-<mode>" or "ours-<old log-probs>", ours with the parent's dtype,
    chunking, packing and generation settings (bench/scaling.py runs its sides through this too)."""
    if side.startswith("trl-"):
        return ["--side", "trl", "--trl-mode", side[len("trl-"):]]
    return ["--side", "ours", "--old-logprobs", side[len("ours-"):], "--dtype", args.dtype,
            "--logprob-chunk-mb", str(args.logprob_chunk_mb), *(["--padding-free"] if args.padding_free else []),
            *(["--keep-finished"] if args.keep_finished else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--old-logprobs", default="recompute", help=argparse.SUPPRESS)
    parser.add_argument("--ours", default="generation",
                        help="our variants, comma-separated old_logprobs settings, each run against TRL")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                        help="our trainer's dtype (bfloat16 is its default on a CPU with AVX512-BF16 or AMX)")
    parser.add_argument("--trl", default=",".join(TRL_MODES),
                        help="TRL's precision settings to run, comma-separated: fp32, bf16 (bf16=True: mixed "
                             "precision, fp32 weights), bf16-weights (bf16=True and the models loaded in bf16)")
    parser.add_argument("--trl-mode", default="fp32", choices=TRL_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)  # one side's device (bench/gpu_check.py)
    parser.add_argument("--models", default="smollm2,qwen-shape",
                        help="comma-separated: smollm2, qwen-shape, qwen1.5b-shape, smollm2-shape (random weights)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--minibatch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--logprob-chunk-mb", type=float, default=128.0,
                        help="ours: MB of fp32 logits per log-prob chunk (TRL forms the whole [B, L, V] logits)")
    parser.add_argument("--padding-free", action="store_true",
                        help="ours: scoring and update passes over packed real tokens (padding_free: true)")
    parser.add_argument("--keep-finished", action="store_true",
                        help="ours: step finished replies with pad until the longest ends, HF generate "
                             "(generation_drop_finished: false; the default drops them)")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="rows per forward+backward in the update, both sides (0 = the minibatch)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs per model (order alternates)")
    parser.add_argument("--qwen-batch", type=int, default=0,
                        help="batch for qwen-shape (minibatch = half); 0 = --batch")
    parser.add_argument("--qwen-max-new-tokens", type=int, default=0,
                        help="reply cap for qwen-shape; 0 = --max-new-tokens")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--malloc", choices=list(MALLOC_SETTINGS), default="default",
                        help="glibc allocator settings of both sides: default; hugetlb (transparent huge pages, as "
                             "`make demo`); tuned (and large freed blocks returned to the OS: "
                             "MALLOC_MMAP_THRESHOLD_=131072)")
    parser.add_argument("--tuned-malloc", dest="malloc", action="store_const", const="tuned",
                        help="the same as --malloc tuned")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    if args.side:
        result = run_ours(args) if args.side == "ours" else run_trl(args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    known = ("smollm2", *RANDOM_SHAPES)
    unknown_models = [name for name in args.models.split(",") if name not in known]
    if unknown_models:
        parser.error(f"--models: unknown model(s) {', '.join(unknown_models)}; choose from {', '.join(known)}")
    # every configuration's minibatch: --qwen-batch gives the Qwen shape its own (half its batch)
    minibatches = {args.minibatch} | ({args.qwen_batch // 2} if args.qwen_batch else set())
    if args.micro_batch < 0 or any(args.micro_batch and m % args.micro_batch for m in minibatches):
        parser.error(f"--micro-batch must be 0 (the minibatch) or a divisor of every minibatch "
                     f"({', '.join(map(str, sorted(minibatches)))}), got {args.micro_batch}")
    if args.logprob_chunk_mb < 0:
        parser.error(f"--logprob-chunk-mb must be >= 0 (0 = no limit), got {args.logprob_chunk_mb}")
    unknown = [mode for mode in args.trl.split(",") if mode not in TRL_MODES]
    if unknown:
        parser.error(f"--trl: unknown setting(s) {', '.join(unknown)}; choose from {', '.join(TRL_MODES)}")
    if not TRL_PY.exists():
        raise SystemExit(f"{TRL_PY} missing: see bench/HISTORY.md to create the TRL environment")
    # PASSIVE: OpenMP threads sleep instead of spinning while they wait. On this shared 2-core machine the default
    # (spinning) made a 2-thread forward+backward 3-4x slower whenever other processes held the cores.
    env = {"OMP_WAIT_POLICY": "PASSIVE", "TRL_EXPERIMENTAL_SILENCE": "1", **os.environ, "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    for key in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):  # only the chosen settings, not the caller's
        env.pop(key, None)
    env.update(MALLOC_SETTINGS[args.malloc])
    print(f"environment: OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}, torch threads = default ({os.cpu_count()} cores), "
          f"allocator {args.malloc} {MALLOC_SETTINGS[args.malloc]}")
    results = {}
    for name in args.models.split(","):
        path = prepare_model(name)
        batch = args.qwen_batch if name == "qwen-shape" and args.qwen_batch else args.batch
        minibatch = batch // 2 if name == "qwen-shape" and args.qwen_batch else args.minibatch
        cap = args.qwen_max_new_tokens if name == "qwen-shape" and args.qwen_max_new_tokens else args.max_new_tokens
        common = ["--model-path", path, "--batch", str(batch), "--minibatch", str(minibatch), "--epochs",
                  str(args.epochs), "--micro-batch", str(args.micro_batch), "--max-new-tokens", str(cap),
                  "--temperature", str(args.temperature),
                  "--warmup", str(args.warmup), "--iterations", str(args.iterations), "--seed", str(args.seed)]
        print(f"== {name}: batch {batch}, minibatch {minibatch}, micro-batch {args.micro_batch or minibatch}, "
              f"epochs {args.epochs}, reply cap {cap}, "
              f"temperature {args.temperature}, LoRA r16/alpha32 on 7 linears (policy and value), ours in "
              f"{args.dtype}, TRL in {args.trl}, "
              f"{args.warmup} warm-up + {args.iterations} timed iterations per run, {args.rounds} round(s)", flush=True)
        ours_sides = [f"ours-{variant}" for variant in args.ours.split(",")]
        trl_sides = [f"trl-{mode}" for mode in args.trl.split(",")]
        sides = ours_sides + trl_sides
        runs = {side: [] for side in sides}
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                python = TRL_PY if side.startswith("trl-") else OURS_PY
                started = time.perf_counter()
                proc = subprocess.run([str(python), __file__, *side_flags(side, args), *common], capture_output=True,
                                      text=True, env=env, cwd=ROOT)
                line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
                if proc.returncode != 0 or line is None:
                    print(proc.stdout[-3000:], proc.stderr[-5000:], file=sys.stderr)
                    raise SystemExit(f"{side} failed on {name} (exit {proc.returncode})")
                result = json.loads(line[len("RESULT "):])
                runs[side].append(result)
                s = summarise(result)
                print(f"  {side:15s} round {r}: {s['total']:7.2f} s/it (gen {s['gen']:.2f}, score {s['score']:.2f}, "
                      f"update {s['update']:.2f}), reply len {s['len']:.1f}, peak RSS {s['peak_rss_gb']:.2f} GB "
                      f"(after loading {s['rss_loaded_gb']:.2f}), wall {time.perf_counter() - started:.0f} s",
                      flush=True)
        merged = {side: summarise({"rows": [row for res in rs for row in res["rows"]],
                                   "peak_rss_gb": max(res["peak_rss_gb"] for res in rs),
                                   "rss_loaded_gb": max(res["rss_loaded_gb"] for res in rs)})
                   for side, rs in runs.items()}
        results[name] = {"config": {"batch": batch, "minibatch": minibatch, "epochs": args.epochs,
                                    "max_new_tokens": cap,
                                    "temperature": args.temperature}, **merged}
        best_trl = min(trl_sides, key=lambda side: merged[side]["total"])  # TRL at its best setting here
        results[name]["best_trl"] = best_trl
        t = merged[best_trl]
        for side in ours_sides:
            o = merged[side]
            print(f"  {'phase':10s} {side:>15s} {best_trl:>15s} {'ratio':>9s}")
            for key, unit in (("gen", "s"), ("score", "s"), ("update", "s"), ("total", "s"), ("peak_rss_gb", "GB"),
                              ("len", "tok")):
                print(f"  {key:10s} {o[key]:14.2f}{unit[0]} {t[key]:14.2f}{unit[0]} {o[key] / t[key]:9.2f}")
            print(f"  per reply token: {side} {o['total'] / o['len']:.3f} s, TRL {t['total'] / t['len']:.3f} s "
                  f"(ratio {(o['total'] / o['len']) / (t['total'] / t['len']):.2f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
