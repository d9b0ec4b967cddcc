"""Issue 18's options (all off by default): critic warm-up, decoupled and length-adaptive GAE lambda, asymmetric and
dual clipping, where the KL goes and which estimator. Pure math against hand computations; the trainer on tiny
models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.parallel.distributed import current
from ppo_rlhf.ppo.advantages import GAEAdvantages
from ppo_rlhf.ppo.objectives import clipped_policy_loss, gae, kl_estimate, length_adaptive_lam, shape_rewards
from ppo_rlhf.ppo.toy import clip_variants
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop, trainable_parameters
from ppo_rlhf.train import train

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time"]


# ------------------------------------------------------------------------------ pure math, by hand


def test_kl_estimators_by_hand():
    p, ref, mask = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]), torch.ones(1)
    # k1 = log(p/ref) = log 2; k2 = 0.5 log(2)^2; k3 = ref/p - 1 - log(ref/p) = 0.5 - 1 + log 2
    assert kl_estimate(p, ref, "k1", mask).item() == pytest.approx(math.log(2))
    assert kl_estimate(p, ref, "k2", mask).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(p, ref, "k3", mask).item() == pytest.approx(-0.5 + math.log(2))
    # the same policy: every estimate is 0
    assert all(kl_estimate(p, p, k, mask).item() == 0 for k in ("k1", "k2", "k3"))


def test_kl_estimate_masks_padding_before_the_exponential():
    """Issue 29: a padding position whose log-probs differ by > 88 nats overflowed k3's exp; inf times the zero
    gradient of a masked loss made the policy's gradient nan (the step was skipped)."""
    from ppo_rlhf.ppo.objectives import normalise_loss

    new = torch.tensor([[-200.0, -1.0, -1.5, -150.0]], requires_grad=True)
    ref, mask = torch.tensor([[0.0, -1.2, -1.3, 0.0]]), torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    kl = kl_estimate(new, ref, "k3", mask)
    normalise_loss(kl, mask).backward()
    assert torch.isfinite(new.grad).all() and new.grad[0, [0, 3]].tolist() == [0.0, 0.0]
    # on the reply: d/d log p of (ref/p - 1 - log(ref/p)) = 1 - ref/p, over 2 tokens; the values untouched
    expected = (1 - torch.exp(ref - new.detach())) / 2
    assert torch.equal(new.grad[0, 1:3], expected[0, 1:3])
    assert kl[0, [0, 3]].tolist() == [0.0, 0.0] and torch.isfinite(kl).all()
    # the values on the reply are the very floats of the unmasked estimate
    full = kl_estimate(new.detach(), ref, "k3", torch.ones_like(mask))
    assert torch.equal(kl[0, 1:3], full[0, 1:3])


@pytest.mark.parametrize("estimator, gradient_of", [("k1", "zero"), ("k2", "KL(pi||ref)"), ("k3", "KL(ref||pi)")])
def test_what_each_estimator_pulls_on_in_the_loss(estimator, gradient_of):
    """docs/options.md's claims, checked exactly on one categorical distribution: the gradient of an estimator as a loss
    term, averaged over the policy's own samples (the samples held fixed, as in the loss), is 0 for k1, the gradient
    of KL(pi || ref) for k2 and the gradient of KL(ref || pi) for k3."""
    logits = torch.tensor([0.3, -1.0, 2.0, 0.1], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, 1.0, -0.4], dtype=torch.float64), 0)
    log_pi = torch.log_softmax(logits, 0)
    expected_loss = (log_pi.exp().detach() * kl_estimate(log_pi, ref, estimator, torch.ones(4))).sum()
    forward_kl = (log_pi.exp() * (log_pi - ref)).sum()  # KL(pi || ref)
    reverse_kl = (ref.exp() * (ref - log_pi)).sum()  # KL(ref || pi)
    got, forward, reverse = (torch.autograd.grad(x, logits, retain_graph=True)[0]
                             for x in (expected_loss, forward_kl, reverse_kl))
    target = {"zero": torch.zeros(4, dtype=torch.float64), "KL(pi||ref)": forward, "KL(ref||pi)": reverse}
    for name, value in target.items():
        assert torch.allclose(got, value, atol=1e-12) == (name == gradient_of), name


def one_token(ratio: float, advantage: float, **variant) -> tuple[float, float]:
    """(loss, d loss / d log p_new) of clipped_policy_loss for a single token."""
    new = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss = clipped_policy_loss(new, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[advantage]]),
                               torch.ones(1, 1), **variant).loss
    (gradient,) = torch.autograd.grad(loss, new)
    return loss.item(), gradient.item()


@pytest.mark.parametrize("ratio, advantage, variant, loss, gradient", [
    # A > 0, r = 1.25: PPO clips at 1.2 (no gradient); clip-higher 0.28 does not yet (loss -r A, gradient -r A)
    (1.25, 1.0, {}, -1.2, 0.0),
    (1.25, 1.0, {"clip_range_high": 0.28}, -1.25, -1.25),
    (1.5, 1.0, {"clip_range_high": 0.28}, -1.28, 0.0),
    # A < 0, r = 0.7: the lower range 0.2 clips (loss -A (1 - 0.2)), 0.4 does not (loss -A r, gradient -A r)
    (0.7, -1.0, {}, 0.8, 0.0),
    (0.7, -1.0, {"clip_range": 0.4}, 0.7, 0.7),
    # A < 0, r = 4: PPO's loss -A r = 4 grows without bound; dual-clip c = 3 caps it at -c A = 3, gradient 0
    (4.0, -1.0, {}, 4.0, 4.0),
    (4.0, -1.0, {"dual_clip": 3.0}, 3.0, 0.0),
    (2.0, -1.0, {"dual_clip": 3.0}, 2.0, 2.0),  # below the cap: PPO's loss
    (4.0, 1.0, {"dual_clip": 3.0}, -1.2, 0.0),  # A > 0: dual-clip does nothing
])
def test_clipping_variants_by_hand(ratio, advantage, variant, loss, gradient):
    got_loss, got_gradient = one_token(ratio, advantage, **variant)
    assert got_loss == pytest.approx(loss) and got_gradient == pytest.approx(gradient, abs=1e-12)


def test_clip_fraction_counts_each_side_with_its_own_range():
    new = torch.tensor([[math.log(1.25), math.log(0.85), math.log(0.75)]])
    result = clipped_policy_loss(new, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), clip_range=0.2,
                                 clip_range_high=0.28)
    assert result.clip_fraction.item() == pytest.approx(1 / 3)  # only 0.75 < 0.8


def test_toy_table_shows_each_variant_on_the_same_token():
    variants = clip_variants()
    ppo, higher, dual = (variants[name] for name in variants)
    assert ppo[0]["min"] == pytest.approx(1.8) and higher[0]["min"] == pytest.approx(1.28 * 1.5)
    runaway = [row["case"] for row in ppo].index("A < 0, ratio went up 4x")
    assert ppo[runaway]["gradient"] < -3 and dual[runaway]["min"] == pytest.approx(-2.4)
    assert dual[runaway]["gradient"] == 0


def test_decoupled_lambda_by_hand():
    values, mask = torch.full((1, 3), 0.5), torch.ones(1, 3)
    shaped = shape_rewards(torch.ones(1), torch.zeros(1, 3), mask, beta=0.0)  # rewards (0, 0, 1)
    # deltas: (0, 0, 0.5); lambda 0.5: A = (0.125, 0.25, 0.5); lambda 1: A = (0.5, 0.5, 0.5), returns = A + V = 1
    _, raw, returns = GAEAdvantages(1.0, 0.5, current(), critic_lam=1.0)(shaped, values)
    assert torch.allclose(raw, torch.tensor([[0.125, 0.25, 0.5]]))
    assert torch.allclose(returns, torch.ones(1, 3))
    # default critic_lam = lam: one lambda for both
    _, raw, returns = GAEAdvantages(1.0, 0.5, current())(shaped, values)
    assert torch.allclose(returns, raw + values)


def test_length_adaptive_lambda_by_hand():
    lam = length_adaptive_lam(torch.tensor([20, 40, 5]), alpha=0.1)
    assert torch.allclose(lam, torch.tensor([0.5, 0.75, 0.0]))  # 1 - 1/2, 1 - 1/4, 1 - 2 floored at 0
    # a lambda per row: row 0 with 0.5 as above, row 1 with 0 (A = delta)
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]] * 2), torch.full((2, 3), 0.5)
    advantages, _ = gae(rewards, values, torch.ones(2, 3), gamma=1.0, lam=torch.tensor([0.5, 0.0]))
    assert torch.allclose(advantages, torch.tensor([[0.125, 0.25, 0.5], [0.0, 0.0, 0.5]]))
    # the strategy applies it to the advantages, and the value targets keep critic_lam (default: lam)
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    mask[1, 2] = 1.0  # a 1-token reply: lambda floored at 0
    strategy = GAEAdvantages(1.0, 1.0, current(), length_alpha=2 / 3)  # length 3: lambda 1 - 1/2 = 0.5
    _, raw, returns = strategy(shape_rewards(torch.ones(2), torch.zeros(2, 3), mask, beta=0.0), values)
    assert torch.allclose(raw[0], torch.tensor([0.125, 0.25, 0.5])) and torch.allclose(returns[0], torch.ones(3))


# ------------------------------------------------------------------------------ the trainer on tiny models


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("options")
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"policy": str(policy), "reward": str(reward), "prompts": str(prompts)}


def config(setup, out, **overrides) -> TrainConfig:
    values = dict(policy_model=setup["policy"], reward_model=setup["reward"], prompts=setup["prompts"], out=str(out),
                  iterations=2, batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=4,
                  lora_rank=4, checkpoint_every=1, tensorboard=False, quiet=True, policy_lr=1e-2, value_lr=1e-2)
    return build_config(TrainConfig, {**values, **overrides})


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainable_parameters(model)]


def moved(before: list[torch.Tensor], model) -> bool:
    return any(not torch.equal(b, a) for b, a in zip(before, trainable_parameters(model)))


def test_critic_warmup_moves_the_critic_not_the_policy(setup, tmp_path):
    trainer = PPOLoop(config(setup, tmp_path / "run", critic_warmup_iterations=1))
    policy, value = weights(trainer.policy), weights(trainer.value_model)
    stats, _ = trainer.iteration(0)
    assert stats["phase"] == "critic-warmup" and math.isnan(stats["pg_loss"]) and math.isfinite(stats["v_loss"])
    assert not moved(policy, trainer.policy) and moved(value, trainer.value_model)
    assert trainer.policy_version == 0  # no policy step: the generator needs no new weights
    stats, _ = trainer.iteration(1)
    assert stats["phase"] == "policy" and moved(policy, trainer.policy)


def test_policy_start_ev_gates_the_policy(setup, tmp_path):
    trainer = PPOLoop(config(setup, tmp_path / "run", policy_start_ev=1.0))  # an EV of 1 is never reached here
    policy = weights(trainer.policy)
    assert [trainer.iteration(i)[0]["phase"] for i in range(2)] == ["critic-warmup"] * 2
    assert not moved(policy, trainer.policy) and not trainer.policy_started
    trainer.cfg = build_config(TrainConfig, {**vars(trainer.cfg), "policy_start_ev": -1e9})  # any EV passes
    assert trainer.iteration(2)[0]["phase"] == "policy" and moved(policy, trainer.policy)
    assert trainer.state_dict()["policy_started"]


def test_history_shows_the_phase_and_the_kl_used(setup, tmp_path):
    run_dir = train(config(setup, tmp_path / "run", critic_warmup_iterations=1))
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [row["phase"] for row in history] == ["critic-warmup", "policy"]
    assert all(row["kl_used"] == "k1 in reward" for row in history)


@pytest.mark.parametrize("kl_in, estimator", [("reward", "k2"), ("reward", "k3"), ("loss", "k2"), ("loss", "k3")])
def test_where_the_kl_goes(setup, tmp_path, kl_in, estimator):
    from ppo_rlhf.ppo.objectives import normalise_loss

    cfg = config(setup, tmp_path / "run", kl_in=kl_in, kl_estimator=estimator, beta=0.5)
    trainer = PPOLoop(cfg)
    with torch.no_grad():  # move the policy away from the reference, so the KL is not zero
        for p in trainable_parameters(trainer.policy):
            p.add_(0.05 * torch.randn_like(p))
    batch = trainer.score(trainer.rollout(PROMPTS))
    act = batch.action_mask.bool()
    expected_kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, estimator, batch.action_mask)
    assert torch.allclose(batch.kl[act], expected_kl[act]) and float(batch.kl[act].abs().sum()) > 0
    last = act.shape[1] - 1 - act.int().flip(1).argmax(1)
    score_only = torch.zeros_like(batch.rewards)
    score_only[torch.arange(len(last)), last] = batch.scores
    if kl_in == "reward":
        assert torch.allclose(batch.rewards[act], (score_only - 0.5 * batch.kl)[act])
    else:  # the rewards are free of KL; the loss carries beta * KL of the current policy
        assert torch.equal(batch.rewards[act], score_only[act])
        loss, numbers = trainer.policy_loss(batch, float(act.sum()), 1.0)
        with torch.no_grad():
            new = trainer.actor.logprobs(batch.input_ids, batch.attention_mask, 0)
        term = normalise_loss(kl_estimate(new, batch.ref_logprobs, estimator, batch.action_mask), batch.action_mask)
        assert float(loss.detach()) == pytest.approx(numbers["pg_loss"] + 0.5 * float(term), rel=1e-5)


def test_options_refused_without_a_critic(setup, tmp_path):
    from ppo_rlhf.errors import UsageError

    for option in ({"critic_warmup_iterations": 1}, {"policy_start_ev": 0.2}, {"critic_lam": 1.0}):
        with pytest.raises(UsageError, match="gae"):
            config(setup, tmp_path / "run", advantage_estimator="rloo", group_size=2, **option).validate()


def test_k1_in_the_loss_is_refused(setup, tmp_path):
    """Issue 29: k1 as a loss term has a zero gradient in expectation on-policy: the penalty would do nothing."""
    from ppo_rlhf.errors import UsageError

    for options in ({"kl_in": "loss", "kl_estimator": "k1"},
                    {"advantage_estimator": "grpo", "group_size": 2, "kl_estimator": "k1"}):  # grpo: the loss's default
        with pytest.raises(UsageError, match="k1's gradient is zero in expectation"):
            config(setup, tmp_path / "run", **options).validate()
    for options in ({"kl_in": "loss", "kl_estimator": "k2"}, {"kl_in": "loss"}, {"kl_estimator": "k1"}):
        config(setup, tmp_path / "run", **options).validate()


def test_policy_lr_schedule_reaches_zero_after_a_critic_warmup(setup, tmp_path):
    """Issue 29: the policy takes no step in the critic warm-up, so its schedule is sized over its own steps (2
    iterations x 2 steps here): linear reaches 0 at the last iteration; the value model's runs over all 3."""
    trainer = PPOLoop(config(setup, tmp_path / "run", iterations=3, critic_warmup_iterations=1,
                                lr_schedule="linear"))
    lrs = [trainer.iteration(i)[0]["lr"] for i in range(3)]  # the policy's LR after each iteration
    assert lrs == [pytest.approx(1e-2), pytest.approx(0.5e-2), 0.0]
    assert trainer.value_optimizer.param_groups[0]["lr"] == 0.0
    from ppo_rlhf.errors import UsageError

    # a warm-up the policy could never finish
    with pytest.raises(UsageError, match=r"iterations \(3\) - critic_warmup_iterations \(1\) = 2"):
        config(setup, tmp_path / "run", iterations=3, critic_warmup_iterations=1, warmup_iterations=3).validate()


def test_a_causal_lm_as_reward_model_is_refused_unless_asked_for(setup, tmp_path):
    """Issue 29: the policy's own folder as reward_model trained against a random head, exit 0."""
    from ppo_rlhf.errors import UsageError

    with pytest.raises(UsageError, match=r"^reward_model: .*causal LM \(LlamaForCausalLM\) without a trained score "
                                         r"head.*init_score_head: true"):
        PPOLoop(config(setup, tmp_path / "run", reward_model=setup["policy"]))
    trainer = PPOLoop(config(setup, tmp_path / "run", reward_model=setup["policy"], advantage_estimator="rloo",
                                group_size=2, init_score_head=True))
    assert trainer.reward_model.model.score.out_features == 1
