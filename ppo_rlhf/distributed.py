"""Data-parallel training: the few collective operations the PPO loop needs, and nothing when there is one process.

`accelerate launch -m ppo_rlhf train ...` (or torchrun) starts N processes with RANK / WORLD_SIZE / MASTER_ADDR in
the environment. `current()` joins them into a torch.distributed group (gloo on CPU, nccl on CUDA) and returns a
`Dist`; in a plain `python -m ppo_rlhf train` it returns the one-process `Dist`, whose every method is the identity.

What each process does (docs/DESIGN.md, "Data parallel"):
* prompts: the sampler draws the same global batch on every process (same seed); each keeps a contiguous share
  of whole prompt groups (`shard`), so rloo/grpo groups never straddle processes;
* rewards: the normalisation statistics come from every process's start-policy replies (`gather_1d`);
* advantages: GAE advantages are whitened with the mean and variance of the global batch's reply tokens
  (all-reduced sums and counts, `masked_whiten`);
* update: each process backpropagates its rows' share of the global minibatch's per-token mean (the token count is
  all-reduced first), then the gradients are all-reduced (summed): every process takes the same step as one
  process on the global minibatch would (DDP's arithmetic, written out);
* checkpoints and logs are written by rank 0 only (`is_main`), after a barrier.

This is DDP-style data parallelism: every process holds the whole model. Sharded training (FSDP, DeepSpeed ZeRO)
needs Accelerator.prepare around the models and optimisers and is not wired in yet; the launcher refuses it.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from ppo_rlhf.errors import UsageError, require


class Dist:
    """One process of `world_size` (rank 0 of 1 when not launched in parallel)."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, name: str) -> torch.device:
        if name in ("auto", "cuda") and torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        require(name in ("auto", "cpu"), f"device {name!r} with {self.world_size} processes: use auto, cuda or cpu")
        return torch.device("cpu")

    # ----------------------------------------------------------------- splitting
    def shard(self, items: Sequence[Any]) -> list[Any]:
        """This rank's contiguous share; the count must divide evenly (equal work, equal global batch)."""
        items = list(items)
        if self.world_size == 1:
            return items
        require(len(items) % self.world_size == 0,
                f"{len(items)} prompts (or prompt groups) do not split evenly over {self.world_size} processes")
        size = len(items) // self.world_size
        return items[self.rank * size : (self.rank + 1) * size]

    # ----------------------------------------------------------------- reductions
    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as td

        td.all_reduce(tensor, op=td.ReduceOp.SUM)
        return tensor

    def sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        return float(self._all_reduce(torch.tensor([value], dtype=torch.float64, device=self._comm_device()))[0])

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return values
        keys = sorted(values)
        total = self._all_reduce(torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self._comm_device()))
        return {k: float(v) for k, v in zip(keys, total.tolist())}

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world_size

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the processes (one flat buffer, one collective)."""
        if self.world_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self._all_reduce(torch.cat([g.reshape(-1).float() for g in grads]))
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
            offset += n

    def gather_1d(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor of any length from every rank, in rank order."""
        if self.world_size == 1:
            return tensor
        import torch.distributed as td

        dev = self._comm_device()
        length = torch.tensor([tensor.numel()], device=dev)
        lengths = [torch.zeros_like(length) for _ in range(self.world_size)]
        td.all_gather(lengths, length)
        width = int(max(int(x) for x in lengths))
        padded = torch.zeros(width, dtype=torch.float64, device=dev)
        padded[: tensor.numel()] = tensor.to(dev, torch.float64)
        pieces = [torch.zeros_like(padded) for _ in range(self.world_size)]
        td.all_gather(pieces, padded)
        out = torch.cat([piece[: int(n)] for piece, n in zip(pieces, lengths)])
        return out.to(tensor.dtype).cpu() if tensor.dtype != torch.bool else out.bool().cpu()

    def masked_whiten(self, x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
        """objectives.masked_whiten with the mean and (unbiased) variance of all processes' masked entries."""
        from ppo_rlhf.objectives import _zero_masked, masked_sum, masked_whiten

        if self.world_size == 1:
            return masked_whiten(x, mask, shift_mean)
        count, total = self.sum(float(mask.sum())), self.sum(float(masked_sum(x.double(), mask)))
        mean = total / count
        squares = self.sum(float(masked_sum((x.double() - mean) ** 2, mask)))
        variance = squares / count * count / max(count - 1, 1)
        whitened = (x - mean) * torch.rsqrt(torch.tensor(variance + 1e-8, dtype=x.dtype, device=x.device))
        if not shift_mean:
            whitened = whitened + mean
        return _zero_masked(whitened, mask)

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as td

            td.barrier()

    def _comm_device(self) -> torch.device:
        import torch.distributed as td

        return torch.device("cuda", self.local_rank) if td.get_backend() == "nccl" else torch.device("cpu")


_CURRENT: Dist | None = None


def current() -> Dist:
    """The process group this process belongs to, joined on first use (WORLD_SIZE > 1 in the environment)."""
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        _CURRENT = Dist()
        return _CURRENT
    distributed_type = os.environ.get("ACCELERATE_DISTRIBUTED_TYPE", "")
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or \
            os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" or distributed_type in ("FSDP", "DEEPSPEED"):
        raise UsageError("FSDP and DeepSpeed are not supported yet: launch with configs/accelerate/ddp.yaml "
                         "(every process holds the whole model)")
    import torch.distributed as td

    if not td.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        td.init_process_group(backend=backend)
    _CURRENT = Dist(td.get_rank(), td.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if torch.cuda.is_available():
        torch.cuda.set_device(_CURRENT.local_rank)
    return _CURRENT


def reset() -> None:
    """Forget the cached group (tests)."""
    global _CURRENT
    _CURRENT = None
