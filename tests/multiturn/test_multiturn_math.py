"""GAE across turns (docs/multi-turn.md): each policy token links to the next policy token, the environment's tokens
between turns (mask 0) never enter, the score sits on the last policy token; turn-level GAE. Every number is the
hand computation of docs/multi-turn.md's worked 2-turn example, and each known buggy form is shown to miss it."""

from pathlib import Path

import pytest
import torch

from ppo_rlhf.ppo.advantages import GAEAdvantages, RLOOAdvantages
from ppo_rlhf.ppo.objectives import (
    ShapedRewards,
    clipped_policy_loss,
    clipped_value_loss,
    gae,
    kl_estimate,
    shape_rewards,
    turn_index,
    turn_level_gae,
)

t = lambda *values: torch.tensor(values, dtype=torch.float64)  # noqa: E731

# The worked example: turn 1 at positions 0-1, the tool's reply (masked) at 2-3, turn 2 at 4-5, padding at 6.
# 99 and -50 sit where the mask is 0: a value, KL or reward read there would change every number below.
MASK = t(1, 1, 0, 0, 1, 1, 0).unsqueeze(0)
VALUES = t(0.3, 0.4, 99.0, 99.0, 0.6, 0.7, -50.0).unsqueeze(0)
LOGPROBS = t(-1.0, -2.0, -9.0, -9.0, -1.5, -0.5, 0.0).unsqueeze(0)
REF_LOGPROBS = t(-2.0, -3.0, -1.0, -1.0, -2.5, -1.5, -7.0).unsqueeze(0)  # KL k1 = 1.0 on every policy token
SCORE, BETA, LAM = t(1.0), 0.1, 0.5


def worked_shaping() -> ShapedRewards:
    kl = kl_estimate(LOGPROBS, REF_LOGPROBS, "k1", MASK)
    assert torch.allclose(kl, t(1.0, 1.0, 0, 0, 1.0, 1.0, 0).unsqueeze(0))
    return shape_rewards(SCORE, kl, MASK, BETA)


def worked_rewards() -> torch.Tensor:
    return worked_shaping().per_token


def test_the_score_lands_on_the_last_policy_token():
    rewards = worked_rewards()
    assert torch.allclose(rewards, t(-0.1, -0.1, 0, 0, -0.1, 0.9, 0).unsqueeze(0))
    # the buggy form: the score on the trajectory's last token (an observation or padding), masked, so it vanishes
    buggy = torch.zeros_like(rewards)
    buggy[0, 6] = SCORE
    buggy_advantages, _ = gae(buggy, VALUES, MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(buggy_advantages, -(VALUES * MASK))  # no score anywhere: only -V remains


def test_token_level_gae_links_each_policy_token_to_the_next_one():
    advantages, returns = gae(worked_rewards(), VALUES, MASK, gamma=1.0, lam=LAM)
    # t=5: 0.9 - 0.7 = 0.2; t=4: -0.1 + 0.7 - 0.6 + 0.5 * 0.2 = 0.1; t=1 (its next policy token is t=4):
    # -0.1 + 0.6 - 0.4 + 0.5 * 0.1 = 0.15; t=0: -0.1 + 0.4 - 0.3 + 0.5 * 0.15 = 0.075
    assert torch.allclose(advantages, t(0.075, 0.15, 0, 0, 0.1, 0.2, 0).unsqueeze(0))
    assert torch.allclose(returns, t(0.375, 0.55, 0, 0, 0.7, 0.9, 0).unsqueeze(0))


def reset_at_holes_gae(rewards, values, mask, gamma, lam):
    """The buggy form: a masked position ends the recursion (V = A = 0 there), so turn 1 never sees turn 2."""
    advantages = torch.zeros_like(values)
    next_value = next_advantage = torch.zeros_like(values[:, 0])
    for step in reversed(range(values.shape[1])):
        delta = rewards[:, step] + gamma * next_value - values[:, step]
        advantages[:, step] = (delta + gamma * lam * next_advantage) * mask[:, step]
        next_value, next_advantage = values[:, step] * mask[:, step], advantages[:, step]
    return advantages


def unmasked_gae(rewards, values, gamma, lam):
    """The buggy form: the recursion runs over every position, the observation's values and rewards included."""
    return reset_at_holes_gae(rewards, values, torch.ones_like(values), gamma, lam)


def test_the_buggy_forms_miss_the_hand_computation():
    expected = t(0.075, 0.15, 0, 0, 0.1, 0.2, 0).unsqueeze(0)
    rewards = worked_rewards()
    assert not torch.allclose(reset_at_holes_gae(rewards, VALUES, MASK, 1.0, LAM) * MASK, expected)
    # KL and values on the masked tool tokens leaking into the neighbouring advantages (miles #1827, verl #7278)
    leaky_rewards = rewards - BETA * (LOGPROBS - REF_LOGPROBS) * (1 - MASK)
    assert not torch.allclose(unmasked_gae(leaky_rewards, VALUES, 1.0, LAM) * MASK, expected)
    # while ours ignores whatever sits there
    garbage = torch.where(MASK.bool(), rewards, torch.full_like(rewards, float("nan")))
    assert torch.allclose(gae(garbage, VALUES, MASK, 1.0, LAM)[0], expected)


def test_turn_level_gae_has_one_step_per_turn():
    assert turn_index(MASK).tolist() == [[0, 0, -1, -1, 1, 1, -1]]
    advantages, returns = turn_level_gae(worked_rewards(), VALUES, MASK, gamma=1.0, lam=LAM)
    # turn 2: R = -0.1 + 0.9 = 0.8, V = 0.6 (its first token): A = 0.2; turn 1: R = -0.2, V = 0.3:
    # A = -0.2 + 0.6 - 0.3 + 0.5 * 0.2 = 0.2
    assert torch.allclose(advantages, t(0.2, 0.2, 0, 0, 0.2, 0.2, 0).unsqueeze(0))
    assert torch.allclose(returns, t(0.5, 0.5, 0, 0, 0.8, 0.8, 0).unsqueeze(0))
    # gamma discounts per turn, not per token: gamma 0.5 on turn 1's delta: -0.2 + 0.5 * 0.6 - 0.3 + 0.25 * 0.2
    advantages, _ = turn_level_gae(worked_rewards(), VALUES, MASK, gamma=0.5, lam=LAM)
    assert advantages[0, 0].item() == pytest.approx(-0.15)


def test_turn_level_gae_of_rows_with_different_turn_counts():
    mask = torch.stack([MASK[0], t(0, 1, 1, 1, 0, 0, 0)])
    values = torch.stack([VALUES[0], t(5.0, 0.2, 7.0, 7.0, 7.0, 7.0, 7.0)])
    rewards = torch.stack([worked_rewards()[0], t(0, 0.1, 0.1, 0.5, 0, 0, 0)])
    advantages, returns = turn_level_gae(rewards, values, mask, gamma=1.0, lam=LAM)
    assert torch.allclose(advantages[1], t(0, 0.5, 0.5, 0.5, 0, 0, 0))  # one turn: R 0.7 - V 0.2
    assert torch.allclose(returns[1], t(0, 0.7, 0.7, 0.7, 0, 0, 0))
    assert torch.allclose(advantages[0], t(0.2, 0.2, 0, 0, 0.2, 0.2, 0))


def test_a_single_reply_gives_the_chapters_numbers_bit_for_bit():
    # one turn: the new recursion and the old one (which reset at every masked position) agree exactly
    torch.manual_seed(0)
    mask = t(0, 0, 1, 1, 1, 1, 0, 0).repeat(3, 1)
    rewards, values = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    advantages, _ = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    assert torch.equal(advantages, reset_at_holes_gae(rewards * mask, values * mask, mask, 0.9, 0.95))
    # and turn-level GAE of a single turn is per-token GAE of one step: the reply's total reward minus V at its start
    turn_advantages, _ = turn_level_gae(rewards, values, mask, gamma=1.0, lam=0.95)
    expected = (rewards * mask).sum(1) - values[:, 2]
    assert torch.allclose(turn_advantages[:, 2:6], expected[:, None].expand(3, 4))


def test_gae_advantages_strategy_whitens_over_policy_tokens_only():
    from ppo_rlhf.parallel.distributed import Dist

    shaped = worked_shaping()
    cases = ((False, t(0.075, 0.15, 0, 0, 0.1, 0.2, 0)), (True, t(0.2, 0.2, 0, 0, 0.2, 0.2, 0)))
    for turn_level, raw_expected in cases:
        strategy = GAEAdvantages(1.0, LAM, Dist(), turn_level=turn_level)
        whitened, raw, _ = strategy(shaped, VALUES)
        assert torch.allclose(raw.double(), raw_expected.unsqueeze(0), atol=1e-6)
        assert whitened[0, 2:4].abs().sum() == 0 and whitened[0, 6] == 0


def test_losses_kl_and_rloo_never_read_the_masked_tokens():
    mask = MASK.repeat(2, 1)
    kl = kl_estimate(LOGPROBS.repeat(2, 1), REF_LOGPROBS.repeat(2, 1), "k3", mask)
    assert kl[:, 2:4].abs().sum() == 0  # the tool tokens' large log-prob gap never reaches the KL
    # a new policy that changed only on the masked tokens: ratio 1 on every policy token, loss = -mean advantage
    new = LOGPROBS.repeat(2, 1) + 5 * (1 - mask)
    advantages = t(0.075, 0.15, 123, 123, 0.1, 0.2, 0).repeat(2, 1)
    policy = clipped_policy_loss(new, LOGPROBS.repeat(2, 1), advantages, mask)
    assert policy.loss.item() == pytest.approx(-(0.075 + 0.15 + 0.1 + 0.2) / 4)
    value = clipped_value_loss(VALUES.repeat(2, 1), VALUES.repeat(2, 1), t(0.375, 0.55, 0, 0, 0.7, 0.9, 0).repeat(2, 1),
                               mask)
    assert value.loss.item() == pytest.approx(0.5 * (0.075**2 + 0.15**2 + 0.1**2 + 0.2**2) / 4)
    # RLOO over whole trajectories: the summed KL counts the 4 policy tokens only
    shaped = shape_rewards(t(1.0, 0.0), kl * 0 + t(1, 1, 0, 0, 1, 1, 0), mask, BETA)
    rloo, _, returns = RLOOAdvantages(2)(shaped, None)
    assert returns[0, 0].item() == pytest.approx(1.0 - 0.4) and rloo[0, 0].item() == pytest.approx(1.0)


def test_the_worked_example_of_docs_multi_turn_is_this_computation():
    """docs/multi-turn.md's table, row by row, is what the code computes on the example (so the page cannot drift)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "multi-turn.md").read_text()
    table = page.split("<!-- worked-example")[1].split("<!-- /worked-example -->")[0].strip().splitlines()[3:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    columns = {name: t(*(float(row[k]) for row in rows)).unsqueeze(0) for k, name in enumerate(
        ("t", "kind", "mask", "V", "logpi", "logref", "kl", "reward", "A", "return", "A_turn", "return_turn")) if
        name != "kind"}
    assert [row[1] for row in rows] == ["turn 1", "turn 1", "tool", "tool", "turn 2", "turn 2", "padding"]
    for name, given in (("mask", MASK), ("V", VALUES), ("logpi", LOGPROBS), ("logref", REF_LOGPROBS)):
        assert torch.equal(columns[name], given), name
    shaped = worked_shaping()
    kl, rewards = shaped.kl, shaped.per_token
    advantages, returns = gae(rewards, VALUES, MASK, gamma=1.0, lam=LAM)
    turn_advantages, turn_returns = turn_level_gae(rewards, VALUES, MASK, gamma=1.0, lam=LAM)
    for name, computed in (("kl", kl), ("reward", rewards), ("A", advantages), ("return", returns),
                           ("A_turn", turn_advantages), ("return_turn", turn_returns)):
        assert torch.allclose(columns[name], computed), name
