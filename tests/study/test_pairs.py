import json

import pytest

from ppo_rlhf.cli import main
from ppo_rlhf.errors import UsageError
from ppo_rlhf.study.judges import GoldJudge
from ppo_rlhf.study.pairs import (
    JudgedReplies,
    flip_labels,
    length_balanced,
    make_pairs,
    pair_replies,
    pair_subset,
    read_pairs,
    summary_line,
)

import tiny

PROMPTS = [f"Tell me a story about cat number {i}." for i in range(10)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tokenizer):
    return str(tiny.eos_prone_policy(tokenizer, tmp_path_factory.mktemp("policy") / "policy", extra=0.5))


def test_make_pairs_orders_by_the_gold_judge(tmp_path, policy):
    out = tmp_path / "pairs.jsonl"
    info = make_pairs(PROMPTS, out, model=policy, judge_spec="gold", reply_cap=24, temperature=0.7, seed=0,
                      batch_size=8)
    pairs = read_pairs(out)
    assert len(pairs) == info["pairs"] > 0
    assert info["pairs"] + info["close"] + info["cut_off"] == len(PROMPTS) == info["candidate_pairs"]
    assert {p["prompt"] for p in pairs} <= set(PROMPTS)
    for pair in pairs:
        assert pair["score_chosen"] > pair["score_rejected"]
    rescored = GoldJudge().score([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
    assert rescored == pytest.approx([p["score_chosen"] for p in pairs])
    # same seed, same pairs
    make_pairs(PROMPTS, tmp_path / "again.jsonl", model=policy, reply_cap=24, seed=0, batch_size=8)
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()


def test_several_replies_pair_every_two_with_a_clear_margin(tmp_path, policy):
    out = tmp_path / "pairs.jsonl"
    info = make_pairs(PROMPTS, out, model=policy, reply_cap=24, seed=0, batch_size=16, replies_per_prompt=4,
                      min_margin=0.01)
    pairs = read_pairs(out)
    assert info["candidate_pairs"] == len(PROMPTS) * 6  # 4 replies: 6 pairs per prompt
    assert info["pairs"] + info["close"] + info["cut_off"] == info["candidate_pairs"]
    assert len(pairs) == info["pairs"] > len(PROMPTS)  # more pairs than prompts: the point of several replies
    assert all(p["score_chosen"] - p["score_rejected"] > 0.01 for p in pairs)
    assert max(sum(p["prompt"] == prompt for p in pairs) for prompt in PROMPTS) > 1
    # a larger margin keeps a subset of the same samples' pairs
    stricter = make_pairs(PROMPTS, tmp_path / "strict.jsonl", model=policy, reply_cap=24, seed=0, batch_size=16,
                          replies_per_prompt=4, min_margin=0.2)
    assert stricter["pairs"] < info["pairs"] and stricter["close"] > info["close"]
    with pytest.raises(UsageError, match="replies-per-prompt must be >= 2"):
        make_pairs(PROMPTS, out, model=policy, replies_per_prompt=1)


def test_pairs_cli(tmp_path, policy, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:4]))
    out = tmp_path / "p.jsonl"
    args = ["pairs", "--prompts", str(prompts), "--out", str(out), "--model", policy, "--reply-cap", "24"]
    assert main(args + ["--judge", "vader"]) == 2  # VADER scores random tokens 0: every pair is a tie
    assert "no usable pair among 4 prompts (4 ties or within --min-margin 0" in capsys.readouterr().err
    # random-token replies often tie under gold too (no word VADER or profanity-check knows): 4 replies a prompt
    # give 24 candidate pairs, not 4
    assert main(args + ["--replies-per-prompt", "4"]) == 0
    assert "pairs" in capsys.readouterr().out and out.is_file()
    assert main(args + ["--judge", "nope"]) == 2
    assert "unknown judge" in capsys.readouterr().err


# pairs of 3 prompts: their length gaps (chosen minus rejected, tokens). a: 3 longer-chosen, 1 shorter-chosen, 1 tie;
# b: 1 longer, 2 shorter; c: 2 longer. Per prompt 1+1 of a and of b are kept; of the surplus (2 longer of a, 1 shorter
# of b, 2 longer of c) 1 longer and the 1 shorter: 6 unequal pairs, 3 longer-chosen, and the tie.
BALANCE_PROMPTS = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
BALANCE_GAPS = [5, 3, 1, -2, 0, -4, -6, 2, 7, 8]


def test_length_balance_half_keeps_as_many_longer_as_shorter_chosen_pairs():
    for seed in range(20):
        keep = length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "half", seed=seed)
        gaps = [BALANCE_GAPS[i] for i in keep]
        assert keep == sorted(keep) and len(keep) == 7 and 4 in keep  # the tie stays
        assert sum(g > 0 for g in gaps) == sum(g < 0 for g in gaps) == 3
        assert 3 in keep  # a's one shorter-chosen pair is always kept
        assert sum(BALANCE_PROMPTS[i] == "a" and BALANCE_GAPS[i] > 0 for i in keep) in (1, 2)
        assert keep == length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "half", seed=seed)  # seeded
    draws = {tuple(length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "half", seed=seed)) for seed in range(20)}
    assert len(draws) > 1


def test_length_balance_similar_respects_the_tolerance_and_none_keeps_all():
    assert length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "similar", tolerance=2) == [2, 3, 4, 7]
    assert length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "similar", tolerance=0) == [4]
    assert length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "none") == list(range(10))
    with pytest.raises(UsageError, match="length balance must be one of none, similar, half"):
        length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "short")
    with pytest.raises(UsageError, match="length-tolerance must be >= 0"):
        length_balanced(BALANCE_PROMPTS, BALANCE_GAPS, "similar", tolerance=-1)


def test_pair_replies_balances_and_counts_what_it_dropped():
    # one prompt, 4 finished replies: the longer the better, so every one of the 6 pairs is longer-chosen
    replies = JudgedReplies(["p"], 4, ["a", "bb", "ccc", "dddd"], [1, 2, 3, 4], [True] * 4, [0.1, 0.2, 0.3, 0.4],
                            "gold")
    assert pair_replies(replies, 0.0).chosen_longer == 6
    half = pair_replies(replies, 0.0, "half")
    assert half.rows == [] and half.unbalanced == 6  # length would predict every pair: none is kept
    similar = pair_replies(replies, 0.0, "similar", length_tolerance=1)
    assert [(r["chosen"], r["rejected"]) for r in similar.rows] == [("bb", "a"), ("ccc", "bb"), ("dddd", "ccc")]
    assert similar.unbalanced == 3 and similar.chosen_longer == 3
    with pytest.raises(UsageError, match="length balance must be one of"):  # before any sampling
        make_pairs(PROMPTS, "unused.jsonl", model="smollm2", length_balance="long")


def test_summary_line_counts_in_the_singular_and_plural():
    info = {"pairs": 3, "prompts": 1, "replies_per_prompt": 4, "close": 2, "min_margin": 0.1, "cut_off": 1,
            "judge": "gold", "mean_score_chosen": 0.5, "mean_score_rejected": 0.1, "chosen_longer_fraction": 0.5}
    assert summary_line(info).startswith("pairs: 3 from 1 prompt x 4 replies (")
    two_prompts_one_reply = info | {"prompts": 2, "replies_per_prompt": 1}
    assert summary_line(two_prompts_one_reply).startswith("pairs: 3 from 2 prompts x 1 reply (")
    balanced = info | {"length_balance": "similar", "length_tolerance": 8, "unbalanced": 5}
    assert "cut-off reply skipped, 5 dropped by the length balance similar (tolerance 8 tokens)); " in summary_line(
        balanced)


def test_read_pairs_accepts_chat_messages(tmp_path):
    row = {
        "prompt": "Hi?",
        "chosen": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello there!"}],
        "rejected": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Go away."}],
    }
    no_prompt = {k: v for k, v in row.items() if k != "prompt"}
    path = tmp_path / "uf.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(no_prompt) + "\n")
    expected = {"prompt": "Hi?", "chosen": "Hello there!", "rejected": "Go away."}
    assert read_pairs(path) == [expected, expected]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "p", "chosen": "a"}, ':2: "rejected" must be'),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, ':2: "chosen" must be'),
        ({"prompt": "", "chosen": "a", "rejected": "b"}, ':2: needs a non-empty "prompt"'),
        ({"prompt": "p", "chosen": "a", "rejected": "b", "score_chosen": "high"}, ':2: "score_chosen" must be'),
    ],
)
def test_malformed_pairs(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(UsageError, match=message):
        read_pairs(path)
    assert main(["reward-model", "train", "--pairs", str(path), "--out", str(tmp_path / "rm")]) == 2


def noisy_pool(n: int) -> list[dict]:
    return [{"prompt": f"p{k % 7}", "chosen": f"good {k}", "rejected": f"bad {k}", "score_chosen": 1.0 + k,
             "score_rejected": -1.0 - k} for k in range(n)]


def test_label_noise_flips_the_stated_share_with_a_fixed_seed():
    pool = noisy_pool(200)
    noisy = flip_labels(pool, 0.25, seed=3)
    flipped = [k for k, pair in enumerate(noisy) if pair.get("flipped")]
    assert len(flipped) == 50  # exactly a quarter, not a coin per pair
    for k, pair in enumerate(noisy):
        original = pool[k]
        if k in flipped:  # the worse reply is now "chosen", its score with it
            assert (pair["chosen"], pair["rejected"]) == (original["rejected"], original["chosen"])
            assert (pair["score_chosen"], pair["score_rejected"]) == (original["score_rejected"],
                                                                      original["score_chosen"])
        else:
            assert pair == original
    assert flip_labels(pool, 0.25, seed=3) == noisy  # the same seed flips the same pairs
    assert [p.get("flipped") for p in flip_labels(pool, 0.25, seed=4)] != [p.get("flipped") for p in noisy]
    assert flip_labels(pool, 0.0, seed=3) == pool and "flipped" not in pool[0]  # the input is left alone
    assert sum(p.get("flipped", False) for p in flip_labels(noisy_pool(10), 0.25, seed=0)) == 2  # round(2.5)
    with pytest.raises(UsageError, match=r"label noise must be a fraction in \[0, 1\], got 1.5"):
        flip_labels(pool, 1.5, seed=0)


def test_a_pair_subset_is_seeded_and_keeps_the_pool_order():
    pool = noisy_pool(100)
    subset = pair_subset(pool, 30, seed=1)
    assert len(subset) == 30 and len({p["chosen"] for p in subset}) == 30
    assert [pool.index(p) for p in subset] == sorted(pool.index(p) for p in subset)
    assert pair_subset(pool, 30, seed=1) == subset and pair_subset(pool, 30, seed=2) != subset
    assert pair_subset(pool, None, seed=1) == pool
    with pytest.raises(UsageError, match="a subset of 101 pairs from a pool of 100"):
        pair_subset(pool, 101, seed=1)
