"""The LM head on a strided slice against a contiguous copy of it, side by side, at the shapes the project runs.

    .venv/bin/python bench/strided_head.py

On this CPU, torch's matmul of a strided half-precision [B, C, D] input by the [V, D] head weight copies the weight
once per row before a batched product; a contiguous input takes the plain matrix product. Two places hand the head
a slice: `generate`'s first step (hidden[:, -1:], the last prompt position) and `token_logprobs`' chunks of
positions (hidden[:, a:b]). `precision.store_frozen_weights` and `logprobs.token_logprobs` make those inputs
contiguous; this script shows why, for SmolLM2's head (V 49,152, D 576) in fp32 and bf16.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (rows, positions in the hidden states, the slice taken)
    "generate's first step, 64 rows": (64, 40, slice(-1, None)),
    "generate's first step, 8 rows": (8, 40, slice(-1, None)),
    "token_logprobs chunk, 8 rows x 64 positions": (8, 120, slice(10, 74)),
}


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: the first call allocates
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; best of {args.repeats}")
    print(f"{'shape':46} {'dtype':9} {'strided s':>10} {'contiguous s':>13} {'ratio':>7}")
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(args.vocab, args.hidden, dtype=dtype)
        for name, (rows, positions, taken) in SHAPES.items():
            strided = torch.randn(rows, positions, args.hidden, dtype=dtype)[:, taken]
            contiguous = strided.contiguous()
            slow = best_seconds(lambda: F.linear(strided, weight), args.repeats)
            fast = best_seconds(lambda: F.linear(contiguous, weight), args.repeats)
            print(f"{name:46} {str(dtype).removeprefix('torch.'):9} {slow:10.3f} {fast:13.3f} {slow / fast:6.1f}x")


if __name__ == "__main__":
    main()
