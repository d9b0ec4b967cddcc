"""Time to a trained model: our PPO (and our GRPO) against TRL's maintained GRPOTrainer on add-tiny, side by side.
Held-out exact match against wall-clock seconds and sampled reply tokens, with 95% intervals.

    .venv/bin/python bench/peer_grpo.py --dry-run --out /tmp/peer_grpo     # tiny random models, one step a side
    .venv/bin/python bench/peer_grpo.py --out runs/peer_grpo               # every side, 1800 s each (quiet machine)
    .venv/bin/python bench/peer_grpo.py --out runs/peer_grpo_smoke --sides ours-ppo,trl-default --max-steps 1 \\
        --heldout 20                                                       # the real path, a few minutes

Each side trains in its own process, one after another (peak memory is the process's own): ours in the project's
.venv, TRL's in bench/.venv-grpo (TRL_VERSION, never a runtime dependency; set-up in bench/HISTORY.md). Both read the
same problems file (OUT/data/train.jsonl, all of add-tiny's training problems) and start from the same model folder
(SmolLM2-135M-Instruct, offline). TRL's driver adds the repository to its path and imports the reward functions
themselves (`ppo_rlhf.tasks.arithmetic.exact_match` and `answer_format`, weights 1 and 0.1 as the preset's): that
module is torch-free and needs only the standard library and PyYAML, so TRL's venv installs nothing of ours, and no
copy of the checker can drift from the one our side and the evaluator use.

Clock: a side's seconds run from just before its trainer is built (model loading and, ours, the reward normalisation
included) and stop at each checkpoint mark; the bench's own checkpoint writes are left out (the same for both
sides). A side stops at the first step whose end is past `--budget-s` (or after `--max-steps`). Checkpoints: at the
first step past every `--checkpoint-every-s` seconds and at the stop, written by this script for both sides into
OUT/eval/SIDE/checkpoints/iter_N/ (the policy: our LoRA adapter, TRL's adapter or full model folder; state.pt: the
step, seconds, reply tokens and peak RSS so far). OUT/eval/SIDE/config.yaml names the start model and the one
evaluation sampler every side shares (temperature 0.7, reply cap 64, the evaluation dtype), so one
`ppo-rlhf task evaluate OUT/eval/*` call scores every checkpoint of every side on the same `--heldout` problems with
the same sampling seed, paired against the start model (its 95% prompt-level bootstrap intervals). Sampled tokens:
the reply tokens each side generated for training (ours: the history's len x batch; TRL: the completion ids its
reward functions receive); the 48 replies of our reward normalisation are sampled before iteration 0 and counted in
time only. Peak RSS: the side process's ru_maxrss.

Precision, each side at its best on this CPU (AMX/AVX512-BF16): ours `dtype: auto` (bf16 frozen weights; LoRA,
heads and optimiser fp32); TRL `bf16=True` (its default: accelerate's autocast over fp32 weights). Not TRL with bf16
weights (peer_trl.py's fastest): its default learning rate of 1e-6 moves a weight by less than bf16's resolution,
so a full fine-tune in bf16 weights would not learn. --trl-precision changes it.

Sides (SIDES). TRL's GRPOConfig defaults in 1.16.0, read from its source (trl/trainer/grpo_config.py): num_generations
8, per_device_train_batch_size 8 (so one prompt x 8 replies per step), gradient_accumulation_steps 1,
steps_per_generation 1, num_iterations 1, loss_type "dapo", beta 0.0, epsilon 0.2, scale_rewards "group",
multi_objective_aggregation "sum_then_normalize", learning_rate 1e-6 (linear decay over 3 epochs, no warm-up),
temperature 1.0, top_p 1.0, max_completion_length 512, gradient_checkpointing True, bf16 True, full fine-tuning
(no peft_config), max_grad_norm 1.0. Set for every TRL side: use_cpu, the seed, reward_weights [1, 0.1], logging and
saving by this script only.

    ours-ppo        configs/smollm2_add_tiny.yaml as it is (the documented preset)
    ours-ppo-warm0  the preset with critic_warmup_iterations 0 (ours' tuning, below)
    ours-grpo       ours at trl-lora's settings (the equal-settings comparison): advantage_estimator grpo,
                    group_size 8, batch 8, minibatch 8, 1 epoch, beta 0, LoRA r16/alpha 32 on 7 linears, lr 1e-4,
                    temperature 0.7, reply cap 64, grpo_eps 1e-4 (TRL's), no penalty for unfinished replies
                    (eos_rule false: TRL has none), reward normalisation on 8 replies (GRPO does not use it)
    trl-default     GRPOConfig() as documented
    trl-tuned       learning_rate 1e-5, max_completion_length 64, temperature 0.7, gradient_checkpointing False
    trl-lora        trl-tuned with LoRA r16/alpha 32 on the 7 linear layers (ours) and learning_rate 1e-4

--screening OUT/screening.json (bench/peer_grpo_screen.py, the rematch's screening) puts the settings it chose over
the screened sides' own (ours-ppo, trl-lora), and puts trl-lora's chosen cell on ours-grpo (its learning rate; its
replies per step as ours' batch): the equal-settings side follows TRL's choice. Each side's side.json keeps them
("cell_settings").

Tuning budget, written here before any run (the same for both trainers): each trainer's documented defaults plus at
most two more settings, every one fixed above from documentation or earlier runs of this repository, none chosen
after seeing a result of this benchmark; each run once (seed 1) for --budget-s seconds; a trainer's result is the
best final held-out accuracy among its runs. TRL's two: trl-tuned (a 10x rate for a 135M model trained for minutes,
the reply cap and temperature of our preset since add-tiny's answers take ~15 tokens, no gradient checkpointing as
memory is ample) and trl-lora (our preset's LoRA and rate). Ours uses one of its two: ours-ppo-warm0 (critic warm-up
0 reached 69.5% against 57.5% with the preset's 3 in `ppo-rlhf compare`, bench/HISTORY.md).

The statistics, one function for both sides (`symmetric_statistics`): L is the plateau of TRL's best side (the mean
of its checkpoints from half the budget on; "best" by that same plateau); `time_ratio`, the seconds at which our side's
3-checkpoint moving average first reaches L over the seconds at which TRL's does (and, beside it, the same with the
first single checkpoint); `plateau_diff`, our plateau minus TRL's, paired over problems with its 95% interval. And
ours-grpo against trl-lora at equal settings: seconds per step and per reply token.

Last run (bench/HISTORY.md, 2026-12-07 05:58-07:12 and 11:05-12:23 UTC, 2-core AMX + AVX512-BF16 Xeon, quiet;
--omp-wait-policy unset; sides trl-lora, trl-tuned, ours-ppo, ours-grpo, 1800 s each, checkpoints every 150 s, 200
held-out problems; one seed a side), read by these rules afterwards (the correction of 2026-12-07 in HISTORY.md):
trl-lora's plateau 70.7%; ours-ppo's 81.6% (+10.9 points); the moving average reached 70.7% at 759 s (ours-ppo)
and 1,203 s (trl-lora), 0.63x; the first single checkpoint at it at 759 s and 902 s, 0.84x; and at trl-lora's final
67.0%, the level the withdrawn text used, at 610 s and 452 s, 1.35x: by that rule ours was slower. GRPO at equal
settings 0.64x TRL's seconds per step (TRL's weights fp32 under bf16 autocast, ours bf16). --dry-run is
tests/bench/test_peer_grpo.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS_PY = ROOT / ".venv" / "bin" / "python"
GRPO_PY = ROOT / "bench" / ".venv-grpo" / "bin" / "python"
TRL_VERSION = "1.16.0"
PRESET = ROOT / "configs" / "smollm2_add_tiny.yaml"
LEVEL = "add-tiny"
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
REWARD_WEIGHTS = [1.0, 0.1]  # exact_match, answer_format: the preset's
TRL_TUNED = {"learning_rate": 1e-5, "max_completion_length": 64, "temperature": 0.7, "gradient_checkpointing": False}
SIDES = {
    "ours-ppo": {"trainer": "ours", "settings": {}},
    "ours-ppo-warm0": {"trainer": "ours", "settings": {"critic_warmup_iterations": 0}},
    "ours-grpo": {"trainer": "ours", "settings": {
        "advantage_estimator": "grpo", "group_size": 8, "batch_size": 8, "minibatch_size": 8, "epochs": 1,
        "beta": 0.0, "lora_rank": 16, "lora_alpha": 32.0, "policy_lr": 1e-4, "temperature": 0.7,
        "max_new_tokens": 64, "grpo_eps": 1e-4, "eos_rule": False, "critic_warmup_iterations": 0,
        "reward_norm_samples": 8}},
    "trl-default": {"trainer": "trl", "settings": {}},
    "trl-tuned": {"trainer": "trl", "settings": TRL_TUNED},
    "trl-lora": {"trainer": "trl", "settings": {**TRL_TUNED, "learning_rate": 1e-4}, "lora": True},
}
# the dry run: tiny random models, one step a side, small batches and replies (fp32: tiny models gain nothing in bf16)
DRY_OURS = {"batch_size": 4, "minibatch_size": 4, "max_new_tokens": 8, "reward_norm_samples": 4, "dtype": "float32",
            "critic_warmup_iterations": 0}  # (one step: a policy update, not a critic warm-up)
DRY_TRL = {"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 8}
# one evaluation sampler for every side: the preset's temperature and reply cap
EVAL_SAMPLER = {"temperature": 0.7, "max_new_tokens": 64, "top_p": 1.0}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class Clock:
    """A side's training seconds (from just before its trainer is built, less the bench's checkpoint writes), its
    sampled reply tokens, and when a checkpoint is due or the budget is spent."""

    def __init__(self, budget_s: float, every_s: float, max_steps: int):
        self.start, self.excluded, self.tokens, self.steps = time.perf_counter(), 0.0, 0, 0
        self.budget_s, self.every_s, self.max_steps = budget_s, every_s, max_steps
        self.next_mark, self.setup_s = every_s, None
        self.records: list[dict] = []

    def seconds(self) -> float:
        return time.perf_counter() - self.start - self.excluded

    def train_begins(self) -> None:
        self.setup_s = self.seconds()

    def step_ends(self) -> tuple[bool, bool]:
        """(a checkpoint is due, the side stops) after one more finished step."""
        self.steps += 1
        now = self.seconds()
        stop = now >= self.budget_s or (self.max_steps > 0 and self.steps >= self.max_steps)
        due = stop or now >= self.next_mark
        while self.next_mark <= now:
            self.next_mark += self.every_s
        return due, stop

    def checkpoint(self, folder: Path, save) -> None:
        """`save(folder / "policy")`, then state.pt (written last: the folder is complete for the evaluator), the
        time taken left out of the side's seconds."""
        import torch

        seconds, started = self.seconds(), time.perf_counter()
        save(folder / "policy")
        record = {"iteration": self.steps, "seconds": seconds, "tokens": self.tokens, "peak_rss_gb": peak_rss_gb()}
        torch.save(record, folder / "state.pt")
        self.records.append(record)
        self.excluded += time.perf_counter() - started

    def summary(self) -> dict:
        return {"steps": self.steps, "seconds": self.seconds(), "setup_s": self.setup_s, "tokens": self.tokens,
                "peak_rss_gb": peak_rss_gb(), "checkpoints": self.records}


def checkpoint_folder(eval_dir: Path, step: int) -> Path:
    return eval_dir / "checkpoints" / f"iter_{step:06d}"  # the layout `ppo-rlhf task evaluate` reads


# ------------------------------------------------------------------------------------------------ ours
def run_ours(args) -> dict:
    sys.path.insert(0, str(ROOT))
    import importlib

    import torch
    import transformers

    from ppo_rlhf import PPOConfig, PPOTrainer
    from ppo_rlhf.config import read_yaml

    importlib.import_module("ppo_rlhf.ppo.trainer")  # its imports (peft, ...) before the clock, as TRL's side does
    clock = Clock(args.budget_s, args.checkpoint_every_s, args.max_steps)
    settings = {**read_yaml(PRESET), **SIDES[args.side]["settings"], **json.loads(args.settings),
                **(DRY_OURS if args.dry_run else {})}
    if args.dry_run and settings.get("group_size", 1) > 1:
        settings["group_size"] = 2
    settings.update(policy_model=args.model, prompts=args.data, out=args.run, overwrite=True, quiet=True,
                    report_to=[], log_completions_every=0, seed=args.seed,
                    # the clock stops the run (the rate is constant: the iteration count changes nothing else); no
                    # checkpoints of its own but the stop's: this script writes the evaluated ones
                    iterations=10**6, checkpoint_every=10**6)
    eval_dir = Path(args.eval_dir)

    class Marks:
        def on_train_begin(self, trainer):
            clock.train_begins()

        def on_iteration_end(self, trainer, stats):
            clock.tokens += round(stats["len"] * trainer.config.batch_size)
            due, stop = clock.step_ends()
            if due:
                clock.checkpoint(checkpoint_folder(eval_dir, clock.steps), trainer.save_model)
            return stop

    trainer = PPOTrainer(PPOConfig(**settings), callbacks=[Marks()])
    trainer.train()
    return {**clock.summary(), "settings": settings, "threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


# ------------------------------------------------------------------------------------------------- TRL
def trl_settings(args) -> dict:
    """GRPOConfig's arguments of a TRL side: its documented defaults, changed only by the side's settings (and a
    screening cell's, bench/peer_grpo_screen.py)."""
    return {"output_dir": args.run, "use_cpu": True, "bf16": args.trl_precision != "fp32", "seed": args.seed,
            "report_to": [], "save_strategy": "no", "logging_steps": 1, "disable_tqdm": True,
            "reward_weights": REWARD_WEIGHTS, **({"max_steps": args.max_steps} if args.max_steps else {}),
            **SIDES[args.side]["settings"], **json.loads(args.settings), **(DRY_TRL if args.dry_run else {})}


def run_trl(args) -> dict:
    # The reward functions themselves, not a copy: ppo_rlhf.tasks.arithmetic is torch-free (stdlib + PyYAML)
    sys.path.insert(0, str(ROOT))
    import datasets
    import torch
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ppo_rlhf.tasks.arithmetic import answer_format, exact_match

    clock = Clock(args.budget_s, args.checkpoint_every_s, args.max_steps)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    # conversational prompts: TRL applies the chat template, as ours does to a string prompt (one user turn)
    dataset = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                                          for r in rows])

    def counted_exact_match(prompts, completions, completion_ids, **columns):
        clock.tokens += sum(len(ids) for ids in completion_ids)  # called once per generated batch
        return exact_match(prompts, completions, completion_ids, **columns)

    counted_exact_match.__name__ = "exact_match"  # TRL logs each reward under its function's name
    settings = trl_settings(args)
    weights = torch.bfloat16 if args.trl_precision == "bf16-weights" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=weights)
    lora = SIDES[args.side].get("lora", False)
    trainer = GRPOTrainer(model=model, reward_funcs=[counted_exact_match, answer_format], args=GRPOConfig(**settings),
                          train_dataset=dataset, processing_class=tokenizer,
                          peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA) if lora else None)
    eval_dir = Path(args.eval_dir)

    def save(folder: Path) -> None:
        # an adapter folder (LoRA) or a plain transformers folder (full fine-tune): both read by `task evaluate`
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(folder)

    class Marks(TrainerCallback):
        def on_train_begin(self, *_, **__):
            clock.train_begins()

        def on_step_end(self, _args, state, control, **__):
            due, stop = clock.step_ends()
            if due:
                clock.checkpoint(checkpoint_folder(eval_dir, clock.steps), save)
            control.should_training_stop = control.should_training_stop or stop

    trainer.add_callback(Marks())
    trainer.train()
    if clock.steps not in [r["iteration"] for r in clock.records]:  # TRL's own max_steps ended it first
        clock.checkpoint(checkpoint_folder(eval_dir, clock.steps), save)
    return {**clock.summary(), "settings": {**settings, "lora": LORA if lora else None,
                                            "precision": args.trl_precision},
            "threads": torch.get_num_threads(), "versions": {
                "trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__}}


# ---------------------------------------------------------------------------------------------- parent
def prepare(args, out: Path) -> tuple[str, Path, str]:
    """(the start model's folder, the training problems file, the evaluation dtype) in our venv."""
    model = start_model(args, out)  # (it puts the repository on sys.path)
    from ppo_rlhf.tasks.arithmetic import write_task

    train, _ = write_task(LEVEL, out / "data", overwrite=True)
    return model, train, "float32" if args.dry_run else args.eval_dtype


def start_model(args, out: Path) -> str:
    """The start model's folder: SmolLM2 offline, or (--dry-run) a tiny random model saved under OUT."""
    sys.path.insert(0, str(ROOT))
    from ppo_rlhf.models.loading import resolve_model_path

    if not args.dry_run:
        return resolve_model_path("smollm2")
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny

    folder = out / "tiny-policy"
    if not (folder / "config.json").is_file():
        tokenizer = tiny.tiny_tokenizer()
        tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, folder)
    return str(folder)


def run_side(side: str, args, out: Path, model: str, data: Path, dtype: str, name: str = "",
             settings: dict | None = None) -> dict:
    """One side in its own process; its result is OUT/eval/NAME/side.json (kept: a finished side is not run again).
    `name`: its folders' name (default: the side's); `settings`: over the side's own (a screening cell's,
    bench/peer_grpo_screen.py)."""
    name, settings = name or side, settings or {}
    eval_dir = out / "eval" / name
    result_file = eval_dir / "side.json"
    if result_file.is_file():
        done = json.loads(result_file.read_text())
        if done.get("omp_wait_policy", "passive") != args.omp_wait_policy:  # runs before the option were passive
            raise SystemExit(f"{name} was run with --omp-wait-policy {done.get('omp_wait_policy', 'passive')} in "
                             f"{out}; use another --out to run it {args.omp_wait_policy}")
        if done.get("cell_settings", {}) != settings:
            raise SystemExit(f"{name} was run with the settings {done.get('cell_settings', {})} in {out}, not "
                             f"{settings}; use another --out")
        print(f"  {name}: done before, {result_file}")
        return done
    shutil.rmtree(eval_dir, ignore_errors=True)  # an unfinished earlier try
    (eval_dir / "checkpoints").mkdir(parents=True)
    # what `ppo-rlhf task evaluate` reads: the start model and the evaluation sampler, the same for every side
    sampler = {"policy_model": model, **EVAL_SAMPLER, "dtype": dtype,
               **({"max_new_tokens": DRY_OURS["max_new_tokens"]} if args.dry_run else {})}
    (eval_dir / "config.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in sampler.items()))
    python = GRPO_PY if SIDES[side]["trainer"] == "trl" else OURS_PY
    command = [str(python), __file__, "--side", side, "--model", model, "--data", str(data),
               "--run", str(out / "runs" / name), "--eval-dir", str(eval_dir), "--budget-s", str(args.budget_s),
               "--checkpoint-every-s", str(args.checkpoint_every_s), "--max-steps", str(args.max_steps),
               "--seed", str(args.seed), "--trl-precision", args.trl_precision, "--settings", json.dumps(settings),
               *(["--dry-run"] if args.dry_run else [])]
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, text=True,
                              env=side_env(args.omp_wait_policy), cwd=ROOT)
    lines = log.read_text().splitlines()
    line = next((line for line in reversed(lines) if line.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        print("\n".join(lines[-40:]), file=sys.stderr)
        raise SystemExit(f"{name} failed (exit {proc.returncode}); its log: {log}")
    result = {"side": side, "trainer": SIDES[side]["trainer"], "omp_wait_policy": args.omp_wait_policy,
              **({"cell_settings": settings} if settings else {}), **json.loads(line[len("RESULT "):])}
    result_file.write_text(json.dumps(result, indent=1))
    print(f"  {name}: {result['steps']} steps, {result['seconds']:.0f} s, {result['tokens']} reply tokens, peak RSS "
          f"{result['peak_rss_gb']:.2f} GB, {len(result['checkpoints'])} checkpoints "
          f"(process {time.perf_counter() - started:.0f} s)", flush=True)
    return result


def side_env(wait_policy: str) -> dict:
    """The environment of both sides and the evaluation. `wait_policy` "passive": OMP_WAIT_POLICY=PASSIVE, OpenMP's
    idle threads sleep at once (bench/peer_trl.py: on a shared 2-core machine spinning made passes 3-4x slower);
    "unset": libgomp's default (a waiting thread spins a while first), what a user's `ppo-rlhf train` or TRL script
    runs with: on a quiet machine decoding ran 1.8x faster so (bench/decode_overhead.py)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                **({"OMP_WAIT_POLICY": "PASSIVE"} if wait_policy == "passive" else {})})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def evaluate(args, out: Path, sides: list[str], folder_name: str = "evaluation", split: str = "heldout",
             problems: int | None = None, replies: int | None = None) -> dict:
    """Every checkpoint of every side and the start model, one `ppo-rlhf task evaluate` call (same problems, seed):
    --heldout held-out problems, --eval-replies each; or `split` "train": the first `problems` training problems
    (bench/peer_grpo_screen.py's validation slice), `replies` each. Written to OUT/FOLDER_NAME/task_eval.json."""
    folder = out / folder_name
    command = [str(OURS_PY), "-m", "ppo_rlhf", "task", "evaluate", *(str(out / "eval" / s) for s in sides),
               "--level", LEVEL, "--split", split, "--heldout", str(args.heldout if problems is None else problems),
               "--out", str(folder), "--checkpoints", "all", "--batch-size", str(args.eval_batch),
               "--replies-per-prompt", str(args.eval_replies if replies is None else replies)]
    print("  " + " ".join(command[1:]), flush=True)
    proc = subprocess.run(command, capture_output=True, text=True, env=side_env(args.omp_wait_policy), cwd=ROOT)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-5000:], file=sys.stderr)
        raise SystemExit(f"the evaluation failed (exit {proc.returncode})")
    return json.loads((folder / "task_eval.json").read_text())


PLATEAU_FROM = 0.5  # a side's plateau: the mean of its checkpoints from this share of the budget's seconds on
WINDOW = 3  # the moving average whose first crossing times a side (1: its first checkpoint at the level)


def plateau_rows(rows: list[dict], budget_s: float) -> list[dict]:
    """A side's checkpoints in the second half of the budget (seconds >= PLATEAU_FROM x budget_s), or of its run when
    it stopped before the budget (--max-steps: the dry run)."""
    start = PLATEAU_FROM * min(budget_s, rows[-1]["seconds"])
    return [row for row in rows if row["seconds"] >= start]


def plateau(rows: list[dict], budget_s: float) -> float:
    """The mean held-out accuracy of a side's second-half checkpoints: its level once learning has flattened, less
    noisy than any one checkpoint (each scores one sample of 200 replies)."""
    return sum(row["accuracy"]["mean"] for row in plateau_rows(rows, budget_s)) / len(plateau_rows(rows, budget_s))


def first_at_level(rows: list[dict], level: float, window: int = WINDOW) -> dict | None:
    """The first checkpoint at which the mean accuracy of the last `window` checkpoints (itself included) is at or
    above `level`: its step, seconds and tokens; None when no window gets there. One rule for every side."""
    for i in range(window - 1, len(rows)):
        recent = [row["accuracy"]["mean"] for row in rows[i - window + 1:i + 1]]
        if sum(recent) / window >= level - 1e-9:  # (means of the same scores summed in another order)
            return {"iteration": rows[i]["iteration"], "seconds": rows[i]["seconds"], "tokens": rows[i]["tokens"]}
    return None


def plateau_cells(records: list[dict], labels: list[str]) -> dict[tuple[int, int], float]:
    """Per held-out reply (problem, reply index), the mean correctness over the checkpoints `labels`."""
    wanted = set(labels)
    cells: dict[tuple[int, int], float] = {}
    for r in records:
        if r["model"] in wanted:
            key = (r["prompt_index"], r["reply_index"])
            cells[key] = cells.get(key, 0.0) + float(r["correct"]) / len(wanted)
    return cells


def plateau_difference(records: list[dict], ours: list[dict], theirs: list[dict], budget_s: float
                       ) -> dict[str, float]:
    """Our plateau minus theirs with its 95% interval, problems resampled: per held-out reply, each side's mean
    correctness over its plateau checkpoints, paired (study.stats.paired_bootstrap)."""
    from ppo_rlhf.study.stats import paired_bootstrap

    a, b = (plateau_cells(records, [row["label"] for row in plateau_rows(rows, budget_s)]) for rows in (ours, theirs))
    keys = sorted(b)
    mean, lo, hi = paired_bootstrap([a[k] - b[k] for k in keys], [k[0] for k in keys])
    return {"mean": mean, "lo": lo, "hi": hi}


def symmetric_statistics(ours: list[dict], theirs: list[dict], records: list[dict], budget_s: float) -> dict:
    """The comparison's statistics, each computed by one function for both sides: the level L is their plateau;
    `time_ratio` is the seconds at which our WINDOW-checkpoint moving average first reaches L over the seconds at
    which theirs does (and `first_checkpoint_ratio` the same with a window of one); `plateau_diff` is our plateau
    minus theirs, paired over problems."""
    level = plateau(theirs, budget_s)
    result: dict = {"level": level, "plateau_ours": plateau(ours, budget_s), "plateau_theirs": level,
                    "plateau_diff": plateau_difference(records, ours, theirs, budget_s)}
    for name, window in (("time", WINDOW), ("first_checkpoint", 1)):
        mine, their = first_at_level(ours, level, window), first_at_level(theirs, level, window)
        result[f"{name}_ours"], result[f"{name}_theirs"] = mine, their
        result[f"{name}_ratio"] = (mine["seconds"] / their["seconds"] if mine and their else None)
        result[f"{name}_token_ratio"] = (mine["tokens"] / max(their["tokens"], 1) if mine and their else None)
    return result


def print_statistics(side: str, other: str, stats: dict) -> None:
    def when(hit: dict | None) -> str:
        return "never" if hit is None else f"{hit['seconds']:.0f} s ({hit['tokens']} tokens)"

    print(f"  {side}: plateau {stats['plateau_ours']:.1%} against {other}'s {stats['plateau_theirs']:.1%}: "
          f"{interval_points(stats['plateau_diff'])} points (paired over problems, 95%)")
    for name, what in (("time", f"{WINDOW}-checkpoint moving average"), ("first_checkpoint", "first checkpoint")):
        ratio = stats[f"{name}_ratio"]
        print(f"    {what} at {other}'s plateau {stats['level']:.1%}: {side} {when(stats[f'{name}_ours'])}, "
              f"{other} {when(stats[f'{name}_theirs'])}"
              + ("" if ratio is None else f": {ratio:.2f}x {other}'s seconds, "
                 f"{stats[f'{name}_token_ratio']:.2f}x its tokens"))


def interval_points(c: dict) -> str:
    return f"{100 * c['mean']:+.1f} [{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]"


def plot(curves: dict[str, list[dict]], start: dict, goal: dict, path: Path) -> None:
    """Held-out exact match against training seconds and against sampled reply tokens, one line per side with its
    95% band; the plateau of TRL's best side dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for axis, key, name in ((axes[0], "seconds", "training seconds"), (axes[1], "tokens", "sampled reply tokens")):
        for side, rows in curves.items():
            xs = [0] + [row[key] for row in rows]
            accuracy = [start] + [row["accuracy"] for row in rows]
            style = "-" if side.startswith("ours") else "--"
            line, = axis.plot(xs, [100 * a["mean"] for a in accuracy], style, marker="o", ms=3, label=side)
            axis.fill_between(xs, [100 * a["lo"] for a in accuracy], [100 * a["hi"] for a in accuracy],
                              color=line.get_color(), alpha=0.12)
        if goal:
            axis.axhline(100 * goal["level"], color="grey", ls="--", lw=0.8)
        axis.set_xlabel(name)
        axis.grid(alpha=0.3)
    if goal:
        axes[1].text(0.98, 100 * goal["level"], f"{goal['trl_best']}'s plateau", fontsize=8, color="grey",
                     va="top", ha="right", transform=axes[1].get_yaxis_transform())
    axes[0].set_ylabel("held-out exact match, % (95% interval)")
    axes[0].legend(fontsize=8, loc="lower right")
    figure.suptitle("add-tiny: time to a trained model, ours and TRL's GRPOTrainer (bench/peer_grpo.py)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(results: dict[str, dict], evaluation: dict, budget_s: float) -> dict:
    """Per checkpoint: seconds, reply tokens, exact match [95%], its change from the start model [95%, paired], peak
    RSS; then each of our sides against TRL's best by `symmetric_statistics`, and GRPO at equal settings per step
    and per reply token."""
    by_label = {s["model"]: s for s in evaluation["summary"]}
    start = evaluation["summary"][0]
    curves = {}
    print(f"\n{'side':15s} {'step':>5s} {'seconds':>8s} {'tokens':>8s}  {'exact match [95%]':22s} "
          f"{'change, points [95%]':22s} {'peak RSS':>8s}")
    acc = start["accuracy"]
    print(f"{'start':15s} {0:5d} {0:8.0f} {0:8d}  {acc['mean']:6.1%} [{acc['lo']:.1%}, {acc['hi']:.1%}]")
    for side, result in results.items():
        rows = []
        for record in result["checkpoints"]:
            summary = by_label[f"{side} step {record['iteration']}"]
            rows.append({**record, "label": summary["model"], "accuracy": summary["accuracy"],
                         "change": summary["accuracy_change"], "kl": summary["kl"], "finished": summary["finished"],
                         "reply_tokens": summary["tokens"]})
            acc = summary["accuracy"]
            print(f"{side:15s} {record['iteration']:5d} {record['seconds']:8.0f} {record['tokens']:8d}  "
                  f"{acc['mean']:6.1%} [{acc['lo']:.1%}, {acc['hi']:.1%}]  "
                  f"{interval_points(summary['accuracy_change']):22s} {record['peak_rss_gb']:6.2f} GB")
        curves[side] = rows
    goal: dict = {}
    trl_sides = [s for s in results if results[s]["trainer"] == "trl"]
    if trl_sides:
        best = max(trl_sides, key=lambda s: plateau(curves[s], budget_s))  # by the rule applied to ours
        level = plateau(curves[best], budget_s)
        print(f"\nTRL's best side by its plateau (mean of its checkpoints from {PLATEAU_FROM * budget_s:.0f} s on): "
              f"{best}, {level:.1%}")
        if level <= start["accuracy"]["mean"]:  # then every checkpoint "reaches" it: no evidence either way
            print(f"  (not above the start model's {start['accuracy']['mean']:.1%}: the ratios below say nothing)")
        goal = {"trl_best": best, "level": level, "ours": {}}
        for side in (s for s in results if results[s]["trainer"] == "ours"):
            goal["ours"][side] = symmetric_statistics(curves[side], curves[best], evaluation["records"], budget_s)
            print_statistics(side, best, goal["ours"][side])
    if "ours-grpo" in results and "trl-lora" in results:
        per = {}
        for side in ("ours-grpo", "trl-lora"):
            r = results[side]
            train_s = r["seconds"] - r["setup_s"]
            per[side] = {"s_per_step": train_s / r["steps"], "s_per_token": train_s / max(r["tokens"], 1),
                         "final": curves[side][-1]["accuracy"]["mean"], "steps": r["steps"]}
        o, t = per["ours-grpo"], per["trl-lora"]
        print(f"\nGRPO at equal settings (after set-up): ours {o['s_per_step']:.2f} s/step, TRL {t['s_per_step']:.2f} "
              f"(ratio {o['s_per_step'] / t['s_per_step']:.2f}); per reply token {o['s_per_token'] * 1e3:.1f} ms, "
              f"{t['s_per_token'] * 1e3:.1f} (ratio {o['s_per_token'] / t['s_per_token']:.2f}); steps {o['steps']} "
              f"and {t['steps']}, final {o['final']:.1%} and {t['final']:.1%}")
        goal["grpo_equal"] = per
    return {"start": start["accuracy"], "curves": curves, "goal": goal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # one side's process
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--eval-dir", help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="{}", help=argparse.SUPPRESS)  # JSON over the side's own (a cell's)
    parser.add_argument("--out", default="runs/peer_grpo", help="folder for data, runs, checkpoints, results")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, from {', '.join(SIDES)}")
    parser.add_argument("--budget-s", type=float, default=1800.0, help="training seconds per side")
    parser.add_argument("--checkpoint-every-s", type=float, default=180.0,
                        help="a checkpoint at the first step past every this many seconds, and at the stop")
    parser.add_argument("--max-steps", type=int, default=0, help="stop a side after this many steps (0: the budget)")
    parser.add_argument("--heldout", type=int, default=200,
                        help="held-out problems every checkpoint answers (0: all 289 of add-tiny)")
    parser.add_argument("--eval-batch", type=int, default=32, help="replies generated at once in the evaluation")
    parser.add_argument("--eval-replies", type=int, default=1, help="replies the evaluation samples per problem")
    parser.add_argument("--eval-dtype", default="auto", choices=["auto", "float32"],
                        help="the evaluation's dtype for every side: auto (ours' training precision) or float32")
    parser.add_argument("--trl-precision", default="bf16", choices=["bf16", "fp32", "bf16-weights"],
                        help="TRL's: bf16 (bf16=True, autocast over fp32 weights, its default), fp32, bf16-weights")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--screening", type=Path,
                        help="bench/peer_grpo_screen.py's screening.json: the settings it chose, per screened side")
    parser.add_argument("--omp-wait-policy", default="unset", choices=["unset", "passive"],
                        help="OpenMP's wait policy for every side and the evaluation: unset (libgomp's default, what "
                             "users run; for a quiet machine) or passive (OMP_WAIT_POLICY=PASSIVE, for a shared one)")
    parser.add_argument("--report-only", action="store_true",
                        help="print the table and draw peer_grpo.png again from OUT's finished sides and evaluation")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny random models, one step a side, 4 held-out problems (tests/bench/test_peer_grpo.py)")
    args = parser.parse_args()
    if args.dry_run:
        args.max_steps, args.heldout, args.eval_batch = 1, min(args.heldout or 4, 4), 8
        args.trl_precision = "fp32" if args.trl_precision == "bf16" else args.trl_precision

    if args.side:
        result = run_trl(args) if SIDES[args.side]["trainer"] == "trl" else run_ours(args)
        print("RESULT " + json.dumps(result, default=str), flush=True)
        return

    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    if any(SIDES[s]["trainer"] == "trl" for s in sides) and not GRPO_PY.exists():
        raise SystemExit(f"{GRPO_PY} missing: see bench/HISTORY.md (TRL's GRPO environment) or `make venv-grpo`")
    out = Path(args.out)
    if args.report_only:
        missing = [s for s in sides if not (out / "eval" / s / "side.json").is_file()]
        if missing or not (out / "evaluation" / "task_eval.json").is_file():
            parser.error(f"--report-only: {out} has no finished {', '.join(missing) or 'evaluation'}")
        results = {side: json.loads((out / "eval" / side / "side.json").read_text()) for side in sides}
        finish(args, out, results, json.loads((out / "evaluation" / "task_eval.json").read_text()))
        return
    if args.screening and not args.screening.is_file():
        parser.error(f"--screening: no file {args.screening}")
    chosen = screened_settings(args.screening) if args.screening else {}
    out.mkdir(parents=True, exist_ok=True)
    model, data, dtype = prepare(args, out)
    print(f"peer_grpo: {LEVEL}, start model {model}, sides {', '.join(sides)}, budget {args.budget_s:.0f} s a side"
          f"{f', at most {args.max_steps} steps' if args.max_steps else ''}, checkpoints every "
          f"{args.checkpoint_every_s:.0f} s, TRL {TRL_VERSION} in {args.trl_precision}, {args.heldout} held-out "
          f"problems, OMP_WAIT_POLICY {'PASSIVE' if args.omp_wait_policy == 'passive' else 'unset'}"
          f"{' (dry run)' if args.dry_run else ''}", flush=True)
    for side in (s for s in sides if s in chosen):
        print(f"  {side}: the screening's {chosen[side]} ({args.screening})", flush=True)
    results = {side: run_side(side, args, out, model, data, dtype, settings=chosen.get(side)) for side in sides}
    finish(args, out, results, evaluate(args, out, sides))


def screened_settings(screening: Path) -> dict[str, dict]:
    """Per screened side, the settings its screening chose (over the side's own in SIDES); and ours-grpo, the
    equal-settings side, at trl-lora's chosen cell: its learning rate, and its replies per optimiser step as ours'
    batch (one optimiser step a batch, TRL's num_generations replies a prompt)."""
    chosen = {side: found["chosen_settings"] for side, found in json.loads(screening.read_text())["sides"].items()}
    if "trl-lora" in chosen:
        trl = chosen["trl-lora"]
        replies = trl["per_device_train_batch_size"]
        chosen["ours-grpo"] = {"policy_lr": trl["learning_rate"], "batch_size": replies, "minibatch_size": replies,
                               "group_size": trl["num_generations"]}
    return chosen


def finish(args, out: Path, results: dict[str, dict], evaluation: dict) -> None:
    summary = report(results, evaluation, args.budget_s)
    (out / "peer_grpo.json").write_text(json.dumps({"args": vars(args), "sides": results, **summary}, indent=1,
                                                   default=str))
    plot(summary["curves"], summary["start"], summary["goal"], out / "peer_grpo.png")
    print(f"wrote {out / 'peer_grpo.json'} and {out / 'peer_grpo.png'}")


if __name__ == "__main__":
    main()
