"""The worked numbers of sections 8.2 to 8.6, and masking properties of every masked function."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.logprobs import entropy_from_logits
from ppo_rlhf.ppo.objectives import (
    AdaptiveKLController,
    FixedKLController,
    clipped_policy_loss,
    clipped_value_loss,
    cpi_objective,
    explained_variance,
    gae,
    kl_estimate,
    kl_k1,
    kl_k3,
    last_token_index,
    masked_mean,
    masked_var,
    masked_whiten,
    probability_ratio,
    shape_rewards,
)

t = lambda *values: torch.tensor(values, dtype=torch.float64)  # noqa: E731


def test_cpi_worked_example_8_2():
    ratio = probability_ratio(t(math.log(0.130)), t(math.log(0.100)))
    assert ratio.item() == pytest.approx(1.30)
    assert cpi_objective(ratio, t(1.5)).item() == pytest.approx(1.95)


# Section 8.4: (p_new, A) -> (r*A, clip(r)*A, min, d objective / d log p_new); p_old = 0.100. The chapter's script
# works from log-probs rounded to 3 decimals, hence ratios 1.301 and 1.501.
FOUR_CASES = [
    (0.130, +1.5, +1.951, +1.800, +1.800, 0.000),
    (0.090, +1.5, +1.350, +1.350, +1.350, +1.350),
    (0.070, -0.8, -0.560, -0.640, -0.640, 0.000),
    (0.150, -0.8, -1.201, -0.960, -1.201, -1.201),
]


@pytest.mark.parametrize("p_new, advantage, unclipped, clipped, minimum, gradient", FOUR_CASES)
def test_four_cases_8_4(p_new, advantage, unclipped, clipped, minimum, gradient):
    old = t(round(math.log(0.100), 3))
    new = t(round(math.log(p_new), 3)).requires_grad_()
    ratio = probability_ratio(new, old)
    assert (ratio * advantage).item() == pytest.approx(unclipped, abs=5e-4)
    assert (ratio.clamp(0.8, 1.2) * advantage).item() == pytest.approx(clipped, abs=5e-4)
    result = clipped_policy_loss(new, old, t(advantage), torch.ones(1), clip_range=0.2)
    objective = -result.loss
    assert objective.item() == pytest.approx(minimum, abs=5e-4)
    objective.backward()
    assert new.grad.item() == pytest.approx(gradient, abs=5e-4)
    assert result.clip_fraction.item() == (1.0 if abs(ratio.item() - 1) > 0.2 else 0.0)
    assert not result.clip_fraction.requires_grad and not result.approx_kl.requires_grad


def test_value_loss_worked_example_8_5():
    values = t(0.50).requires_grad_()
    old_values, returns = t(0.10), t(0.90)
    clipped_prediction = old_values + (values - old_values).clamp(-0.2, 0.2)
    assert ((values - returns) ** 2).item() == pytest.approx(0.16)
    assert ((clipped_prediction - returns) ** 2).item() == pytest.approx(0.36)
    result = clipped_value_loss(values, old_values, returns, torch.ones(1), clip_range=0.2)
    assert result.loss.item() == pytest.approx(0.5 * 0.36)
    result.loss.backward()
    assert values.grad.item() == 0.0  # the clipped term wins: the value model must wait for the next batch
    assert result.clip_fraction.item() == 1.0


def test_gae_worked_rows_8_6():
    # The last three reply tokens of the chapter's reply (t = 8, 9, 10), after a padding position.
    values = t(-6.637, -3.944, -0.964, 123.0).unsqueeze(0)
    rewards = t(0.0, 0.0, 0.843, 99.0).unsqueeze(0)
    mask = t(1, 1, 1, 0).unsqueeze(0)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    assert advantages[0, 2].item() == pytest.approx(1.807, abs=5e-4)
    assert advantages[0, 1].item() == pytest.approx(4.696, abs=2e-3)
    assert advantages[0, 0].item() == pytest.approx(7.154, abs=2e-3)
    assert returns[0, 2].item() == pytest.approx(0.843, abs=5e-4)
    assert advantages[0, 3].item() == 0 and returns[0, 3].item() == 0


def test_shaped_rewards_put_the_score_on_the_last_reply_token():
    mask = t([0, 1, 1, 0], [0, 1, 1, 1])
    logprobs, ref_logprobs = t([5, -1.0, -2.0, 7], [5, -1.0, -1.0, -3.0]), t([1, -1.5, -2.0, 0], [1, -1.0, -1.5, -3.0])
    kl = kl_estimate(logprobs, ref_logprobs, "k1", mask)
    shaped = shape_rewards(t(0.843, -1.0), kl, mask, beta=0.1)
    assert last_token_index(mask).tolist() == [2, 3]
    assert torch.allclose(shaped.kl, t([0, 0.5, 0, 0], [0, 0, 0.5, 0]))
    assert torch.allclose(shaped.per_token, t([0, -0.05, 0.843, 0], [0, 0, -0.05, -1.0]))
    # the critic-free estimators' reward of each reply, from the same pieces: score - beta * summed KL
    assert torch.allclose(shaped.sequence_totals, t(0.843 - 0.05, -1.0 - 0.05))


def test_one_shaped_record_gives_per_token_and_per_reply_rewards_that_agree():
    """GAE's per-token rewards and the critic-free estimators' per-reply totals add up to the same number, with a
    multi-turn environment's turn rewards too; KL and env rewards off the mask (9, -7) are read by neither."""
    mask = t([1, 1, 0, 1, 0], [0, 1, 1, 1, 1])
    kl = t([0.5, 0.25, 9.0, 1.0, 9.0], [9.0, 0.1, 0.2, 0.3, 0.4])
    env_rewards = t([0, 0.3, -7.0, 0, 0], [0, 0, 0.2, 0, 0])
    shaped = shape_rewards(t(1.0, -0.5), kl, mask, beta=0.2, env_rewards=env_rewards)
    by_hand = t(1.0 + 0.3 - 0.2 * 1.75, -0.5 + 0.2 - 0.2 * 1.0)
    assert torch.allclose(shaped.sequence_totals, by_hand)
    assert torch.allclose(shaped.per_token.sum(1), by_hand)
    assert torch.equal(shaped.per_token[mask == 0], torch.zeros(3, dtype=torch.float64))
    assert shaped.per_token[0, 3].item() == pytest.approx(1.0 - 0.2)  # the score at the last reply token


def test_kl_estimators():
    p = torch.softmax(torch.tensor([0.3, -1.0, 2.0, 0.1], dtype=torch.float64), 0)
    q = torch.softmax(torch.tensor([0.0, 0.5, 1.0, -0.4], dtype=torch.float64), 0)
    exact = (p * (p.log() - q.log())).sum()
    # Expectations under p of k1(p, q) and k3 with old = p, new = q both equal KL(p || q).
    assert (p * kl_k1(p.log(), q.log())).sum().item() == pytest.approx(exact.item())
    assert (p * kl_k3(q.log(), p.log())).sum().item() == pytest.approx(exact.item())
    log_ratios = torch.linspace(-5, 5, 101, dtype=torch.float64)
    assert (kl_k3(log_ratios, torch.zeros_like(log_ratios)) >= 0).all()
    assert kl_k3(t(0.3), t(0.3)).item() == 0


def test_entropy_of_uniform_is_log_vocab_and_stable():
    assert entropy_from_logits(torch.zeros(3, 50)).tolist() == pytest.approx([math.log(50)] * 3)
    assert entropy_from_logits(torch.full((7,), 1e4)).item() == pytest.approx(math.log(7), abs=1e-3)
    assert entropy_from_logits(torch.tensor([1e4, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)


def test_whitening_has_mean_zero_std_one_over_the_mask():
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 + 5
    mask = (torch.arange(9) < torch.tensor([[9], [3], [5], [1]])).double()
    white = masked_whiten(x, mask)
    assert masked_mean(white, mask).item() == pytest.approx(0.0, abs=1e-9)
    assert masked_var(white, mask).item() == pytest.approx(1.0, abs=1e-6)
    assert (white[mask == 0] == 0).all()
    scaled = masked_whiten(x, mask, shift_mean=False)  # unit variance, x's own mean kept
    assert masked_mean(scaled, mask).item() == pytest.approx(masked_mean(x, mask).item())
    assert masked_var(scaled, mask).item() == pytest.approx(1.0, abs=1e-6)


def test_explained_variance():
    targets, mask = t(1.0, 2.0, 3.0, 4.0), t(1, 1, 1, 0)
    assert explained_variance(t(1.0, 2.0, 3.0, -50.0), targets, mask) == pytest.approx(1.0)
    assert explained_variance(t(2.0, 2.0, 2.0, 0.0), targets, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(targets, t(5.0, 5.0, 5.0, 1.0), mask))


def test_sequence_aggregation_and_normalizer():
    new, old = t([0.1, 0.15, 0.0], [0.0, 0.0, 0.0]), torch.zeros(2, 3, dtype=torch.float64)
    advantages, mask = t([1.0, 1.0, 9.0], [2.0, 0.0, 0.0]), t([1, 1, 0], [1, 0, 0])
    per_token = -advantages * probability_ratio(new, old)  # all ratios within the clip range
    token = clipped_policy_loss(new, old, advantages, mask).loss
    sequence = clipped_policy_loss(new, old, advantages, mask, aggregation="sequence").loss
    assert token.item() == pytest.approx(per_token[mask.bool()].sum().item() / 3)
    assert sequence.item() == pytest.approx(((per_token[0, 0] + per_token[0, 1]) / 2 + per_token[1, 0]).item() / 2)
    # Two micro-batches with the minibatch's token count as normalizer add up to the minibatch's token mean.
    halves = sum(clipped_policy_loss(new[i : i + 1], old[i : i + 1], advantages[i : i + 1], mask[i : i + 1],
                                     normalizer=3.0).loss for i in range(2))
    assert halves.item() == pytest.approx(token.item())
    with pytest.raises(UsageError):
        clipped_policy_loss(new, old, advantages, mask, aggregation="reply")
    # The same for "sequence" with the minibatch's reply count: one normalisation for every aggregation.
    halves = sum(clipped_value_loss(new[i : i + 1], old[i : i + 1], advantages[i : i + 1], mask[i : i + 1],
                                    aggregation="sequence", normalizer=2.0).loss for i in range(2))
    whole = clipped_value_loss(new, old, advantages, mask, aggregation="sequence").loss
    assert halves.item() == pytest.approx(whole.item()) and whole.item() > 0


def test_adaptive_kl_controller():
    controller = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10_000)
    assert controller.update(current_kl=12.0, n_steps=256) == pytest.approx(0.1 * (1 + 0.2 * 256 / 10_000))
    assert controller.update(current_kl=5.4, n_steps=256) == pytest.approx(0.1 * 1.00512 * (1 - 0.1 * 0.0256))
    restored = AdaptiveKLController(1.0, 1.0, 1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.state_dict() == controller.state_dict()
    with pytest.raises(UsageError):
        AdaptiveKLController(init_beta=0.1, target=0.0, horizon=10)


def test_fixed_kl_controller_keeps_beta():
    controller = FixedKLController(0.05)
    assert controller.update(current_kl=100.0, n_steps=256) == 0.05 and controller.beta == 0.05
    restored = FixedKLController(1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.beta == 0.05


# Masking properties: padding after a reply (mask 0, garbage values) and prompt positions before it never change
# anything computed on the reply tokens.
finite = st.floats(-5, 5, allow_nan=False, width=32)
garbage = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@st.composite
def padded_rows(draw):
    """A batch of reply rows (each at least one token), plus garbage to pad and prefix with."""
    batch = draw(st.integers(1, 3))
    length = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch))
    fields = {name: draw(st.lists(st.lists(finite, min_size=length, max_size=length), min_size=batch, max_size=batch))
              for name in ("a", "b", "c", "d")}
    pad, prompt = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    junk = draw(st.lists(garbage, min_size=4 * batch * (pad + prompt), max_size=4 * batch * (pad + prompt)))
    return lengths, fields, pad, prompt, junk


def _layouts(example):
    """The same data three ways: compact, with trailing padding, with a leading masked prompt."""
    lengths, fields, pad, prompt, junk = example
    base = {name: torch.tensor(v, dtype=torch.float64) for name, v in fields.items()}
    batch, length = base["a"].shape
    mask = (torch.arange(length) < torch.tensor(lengths).unsqueeze(1)).double()
    # Garbage also fills the compact rows beyond each reply's length.
    noise = torch.tensor(junk, dtype=torch.float64).reshape(4, batch, pad + prompt)
    base = {name: torch.where(mask.bool(), x, noise[i, :, :1]) for i, (name, x) in enumerate(base.items())}
    padded = {name: torch.cat([x, noise[i, :, :pad]], 1) for i, (name, x) in enumerate(base.items())}
    prefixed = {name: torch.cat([noise[i, :, pad:], x], 1) for i, (name, x) in enumerate(base.items())}
    zeros = lambda width: torch.zeros(batch, width, dtype=torch.float64)  # noqa: E731
    layouts = [
        (base, mask, slice(0, length)),
        (padded, torch.cat([mask, zeros(pad)], 1), slice(0, length)),
        (prefixed, torch.cat([zeros(prompt), mask], 1), slice(prompt, prompt + length)),
    ]
    return layouts, mask


def _assert_same(results):
    first = results[0]
    for other in results[1:]:
        assert torch.allclose(first, other, atol=1e-9, equal_nan=True)


@settings(max_examples=50, deadline=None)
@given(padded_rows())
def test_masked_mean_and_whiten_ignore_padding_and_prompt(example):
    layouts, mask = _layouts(example)
    _assert_same([masked_mean(x["a"], m) for x, m, _ in layouts])
    _assert_same([masked_whiten(x["a"], m)[:, real] * mask for x, m, real in layouts])


@settings(max_examples=50, deadline=None)
@given(padded_rows())
def test_gae_ignores_padding_and_prompt(example):
    layouts, mask = _layouts(example)
    outputs = [gae(x["a"], x["b"], m) for x, m, _ in layouts]
    _assert_same([advantages[:, real] for (advantages, _), (_, _, real) in zip(outputs, layouts)])
    _assert_same([returns[:, real] for (_, returns), (_, _, real) in zip(outputs, layouts)])


@settings(max_examples=50, deadline=None)
@given(padded_rows(), st.sampled_from(["token", "sequence"]))
def test_losses_ignore_padding_and_prompt(example, aggregation):
    layouts, _ = _layouts(example)
    policy = [clipped_policy_loss(x["a"] * 0.1, x["b"] * 0.1, x["c"], m, aggregation=aggregation)
              for x, m, _ in layouts]
    value = [clipped_value_loss(x["a"], x["b"], x["c"], m, aggregation=aggregation) for x, m, _ in layouts]
    for field in range(3):
        _assert_same([p[field] for p in policy])
    for field in range(2):
        _assert_same([v[field] for v in value])
    # Garbage under the mask must not turn the backward pass into nan either.
    padded, mask, _ = layouts[1]
    new_logprobs = (padded["a"] * 0.1).requires_grad_()
    clipped_policy_loss(new_logprobs, padded["b"] * 0.1, padded["c"], mask, aggregation=aggregation).loss.backward()
    assert torch.isfinite(new_logprobs.grad).all() and (new_logprobs.grad[mask == 0] == 0).all()
