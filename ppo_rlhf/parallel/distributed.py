"""Data-parallel training: the few collective operations the PPO loop needs, and nothing when there is one process.

`accelerate launch -m ppo_rlhf train ...` (or torchrun) starts N processes with RANK / WORLD_SIZE / MASTER_ADDR in
the environment. `current()` joins them into a torch.distributed group (gloo on CPU, nccl on CUDA) and returns a
`Dist`; in a plain `python -m ppo_rlhf train` it returns the one-process `Dist`, whose every method is the identity.

What each process does (docs/DESIGN.md, "Data parallel"):
* prompts: the sampler draws the same global batch on every process (same seed); each keeps a contiguous share
  of whole prompt groups (`shard`), so rloo/grpo groups never straddle processes;
* rewards: the normalisation statistics come from every process's start-policy replies (`gather_1d`);
* advantages: GAE advantages are whitened with the mean and variance of the global batch's reply tokens
  (all-reduced sums and counts, `advantages.masked_whiten_over`);
* update: each process backpropagates its rows' share of the global minibatch's per-token mean (the token count is
  all-reduced first), then the gradients are all-reduced (summed): every process takes the same step as one
  process on the global minibatch would (DDP's arithmetic, written out);
* checkpoints and logs are written by rank 0 only (`is_main`), after a barrier.

Without sharding every process holds the whole model (DDP's layout). With FSDP (`accelerate launch --config_file
configs/accelerate/fsdp.yaml`, which sets ACCELERATE_USE_FSDP=true) every decoder layer is sharded by PyTorch's FSDP2
`fully_shard` (`shard_model`): each process keeps 1/N of the layers' weights, LoRA factors and Adam moments, and
the layers all-gather their weights just before they run. FSDP's reduce-scatter then sums (not averages) the
layers' gradients, which is the same arithmetic as the all-reduce above; the parameters outside the layers
(embeddings, final norm, LM head, the value head) stay whole and go through `all_reduce_grads`. Generation runs
with `synced_gpus` so every process makes the same number of forward calls.

With DeepSpeed (`configs/accelerate/deepspeed_zero2.yaml`: ACCELERATE_USE_DEEPSPEED=true) ZeRO stage 1 or 2 splits
the optimiser state (and gradients) over the processes inside a DeepSpeed engine per trained model (`zero.py`); the
weights stay whole. Stage 3 is refused: FSDP is the way to shard the weights here.

The trainer moves gradients to weights through one `GradientStep` per trained model (`gradient_step`): backward,
then the sum over processes and the norm clip (`finish`), then the optimiser step (`apply`).
"""

from __future__ import annotations

import os
import random
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as td
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ppo_rlhf.errors import require
from ppo_rlhf.utils.device import resolve_device


class Dist:
    """One process of `world_size` (rank 0 of 1 when not launched in parallel)."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, fsdp: bool = False,
                 zero_stage: int = 0):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.fsdp = fsdp and world_size > 1  # decoder layers sharded with FSDP2 (`shard_model`)
        self.zero_stage = zero_stage if world_size > 1 else 0  # DeepSpeed ZeRO stage (0: no DeepSpeed)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, name: str) -> torch.device:
        """This process's device for the configured `name` (several processes: one GPU each, by local rank)."""
        if self.world_size == 1:
            return resolve_device(name)
        if name in ("auto", "cuda") and torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        require(name in ("auto", "cpu"), f"device {name!r} with {self.world_size} processes: use auto, cuda or cpu")
        return torch.device("cpu")

    def diverge_rngs(self, seed: int) -> None:
        """Several processes: reseed each differently (after every process built the same initial weights), so
        they sample different replies; one process keeps its random stream."""
        if self.world_size > 1:
            seed += 7919 * self.rank
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)

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

    def shard_model(self, model: torch.nn.Module) -> None:
        """FSDP: shard each decoder layer (the classes in the model's `_no_split_modules`, the unit Accelerate's
        TRANSFORMER_BASED_WRAP uses) over the processes; a no-op without FSDP. Call before building optimisers:
        the layers' parameters become new (DTensor) parameters."""
        if not self.fsdp:
            return
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        layer_types = set(getattr(base, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_types]
        require(bool(layers), f"FSDP: {type(base).__name__} names no decoder layer class (_no_split_modules) to shard")
        for layer in layers:
            # explicit reshard_after_forward: each layer is its own FSDP root and would otherwise keep its weights
            fully_shard(layer, reshard_after_forward=True)
            layer.set_gradient_divide_factor(1.0)  # sum over processes, as all_reduce_grads does
            layer.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)

    # ----------------------------------------------------------------- optimiser steps
    def gradient_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float):
        """The path from `model`'s losses to its weights: a `GradientStep`, or under DeepSpeed a `zero.ZeroStep`."""
        if not self.zero_stage:
            return GradientStep(self, optimizer, max_norm)
        from ppo_rlhf.parallel.zero import ZeroStep  # lazy: DeepSpeed is optional, needed only under its launch

        return ZeroStep(self, model, optimizer, max_norm)

    # ----------------------------------------------------------------- reductions
    def _all_reduce(self, tensor: torch.Tensor, op: str = "SUM") -> torch.Tensor:
        td.all_reduce(tensor, op=getattr(td.ReduceOp, op))
        return tensor

    def max(self, value: float) -> float:
        if self.world_size == 1:
            return value
        return float(self._all_reduce(torch.tensor([value], dtype=torch.float64, device=self._comm_device()), "MAX")[0])

    def sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        return float(self._all_reduce(torch.tensor([value], dtype=torch.float64, device=self._comm_device()))[0])

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return values
        keys = sorted(values)
        total = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self._comm_device())
        total = self._all_reduce(total)
        return {k: float(v) for k, v in zip(keys, total.tolist())}

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the processes (one flat buffer, one collective); FSDP-sharded
        parameters are skipped (their backward already reduce-scattered the sum)."""
        params = [p for p in params if not is_sharded(p)]
        if self.world_size == 1 or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self._all_reduce(torch.cat([g.reshape(-1).float() for g in grads]))
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
            offset += n

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """torch.nn.utils.clip_grad_norm_ over whole and FSDP-sharded gradients alike (after the reductions, every
        process holds the same whole gradients and its own shards): the global L2 norm, gradients scaled in place
        by min(1, max_norm / (norm + 1e-6)); returns the norm before clipping."""
        if not any(is_sharded(p) for p in params):
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        grads = [p.grad for p in params if p.grad is not None]
        shard_squares = sum(float(g.to_local().double().pow(2).sum()) for g in grads if is_sharded(g))
        whole_squares = sum(float(g.double().pow(2).sum()) for g in grads if not is_sharded(g))
        norm = (self.sum(shard_squares) + whole_squares) ** 0.5
        scale = min(1.0, max_norm / (norm + 1e-6))
        for g in grads:
            (g.to_local() if is_sharded(g) else g).mul_(scale)
        return norm

    def full_tensors(self, tree: Any) -> Any:
        """`tree` (dicts, lists, tensors: a state dict) with every FSDP shard replaced by the whole tensor, on the
        CPU. A collective under FSDP: every process calls it, in the same order."""
        if isinstance(tree, dict):
            return {key: self.full_tensors(value) for key, value in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(self.full_tensors(value) for value in tree)
        if isinstance(tree, torch.Tensor):
            return (tree.full_tensor() if is_sharded(tree) else tree).detach().cpu()
        return tree

    def gather_objects(self, value: Any) -> list[Any]:
        """Every process's (picklable, CPU) `value`, in rank order."""
        if self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        td.all_gather_object(values, value)
        return values

    def gather_1d(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor of any length from every rank, in rank order."""
        if self.world_size == 1:
            return tensor
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

    def barrier(self) -> None:
        if self.world_size > 1:
            td.barrier()

    def _comm_device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if td.get_backend() == "nccl" else torch.device("cpu")


class GradientStep:
    """One trained model's path from loss to weights without DeepSpeed: `backward` each micro-batch's loss, then
    `finish` (sum the gradients over the processes, clip their norm; returns the norm before clipping), then
    `apply` if the trainer accepts the step (every model's numbers finite) or `discard`. It saves and loads its
    optimiser's state."""

    def __init__(self, dist: Dist, optimizer: torch.optim.Optimizer, max_norm: float):
        self.dist, self.optimizer, self.max_norm = dist, optimizer, max_norm
        self.params = [p for group in optimizer.param_groups for p in group["params"]]  # the trained ones

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def finish(self) -> float:
        self.dist.all_reduce_grads(self.params)
        return self.dist.clip_grad_norm(self.params, self.max_norm)

    def apply(self) -> None:
        self.optimizer.step()

    def discard(self) -> None:
        """The trainer skips this step: nothing was applied, so only the gradients go."""
        self.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        """The optimiser's whole state (FSDP shards gathered, on the CPU). A collective: every process calls it."""
        return self.dist.full_tensors(self.optimizer.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A saved `state_dict`, cut into this process's shards under FSDP."""
        require("ranks" not in state, "this optimiser state was written under DeepSpeed ZeRO: resume it with the "
                                      "launch configuration that wrote it")
        self.optimizer.load_state_dict(state)
        for param, param_state in self.optimizer.state.items():  # FSDP: the loaded whole moments become shards
            if is_sharded(param):
                for key, value in param_state.items():
                    if isinstance(value, torch.Tensor) and value.shape == param.shape:
                        param_state[key] = as_shard_of(param, value)


def as_shard_of(param: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """`whole` cut like the FSDP-sharded `param` (every process has read the same file: no communication)."""
    whole = whole.to(param.device, param.dtype)
    return distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)


def is_sharded(tensor: torch.Tensor) -> bool:
    """An FSDP-sharded parameter or gradient (a DTensor)."""
    return isinstance(tensor, DTensor)


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
    zero_stage = 0
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" or distributed_type == "DEEPSPEED":
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
        require(stage in ("1", "2"), f"DeepSpeed ZeRO stage {stage} is not supported: use stage 1 or 2 (the weights "
                                     "stay whole), or configs/accelerate/fsdp.yaml to shard the weights")
        zero_stage = int(stage)
    fsdp = distributed_type == "FSDP" or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    require(not (fsdp and zero_stage), "choose FSDP or DeepSpeed, not both")
    if not td.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        td.init_process_group(backend=backend)
    _CURRENT = Dist(td.get_rank(), td.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), fsdp, zero_stage)
    if torch.cuda.is_available():
        torch.cuda.set_device(_CURRENT.local_rank)
    return _CURRENT
