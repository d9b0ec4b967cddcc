"""`ppo-rlhf toy`'s arguments; the six-token bandit itself is toy.py.

A module of its own because toy.py is torch from top to bottom: the CLI reads the flags from here, so
`ppo-rlhf toy --help` (or a bad flag) answers before torch loads, and `run` imports the experiments.
"""

from __future__ import annotations

import argparse
import json

from ppo_rlhf.config import POSITIVE_FLOAT, POSITIVE_INT, SEED, Bounds, Checked

# The chapter gives no learning rate; with this one the shape of its results holds (see tests/ppo/test_toy.py).
DEFAULT_LR = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", choices=["all", "cases", "one-batch", "loop"], default="all",
                        help="which to run: cases (PPO's clipped objective and its gradient for a token in each of "
                             "four situations), one-batch (one batch reused for many Adam steps by each "
                             "objective), loop (the full loop, a fresh batch every iteration), or all (default)")
    parser.add_argument("--seeds", type=POSITIVE_INT, default=500, help="independent runs (default 500)")
    parser.add_argument("--iterations", type=POSITIVE_INT, default=40,
                        help="iterations of the loop experiment (default 40)")
    parser.add_argument("--batch", type=Checked(int, Bounds(low=2)), default=32,
                        help="tokens sampled per batch, at least 2: advantage = reward - batch mean (default 32)")
    parser.add_argument("--lr", type=POSITIVE_FLOAT, default=DEFAULT_LR,
                        help=f"Adam learning rate (default {DEFAULT_LR})")
    parser.add_argument("--seed", type=SEED, default=0, help="random seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: argparse.Namespace) -> int:
    import torch  # lazy, with the experiments: see the module docstring

    from ppo_rlhf.ppo.toy import run_experiments

    # [seeds, 6] tensors are too small to gain from threads; on a busy machine extra threads only cost time.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report, texts = run_experiments(args)
    finally:
        torch.set_num_threads(threads)
    print(json.dumps(report) if args.json else "\n\n".join(texts))
    return 0
