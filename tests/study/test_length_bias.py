"""The held-out numbers that tell a proxy from a length detector, and the length term's start, by hand."""

import math

import pytest

from ppo_rlhf.study.length_bias import length_fit, length_report, length_scale, report_line, subset_accuracy

# 5 held-out pairs of 3 prompts: margins r(chosen) - r(rejected) and length gaps (chosen minus rejected, tokens)
MARGINS = [1.0, -1.0, 2.0, 0.5, -0.5]  # right, wrong, right, right, wrong
GAPS = [10, -2, -20, 3, 30]
PROMPTS = ["a", "a", "b", "b", "c"]
WORDS = [1.0, 1.0, -1.0, -1.0, 1.0]  # right, right, wrong, wrong, right


def test_length_report_by_hand():
    report = length_report(MARGINS, GAPS, PROMPTS, [1.0, 3.0, 2.0], [1, 2, 3], WORDS, tolerance=3, seed=0)
    assert report["all"]["pairs"] == 5 and report["all"]["accuracy"][0] == 0.6
    # within 3 tokens: pairs 2 (wrong) and 4 (right)
    assert report["similar_length"]["pairs"] == 2 and report["similar_length"]["accuracy"][0] == 0.5
    # chosen shorter: pairs 2 (wrong) and 3 (right); chosen longer: 1, 4 right and 5 wrong
    assert report["shorter_chosen"]["pairs"] == 2 and report["shorter_chosen"]["accuracy"][0] == 0.5
    assert report["longer_chosen"]["pairs"] == 3 and report["longer_chosen"]["accuracy"][0] == pytest.approx(0.6667)
    # lengths 1, 2, 3 and scores 1, 3, 2: centred (-1, 0, 1) and (-1, 1, 0), correlation 1 / sqrt(2 * 2)
    assert report["reply_length_corr"] == 0.5 and report["replies"] == 3
    assert report["words"]["accuracy"][0] == 0.6
    mean, lo, hi = report["rm_minus_words"]  # differences 0, -1, 1, 1, -1
    assert mean == 0.0 and lo < 0 < hi
    line = report_line(report)
    assert "similar-length (<= 3 tokens) accuracy 0.50 (2)" in line and "correlation +0.50" in line
    assert "RM - word counts +0.000 [" in line


def test_an_empty_subset_and_constant_lengths_say_so():
    report = length_report([1.0, 1.0], [20, 30], ["a", "b"], [1.0, 2.0], [5, 5], None, tolerance=3)
    assert report["similar_length"] == {"pairs": 0, "accuracy": None} and report["reply_length_corr"] is None
    assert "rm_minus_words" not in report
    assert "accuracy n/a" in report_line(report) and "correlation n/a" in report_line(report)
    assert subset_accuracy([True, False], [True, True], ["a", "a"])["accuracy"] == [0.5, 0.5, 0.5]  # one prompt


def test_the_length_term_starts_where_length_alone_fits():
    # two pairs where the longer reply won, one where it lost: 2 sigmoid(-w) = sigmoid(w), so sigmoid(w) = 2/3
    assert length_fit([1.0, 1.0, -1.0]) == pytest.approx(math.log(2.0))
    assert length_fit([-1.0, -1.0, 1.0]) == pytest.approx(-math.log(2.0))
    assert length_fit([1.0, 2.0]) == 10.0  # length separates the pairs: the bound
    assert length_fit([0.0, 0.0]) == 0.0
    assert length_scale([3, -4]) == pytest.approx(math.sqrt(12.5)) and length_scale([0, 0]) == 1.0
