"""The word-count yardstick of the reward model: learns a word-level preference, and its curve has the RM's points."""

import random

from ppo_rlhf.study.word_baseline import word_baseline

GOOD, BAD, FILLER = ["lovely", "kind", "great"], ["awful", "nasty", "hateful"], ["the", "day", "was", "a", "walk"]


def pairs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)

    def reply(words: list[str]) -> str:
        return " ".join(rng.sample(FILLER, 3) + [rng.choice(words)])

    return [{"prompt": "p", "chosen": reply(GOOD), "rejected": reply(BAD)} for _ in range(n)]


def test_word_baseline_learns_a_word_level_preference():
    curve = word_baseline(pairs(64, seed=1), pairs(40, seed=2))
    assert [point["pairs"] for point in curve] == [8, 16, 32, 64]  # 1/8, 1/4, 1/2 and all, like the RM's curve
    assert curve[-1]["accuracy"] == 1.0


def test_word_baseline_is_at_chance_on_labels_that_words_cannot_tell():
    train = [{"prompt": "p", "chosen": "left right", "rejected": "right left"} for _ in range(16)]  # same words
    assert word_baseline(train, train)[-1]["accuracy"] == 0.0  # every held-out pair a tie: not counted as right
