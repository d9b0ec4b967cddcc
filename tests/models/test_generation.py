"""Generation backends through their interface: HF generate, and vLLM with a fake engine on CPU."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models import generation
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.models.generation import HFGenerator, VLLMGenerator
from ppo_rlhf.models.loading import LoraSettings, add_policy_lora
from ppo_rlhf.models.logprobs import token_logprobs
from ppo_rlhf.models.merge import merged_state_dict
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop

import tiny


class FakeEngine:
    """VLLMServer's surface: generate(prompt_ids, params) -> token ids per prompt; load_weights(weights)."""

    def __init__(self, replies: list[list[int]]):
        self.replies, self.calls, self.weights = replies, [], None

    def generate(self, prompt_ids, params, seeds):
        self.calls.append((prompt_ids, params, seeds))
        return [list(self.replies[i % len(self.replies)]) for i in range(len(prompt_ids))]

    def load_weights(self, weights):
        self.weights = dict(weights)


def lora_policy(tokenizer):
    policy = add_policy_lora(tiny.tiny_causal_lm(tokenizer), LoraSettings(rank=4, alpha=8))
    with torch.no_grad():  # a non-zero adapter, so merging changes the weights
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return policy


def test_merged_state_dict_is_plain_hf_and_merged(tokenizer):
    policy = lora_policy(tokenizer)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    weights = merged_state_dict(policy)
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(weights) == set(reference)  # HF names: model.layers.0.self_attn.q_proj.weight, ...
    assert all(torch.allclose(weights[k], reference[k], atol=1e-6) for k in reference)
    assert not torch.allclose(weights["model.layers.0.self_attn.q_proj.weight"],
                              before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    # the policy itself is untouched (unmerged again)
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_vllm_generator_builds_rollout_from_token_ids(tokenizer):
    eos = tokenizer.eos_token_id
    word = tokenizer("happy day", add_special_tokens=False)["input_ids"]
    engine = FakeEngine([word + [eos, 7, 7], word])  # finished (tail after EOS dropped), unfinished
    gen = VLLMGenerator(engine, tokenizer, [eos], max_new_tokens=len(word) + 3, temperature=0.7)
    rollout = gen.generate(["Hello", "Tell me a story"])
    prompts, params, seeds = engine.calls[0]
    assert len(seeds) == 2 and seeds[0] != seeds[1]  # one seed per prompt: equal prompts get independent replies
    assert prompts[0] == chat_prompt_ids(tokenizer, "Hello")
    assert params["temperature"] == 0.7 and params["top_k"] == -1 and params["stop_token_ids"] == [eos]
    assert params["logprobs"] is None  # the engine's log-probs are never asked for
    assert rollout.reply_ids == [word + [eos], word]
    assert rollout.finished.tolist() == [True, False]
    assert rollout.reply_texts[0] == tokenizer.decode(word)
    # the right-padded batch follows the conventions (action mask on exactly the reply tokens)
    assert rollout.action_mask.sum(1).tolist() == [len(word) + 1, len(word)]

    policy = lora_policy(tokenizer)
    gen.sync(policy)
    assert set(engine.weights) == set(merged_state_dict(policy)) and gen.synced == 1


def tiny_trainer_config(root: Path, tokenizer, **settings) -> TrainConfig:
    """A TrainConfig of two prompts, batch 2, on a tiny policy and reward model saved under `root`."""
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Hi", "Tell me a story"]))
    return build_config(TrainConfig, dict(policy_model=str(policy), reward_model=str(reward), prompts=str(prompts),
                                          out=str(root / "run"), batch_size=2, minibatch_size=2, max_new_tokens=4,
                                          reward_norm_samples=2, lora_rank=4, quiet=True, tensorboard=False,
                                          **settings))


def test_trainer_recomputes_logprobs_from_vllm_tokens(tmp_path, tokenizer, monkeypatch):
    cfg = tiny_trainer_config(tmp_path, tokenizer)
    trainer = PPOLoop(cfg)
    engine = FakeEngine([[5, 6, tokenizer.eos_token_id], [8, 9, 10, 11]])
    trainer.generator = VLLMGenerator(engine, trainer.tokenizer, [tokenizer.eos_token_id], 4, cfg.temperature)
    rollout = trainer.rollout(["Hi", "Tell me a story"])
    assert trainer.generator.synced == 1 and engine.weights is not None
    trainer.rollout(["Hi", "Tell me a story"])
    assert trainer.generator.synced == 1  # unchanged policy: no second copy
    batch = trainer.score(rollout)
    expected = token_logprobs(trainer.policy, rollout.input_ids, rollout.attention_mask, cfg.temperature)
    act = batch.action_mask.bool()
    assert torch.allclose(batch.old_logprobs[act], expected[act], atol=1e-6)
    trainer.policy_version += 1  # an optimiser step happened: the next rollout syncs again
    trainer.rollout(["Hi", "Tell me a story"])
    assert trainer.generator.synced == 2


def test_hf_generator_is_generate_rollout(tokenizer):
    policy = tiny.tiny_causal_lm(tokenizer)
    gen = HFGenerator(policy, tokenizer, max_new_tokens=3, temperature=1.0)
    torch.manual_seed(0)
    a = gen.generate(["Hello", "Tell me"])
    from ppo_rlhf.models.rollout import generate_rollout

    torch.manual_seed(0)
    b = generate_rollout(policy, tokenizer, ["Hello", "Tell me"], 3, 1.0)
    assert a.reply_ids == b.reply_ids


def test_vllm_backend_without_vllm_is_a_usage_error(tokenizer, monkeypatch):
    monkeypatch.setattr(generation, "vllm_python", lambda: None)  # no .venv-vllm, no vllm in this environment
    with pytest.raises(UsageError, match="make venv-vllm"):
        VLLMGenerator.create("x", tokenizer, [0], 4, 0.7)


def test_vllm_python_needs_an_environment_that_has_vllm(monkeypatch):
    monkeypatch.setenv("PPO_RLHF_VLLM_PYTHON", "/opt/gpu-venv/bin/python")
    assert generation.vllm_python() == "/opt/gpu-venv/bin/python"  # named explicitly: used as is
    # the probe asks the other python itself (the project's venv has no vllm: what a failed `make venv-vllm` leaves)
    assert generation._imports_vllm(sys.executable) == (importlib.util.find_spec("vllm") is not None)


def test_merged_copy_samples_what_the_policy_samples_and_follows_its_updates(tokenizer):
    policy = lora_policy(tokenizer)  # float32: the merged weights equal W + B A * scale to rounding
    plain = HFGenerator(policy, tokenizer, max_new_tokens=5, temperature=1.0, record_logprobs=True)
    merged = HFGenerator(policy, tokenizer, max_new_tokens=5, temperature=1.0, record_logprobs=True, merged=True)
    prompts = ["Hello", "Tell me a story", "Hi"]
    copies = []
    for update in range(2):
        plain.sync(policy)
        merged.sync(policy)
        assert merged.policy is not policy and not hasattr(merged.policy, "get_base_model")  # a plain HF model
        weights = merged_state_dict(policy)
        assert all(torch.equal(merged.policy.state_dict()[k], weights[k]) for k in weights)
        torch.manual_seed(update)
        a = plain.generate(prompts)
        torch.manual_seed(update)
        b = merged.generate(prompts)
        assert a.reply_ids == b.reply_ids
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
        copies.append(merged.policy)
        with torch.no_grad():  # an optimiser step on the adapter: the next sync must carry it
            for name, p in policy.named_parameters():
                if "lora_A" in name:
                    p.add_(torch.randn_like(p) * 0.5)
    assert copies[0] is copies[1]  # refreshed in place, not rebuilt


def test_trainer_samples_from_the_merged_copy_and_scores_on_the_policy(tmp_path, tokenizer):
    cfg = tiny_trainer_config(tmp_path, tokenizer, generation_merged_copy=True, dtype="float32")
    trainer = PPOLoop(cfg)
    rollout = trainer.rollout(["Hi", "Tell me a story"])
    assert isinstance(trainer.generator, HFGenerator) and trainer.generator.policy is not trainer.policy
    batch = trainer.score(rollout)  # log pi_old recomputed on the policy itself
    expected = token_logprobs(trainer.policy, rollout.input_ids, rollout.attention_mask, cfg.temperature)
    act = batch.action_mask.bool()
    assert torch.allclose(batch.old_logprobs[act], expected[act], atol=1e-6)
    assert torch.allclose(rollout.logprobs[act], expected[act], atol=1e-4)  # the copy's own, float32 here


def test_merged_copy_is_a_setting_of_the_hf_backend():
    with pytest.raises(UsageError, match="generation_merged_copy"):
        build_config(TrainConfig, dict(policy_model="x", reward_model="y", prompts="p.jsonl",
                                       generation_merged_copy=True, generation_backend="vllm"))
