"""The prepared GPU check: one command, at most 8 minutes on one H200, one JSON and a short summary.

    python3 bench/gpu_check.py --out $OUT --tokenizer bench/.gpu-carry/smollm2-tokenizer   # the GPU machine
    .venv/bin/python bench/gpu_check.py --dry-run --out /tmp/gpu_check                       # this CPU, tiny models

bench/HISTORY.md ("GPU check") gives the device tool's command line: the carried wheels (bench/gpu_wheels.sh) are
installed first, since that machine has no network.

Parts, each a subprocess with its own time box (a part that fails or runs out of time is recorded with its error
line, and the rest still run; `--budget` bounds the whole):
  gemm   the bf16 GEMM peak of this device (random data, best of several shapes): the MFU denominator
  ours   our trainer at the GPU check's configuration (Qwen2.5-0.5B shape, random weights, batch 32, minibatch 16,
         2 epochs, reply cap 128) in bf16: bench/peer_trl.py's side "ours", one warm-up and two timed iterations,
         s per phase, each phase's MFU (bench/limit.py's FLOP counts), peak GPU memory against `ppo-rlhf memory`'s
         estimate (ppo_rlhf/models/memory.py)
  trl    TRL 1.12.0 at the same configuration (peer_trl.py's side "trl", bf16-weights), one warm-up, one timed
  fsdp   one iteration with every decoder layer sharded by FSDP2 (fully_shard) in one process over nccl, and a
         checkpoint's state gathered from the shards
  zero2  the same under DeepSpeed ZeRO-2 (DeepSpeed's engine around our AdamW)
  tests  the test suite's model tests on the device (`pytest --device cuda`, MODEL_TESTS)
One process has nothing to split: `distributed.Dist` turns FSDP and ZeRO off at world size 1, and one GPU cannot
hold two nccl ranks, so the fsdp and zero2 parts force them on in their one process (the sharded code path runs:
DTensor parameters, the collectives over a one-rank group; what sharding saves over N GPUs is not measured).

--dry-run runs the same parts on this CPU in under 2 minutes (tests/bench/test_gpu_check.py): a tiny random Qwen2 with a
tiny tokenizer (tests/tiny.py), gloo instead of nccl, one small test, and TRL's part skipped (with the reason) when
TRL 1.12.0 is neither importable nor in bench/.venv-trl.

Not run on a GPU yet (no GPU has been lent to a session since it was written), so it has printed nothing there;
the dry run passes in the test suite.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# Test files whose tiny-model configs leave `device` at auto, so that `--device cuda` puts them on the GPU
MODEL_TESTS = ["tests/ppo/test_trainer.py", "tests/ppo/test_ppo_options.py", "tests/ppo/test_estimators.py",
               "tests/models/test_generation.py", "tests/models/test_precision.py"]
# (config, per-part time boxes in seconds) of the real check and of the dry run
REAL = {"model": "qwen-shape", "device": "cuda", "backend": "nccl", "batch": 32, "minibatch": 16, "epochs": 2,
        "cap": 128, "warmup": 1, "iterations": 2, "trl_iterations": 1,
        "sharded": {"batch": 8, "minibatch": 4, "cap": 32},
        "gemm_shapes": {"8192^3": (8192, 8192, 8192), "4096^3": (4096, 4096, 4096),
                        "4096x896x4864": (4096, 896, 4864), "4096x4864x896": (4096, 4864, 896)},
        "gemm_seconds": 2.0, "tests": MODEL_TESTS, "test_filter": "",
        "boxes": {"gemm": 40, "ours": 150, "trl": 150, "fsdp": 75, "zero2": 90, "tests": 150}}
DRY = {"model": "qwen-tiny", "device": "cpu", "backend": "gloo", "batch": 4, "minibatch": 2, "epochs": 2, "cap": 6,
       "warmup": 0, "iterations": 1, "trl_iterations": 1, "sharded": {"batch": 2, "minibatch": 2, "cap": 4},
       "gemm_shapes": {"256^3": (256, 256, 256)}, "gemm_seconds": 0.3,
       "tests": ["tests/ppo/test_trainer.py"], "test_filter": "test_masks_rewards_and_advantages and llama",
       # zero2: DeepSpeed compiles its CPU shared-memory op on first use on a machine (~2 min on 2 cores; cached
       # in ~/.cache/torch_extensions, as for tests/parallel/test_distributed.py's DeepSpeed test)
       "boxes": {"gemm": 30, "ours": 60, "trl": 90, "fsdp": 60, "zero2": 240, "tests": 90}}
TRL_VERSION = "1.12.0"
CARRIED_TOKENIZER = ROOT / "bench" / ".gpu-carry" / "smollm2-tokenizer"
OUTCOME_LINE = re.compile(r"\] (PASSED|FAILED|ERROR|SKIPPED) (tests/\S+::\S+)")
TEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)\b", re.MULTILINE)
VERSIONS = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "deepspeed", "pyarrow", "pytest")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def result_line(output: str) -> dict | None:
    """The JSON of a child's last `RESULT {...}` line (peer_trl.py's protocol), or None."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def error_line(output: str, returncode: int) -> str:
    """The last line that looks like an error, else the last line: what a failed part is remembered by."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line or "Exception" in line]
    return f"exit {returncode}: " + ((errors or lines or ["no output"])[-1])[:400]


# ------------------------------------------------------------------------------------------ parts (children)
def part_gemm(args) -> dict:
    import torch
    from limit import gemm_throughput

    gemm = gemm_throughput(torch.bfloat16, args.cfg["gemm_seconds"], args.cfg["gemm_shapes"], args.cfg["device"])
    return {"gflops": gemm, "peak_gflops": max(gemm.values()), "shape": max(gemm, key=gemm.get)}


def part_sharded(args, kind: str) -> dict:
    """One iteration of our trainer with FSDP2 (`kind` fsdp) or ZeRO-2 (zero2) in one process; the checkpoint state
    gathered from the shards (what rank 0 writes)."""
    import torch
    import torch.distributed as td
    from common import peak_gpu_gb
    from peer_trl import ours_trainer

    from ppo_rlhf.parallel import distributed

    cuda = args.cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    # what `torchrun --nproc-per-node 1` would set (DeepSpeed reads LOCAL_RANK itself)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    td.init_process_group(args.cfg["backend"])
    dist = distributed.Dist()
    if kind == "fsdp":
        dist.fsdp = True  # Dist(world_size=1) turns it off: forced on here (the module docstring says why)
    else:
        dist.zero_stage = 2
    distributed._CURRENT = dist
    small = args.cfg["sharded"]
    trainer = ours_trainer(peer_args(args, batch=small["batch"], minibatch=small["minibatch"], cap=small["cap"]))
    start = time.perf_counter()
    stats, _ = trainer.iteration(0)
    seconds = time.perf_counter() - start
    state = trainer.state_dict()  # a collective: every shard / partition gathered
    sharded = sum(distributed.is_sharded(p) for model in trainer.models.values() for p in model.parameters())
    trainer_steps = {name: type(role.step).__name__ for name, role in trainer.roles.items()}
    td.destroy_process_group()
    keys = ("pg_loss", "v_loss", "grad_norm_policy", "grad_norm_value", "skipped_steps")
    finite = all(isinstance(stats.get(k), (int, float)) and stats[k] == stats[k] for k in keys if k in stats)
    return {"seconds": seconds, "stats": {k: stats.get(k) for k in keys}, "finite": finite,
            "sharded_parameters": sharded, "steps": trainer_steps, "state_parts": sorted(state),
            "backend": args.cfg["backend"], "peak_gpu_gb": peak_gpu_gb()}


def peer_args(args, batch: int, minibatch: int, cap: int) -> argparse.Namespace:
    """peer_trl.py's arguments for our side's trainer (its `ours_trainer`), for one iteration."""
    return argparse.Namespace(model_path=args.model_path, batch=batch, minibatch=minibatch, micro_batch=0,
                              epochs=args.cfg["epochs"], max_new_tokens=cap, temperature=0.7, warmup=0,
                              iterations=1, seed=1, old_logprobs="generation", dtype="bfloat16",
                              logprob_chunk_mb=128.0, device=args.cfg["device"], padding_free=False,
                              keep_finished=False)


# ------------------------------------------------------------------------------------------ parent
def peer_command(side: str, args, cfg: dict, iterations: int, python: str) -> list[str]:
    flags = (["--side", "trl", "--trl-mode", "bf16-weights"] if side == "trl"
             else ["--side", "ours", "--old-logprobs", "generation", "--dtype", "bfloat16",
                   "--logprob-chunk-mb", "128"])
    return [python, str(ROOT / "bench" / "peer_trl.py"), *flags, "--model-path", args.model_path,
            "--batch", str(cfg["batch"]), "--minibatch", str(cfg["minibatch"]), "--epochs", str(cfg["epochs"]),
            "--micro-batch", "0", "--max-new-tokens", str(cfg["cap"]), "--temperature", "0.7",
            "--warmup", str(cfg["warmup"]), "--iterations", str(iterations), "--seed", "1", "--device", cfg["device"]]


def trl_python() -> tuple[str | None, str]:
    """An interpreter with TRL 1.12.0 (this one, else bench/.venv-trl), or None and why not."""
    try:
        version = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version == TRL_VERSION:
        return sys.executable, f"trl {version} in {sys.executable}"
    venv = ROOT / "bench" / ".venv-trl" / "bin" / "python"
    if venv.exists():
        return str(venv), f"trl from {venv}"
    return None, (f"TRL {TRL_VERSION} is not installed here ({'trl ' + version if version else 'no trl'} in "
                  f"{sys.executable}, no bench/.venv-trl): bench/HISTORY.md says how to make it")


def run_bounded(command: list[str], timeout: float, env: dict) -> tuple[int | None, str, str]:
    """(exit status or None when it ran out of `timeout`, stdout, stderr). Out of time, its whole process group is
    killed: a compiler or worker it started must not outlive it (nor hold a lock the next part waits on)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        stdout, stderr = proc.communicate()
        return None, stdout, stderr


def kill_session(session: int) -> None:
    """SIGKILL every process of the session a part was started in: its process group, and the groups its
    grandchildren made (ninja runs each compiler in a group of its own)."""
    os.killpg(session, signal.SIGKILL)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
            if int(fields[3]) == session:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read


def run_child(name: str, command: list[str], timeout: float, log: list[str], env: dict) -> tuple[dict, str]:
    """Run one part; (its RESULT or {}, '' or the error line). The output goes to the combined log."""
    started = time.perf_counter()
    returncode, stdout, stderr = run_bounded(command, timeout, env)
    output, error = stdout + stderr, ""
    result = result_line(stdout)
    if returncode is None:
        result, error = None, f"timed out after {timeout:.0f} s (its time box)"
    elif returncode != 0 or result is None:
        error = error_line(output, returncode)
    log.append(f"===== {name}: {' '.join(command)}\n{output}\n===== {name}: {time.perf_counter() - started:.1f} s, "
               f"{error or 'ok'}\n")
    return result or {}, error


def run_tests(cfg: dict, timeout: float, log: list[str], env: dict, work: Path) -> tuple[dict, str]:
    """The model tests on the device (pytest --device); counts and failures from its JUnit XML, or, when the time
    box stopped it before pytest wrote that, from the outcome lines it printed so far (-v)."""
    junit = work / "tests.xml"
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--device", cfg["device"],
               "-m", "not smoke and not vllm", *(["-k", cfg["test_filter"]] if cfg["test_filter"] else []),
               f"--junitxml={junit}", *cfg["tests"]]
    if cfg["device"] == "cuda" and importlib.util.find_spec("xdist"):
        command += ["-n", "4"]  # tiny models are bound by kernel launches: four processes share the GPU
    if importlib.util.find_spec("pytest_timeout"):
        command += ["--timeout", "120"]  # one hung test fails alone instead of eating the part's time box
    started = time.perf_counter()
    returncode, stdout, stderr = run_bounded(command, timeout, env)
    output = stdout + stderr
    error = f"timed out after {timeout:.0f} s (its time box)" if returncode is None else ""
    log.append(f"===== tests: {' '.join(command)}\n{output}\n")
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    if not junit.is_file():
        # "tests/x.py::name[p] PASSED [ 1%]", or with xdist "[gw0] [ 1%] FAILED tests/x.py::name[p]"
        for outcome, test in OUTCOME_LINE.findall(output) + [(o, t) for t, o in TEST_LINE.findall(output)]:
            counts[{"ERROR": "errors"}.get(outcome, outcome.lower())] += 1
            if outcome in ("FAILED", "ERROR"):
                failures.append(test)
        if not any(counts.values()):
            return {}, error or error_line(output, returncode)
        counts["partial"] = True
    for case in (ElementTree.parse(junit).getroot().iter("testcase") if junit.is_file() else ()):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        counts[{"failure": "failed", "error": "errors"}.get(outcome, outcome)] += 1
        if outcome in ("failure", "error"):
            message = next(child for child in case if child.tag == outcome).get("message", "")
            first = message.splitlines()[0][:300] if message else ""
            failures.append(f"{case.get('classname')}::{case.get('name')}: {first}")
    result = {**counts, "failures": failures, "files": cfg["tests"], "filter": cfg["test_filter"],
              "seconds": time.perf_counter() - started}
    return result, error or (f"{counts['failed'] + counts['errors']} test(s) failed" if failures else "")


def memory_estimate(model_path: str, batch: int, cap: int) -> dict:
    """`ppo-rlhf memory`'s numbers for this model and batch: weights + optimiser state of the setup our trainer
    runs (LoRA policy; LoRA value model on the reward model's backbone; bf16 frozen, fp32 trained = its "mixed"),
    and the KV cache of generation; the full-batch fp32 logits are what a trainer without chunks would add."""
    from common import PROMPTS
    from transformers import AutoTokenizer

    from ppo_rlhf.models.chat import chat_prompt_ids
    from ppo_rlhf.models.memory import build_report, shape_from_config

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    seq_len = max(len(chat_prompt_ids(tokenizer, p)) for p in PROMPTS) + cap
    report = build_report([], shape_from_config(model_path), 16, batch, seq_len, None)
    setup = report["lora"]["setups"]["mixed"]["LoRA policy, LoRA value on the reward backbone"]
    act = report["activations"]
    return {"seq_len": seq_len, "weights_and_optimiser_gb": setup["total"], "kv_cache_bf16_gb": act["kv_cache_bf16"],
            "estimate_gb": setup["total"] + act["kv_cache_bf16"], "full_batch_logits_fp32_gb": act["logits_fp32"]}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def side_numbers(result: dict, peak_gflops: float | None) -> dict:
    """Mean s per phase of the timed iterations, and each phase's MFU against the measured bf16 GEMM peak."""
    rows = result["rows"]
    times = {phase: mean([row[phase] for row in rows]) for phase in ("gen", "score", "update", "total")}
    out = {"seconds": times, "reply_len": mean([row["len"] for row in rows]), "peak_gpu_gb": result.get("peak_gpu_gb"),
           "peak_rss_gb": result["peak_rss_gb"], "dtype": result.get("dtype"), "device": result.get("device"),
           "iterations": len(rows)}
    if peak_gflops:
        flops = {key: mean([row["flops"][key] for row in rows]) for key in ("gen", "score", "update_6N", "update_4N")}
        out["tflop"] = {key: value / 1e12 for key, value in flops.items()}
        out["mfu"] = {"gen": flops["gen"] / times["gen"] / 1e9 / peak_gflops,
                      "score": flops["score"] / times["score"] / 1e9 / peak_gflops,
                      "update_6N": flops["update_6N"] / times["update"] / 1e9 / peak_gflops,
                      "update_4N": flops["update_4N"] / times["update"] / 1e9 / peak_gflops,
                      "iteration_work": (flops["gen"] + flops["score"] + flops["update_4N"]) / times["total"] / 1e9
                      / peak_gflops}
    return out


def gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GB"


def summary(report: dict) -> str:
    cfg, parts = report["config"], report["parts"]
    lines = [f"gpu_check {report['started']} ({'dry run, ' if report['dry_run'] else ''}{report['device_name']}; "
             f"{report['wall_s']:.0f} s): {cfg['model']}, batch {cfg['batch']}, minibatch {cfg['minibatch']}, "
             f"{cfg['epochs']} epochs, cap {cfg['cap']}, bf16"]
    for name, part in parts.items():
        head = f"{name:6s} {part['status']:7s} {part['seconds']:6.1f} s"
        r = part.get("result") or {}
        if name == "tests" and "passed" in r:  # counts, also from a run its time box stopped
            lines.append(f"{head}  {r['passed']} passed, {r['failed']} failed, {r['errors']} errors, "
                         f"{r['skipped']} skipped" + (f" ({part['error']})" if part.get("error") else ""))
            continue
        if part["status"] != "ok":
            lines.append(f"{head}  {part.get('error') or part.get('reason')}")
            continue
        if name == "gemm":
            lines.append(f"{head}  bf16 GEMM peak {r['peak_gflops'] / 1e3:.1f} TFLOP/s ({r['shape']})")
        elif name in ("ours", "trl"):
            s = r["seconds"]
            text = (f"{head}  {s['total']:.2f} s/it: gen {s['gen']:.2f}, score {s['score']:.2f}, update "
                    f"{s['update']:.2f}; reply {r['reply_len']:.1f} tok; peak GPU {gb(r['peak_gpu_gb'])}")
            if "mfu" in r:
                m = r["mfu"]
                text += (f"; MFU gen {m['gen']:.1%}, score {m['score']:.1%}, update {m['update_6N']:.1%} (6N) / "
                         f"{m['update_4N']:.1%} (work done), iteration {m['iteration_work']:.1%}")
            lines.append(text)
        elif name in ("fsdp", "zero2"):
            lines.append(f"{head}  one iteration {r['seconds']:.2f} s over {r['backend']}, "
                         f"{r['sharded_parameters']} sharded parameters, steps {r['steps']}, finite {r['finite']}, "
                         f"peak GPU {gb(r['peak_gpu_gb'])}")
    memory, ours, trl = report.get("memory"), parts.get("ours", {}), parts.get("trl", {})
    if memory:
        measured = ours.get("result", {}).get("peak_gpu_gb") if ours.get("status") == "ok" else None
        lines.append(f"memory estimate (ppo-rlhf memory: weights+optimiser {memory['weights_and_optimiser_gb']:.2f} GB "
                     f"+ KV cache {memory['kv_cache_bf16_gb']:.2f} GB) {memory['estimate_gb']:.2f} GB; measured peak "
                     + (f"{measured:.2f} GB ({measured / memory['estimate_gb']:.2f}x)" if measured else "n/a"))
    if ours.get("status") == "ok" and trl.get("status") == "ok":
        o, t = ours["result"], trl["result"]
        ratio = o["seconds"]["total"] / t["seconds"]["total"]
        memory_ratio = (f", peak GPU memory {o['peak_gpu_gb'] / t['peak_gpu_gb']:.2f}"
                        if o["peak_gpu_gb"] and t["peak_gpu_gb"] else "")
        lines.append(f"ours/TRL: time {ratio:.2f}{memory_ratio}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.txt and gpu_check.log")
    parser.add_argument("--dry-run", action="store_true",
                        help="this CPU, tiny models, gloo (tests/bench/test_gpu_check.py)")
    parser.add_argument("--tokenizer", help="folder with SmolLM2's tokenizer files (default: bench/gpu_wheels.sh's "
                                            "bench/.gpu-carry/smollm2-tokenizer when it is there, else SmolLM2's own)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check (default 450)")
    parser.add_argument("--parts", default="gemm,ours,trl,fsdp,zero2,tests", help="comma-separated, in this order")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child: run one part, print RESULT
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.cfg = DRY if args.dry_run else REAL

    if args.part:
        result = part_gemm(args) if args.part == "gemm" else part_sharded(args, args.part)
        print("RESULT " + json.dumps(result), flush=True)
        return

    started, deadline = time.perf_counter(), time.perf_counter() + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    cfg = args.cfg
    import torch
    from common import prepare_model

    require_cuda = cfg["device"] == "cuda"
    if require_cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_check: CUDA is not available (use --dry-run on a machine without a GPU)")
    tokenizer = args.tokenizer
    if not tokenizer and not args.dry_run and CARRIED_TOKENIZER.is_dir():
        tokenizer = str(CARRIED_TOKENIZER)
    if args.dry_run and not tokenizer:  # a tiny tokenizer, as the tests use
        sys.path.insert(0, str(ROOT / "tests"))
        import tiny

        tokenizer = str(work / "tokenizer")
        tiny.tiny_tokenizer().save_pretrained(tokenizer)
    prepared = time.perf_counter()
    try:  # the model every part but gemm and tests needs; without it, those parts say so and the others run
        args.model_path, model_error = prepare_model(cfg["model"], tokenizer, cache=ROOT / "bench" / ".cache"), ""
    except Exception as error:
        args.model_path, model_error = None, f"the random model could not be made: {type(error).__name__}: {error}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    report: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry_run": args.dry_run,
        "device_name": torch.cuda.get_device_name(0) if require_cuda else "cpu",
        "config": {k: v for k, v in cfg.items() if k != "gemm_shapes"}, "model_path": args.model_path,
        "prepare_s": time.perf_counter() - prepared, "model_error": model_error or None, "versions": {}, "parts": {},
    }
    for package in VERSIONS:
        try:
            report["versions"][package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            report["versions"][package] = None
    report["versions"]["cuda"] = torch.version.cuda
    try:
        report["memory"] = memory_estimate(args.model_path, cfg["batch"], cfg["cap"]) if args.model_path else None
    except Exception as error:  # recorded, never fatal: the measured peak is still worth having
        report["memory"] = None
        report["memory_error"] = f"{type(error).__name__}: {error}"[:400]

    log: list[str] = []
    peak = None
    for name in args.parts.split(","):
        left = deadline - time.perf_counter()
        part: dict = {"status": "skipped", "seconds": 0.0}
        report["parts"][name] = part
        if left < 10:
            part["reason"] = f"out of time (--budget {args.budget:.0f} s)"
            continue
        if model_error and name not in ("gemm", "tests"):
            part["reason"] = model_error[:400]
            continue
        timeout, begun = min(cfg["boxes"][name], left), time.perf_counter()
        error = ""
        if name == "tests":
            result, error = run_tests(cfg, timeout, log, env, work)
        elif name in ("ours", "trl"):
            python, why = (sys.executable, "") if name == "ours" else trl_python()
            if python is None:
                part["reason"] = why
                continue
            iterations = cfg["iterations"] if name == "ours" else cfg["trl_iterations"]
            result, error = run_child(name, peer_command(name, args, cfg, iterations, python), timeout, log, env)
            if result:
                result = side_numbers(result, peak if name == "ours" else None)
                if name == "trl":
                    result["trl"] = why
        else:
            command = [sys.executable, __file__, "--part", name, "--out", str(out),
                       *(["--model-path", args.model_path] if args.model_path else []),
                       *(["--dry-run"] if args.dry_run else [])]
            result, error = run_child(name, command, timeout, log, env)
            if name == "gemm" and result:
                peak = result["peak_gflops"]
        part.update(status="failed" if error else "ok", seconds=time.perf_counter() - begun, result=result,
                    **({"error": error} if error else {}))
        if name == "tests" and result and not result.get("partial") and error.endswith("test(s) failed"):
            part["status"] = "ok"  # the tests ran; their failures are results (listed), not a broken part
    report["wall_s"] = time.perf_counter() - started
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (out / "gpu_check.log").write_text("".join(log))
    text = summary(report)
    (out / "gpu_check.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
