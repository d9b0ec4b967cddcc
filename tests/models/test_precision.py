"""The bf16 path (precision.py) and the rollout/trainer mismatch it brings: mismatch_kl, the first ratio's spread and
truncated importance sampling, on tiny llama/qwen2 models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models import precision
from ppo_rlhf.models.loading import LoraSettings, load_policy, load_value_model
from ppo_rlhf.models.precision import resolve_dtype, weight_dtypes
from ppo_rlhf.ppo.objectives import clipped_policy_loss, kl_k3, masked_mean, truncated_importance_weights
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp(f"precision_{request.param}")
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer, arch=request.param), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer, arch=request.param), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"policy": str(policy), "reward": str(reward), "prompts": str(prompts)}


def config(setup, out, **overrides) -> TrainConfig:
    values = dict(policy_model=setup["policy"], reward_model=setup["reward"], prompts=setup["prompts"], out=str(out),
                  iterations=1, batch_size=4, minibatch_size=2, epochs=2, max_new_tokens=6, reward_norm_samples=4,
                  lora_rank=4, tensorboard=False, quiet=True, policy_lr=1e-3, value_lr=1e-3, device="cpu")
    values.update(overrides)
    return build_config(TrainConfig, values)


def test_dtype_resolution(monkeypatch):
    assert resolve_dtype("float32", CPU) == torch.float32 and resolve_dtype("bfloat16", CPU) == torch.bfloat16
    assert precision.cpu_has_native_bf16("flags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    assert precision.cpu_has_native_bf16("flags\t\t: fpu amx_bf16\n")
    assert not precision.cpu_has_native_bf16("flags\t\t: fpu avx2 avx512f\n")
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        assert resolve_dtype("auto", CPU) == expected
    with pytest.raises(UsageError, match="dtype must be one of"):
        resolve_dtype("half", CPU)
    assert TrainConfig().dtype == "auto"


def test_bf16_storage_keeps_trained_parts_and_heads_fp32(setup):
    lora = LoraSettings(rank=4)
    policy = load_policy(setup["policy"], lora, dtype=torch.bfloat16)
    value = load_value_model(setup["reward"], lora, dtype=torch.bfloat16)
    for model in (policy, value):
        for name, param in model.named_parameters():
            kept = param.requires_grad or "lora_" in name or ".score." in name
            assert param.dtype == (torch.float32 if kept else torch.bfloat16), name
        assert any(p.requires_grad for p in model.parameters())
    assert value.base_model.model.score.original_module.weight.dtype == torch.float32  # the frozen reward head too
    # the base weights take half the bytes they took in fp32
    fp32 = load_policy(setup["policy"], lora)
    assert set(weight_dtypes(fp32)) == {torch.float32}
    frozen = sum(n for dtype, n in weight_dtypes(policy).items() if dtype == torch.bfloat16)
    assert frozen == sum(p.numel() for p in fp32.parameters() if not p.requires_grad)


def test_half_lm_head_reads_a_contiguous_input(setup):
    # torch's CPU matmul of a strided half [B, C, D] slice by the [V, D] head copies the head once per row
    # (bench/HISTORY.md, "A strided slice before the LM head"); generate's first step hands the head hidden[:, -1:],
    # so a half model makes it contiguous
    policy = load_policy(setup["policy"], LoraSettings(rank=4), dtype=torch.bfloat16)
    head = policy.get_output_embeddings()
    seen = []
    head.register_forward_hook(lambda module, args, output: seen.append(args[0].is_contiguous()))
    hidden = torch.randn(3, 5, head.in_features, dtype=torch.bfloat16)
    strided = hidden[:, -1:]
    assert not strided.is_contiguous()
    assert torch.equal(head(strided), head(strided.contiguous())) and seen == [True, True]
    assert not load_policy(setup["policy"], LoraSettings(rank=4)).get_output_embeddings()._forward_pre_hooks  # fp32


def test_lora_products_run_in_bf16_from_fp32_factors(setup):
    # bf16 activations meet the fp32 LoRA factors cast to bf16 (not the activations cast to fp32); the factors, and
    # so their gradients and AdamW's states, stay fp32. A float32 model is left exactly as PEFT made it.
    policy = load_policy(setup["policy"], LoraSettings(rank=4), dtype=torch.bfloat16)
    layer = policy.base_model.model.model.layers[0].self_attn.q_proj
    factor_a, factor_b = layer.lora_A["default"], layer.lora_B["default"]
    torch.nn.init.normal_(factor_b.weight)  # PEFT starts B at zero, which would hide the LoRA term
    assert not layer.cast_input_dtype_enabled and type(factor_a) is precision.HalfMatmulLinear
    assert factor_a.weight.dtype == factor_b.weight.dtype == torch.float32
    x = torch.randn(2, 3, layer.in_features, dtype=torch.bfloat16)
    out = layer(x)
    a, b = factor_a.weight.to(torch.bfloat16), factor_b.weight.to(torch.bfloat16)
    by_hand = layer.base_layer(x) + (x @ a.T @ b.T) * layer.scaling["default"]
    assert out.dtype == torch.bfloat16 and torch.equal(out, by_hand)
    out.float().square().sum().backward()
    assert factor_a.weight.grad.dtype == factor_b.weight.grad.dtype == torch.float32
    assert factor_a.weight.grad.abs().sum() > 0
    # undone: PEFT's own path (activations to fp32) again, within bf16 rounding of the half products
    precision.half_lora_products(policy, enabled=False)
    assert layer.cast_input_dtype_enabled and type(factor_a) is torch.nn.Linear
    assert torch.allclose(layer(x).float(), out.float(), rtol=0.05, atol=0.05)
    fp32 = load_policy(setup["policy"], LoraSettings(rank=4))
    fp32_layer = fp32.base_model.model.model.layers[0].self_attn.q_proj
    assert fp32_layer.cast_input_dtype_enabled and type(fp32_layer.lora_A["default"]) is torch.nn.Linear


def test_bf16_ppo_iteration(setup, tmp_path):
    trainer = PPOLoop(config(setup, tmp_path / "run", dtype="bfloat16"))
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0
    stats, batch = trainer.iteration(1)
    assert stats["skipped_steps"] == 0
    for key in ("pg_loss", "v_loss", "approx_kl", "grad_norm_policy", "grad_norm_value", "mismatch_kl", "ratio_spread"):
        assert math.isfinite(stats[key]), key
    assert stats["mismatch_kl"] >= 0 and stats["ratio_spread"] >= 0
    for name in ("old_logprobs", "ref_logprobs", "entropy", "old_values", "rewards", "kl", "advantages", "returns",
                 "logprobs", "tis_weights"):
        assert getattr(batch, name).dtype == torch.float32, name
    for model, optimizer in ((trainer.policy, trainer.policy_optimizer),
                             (trainer.value_model, trainer.value_optimizer)):
        trained = [p for p in model.parameters() if p.requires_grad]
        assert trained and all(p.dtype == torch.float32 for p in trained)
        states = [t for p in trained for t in optimizer.state[p].values() if torch.is_tensor(t) and t.numel() > 1]
        assert states and all(t.dtype == torch.float32 for t in states)
        assert any(p.dtype == torch.bfloat16 for p in model.parameters() if not p.requires_grad)


def test_recorded_logprobs_are_compared_with_the_forward_and_tis_corrects(setup, tmp_path):
    """A constructed mismatch: the rollout's recorded log-probs shifted by known amounts per token."""
    cap = 1.5
    trainer = PPOLoop(config(setup, tmp_path / "run", dtype="float32", tis_cap=cap))
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0
    torch.manual_seed(0)
    rollout = trainer.rollout(PROMPTS)
    act = rollout.action_mask
    shift = torch.linspace(-1.0, 1.0, act.numel()).reshape(act.shape) * act  # log pi_rollout - log pi_old
    rollout.logprobs = rollout.logprobs + shift
    batch = trainer.score(rollout)
    recorded = rollout.logprobs
    expected_weights = torch.exp(batch.old_logprobs - recorded).clamp(max=cap)
    on = act.bool()
    assert torch.allclose(batch.tis_weights[on], expected_weights[on])
    assert batch.tis_weights[on].max() == pytest.approx(cap) and batch.tis_weights[on].min() < 1
    assert torch.allclose(batch.tis_weights[on], torch.exp(-shift[on]).clamp(max=cap), atol=1e-4)
    expected_kl = masked_mean(kl_k3(batch.old_logprobs, recorded), act)
    mismatch_kl = trainer.batch_stats(batch)["mismatch_kl"]
    assert mismatch_kl == pytest.approx(float(expected_kl)) and mismatch_kl > 0.05
    # off by default: the same rollout gives weights 1 and the same measured mismatch
    plain = PPOLoop(config(setup, tmp_path / "plain", dtype="float32"))
    plain.reward_mean, plain.reward_std = 0.0, 1.0
    unweighted = plain.score(rollout)
    assert torch.equal(unweighted.tis_weights, torch.ones_like(act))
    assert plain.batch_stats(unweighted)["mismatch_kl"] == pytest.approx(mismatch_kl, rel=1e-4)


def test_token_weights_scale_each_token_of_the_policy_loss():
    g = torch.Generator().manual_seed(0)
    new = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    old, adv = torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=g) > 0.3).double()
    rollout = old + torch.randn(3, 5, generator=g, dtype=torch.float64)
    weights = truncated_importance_weights(old, rollout, 2.0)
    assert torch.equal(weights, torch.exp(old - rollout).clamp(max=2.0)) and not weights.requires_grad
    weighted = clipped_policy_loss(new, old, adv, mask, 0.2, token_weights=weights)
    ratio = torch.exp(new - old)
    per_token = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * weights
    assert torch.allclose(weighted.loss, (per_token * mask).sum() / mask.sum())
    assert weighted.ratio_spread == ((ratio - 1).abs() * mask).max()
    unweighted = clipped_policy_loss(new, old, adv, mask, 0.2, token_weights=torch.ones_like(old))
    assert torch.equal(unweighted.loss, clipped_policy_loss(new, old, adv, mask, 0.2).loss)


@pytest.mark.parametrize("flags, message", [
    (dict(tis_cap=-1.0), "tis_cap: expected a number >= 0"),
    (dict(tis_cap=2.0, old_logprobs="generation"), "tis_cap needs old_logprobs: recompute"),
    (dict(dtype="half"), "dtype: expected one of auto, float32, bfloat16, float16"),
])
def test_bad_settings_are_refused(setup, tmp_path, flags, message):
    with pytest.raises(UsageError, match=message):
        config(setup, tmp_path / "run", **flags).validate()
