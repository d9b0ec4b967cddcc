"""DeepSpeed ZeRO stage 1 or 2 for the two trained models: optimiser state (stage 1) and gradients (stage 2) split
over the data-parallel processes by DeepSpeed's engine; the weights stay whole on every process, so generation,
the reference (adapter off) and the reward model (value adapter off) run as they do without it.

`accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml -m ppo_rlhf train ...` sets
ACCELERATE_USE_DEEPSPEED and ACCELERATE_DEEPSPEED_ZERO_STAGE (read by `distributed.current`) and
ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE (read here). Each trained model gets its own engine around the
trainer's own AdamW (eps, no weight decay and learning rate from the training config), with:
* managed_gradient_accumulation off: every `engine.step()` ends an accumulation, so the trainer's micro-batches
  (and a PPO-ptx batch) are simply more backward calls before one step;
* the loss multiplied by the process count before DeepSpeed averages the gradients over the processes: the
  trainer's losses are already divided by the global token count, so the average of N x loss is the global sum,
  the same arithmetic as `Dist.all_reduce_grads`;
* gradient_clipping = max_grad_norm (DeepSpeed's clip is torch's: scale by max_norm / (norm + 1e-6) when above).
DeepSpeed's step is one call (finish the reduction, clip, skip a non-finite gradient, update), taken in `finish`;
when another model's gradient is not finite the trainer skips every model's step, so `discard` puts back the
weights and optimiser partition `finish` saved (LoRA's: small): a skip leaves every model untouched, as in the
other layouts.

Checkpoints hold each process's optimiser partition (AdamW's moments over its flat slice), gathered into the one
state.pt rank 0 writes; a run resumes with the same number of processes and ZeRO stage.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import torch

from ppo_rlhf.errors import UsageError, require


class ZeroStep:
    """One trained model's path from loss to weights through a DeepSpeed engine (`distributed.GradientStep`'s
    interface): `zero_grad`, `backward` per micro-batch, `finish` (the engine's step; returns the gradient norm
    before clipping, inf for a step DeepSpeed skipped), then `apply` (keep it) or `discard` (undo it)."""

    def __init__(self, dist, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float):
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
        try:
            import deepspeed  # lazy: an optional dependency; missing, it is a UsageError naming the install
        except ImportError:
            raise UsageError("a DeepSpeed launch needs DeepSpeed: pip install --no-build-isolation 'deepspeed>=0.19' "
                             "(it builds against the torch already installed)") from None
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        offload = os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none").lower()
        dtype = next(p for p in model.parameters() if p.requires_grad).dtype
        require(dtype != torch.float16, "DeepSpeed: train in float32 or bfloat16 (float16 needs loss scaling)")
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,  # DeepSpeed's batch bookkeeping only: the trainer makes the batches
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "gradient_clipping": max_norm,
            "zero_optimization": {"stage": dist.zero_stage,
                                  **({"offload_optimizer": {"device": offload}} if offload != "none" else {})},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,  # keep the trainer's AdamW, also with the optimiser offloaded
            "bf16": {"enabled": dtype == torch.bfloat16},
            "steps_per_print": 2**31 - 1,
        }
        self.dist, self.optimizer = dist, optimizer
        self.trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
        self.before: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                               dist_init_required=False)

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        """Add the gradient of `loss` summed over the processes (DeepSpeed averages: hence x world_size)."""
        self.engine.backward(loss * self.dist.world_size, scale_wrt_gas=False)

    def finish(self) -> float:
        """DeepSpeed's whole step (reduce, clip, update, or skip a non-finite gradient); what it changed is kept
        until the trainer `apply`s or `discard`s it. Returns the gradient norm before clipping, inf when skipped."""
        self.before = ({name: p.detach().clone() for name, p in self.trained.items()},
                       copy.deepcopy(self.optimizer.state_dict()))
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float("inf") if norm is None or not self.engine.was_step_applied() else float(norm)

    def apply(self) -> None:
        self.before = None  # `finish` took DeepSpeed's step

    def discard(self) -> None:
        """Undo `finish`'s step (another model's gradient was not finite): the weights and this process's optimiser
        partition as they were, the master copy refreshed from those weights."""
        assert self.before is not None  # (`finish` kept them)
        weights, optimizer_state = self.before
        with torch.no_grad():
            for name, p in self.trained.items():
                p.copy_(weights[name])
        self.optimizer.load_state_dict(optimizer_state)
        self.engine.optimizer.refresh_fp32_params()
        self.before = None

    def state_dict(self) -> dict[str, Any]:
        """Every process's optimiser partition (a collective: every process calls it)."""
        dist = self.dist
        ranks = dist.gather_objects(dist.full_tensors(self.optimizer.state_dict()))
        return {"zero_stage": dist.zero_stage, "ranks": ranks}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """This process's partition of a saved `state_dict`, after the weights were loaded into the model."""
        dist, ranks = self.dist, saved.get("ranks")
        if ranks is None:
            raise UsageError("this optimiser state was not written under DeepSpeed ZeRO: resume it with the launch "
                             "configuration that wrote it")
        require(len(ranks) == dist.world_size and saved["zero_stage"] == dist.zero_stage,
                f"this checkpoint's optimiser state was written by {len(ranks)} DeepSpeed ZeRO-{saved['zero_stage']} "
                f"processes: resume it with the same launch configuration")
        self.optimizer.load_state_dict(ranks[dist.rank])
        self.engine.optimizer.refresh_fp32_params()  # the master copy from the weights the checkpoint just loaded
