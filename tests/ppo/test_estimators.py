"""Critic-free advantage estimators (RLOO, GRPO), the EV-gated one, group sampling, PPO-ptx and LR schedules."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.parallel.distributed import Dist
from ppo_rlhf.ppo.advantages import EVGatedAdvantages, GAEAdvantages, RLOOAdvantages
from ppo_rlhf.ppo.checkpoint import latest_checkpoint
from ppo_rlhf.ppo.objectives import broadcast_to_tokens, grpo_advantages, rloo_advantages, shape_rewards
from ppo_rlhf.ppo.schedules import lr_lambda
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop
from ppo_rlhf.train import train

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time"]


# ---------------------------------------------------------------- pure math, exact small cases


def test_rloo_leave_one_out_exact():
    rewards = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])
    adv = rloo_advantages(rewards, 3)
    # group 1: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - 1.5 = 4.5; group 2: 0 - 1.5, 0 - 1.5, 3 - 0
    assert torch.allclose(adv, torch.tensor([-3.0, -1.5, 4.5, -1.5, -1.5, 3.0]))
    # = k/(k-1) (R - group mean), and sums to zero per group
    assert torch.allclose(adv[:3], 1.5 * (rewards[:3] - 3.0))
    assert torch.allclose(adv.reshape(2, 3).sum(1), torch.zeros(2))


def test_grpo_group_normalisation_exact():
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0])
    adv = grpo_advantages(rewards, 2, eps=0.0)
    # group (1, 3): mean 2, unbiased std sqrt(2): -1/sqrt2, +1/sqrt2; a group of equal rewards gets 0 (eps > 0)
    assert torch.allclose(adv[:2], torch.tensor([-1.0, 1.0]) / math.sqrt(2))
    assert torch.equal(grpo_advantages(rewards, 2, eps=1e-6)[2:], torch.zeros(2))


def test_sequence_reward_and_broadcast():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    kl = torch.tensor([[9.0, 0.5, 0.25, 9.0], [9.0, 9.0, 1.0, 9.0]])  # garbage off the mask is ignored
    totals = shape_rewards(torch.tensor([1.0, 2.0]), kl, mask, beta=0.1).sequence_totals
    assert torch.allclose(totals, torch.tensor([1.0 - 0.075, 2.0 - 0.1]))
    spread = broadcast_to_tokens(torch.tensor([3.0, -1.0]), mask)
    assert torch.equal(spread, torch.tensor([[0.0, 3.0, 3.0, 0.0], [0.0, 0.0, -1.0, 0.0]]))


def test_gae_and_rloo_read_one_shaped_record_alike():
    """One ShapedRewards feeds both kinds of estimator: with gamma = lambda = 1 and no values, GAE's return at a
    reply's first token is the sum of its per-token rewards, RLOO's return its sequence total; they are equal."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    kl = torch.tensor([[0.5, 0.25, 0.125, 9.0], [9.0, 1.0, 0.5, 0.25]])
    shaped = shape_rewards(torch.tensor([1.0, -2.0]), kl, mask, beta=0.2)
    _, _, gae_returns = GAEAdvantages(1.0, 1.0, Dist())(shaped, torch.zeros(2, 4))
    _, _, rloo_returns = RLOOAdvantages(2)(shaped, None)
    expected = torch.tensor([1.0 - 0.2 * 0.875, -2.0 - 0.2 * 1.75])
    first_tokens = [0, 1], [0, 1]
    assert torch.allclose(gae_returns[first_tokens], expected) and torch.allclose(rloo_returns[first_tokens], expected)


def test_groups_must_divide():
    with pytest.raises(UsageError):
        rloo_advantages(torch.zeros(5), 2)
    with pytest.raises(UsageError):
        grpo_advantages(torch.zeros(4), 1)


def ev_gated(values: list[list[float]]) -> tuple[EVGatedAdvantages, tuple[torch.Tensor, ...]]:
    """4 replies of 2 tokens in groups of 2, scores 1, 0, 0, 1 at the last token, no KL; gamma = lambda = 1, so a
    token's GAE return is its reply's score and its raw advantage the score minus its value."""
    estimator = EVGatedAdvantages(GAEAdvantages(1.0, 1.0, Dist()), RLOOAdvantages(2), Dist())
    shaped = shape_rewards(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, 2), torch.ones(4, 2), beta=0.0)
    return estimator, estimator(shaped, torch.tensor(values))


def test_ev_gate_uses_the_critic_while_it_explains_the_batch():
    estimator, (advantages, raw, returns) = ev_gated([[0.9, 0.9], [0.1, 0.1], [0.2, 0.2], [0.8, 0.8]])
    # returns 1 1 | 0 0 | 0 0 | 1 1 (mean 1/2, squares summed 2); returns - values +-0.1 (x4), +-0.2 (x4): squares
    # summed 0.2, mean 0: explained variance 1 - 0.2 / 2 = 0.9 > 0, so GAE's advantages, whitened (unbiased std
    # sqrt(0.2 / 7))
    assert estimator.stats() == {"ev_gate": 1.0}
    expected_raw = torch.tensor([[0.1, 0.1], [-0.1, -0.1], [-0.2, -0.2], [0.2, 0.2]])
    assert torch.allclose(raw, expected_raw, atol=1e-6)
    assert torch.allclose(advantages, expected_raw / math.sqrt(0.2 / 7), atol=1e-4)
    assert torch.equal(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))


def test_ev_gate_falls_back_to_the_group_baseline_when_the_critic_explains_nothing():
    estimator, (advantages, raw, returns) = ev_gated([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    # returns - values = +-1 on every token: squares summed 8 against the returns' 2, explained variance -3 <= 0;
    # the group baseline: each score minus the other reply's of its prompt, (1 - 0, 0 - 1 | 0 - 1, 1 - 0)
    assert estimator.stats() == {"ev_gate": 0.0}
    expected = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0]])
    assert torch.equal(advantages, expected) and torch.equal(raw, expected)
    # the critic still trains on GAE's returns
    assert torch.equal(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))


def test_ev_gate_stays_shut_when_the_returns_do_not_vary():
    estimator = EVGatedAdvantages(GAEAdvantages(1.0, 1.0, Dist()), RLOOAdvantages(2), Dist())
    shaped = shape_rewards(torch.ones(2), torch.zeros(2, 2), torch.ones(2, 2), beta=0.0)  # rewards 0, 1 per reply
    advantages, _, _ = estimator(shaped, torch.full((2, 2), 0.5))
    # every return is 1: the explained variance is nan (no variance to explain), the critic is not trusted
    assert estimator.stats() == {"ev_gate": 0.0} and torch.equal(advantages, torch.zeros(2, 2))


def test_lr_lambda_shapes():
    warm = lr_lambda("linear", warmup_steps=2, total_steps=6)
    assert [warm(s) for s in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    cos = lr_lambda("cosine", 0, 4)
    assert [cos(s) for s in range(5)] == pytest.approx([1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5,
                                                        0.5 - 0.5 * math.cos(math.pi / 4), 0.0])
    assert lr_lambda("constant", 0, 10)(7) == 1.0


# ---------------------------------------------------------------- on tiny models


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("estimators")
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    ptx = root / "ptx.jsonl"
    ptx.write_text("".join(json.dumps({"text": t}) + "\n" for t in tiny.CORPUS))
    return {"policy": str(policy), "reward": str(reward), "prompts": str(prompts), "ptx": str(ptx)}


def config(setup, out, **overrides) -> TrainConfig:
    values = dict(policy_model=setup["policy"], reward_model=setup["reward"], prompts=setup["prompts"], out=str(out),
                  iterations=2, batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=5, reward_norm_samples=4,
                  lora_rank=4, checkpoint_every=1, tensorboard=False, quiet=True, policy_lr=1e-3, value_lr=1e-3,
                  dtype="float32")  # exact resumes asserted
    values.update(overrides)
    return build_config(TrainConfig, values)


@pytest.mark.parametrize("flags, message", [
    (dict(advantage_estimator="rloo"), "group_size >= 2"),
    (dict(advantage_estimator="ev-gated"), "group_size >= 2"),
    (dict(advantage_estimator="nope"), "advantage_estimator"),
    (dict(group_size=3), "multiple of group_size"),
    (dict(ptx_coef=0.5), "ptx_data"),
    (dict(lr_schedule="step"), "lr_schedule"),
    (dict(generation_backend="tgi"), "generation_backend"),
    (dict(old_logprobs="engine"), "old_logprobs"),
    (dict(old_logprobs="generation", generation_backend="vllm"), "never trusted"),
])
def test_validation(setup, tmp_path, flags, message):
    with pytest.raises(UsageError, match=message):
        config(setup, tmp_path / "run", **flags)


def test_group_sampling_repeats_each_prompt(setup, tmp_path):
    trainer = PPOLoop(config(setup, tmp_path / "run", advantage_estimator="rloo", group_size=2, batch_size=4))
    prompts = trainer.next_prompts()
    assert len(prompts) == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[0] != prompts[2]
    assert trainer.value_model is None and set(trainer.models) == {"policy"}


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_critic_free_run_and_resume(setup, tmp_path, estimator):
    cfg = config(setup, tmp_path / "run", advantage_estimator=estimator, group_size=2, epochs=2)
    trainer = PPOLoop(cfg)
    rollout = trainer.rollout(trainer.next_prompts())
    batch = trainer.score(rollout)
    act = batch.action_mask
    # one advantage per reply, on every reply token, from the sequence rewards of its group
    per_reply = shape_rewards(batch.scores, batch.kl, act, trainer.reward_beta).sequence_totals
    # (GRPO: from the scores alone; its KL penalty is a loss term, test_grpo_kl_is_a_loss_term_not_a_reward)
    expected = (rloo_advantages(per_reply, 2) if estimator == "rloo"
                else grpo_advantages(batch.scores, 2, cfg.grpo_eps))
    assert torch.allclose(batch.advantages, broadcast_to_tokens(expected, act), atol=1e-6)
    assert torch.all(batch.old_values == 0)

    run_dir = train(cfg)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert len(history) == 2
    for row in history:
        assert all(math.isnan(row[k]) for k in ("v_loss", "ev", "vclipfrac")), row
        assert math.isfinite(row["pg_loss"])
    last = latest_checkpoint(run_dir)
    assert (last / "policy" / "adapter_model.safetensors").is_file() and not (last / "value").exists()
    # resume with more iterations: works without a value model
    more = build_config(TrainConfig, {**vars(cfg), "iterations": 3})
    train(more, resume=True)
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 3


def test_ev_gated_run_trains_the_critic_every_iteration_and_logs_the_gate(setup, tmp_path):
    cfg = config(setup, tmp_path / "run", advantage_estimator="ev-gated", group_size=2, iterations=3)
    run_dir = train(cfg)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert len(history) == 3
    for row in history:
        # the gate is the sign of the batch's explained variance, the dashboard's ev
        assert row["ev_gate"] == float(row["ev"] > 0), row
        assert math.isfinite(row["v_loss"]) and math.isfinite(row["grad_norm_value"])  # the critic trained
    assert list(history[0]).index("ev_gate") == list(history[0]).index("ev") + 1
    assert (latest_checkpoint(run_dir) / "value").is_dir()


def test_ptx_and_schedule_resume(setup, tmp_path):
    cfg = config(setup, tmp_path / "run", ptx_coef=0.5, ptx_data=setup["ptx"], ptx_batch_size=2,
                 lr_schedule="cosine", warmup_iterations=1, iterations=2)
    trainer = PPOLoop(cfg)
    assert set(trainer.schedulers) == {"policy", "value"}
    # warm-up: 1 iteration = epochs * batch/minibatch = 2 steps -> first lr is half the peak
    assert trainer.policy_optimizer.param_groups[0]["lr"] == pytest.approx(cfg.policy_lr / 2)
    run_dir = train(cfg)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert all(math.isfinite(row["ptx_loss"]) and row["ptx_loss"] > 0 for row in history)
    saved = torch.load(latest_checkpoint(run_dir) / "state.pt", weights_only=True)
    assert saved["trainer"]["schedulers"]["policy"]["last_epoch"] == 4 and saved["trainer"]["ptx"] is not None
    # the resumed trainer continues the schedule where it stopped
    more = build_config(TrainConfig, {**vars(cfg), "iterations": 3})
    train(more, resume=True)
    saved = torch.load(latest_checkpoint(run_dir) / "state.pt", weights_only=True)
    assert saved["trainer"]["schedulers"]["policy"]["last_epoch"] == 6


def test_ptx_gradient_is_the_lm_loss(setup, tmp_path):
    """The ptx term's gradient is exactly ptx_coef times the gradient of the mean next-token NLL."""
    from ppo_rlhf.ppo.ptx import ptx_nll

    cfg = config(setup, tmp_path / "run", ptx_coef=2.0, ptx_data=setup["ptx"], ptx_batch_size=3)
    trainer = PPOLoop(cfg)
    state = trainer.ptx.state()
    trainer.policy.zero_grad()
    trainer.ptx_step()
    params = [p for p in trainer.policy.parameters() if p.requires_grad]
    got = [p.grad.clone() for p in params]
    trainer.ptx.load(state)
    trainer.policy.zero_grad()
    ids, att = trainer.ptx.next_batch()
    (ptx_nll(trainer.policy, ids, att) * 2.0).backward()
    assert all(torch.allclose(a, p.grad) for a, p in zip(got, params))


def test_grpo_kl_is_a_loss_term_not_a_reward(setup, tmp_path):
    """Issue 13 item 12: tied scores give GRPO no advantage, whatever the KL (RLOO keeps its small KL difference);
    GRPO's policy loss adds beta * the k3 estimate of KL(pi || pi_ref) instead."""
    from ppo_rlhf.ppo.advantages import GRPOAdvantages, RLOOAdvantages
    from ppo_rlhf.ppo.objectives import clipped_policy_loss, kl_k3, masked_mean

    scores, mask = torch.tensor([0.5, 0.5]), torch.ones(2, 2)
    kl = torch.tensor([[0.5, 0.5], [0.5, 0.6]])  # summed: 1.0 and 1.1
    # GRPO's default is kl_in: loss, so the beta the estimator sees (the one in the reward) is 0
    grpo, _, _ = GRPOAdvantages(2, 1e-6)(shape_rewards(scores, kl, mask, beta=0.0), None)
    rloo, _, _ = RLOOAdvantages(2)(shape_rewards(scores, kl, mask, beta=0.05), None)
    assert torch.equal(grpo, torch.zeros(2, 2))
    assert torch.allclose(rloo[:, 0], torch.tensor([0.005, -0.005]), atol=1e-6)
    # kl_in: reward would fold it in, and the group std blows the tiny KL difference up to a full-size advantage
    folded, _, _ = GRPOAdvantages(2, 1e-6)(shape_rewards(scores, kl, mask, beta=0.05), None)
    assert torch.allclose(folded[:, 0], torch.tensor([0.7071, -0.7071]), atol=1e-3)

    cfg = config(setup, tmp_path / "run", advantage_estimator="grpo", group_size=2, beta=0.3)
    assert (cfg.kl_placement, cfg.kl_kind) == ("loss", "k3")  # GRPO's defaults: one mechanism, one case of it
    trainer = PPOLoop(cfg)
    with torch.no_grad():  # move the policy away from the reference, so the KL term is not zero
        for p in trainer.policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    batch = trainer.score(trainer.rollout(trainer.next_prompts()))
    act = batch.action_mask
    loss, numbers = trainer.policy_loss(batch, float(act.sum()), 1.0)
    with torch.no_grad():
        new = trainer.actor.logprobs(batch.input_ids, batch.attention_mask, 0)
    pg = clipped_policy_loss(new, batch.old_logprobs, batch.advantages, act, cfg.clip_range).loss
    k3 = masked_mean(kl_k3(batch.ref_logprobs, new), act)
    assert float(k3) > 1e-4 and numbers["pg_loss"] == pytest.approx(float(pg), abs=1e-6)
    assert float(loss) == pytest.approx(float(pg + 0.3 * k3), rel=1e-5, abs=1e-7)
    # the rewards hold the score alone: no KL in them (the dashboard's kl is the k3 estimate at pi_old)
    rows = torch.arange(act.shape[0])
    last = act.shape[1] - 1 - act.flip(1).argmax(1)
    expected = torch.zeros_like(batch.rewards)
    expected[rows, last] = batch.scores
    assert torch.equal(torch.where(act.bool(), batch.rewards, 0.0), expected) and float(batch.kl.abs().sum()) > 0
