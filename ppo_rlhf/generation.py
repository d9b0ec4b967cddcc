"""Generation backends behind one interface: `generate(prompts) -> Rollout`.

* `HFGenerator` (default, `generation_backend: hf`): Hugging Face `generate` on the policy itself
  (`rollout.generate_rollout`).
* `VLLMGenerator` (`generation_backend: vllm`, extra `pip install 'ppo-rlhf[vllm]'`, GPU only): a vLLM engine
  holding a copy of the policy. Before each iteration's rollout `sync(policy)` copies the policy's weights into
  the engine, with the LoRA adapter merged in (W + B A * alpha / r), under the plain Hugging Face parameter names
  that vLLM's `model.load_weights` expects.

With vLLM only the sampled token ids leave the engine: the trainer recomputes log pi_old, log pi_ref and the
values itself from those ids, at the training temperature (docs/DESIGN.md). The engine's own log-probs are never
requested and never trusted: vLLM's kernels, its bf16 weights and its sampler differ slightly from the training
forward pass, and the PPO ratio must be 1 before the first update. The HF backend samples from the training
policy itself, so with `old_logprobs: generation` it may hand over log pi_old recorded from its own logits.

vLLM version targeted: 0.8 - 0.10 (the `LLM(...)` offline API; weights reach the model through
`llm.llm_engine.model_executor.driver_worker...model_runner.model.load_weights`, the path TRL uses, which needs
the engine in this process: we set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it). An engine that has its
own `load_weights(iterable)` method (a custom wrapper, or the test's fake engine) is used directly.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Protocol

import torch
from torch import nn

from ppo_rlhf.errors import UsageError, require

BACKENDS = ("hf", "vllm")


class Generator(Protocol):
    def sync(self, policy: nn.Module) -> None:
        """Make the backend sample from the policy's current weights (called before every rollout)."""

    def generate(self, prompts: list[str]):
        """One reply per prompt, as a `rollout.Rollout` (CPU tensors, right-padded)."""


def rollout_from_tokens(tokenizer, prompts: list[str], prompt_ids: list[list[int]], outputs: list[list[int]],
                        eos: list[int]):
    """A Rollout from sampled token ids: each reply cut after its first EOS (kept); no EOS = unfinished."""
    from ppo_rlhf.rollout import Rollout, build_batch

    require(len(outputs) == len(prompts), f"the engine returned {len(outputs)} replies for {len(prompts)} prompts")
    reply_ids, finished = [], []
    for row in outputs:
        row = [int(t) for t in row]
        end = next((i for i, token in enumerate(row) if token in eos), None)
        reply_ids.append(row if end is None else row[: end + 1])
        finished.append(end is not None)
    input_ids, attention_mask, action_mask = build_batch(prompt_ids, reply_ids, tokenizer.pad_token_id)
    return Rollout(prompts=list(prompts), prompt_ids=prompt_ids, reply_ids=reply_ids,
                   reply_texts=tokenizer.batch_decode(reply_ids, skip_special_tokens=True),
                   finished=torch.tensor(finished, dtype=torch.bool), input_ids=input_ids,
                   attention_mask=attention_mask, action_mask=action_mask)


class HFGenerator:
    """Hugging Face `generate` on the training policy (nothing to sync: it is the policy)."""

    def __init__(self, policy: nn.Module, tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 batch_size: int | None = None, record_logprobs: bool = False):
        self.policy, self.tokenizer = policy, tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.batch_size = max_new_tokens, temperature, top_p, batch_size
        self.record_logprobs = record_logprobs

    def sync(self, policy: nn.Module) -> None:
        self.policy = policy

    def generate(self, prompts: list[str]):
        from ppo_rlhf.rollout import generate_rollout

        return generate_rollout(self.policy, self.tokenizer, prompts, self.max_new_tokens, self.temperature,
                                batch_size=self.batch_size, top_p=self.top_p, record_logprobs=self.record_logprobs)


# ------------------------------------------------------------------------------------------------ vLLM


@torch.no_grad()
def merged_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights with its LoRA adapter merged, under plain Hugging Face names
    (`model.layers.0.self_attn.q_proj.weight`), without changing the policy. A model without PEFT is returned as is."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(policy, PeftModel):
        return {name: tensor.detach().clone() for name, tensor in policy.state_dict().items()}
    prefix = "base_model.model."

    def plain(name: str) -> str:
        name = name[len(prefix):] if name.startswith(prefix) else name
        return name.replace(".base_layer.", ".")

    weights = {plain(name): tensor.detach().clone() for name, tensor in policy.state_dict().items()
               if "lora_" not in name and "modules_to_save" not in name}
    # W + scale * B A computed on the side: merge_adapter()/unmerge_adapter() would leave rounding error in the
    # policy's base weights, which are also the reference model
    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            key = plain(name + ".weight")
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    weights[key] = weights[key] + module.get_delta_weight(adapter).to(weights[key].dtype)
    return weights


def _engine_model(engine: Any) -> Any:
    """The nn.Module inside a vLLM engine that has `load_weights` (in-process engine; vLLM 0.8 - 0.10)."""
    executor = engine.llm_engine.model_executor
    worker = executor.driver_worker
    worker = getattr(worker, "worker", worker)  # V1 wraps the GPU worker in a WorkerWrapperBase
    return worker.model_runner.model


def load_engine_weights(engine: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    if hasattr(engine, "load_weights"):
        engine.load_weights(weights)
        return
    try:
        model = _engine_model(engine)
    except AttributeError as error:
        raise UsageError("cannot reach the vLLM model to sync weights (this vLLM version's engine layout is not "
                         "supported; set VLLM_ENABLE_V1_MULTIPROCESSING=0 and use vLLM 0.8-0.10)") from error
    model.load_weights(weights)


def _sampling_params(**kwargs) -> Any:
    try:
        from vllm import SamplingParams
    except ImportError:  # a fake engine in tests: plain keyword arguments
        return dict(kwargs)
    return SamplingParams(**kwargs)


class VLLMGenerator:
    """Sampling with a vLLM engine; the trainer re-scores the returned token ids itself.

    `engine` is any object with vLLM's `LLM.generate(prompts, sampling_params, use_tqdm=...)` returning objects with
    `.outputs[0].token_ids` (and, for `sync`, the in-process model path or its own `load_weights`). Pass one to test
    on CPU; `VLLMGenerator.create` builds the real engine.
    """

    def __init__(self, engine: Any, tokenizer, eos: list[int], max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, make_params: Callable[..., Any] = _sampling_params):
        self.engine, self.tokenizer, self.eos = engine, tokenizer, list(eos)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.make_params = make_params
        self.synced = 0

    @classmethod
    def create(cls, model_path: str, tokenizer, eos: list[int], max_new_tokens: int, temperature: float,
               top_p: float = 1.0, dtype: str = "float32", seed: int = 1, gpu_memory_utilization: float = 0.3,
               max_model_len: int | None = None) -> "VLLMGenerator":
        try:
            import vllm  # noqa: F401  (lazy: a heavy import, and an optional extra)
        except ImportError:
            raise UsageError("generation_backend vllm needs vLLM: pip install 'ppo-rlhf[vllm]' (Linux + CUDA GPU)") from None
        require(torch.cuda.is_available(), "generation_backend vllm needs a CUDA GPU; use generation_backend hf on CPU")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, for weight sync
        from vllm import LLM

        engine = LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                     gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                     enable_prefix_caching=False)
        return cls(engine, tokenizer, eos, max_new_tokens, temperature, top_p)

    def sync(self, policy: nn.Module) -> None:
        """Copy the policy's merged weights into the engine (every iteration: the policy changed)."""
        load_engine_weights(self.engine, list(merged_state_dict(policy).items()))
        self.synced += 1

    def generate(self, prompts: list[str]):
        from ppo_rlhf.chat import chat_prompt_ids

        require(len(prompts) > 0, "no prompts to generate from")
        prompt_ids = [chat_prompt_ids(self.tokenizer, p) for p in prompts]
        # A per-call seed from torch's RNG keeps runs reproducible under the trainer's seed.
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        params = self.make_params(
            n=1, temperature=self.temperature, top_p=self.top_p, top_k=-1, min_p=0.0, repetition_penalty=1.0,
            presence_penalty=0.0, frequency_penalty=0.0, max_tokens=self.max_new_tokens, stop_token_ids=self.eos,
            skip_special_tokens=True, seed=seed, logprobs=None,
        )
        results = self.engine.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        outputs = [list(result.outputs[0].token_ids) for result in results]
        return rollout_from_tokens(self.tokenizer, prompts, prompt_ids, outputs, self.eos)


def make_generator(cfg, policy: nn.Module, tokenizer, model_path: str | None = None) -> Generator:
    """The backend `cfg.generation_backend` names, for a TrainConfig."""
    from ppo_rlhf.rollout import eos_token_ids

    require(cfg.generation_backend in BACKENDS, f"generation_backend must be one of {BACKENDS}")
    if cfg.generation_backend == "hf":
        return HFGenerator(policy, tokenizer, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                           cfg.generation_batch_size or None, record_logprobs=cfg.old_logprobs == "generation")
    from ppo_rlhf.models import resolve_model_path

    return VLLMGenerator.create(model_path or resolve_model_path(cfg.policy_model), tokenizer,
                                eos_token_ids(policy, tokenizer), cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                                dtype=cfg.dtype, seed=cfg.seed)
