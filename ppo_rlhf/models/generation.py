"""Generation backends behind one interface: `generate(prompts) -> Rollout`.

* `HFGenerator` (default, `generation_backend: hf`): Hugging Face `generate` on the policy itself
  (`rollout.generate_rollout`); with `generation_drop_finished` our own decode loop (ppo_rlhf/models/decode.py), which
  drops finished rows from the batch and its KV cache between steps. With `generation_merged_copy` it samples from a
  plain copy of the model whose weights are the policy's with its LoRA adapter merged (`merge.merged_copy`, refreshed
  before each rollout): a decoding step then runs 7 linear layers a block instead of 21 and no dtype casts.
* `VLLMGenerator` (`generation_backend: vllm`): a vLLM engine holding a copy of the policy. vLLM pins its own
  transformers range, so the engine runs in its own environment (.venv-vllm, `make venv-vllm`) and process
  (ppo_rlhf/models/vllm_server.py, imports only vllm), spoken to by `VLLMServer` with token ids over a pipe. Before each
  iteration's rollout `sync(policy)` writes the policy's weights, LoRA merged in (W + B A * alpha / r), under the
  plain Hugging Face names, as safetensors to the server's folder; the server reloads them into the running engine
  (vLLM's worker `reload_weights`, no restart).

With vLLM only the sampled token ids leave the engine: the trainer recomputes log pi_old, log pi_ref and the
values itself from those ids, at the training temperature (docs/DESIGN.md). The engine's own log-probs are never
used for training: vLLM's kernels and sampler differ slightly from the training forward pass, and the PPO ratio
must be 1 before the first update (tests/models/test_vllm_engine.py measures how close they are). The HF backend samples
from the training policy itself, so with `old_logprobs: generation` it may hand over log pi_old recorded from its
own logits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import IO, Any, Protocol

import torch
from torch import nn

from ppo_rlhf.data import Prompt
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.models.merge import merged_copy, merged_state_dict

BACKENDS = ("hf", "vllm")


class Generator(Protocol):
    def sync(self, policy: nn.Module) -> None:
        """Make the backend sample from the policy's current weights (called before every rollout)."""

    def generate(self, prompts: list[Prompt], columns: list[dict[str, Any]] | None = None):
        """One reply per prompt, as a `rollout.Rollout` (CPU tensors, right-padded), each row's other dataset
        `columns` carried in it (None: none)."""


def rollout_from_tokens(tokenizer, prompts: list[Prompt], prompt_ids: list[list[int]], outputs: list[list[int]],
                        eos: list[int]):
    """A Rollout from sampled token ids: each reply cut after its first EOS (kept); no EOS = unfinished."""
    from ppo_rlhf.models.rollout import Rollout, build_batch, cut_at_eos

    require(len(outputs) == len(prompts), f"the engine returned {len(outputs)} replies for {len(prompts)} prompts")
    reply_ids, finished = [], []
    for row in outputs:
        ids, done = cut_at_eos([int(t) for t in row], eos)
        reply_ids.append(ids)
        finished.append(done)
    input_ids, attention_mask, action_mask = build_batch(prompt_ids, reply_ids, tokenizer.pad_token_id)
    return Rollout(prompts=list(prompts), prompt_ids=prompt_ids, reply_ids=reply_ids,
                   reply_texts=tokenizer.batch_decode(reply_ids, skip_special_tokens=True),
                   finished=torch.tensor(finished, dtype=torch.bool), input_ids=input_ids,
                   attention_mask=attention_mask, action_mask=action_mask)


class HFGenerator:
    """Hugging Face `generate` on the training policy (nothing to sync: it is the policy), or with `merged` on a
    copy of it with the LoRA adapter merged into the weights (`merge.merged_copy`, refreshed by `sync`). In bf16 the
    copy samples from a distribution close to the policy's forward: per reply token KL(policy || copy) 6.1e-4 on
    average on SmolLM2 after 30 minutes of training, 61 of 64 replies the same tokens (bench/decode_overhead.py
    --adapter, bench/HISTORY.md 2026-12-07; measured when the merge still rounded the LoRA product to bf16 before
    adding it)."""

    def __init__(self, policy: nn.Module, tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 batch_size: int | None = None, record_logprobs: bool = False, drop_finished: bool = False,
                 merged: bool = False):
        self.policy, self.tokenizer = policy, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.batch_size = batch_size
        self.record_logprobs, self.drop_finished = record_logprobs, drop_finished
        self.merged, self.copy = merged, None

    def sync(self, policy: nn.Module) -> None:
        """What `generate` samples from: the policy, or its merged copy refreshed from the policy's weights now."""
        if self.merged:
            require(hasattr(policy, "get_base_model"), "generation_merged_copy needs a LoRA policy (nothing to merge)")
            self.copy = merged_copy(policy, self.copy)
        self.policy = self.copy if self.merged else policy

    def generate(self, prompts: list[Prompt], columns: list[dict[str, Any]] | None = None):
        from ppo_rlhf.models.rollout import generate_rollout

        rollout = generate_rollout(self.policy, self.tokenizer, prompts, self.max_new_tokens, self.temperature,
                                   batch_size=self.batch_size, top_p=self.top_p, record_logprobs=self.record_logprobs,
                                   drop_finished=self.drop_finished)
        if columns is not None:
            rollout.columns = columns
        return rollout


# ------------------------------------------------------------------------------------------------ vLLM


SERVER = Path(__file__).with_name("vllm_server.py")


def vllm_python() -> str | None:
    """The python that can import vLLM: $PPO_RLHF_VLLM_PYTHON, else the set-up's .venv-vllm next to this package
    (`make venv-vllm`), else this interpreter if it has vLLM; None when there is none."""
    named = os.environ.get("PPO_RLHF_VLLM_PYTHON")
    if named:
        return named
    local = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if local.exists() and _imports_vllm(str(local)):
        return str(local)
    return sys.executable if importlib.util.find_spec("vllm") else None


def _imports_vllm(python: str) -> bool:
    """Whether that python finds vllm (a failed `make venv-vllm` can leave a python without it); no import: fast."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


class VLLMServer:
    """Client of a vLLM engine running ppo_rlhf/models/vllm_server.py in its own process and environment.

    Weights travel as a safetensors file in a private folder (`load_weights`); prompts and replies as token ids
    over the server's stdin/stdout. The engine's log goes to `log` in that folder and its tail into any error.
    """

    def __init__(self, model_path: str, python: str, dtype: str = "float32", seed: int = 1,
                 max_model_len: int = 0, max_logprobs: int = 20, kv_cache_gib: int = 1):
        self.folder = Path(tempfile.mkdtemp(prefix="ppo_rlhf_vllm_"))
        self.log = self.folder / "server.log"
        command = [python, str(SERVER), "--model", str(model_path), "--dtype", dtype, "--seed", str(seed),
                   "--max-model-len", str(max_model_len), "--max-logprobs", str(max_logprobs),
                   "--kv-cache-gib", str(kv_cache_gib)]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            text=True)
        # closes the pipe (the server exits on EOF) and removes the folder, also when the trainer crashes
        self._finalizer = weakref.finalize(self, _stop_server, self.process, self.folder)
        self._read()  # {"ready": true} once the engine is up

    def _read(self) -> dict:
        line = self._pipe("stdout").readline()
        if not line:
            self.process.wait()
            tail = "\n".join(self.log.read_text().splitlines()[-15:])
            raise RuntimeError(f"the vLLM server exited (status {self.process.returncode}); its log ends:\n{tail}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the vLLM server refused a request: {reply['error']}")
        return reply

    def _pipe(self, name: str) -> IO[str]:
        pipe = getattr(self.process, name)
        assert pipe is not None  # (both are PIPEs: __init__)
        return pipe

    def request(self, request: dict) -> dict:
        self._pipe("stdin").write(json.dumps(request) + "\n")
        self._pipe("stdin").flush()
        return self._read()

    def generate(self, prompt_ids: list[list[int]], params: dict, seeds: list[int]) -> list[list[int]]:
        """Sampled token ids per prompt; `params` are vLLM SamplingParams fields, `seeds` one per prompt."""
        request = {"op": "generate", "prompt_ids": prompt_ids, "params": params, "seeds": seeds}
        return self.request(request)["token_ids"]

    def load_weights(self, weights: dict[str, torch.Tensor]) -> float:
        """Write the weights to the folder and load them into the running engine; returns the server's seconds."""
        from safetensors.torch import save_file

        save_file({name: tensor.contiguous() for name, tensor in weights.items()}, self.folder / "model.safetensors")
        return self.request({"op": "load", "path": str(self.folder)})["seconds"]

    def close(self) -> None:
        self._finalizer()


def _stop_server(process: subprocess.Popen, folder: Path) -> None:
    if process.poll() is None and process.stdin is not None:
        process.stdin.close()  # the server's loop ends on EOF
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    shutil.rmtree(folder, ignore_errors=True)


class VLLMGenerator:
    """Sampling with a vLLM engine; the trainer re-scores the returned token ids itself.

    `engine` is a `VLLMServer` or anything with its `generate(prompt_ids, params, seeds) -> token ids` and
    `load_weights(weights)` (the tests' fake engine); `VLLMGenerator.create` starts the real one.
    """

    def __init__(self, engine: Any, tokenizer, eos: list[int], max_new_tokens: int, temperature: float,
                 top_p: float = 1.0):
        self.engine, self.tokenizer, self.eos = engine, tokenizer, list(eos)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.synced = 0

    @classmethod
    def create(cls, model_path: str, tokenizer, eos: list[int], max_new_tokens: int, temperature: float,
               top_p: float = 1.0, dtype: str = "float32", seed: int = 1,
               max_model_len: int = 0) -> "VLLMGenerator":
        python = vllm_python()
        if python is None:
            raise UsageError("generation_backend vllm needs vLLM in its own environment: run `make venv-vllm` "
                             "(or set PPO_RLHF_VLLM_PYTHON to a python that has vllm)")
        require(Path(model_path).is_dir(), f"generation_backend vllm needs a model folder, not {model_path}")
        server = VLLMServer(model_path, python, dtype=dtype, seed=seed, max_model_len=max_model_len)
        return cls(server, tokenizer, eos, max_new_tokens, temperature, top_p)

    def sync(self, policy: nn.Module) -> None:
        """Copy the policy's merged weights into the engine (every iteration: the policy changed)."""
        self.engine.load_weights(merged_state_dict(policy))
        self.synced += 1

    def generate(self, prompts: list[Prompt], columns: list[dict[str, Any]] | None = None):
        from ppo_rlhf.models.chat import chat_prompt_ids

        require(len(prompts) > 0, "no prompts to generate from")
        prompt_ids = [chat_prompt_ids(self.tokenizer, p) for p in prompts]
        # Seeds from torch's RNG keep runs reproducible under the trainer's seed; one per prompt, so that equal
        # prompts still get independent replies.
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        params = dict(
            n=1, temperature=self.temperature, top_p=self.top_p, top_k=-1, min_p=0.0, repetition_penalty=1.0,
            presence_penalty=0.0, frequency_penalty=0.0, max_tokens=self.max_new_tokens, stop_token_ids=self.eos,
            logprobs=None,
        )
        outputs = self.engine.generate(prompt_ids, params, seeds)
        rollout = rollout_from_tokens(self.tokenizer, prompts, prompt_ids, outputs, self.eos)
        if columns is not None:
            rollout.columns = columns
        return rollout


def make_generator(cfg, policy: nn.Module, tokenizer, model_path: str | None = None) -> Generator:
    """The backend `cfg.generation_backend` names, for a TrainConfig."""
    from ppo_rlhf.models.rollout import eos_token_ids

    require(cfg.generation_backend in BACKENDS, f"generation_backend must be one of {BACKENDS}")
    if cfg.generation_backend == "hf":
        from ppo_rlhf.parallel.distributed import current

        require(not (cfg.generation_merged_copy and current().fsdp),
                "generation_merged_copy is a single-process setting: under FSDP no process holds the whole weights")
        # log-probs always recorded (one fp32 log-softmax per step): they are pi_old with old_logprobs: generation,
        # and otherwise what the trainer's mismatch_kl and truncated importance sampling compare its forward with
        return HFGenerator(policy, tokenizer, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                           cfg.generation_batch_size or None, record_logprobs=True,
                           drop_finished=cfg.generation_drop_finished, merged=cfg.generation_merged_copy)
    from ppo_rlhf.models.loading import resolve_model_path
    from ppo_rlhf.models.precision import dtype_name, resolve_dtype

    # the engine holds the weights in the dtype the policy's frozen weights have (`dtype: auto` resolved here)
    dtype = dtype_name(resolve_dtype(cfg.dtype, next(policy.parameters()).device))
    return VLLMGenerator.create(model_path or resolve_model_path(cfg.policy_model), tokenizer,
                                eos_token_ids(policy, tokenizer), cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                                dtype=dtype, seed=cfg.seed)
