"""Padding-free passes (`padding_free`, ppo_rlhf/models/packing.py) give the padded path's numbers: per-token log-probs,
entropies, values and reward scores, then the PPO losses and gradients, in fp32 on tiny llama and qwen2 models,
with a 1-token reply and a reply at the cap in the batch."""

from __future__ import annotations

import json

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.models.logprobs import first_reply_position, token_logprobs
from ppo_rlhf.models.packing import Packing
from ppo_rlhf.models.rollout import Rollout, build_batch
from ppo_rlhf.models.scores import RewardModel, reward_scores, sequence_values
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop, trainable_parameters

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you today?", "Once upon a time", "What is the source of energy?"]
CAP = 6
REPLY_LENGTHS = [1, CAP, 3, 5]  # a reply that is its EOS alone, one cut at the cap, two in between
RTOL = 1e-5


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Within 1e-5 relative to the tensor's largest entry. Elementwise it cannot be: the two paths multiply matrices
    of other shapes, so each entry carries float32 rounding of the whole sum (~1e-6 of the largest terms), and a
    gradient entry near 0 is mostly that rounding."""
    return float((a - b).abs().max()) <= RTOL * float(b.abs().max())


def fixed_rollout(tokenizer, lengths: list[int] = REPLY_LENGTHS, seed: int = 0) -> Rollout:
    """Replies of the given lengths: random non-EOS tokens, ended by EOS when shorter than the cap."""
    generator = torch.Generator().manual_seed(seed)
    eos = tokenizer.eos_token_id
    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in PROMPTS]
    reply_ids = []
    for n in lengths:
        tokens = torch.randint(3, len(tokenizer), (n,), generator=generator).tolist()
        reply_ids.append(tokens if n == CAP else tokens[:-1] + [eos])
    input_ids, attention_mask, action_mask = build_batch(prompt_ids, reply_ids, tokenizer.pad_token_id)
    return Rollout(prompts=list(PROMPTS), prompt_ids=prompt_ids, reply_ids=reply_ids,
                   reply_texts=tokenizer.batch_decode(reply_ids, skip_special_tokens=True),
                   finished=torch.tensor([n < CAP for n in lengths]), input_ids=input_ids,
                   attention_mask=attention_mask, action_mask=action_mask)


def test_pack_and_unpack_put_every_real_token_back():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    ids = torch.arange(12).reshape(3, 4)
    packing = Packing.of(mask)
    assert packing.pack(ids).tolist() == [0, 1, 2, 4, 8, 9, 10, 11]  # sequence after sequence
    assert packing.cols.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]  # the position ids restart at each sequence
    assert torch.equal(packing.unpack(packing.pack(ids)), ids * mask)


@pytest.mark.parametrize("arch,attention", [("llama", "sdpa"), ("qwen2", "sdpa"), ("llama", "eager")])
def test_per_token_outputs_and_scores_equal_the_padded_path(tokenizer, arch, attention):
    rollout = fixed_rollout(tokenizer)
    ids, att = rollout.input_ids, rollout.attention_mask
    policy = tiny.tiny_causal_lm(tokenizer, arch=arch, initializer_range=0.3, attn_implementation=attention)
    reward = tiny.tiny_reward_model(tokenizer, arch=arch)
    first = first_reply_position(rollout.prompt_ids)
    # where packing computes a log-prob: from `first`, wherever the next token is real; 0 elsewhere
    targets_real = att[:, 1:].bool() & (torch.arange(ids.shape[1] - 1) >= first)
    assert targets_real.sum() > rollout.action_mask.sum()  # prompt positions of the longer prompts too
    with torch.no_grad():
        for chunk in (None, 2):  # one head pass, and several chunks of B x 2 positions
            padded = token_logprobs(policy, ids, att, 0.7, with_entropy=True, chunk_size=chunk, first=first)
            packed = token_logprobs(policy, ids, att, 0.7, with_entropy=True, chunk_size=chunk, first=first,
                                    padding_free=True)
            for a, b in zip(packed, padded):
                assert close(a[targets_real], b[targets_real])
                assert torch.all(a[~targets_real] == 0)
        values = sequence_values(reward, ids, att), sequence_values(reward, ids, att, padding_free=True)
        real = att[:, :-1].bool()
        assert close(values[1][real], values[0][real]) and torch.all(values[1][~real] == 0)
        for size in (None, 3):  # the whole batch in one pass, and sub-batches of 3 rows and 1 row
            scores = reward_scores(reward, ids, att, size), reward_scores(reward, ids, att, size, padding_free=True)
            assert close(scores[1], scores[0])
    assert policy.config._attn_implementation == attention  # the packed passes' attention was put back
    # the 1-token reply's only log-prob, and the reply at the cap's last one, are there
    assert padded[0][0, len(rollout.prompt_ids[0]) - 1] != 0 and packed[0][1, att[1].sum() - 2] != 0


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp(f"packing_{request.param}")
    arch = request.param
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer, arch=arch, initializer_range=0.3), tokenizer,
                            root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer, arch=arch), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"policy": str(policy), "reward": str(reward), "prompts": str(prompts), "root": root}


def one_step(setup, padding_free: bool, **overrides) -> tuple[dict, dict[str, float], list[torch.Tensor]]:
    """Score a fixed rollout and take one minibatch step's gradients (not applied): (experience, stats, grads)."""
    cfg = build_config(TrainConfig, dict(
        policy_model=setup["policy"], reward_model=setup["reward"], prompts=setup["prompts"],
        out=str(setup["root"] / f"run_{padding_free}"), batch_size=4, minibatch_size=4, micro_batch_size=2,
        max_new_tokens=CAP, lora_rank=4, tensorboard=False, quiet=True, dtype="float32", max_grad_norm=1e9,
        beta=0.1, padding_free=padding_free, **overrides))
    trainer = PPOLoop(cfg)
    trainer.reward_mean, trainer.reward_std = 0.2, 1.5
    torch.manual_seed(5)
    with torch.no_grad():  # non-zero adapters (LoRA's B starts at 0), the same in both runs
        for p in trainable_parameters(trainer.policy) + trainable_parameters(trainer.value_model):
            p.add_(0.05 * torch.randn_like(p))
    experience = trainer.score(fixed_rollout(trainer.tokenizer))
    # ratios spread around 1, so that some clip and the loss is not the ~0 of whitened advantages times ratio 1
    noise = 0.3 * torch.randn(experience.action_mask.shape, generator=torch.Generator().manual_seed(7))
    experience.old_logprobs = experience.old_logprobs + noise * experience.action_mask
    trainer.set_training(True)
    stats = trainer.minibatch_step(experience, [3, 0, 2, 1], trainer.roles)  # micro-batches {3, 0} and {2, 1}
    grads = [p.grad.clone() for p in trainable_parameters(trainer.policy) + trainable_parameters(trainer.value_model)]
    return experience, stats, grads


@pytest.mark.parametrize("overrides", [{}, {"entropy_coef": 0.01, "kl_in": "loss"}],
                         ids=["frozen-head", "checkpointed-head"])
def test_losses_and_gradients_equal_the_padded_path(setup, overrides):
    padded, padded_stats, padded_grads = one_step(setup, False, **overrides)
    packed, packed_stats, packed_grads = one_step(setup, True, **overrides)
    act = padded.action_mask
    assert act[0].sum() == 1 and act[1].sum() == CAP  # the 1-token reply and the reply at the cap
    for name in ("old_logprobs", "ref_logprobs", "entropy", "old_values", "rewards", "advantages", "returns"):
        assert close(getattr(packed, name) * act, getattr(padded, name) * act), name
    assert close(packed.raw_scores, padded.raw_scores)
    for key in ("pg_loss", "v_loss", "clipfrac", "approx_kl", "grad_norm_policy", "grad_norm_value"):
        assert packed_stats[key] == pytest.approx(padded_stats[key], rel=RTOL, abs=1e-9), key
    assert padded_stats["clipfrac"] > 0 and padded_stats["pg_loss"] != 0
    assert all(float(g.abs().max()) > 0 for g in padded_grads)
    for a, b in zip(packed_grads, padded_grads):
        assert close(a, b)


def test_the_frozen_reward_model_role_packs_too(tokenizer):
    """The critic-free estimators' RewardModel scores (prompt, reply) texts the same packed or padded."""
    rollout = fixed_rollout(tokenizer)
    model = tiny.tiny_reward_model(tokenizer, arch="qwen2")
    padded, packed = (RewardModel(model, tokenizer, padding_free=flag).score_texts(rollout.prompts,
                                                                                  rollout.reply_texts, 3)
                      for flag in (False, True))
    assert close(packed, padded)


def test_an_architecture_not_checked_is_refused(tokenizer):
    model = tiny.tiny_causal_lm(tokenizer)
    model.config.model_type = "gpt_bigcode"  # stands for any architecture the equality tests do not cover
    rollout = fixed_rollout(tokenizer)
    with pytest.raises(UsageError, match="padding_free is checked on llama, qwen2 models only"):
        token_logprobs(model, rollout.input_ids, rollout.attention_mask, 1.0, padding_free=True)
