"""The six-token bandit (section 8.3/8.4): the shape of the chapter's results must hold with the default settings."""

import contextlib
import io
import json

import pytest
import torch

from ppo_rlhf import cli
from ppo_rlhf.ppo import toy


@pytest.fixture(scope="module")
def report() -> dict:
    """One run of `ppo-rlhf toy --json` with the defaults (500 seeds), shared by the shape tests."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["toy", "--json"]) == 0
    return json.loads(out.getvalue())


def test_start_policy_has_the_chapters_expected_reward():
    assert toy.expected_reward(toy.START_LOGITS.unsqueeze(0)).item() == pytest.approx(0.050, abs=1e-12)
    probs = torch.softmax(toy.START_LOGITS, 0)
    assert probs[2] == probs[3] == probs.max()  # it prefers the middling tokens


def test_four_cases_table(report):
    rows = report["cases"]
    assert [round(r["ratio"], 3) for r in rows] == [1.301, 0.900, 0.700, 1.501]
    assert [round(r["min"], 3) for r in rows] == [1.800, 1.350, -0.640, -1.201]
    assert [round(r["gradient"], 3) + 0.0 for r in rows] == [0.0, 1.350, 0.0, -1.201]


def test_one_batch_clip_moves_far_less(report):
    results = report["one_batch"]
    clip = results["clip"]["kl_old_new"]
    assert results["reinforce"]["kl_old_new"] > 20 * clip and results["ratio"]["kl_old_new"] > 20 * clip
    assert results["reinforce"]["kl_old_new"] > 1 and results["ratio"]["kl_old_new"] > 1  # near deterministic
    # The unclipped ratio objective gambles: a higher mean, but its worst tenth ends far below the start (+0.050).
    assert results["ratio"]["expected_reward"] > results["clip"]["expected_reward"]
    assert results["ratio"]["p10"] < 0 < results["clip"]["p10"]


def test_loop_clip_is_best_and_rarely_stuck(report):
    results = report["loop"]
    final = {name: r["expected_reward"]["40"] for name, r in results.items()}
    p10 = {name: r["p10"] for name, r in results.items()}
    assert max(final, key=final.get) == "clip_K10"
    assert max(p10, key=p10.get) == "clip_K10"
    stuck = {name: r["stuck_share"] for name, r in results.items()}
    for unclipped in ("reinforce_K10", "ratio_K10"):
        assert stuck[unclipped] >= 2 * stuck["clip_K10"] and stuck[unclipped] >= stuck["clip_K10"] + 0.10
    assert stuck["reinforce_K1"] <= 0.02
    # Ten steps per batch are faster early on than one.
    assert results["clip_K10"]["expected_reward"]["10"] > results["reinforce_K1"]["expected_reward"]["10"]


def test_text_output_mirrors_the_book(capsys):
    assert cli.main(["toy", "--seeds", "8", "--iterations", "3", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "== 1. the clipped objective for one token (epsilon = 0.2)" in out
    assert "ratio 1.501  A -0.8  r*A -1.201  clip(r)*A -0.960  min -1.201  d objective / d log p -1.201" in out
    assert "clip_K10      expected reward after 3 iterations:" in out


@pytest.mark.parametrize("flags", [["--seeds", "0"], ["--iterations", "-1"], ["--batch", "1"], ["--lr", "0"]])
def test_bad_options_give_one_line_errors(capsys, flags):
    assert cli.main(["toy", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-rlhf toy: error:") and err.count("\n") == 1
