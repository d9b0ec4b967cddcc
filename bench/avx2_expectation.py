"""What to expect on an AVX2-only CPU, measured on this one: the same short SmolLM2 run (reward functions only, batch
8, cap 24, 2 iterations) as this machine runs it (`dtype auto`) and with the instruction sets cut down to AVX2
(`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`, `MKL_ENABLE_INSTRUCTIONS=AVX2`, and `dtype float32`, which is
what `auto` picks without native bf16), alternating in one process tree, the ratio of the seconds per iteration.
An emulation: a real AVX2-only CPU also differs in clock, cache and memory bandwidth.

    python bench/avx2_expectation.py --rounds 2

Last run (2026-12-04 17:31-17:35 UTC, Intel Xeon with amx_bf16 avx2 avx512_bf16, quiet): this CPU 9.2 / 9.4 s per
iteration, the AVX2-only emulation 15.4 / 15.3 s: 1.65x.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ppo_rlhf.models.precision import cpu_matrix_flags  # noqa: E402

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def one_run(work: Path, name: str, dtype: str, extra_env: dict[str, str]) -> float:
    out = work / name
    cmd = [sys.executable, "-m", "ppo_rlhf", "train", "--policy-model", "smollm2", "--prompts",
           str(work / "data" / "train.jsonl"), "--reward-funcs", "ppo_rlhf.tasks.arithmetic:exact_match",
           "ppo_rlhf.tasks.arithmetic:answer_format", "--iterations", "2", "--batch-size", "8", "--minibatch-size", "4",
           "--max-new-tokens", "24", "--reward-norm-samples", "8", "--dtype", dtype, "--out", str(out),
           "--overwrite", "--quiet", "--critic-warmup-iterations", "0"]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **extra_env})
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return sum(r["time_total"] for r in rows) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="avx2_"))
    subprocess.run([sys.executable, "-m", "ppo_rlhf", "task", "write", "add-tiny", "--out", str(work / "data")],
                   check=True, cwd=ROOT)
    here, avx2 = [], []
    for round_ in range(args.rounds):
        here.append(one_run(work, f"here{round_}", "auto", {}))
        avx2.append(one_run(work, f"avx2{round_}", "float32", AVX2))
        print(f"round {round_}: this CPU (auto) {here[-1]:.1f} s/iteration, AVX2-only emulation (float32) "
              f"{avx2[-1]:.1f} s/iteration", flush=True)
    print(f"CPU flags: {cpu_matrix_flags()}; threads: {os.cpu_count()}")
    print(f"AVX2-only / this CPU: {sum(avx2) / sum(here):.2f}x the time per iteration")


if __name__ == "__main__":
    main()
