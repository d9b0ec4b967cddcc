"""The reward-hacking monitor (ppo_rlhf/ppo/monitor.py): its numbers against hand computations, its baseline through
a checkpoint, and `monitor_judges` on tiny-model runs (scored beside the reward, never part of it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ppo_rlhf import PPOConfig, PPOTrainer, UsageError
from ppo_rlhf.cli import main
from ppo_rlhf.ppo.dashboard import dashboard_line, scalar_tags
from ppo_rlhf.ppo.monitor import GAIN_STANDARD_ERRORS, HackingMonitor, LengthBaseline, length_share, pearson

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time",
           "I love this day", "The quick brown fox", "This is terrible", "A cat in a house"]
TIME_KEYS = ("time_gen", "time_score", "time_update", "time_total", "gen_tokens_per_s")

# the start policy's replies: rewards r and lengths l (tokens)
START_R, START_L = [1.0, 2.0, 3.0, 6.0], [2, 4, 4, 6]


# ------------------------------------------------------------------------------------------------ the arithmetic
def test_correlation_by_hand():
    # mean r 3, mean l 4; deviations (-2, -1, 0, 3) and (-2, 0, 0, 2): sum of products 10, of squares 14 and 8
    assert pearson(START_R, START_L) == pytest.approx(10 / math.sqrt(14 * 8), rel=1e-15)  # 0.9449
    assert pearson([3.0, 1.0], [1.0, 3.0]) == pytest.approx(-1.0)
    # undefined: a constant length, a constant reward, one reply, a non-finite reward
    assert pearson([1.0, 2.0, 3.0], [5, 5, 5]) is None
    assert pearson([2.0, 2.0], [1, 3]) is None
    assert pearson([2.0], [1]) is None
    assert pearson([1.0, math.nan, 3.0], [1, 2, 3]) is None


def test_baseline_fit_by_hand():
    baseline = LengthBaseline.fit(START_R, START_L)
    # least squares: b = sum(dr dl) / sum(dl^2) = 10 / 8; unbiased variance 14 / 3
    assert (baseline.mean_reward, baseline.mean_length, baseline.slope, baseline.count) == (3.0, 4.0, 1.25, 4)
    assert baseline.reward_variance == pytest.approx(14 / 3)
    assert LengthBaseline.fit([1.0, 2.0], [7, 7]).slope is None  # one length: no slope


def test_length_share_by_hand():
    baseline = LengthBaseline.fit(START_R, START_L)
    # mean r 8.5 (gain 5.5), mean l 8: the start's slope explains 1.25 * (8 - 4) = 5 of the 5.5 gained
    rewards, lengths = [7.0, 8.0, 9.0, 10.0], [6, 8, 8, 10]
    standard_error = math.sqrt((14 / 3) / 4 + (5 / 3) / 4)  # variance of this batch: (2.25+0.25+0.25+2.25) / 3
    assert 5.5 > GAIN_STANDARD_ERRORS * standard_error  # 5.5 > 2.52: divided by
    assert length_share(baseline, rewards, lengths) == pytest.approx(10 / 11, rel=1e-15)
    # a lost reward: mean r -2 (gain -5), mean l 1.5: 1.25 * (1.5 - 4) / -5 = 0.625 (shorter replies lost it)
    assert length_share(baseline, [-3.0, -2.0, -1.0, -2.0], [1, 1, 2, 2]) == pytest.approx(0.625, rel=1e-15)
    # gain 0.25 against 2 * sqrt(14/12 + (0.6875 + 0.0625 + 1.5625 + 0.5625) / 3 / 4) = 2.56: noise, not divided by
    assert length_share(baseline, [3.0, 4.0, 2.0, 4.0], [4, 4, 4, 4]) is None
    assert length_share(baseline, START_R, START_L) is None  # no gain at all
    assert length_share(baseline, [7.0, math.nan], [1, 2]) is None  # a skipped batch
    assert length_share(LengthBaseline.fit([1.0, 2.0], [7, 7]), rewards, lengths) is None  # no slope


def test_the_threshold_is_two_standard_errors():
    # every start reply 0 (variance 0) and a batch of (g - 1, g + 1): se = sqrt(2 / 2), so 2 se = 2
    baseline = LengthBaseline.fit([0.0, 0.0], [1, 3])
    assert baseline.slope == 0.0
    assert length_share(baseline, [1.0, 3.0], [1, 3]) is None  # gain 2.0: exactly 2 se, still noise
    assert length_share(baseline, [1.5, 3.5], [1, 3]) == 0.0  # gain 2.5: the flat start explains none of it


def test_monitor_stats_and_its_baseline_through_a_state_dict():
    monitor = HackingMonitor()
    assert monitor.stats(START_R, START_L) == {"reward_length_corr": pytest.approx(0.944911182523068),
                                               "length_share": None}  # no baseline yet
    monitor.start(START_R, START_L)
    # deviations (-1.5, -0.5, 0.5, 1.5) and (-2, 0, 0, 2): products 6, squares 5 and 8
    expected = {"reward_length_corr": pytest.approx(6 / math.sqrt(5 * 8)), "length_share": pytest.approx(10 / 11)}
    assert monitor.stats([7.0, 8.0, 9.0, 10.0], [6, 8, 8, 10]) == expected
    state = json.loads(json.dumps(monitor.state_dict()))  # (plain numbers: a checkpoint holds them as they are)
    resumed = HackingMonitor()
    resumed.load_state_dict(state)
    assert resumed.baseline == monitor.baseline
    assert resumed.stats([7.0, 8.0, 9.0, 10.0], [6, 8, 8, 10]) == monitor.stats([7.0, 8.0, 9.0, 10.0], [6, 8, 8, 10])
    older = HackingMonitor()
    older.load_state_dict(None)  # a checkpoint from before the monitor: no share, never a wrong one
    assert older.stats([7.0, 8.0, 9.0, 10.0], [6, 8, 8, 10])["length_share"] is None
    unset = HackingMonitor()
    unset.start([1.0, math.inf], [1, 2])  # a non-finite start reward leaves no baseline
    assert unset.baseline is None


def test_dashboard_line_and_tracker_tags_show_the_monitor():
    stats = {"iteration": 3, "score": 0.5, "reward/exact_match": 0.75, "time_gen": 2.0,
             "reward_length_corr": 0.9449, "length_share": None, "monitor/judge": 0.25, "time_total": 9.0,
             "time_score": 1.0, "time_update": 6.0}
    assert "  len_r +0.94  (9s, gen 2s" in dashboard_line(stats)
    assert "len_r -" in dashboard_line({**stats, "reward_length_corr": None})
    assert "len_r" not in dashboard_line({k: v for k, v in stats.items() if k != "reward_length_corr"})  # older runs
    assert scalar_tags(stats) == {"ppo/score": 0.5, "ppo/reward/exact_match": 0.75, "time/time_gen": 2.0,
                                  "monitor/reward_length_corr": 0.9449, "monitor/judge": 0.25, "time/time_total": 9.0,
                                  "time/time_score": 1.0, "time/time_update": 6.0}  # None (undefined): no point


# ------------------------------------------------------------------------------------------------ on a run
@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("monitor")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    judges = root / "judges.py"
    judges.write_text("def words(completions, **columns):\n"
                      "    return [float(len(c.split())) for c in completions]\n")
    # a policy that ends about half its replies early: lengths that vary, within a batch and between batches
    return {"policy": str(tiny.eos_prone_policy(tokenizer, root / "policy", extra=0.6)), "prompts": str(prompts),
            "judges": str(judges)}


def settings(models, out: Path, **overrides) -> dict:
    values = dict(policy_model=models["policy"], prompts=models["prompts"], out=str(out), iterations=3, batch_size=8,
                  minibatch_size=4, epochs=1, max_new_tokens=12, reward_norm_samples=8, lora_rank=4,
                  checkpoint_every=1, report_to=[], quiet=True, policy_lr=1e-3, advantage_estimator="rloo",
                  group_size=2, temperature=1.5, dtype="float32", log_completions_every=1)
    return values | overrides


class LengthReward:
    """reward = reply length in tokens, + 10 once training starts (a callback's on_train_begin: after the
    normalisation samples): a gain of about 10 that the start's reward-length line (slope 1) does not explain.
    Records (bonus, lengths) of every call."""

    def __init__(self):
        self.bonus, self.calls = 0.0, []
        self.__name__ = "length_reward"

    def on_train_begin(self, trainer):
        self.bonus = 10.0

    def __call__(self, completions, completion_ids, **columns):
        lengths = [len(ids) for ids in completion_ids]
        self.calls.append((self.bonus, lengths))
        return [length + self.bonus for length in lengths]


def history(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (Path(run_dir) / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in rows]


def test_a_runs_monitor_against_a_hand_computation(models, tmp_path):
    reward = LengthReward()
    run_dir = PPOTrainer(PPOConfig(**settings(models, tmp_path / "run")), reward_funcs=[reward],
                         callbacks=[reward]).train()
    rows = history(run_dir)
    start = [length for bonus, lengths in reward.calls if bonus == 0 for length in lengths]  # the 8 norm samples
    batches = [lengths for bonus, lengths in reward.calls if bonus == 10]
    assert len(start) == 8 and len(batches) == 3 and np.std(start) > 0
    slope, mean_l0 = np.polyfit(start, start, 1)[0], np.mean(start)  # reward = length at the start: slope 1
    assert slope == pytest.approx(1.0)
    for row, lengths in zip(rows, batches):
        rewards = np.array(lengths, dtype=float) + 10
        assert row["len"] == pytest.approx(np.mean(lengths))  # the same replies as the dashboard's len
        assert row["rm_raw"] == pytest.approx(np.mean(rewards))
        if np.std(lengths) > 0:
            assert row["reward_length_corr"] == pytest.approx(np.corrcoef(rewards, lengths)[0, 1]) == pytest.approx(1)
        else:
            assert row["reward_length_corr"] is None
        gain = np.mean(rewards) - mean_l0  # the start's mean reward is its mean length
        assert gain > 2 * math.sqrt(np.var(start, ddof=1) / 8 + np.var(rewards, ddof=1) / 8)  # well above the noise
        assert row["length_share"] == pytest.approx((np.mean(lengths) - mean_l0) / gain, abs=1e-12)
    assert any(row["length_share"] != 0 for row in rows)


def test_monitor_judges_are_logged_and_change_nothing_else(models, tmp_path):
    def noisy(completions, **columns):
        """A judge that draws random numbers: the run's own must not move."""
        return (torch.rand(len(completions)) + 5).tolist()

    def sometimes(completions, completion_ids, **columns):
        return [float(len(ids)) if len(ids) % 2 else None for ids in completion_ids]

    base = settings(models, tmp_path / "plain")
    reward = LengthReward()
    plain = history(PPOTrainer(PPOConfig(**base), reward_funcs=[reward], callbacks=[reward]).train())
    reward = LengthReward()
    judged_dir = PPOTrainer(PPOConfig(**settings(models, tmp_path / "judged", report_to=["tensorboard"])),
                            reward_funcs=[reward], callbacks=[reward],
                            monitor_judges=[f"{models['judges']}:words", noisy, sometimes]).train()
    judged = history(judged_dir)
    judge_keys = {"monitor/words", "monitor/noisy", "monitor/sometimes"}
    assert all(judge_keys <= set(row) for row in judged)
    # the training's numbers, bit for bit: the judges never enter the reward, the update or the random numbers
    assert [{k: v for k, v in row.items() if k not in judge_keys} for row in judged] == plain
    completions = [json.loads(line) for line in (judged_dir / "completions.jsonl").read_text().splitlines()]
    for row in judged:
        replies = [c["completion"] for c in completions if c["iteration"] == row["iteration"]]
        assert len(replies) == 8
        assert row["monitor/words"] == pytest.approx(np.mean([len(reply.split()) for reply in replies]))
        assert 5 <= row["monitor/noisy"] <= 6
        lengths = [c["reward/length_reward"] - 10 for c in completions if c["iteration"] == row["iteration"]]
        odd = [length for length in lengths if length % 2]  # the replies it scored (None for the others)
        assert odd, "every reply of this batch had an even length: the None case alone was tested"
        assert row["monitor/sometimes"] == pytest.approx(np.mean(odd))
    saved = (judged_dir / "config.yaml").read_text()
    assert f"{models['judges']}:words" in saved and "noisy" in saved
    events = EventAccumulator(str(judged_dir / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"monitor/reward_length_corr", "monitor/length_share", "monitor/words", "monitor/noisy"} <= tags
    for tag, key in (("monitor/words", "monitor/words"), ("monitor/length_share", "length_share")):
        assert [e.value for e in events.Scalars(tag)] == pytest.approx([row[key] for row in judged])


def test_a_resumed_run_keeps_the_baseline(models, tmp_path):
    class StopAfterFirst:
        def on_iteration_end(self, trainer, stats):
            return stats["iteration"] == 0

    reward = LengthReward()
    whole = history(PPOTrainer(PPOConfig(**settings(models, tmp_path / "a")), reward_funcs=[reward],
                               callbacks=[reward]).train())
    assert all(row["length_share"] is not None for row in whole)  # (None everywhere would prove nothing)
    reward = LengthReward()
    PPOTrainer(PPOConfig(**settings(models, tmp_path / "b")), reward_funcs=[reward],
               callbacks=[reward, StopAfterFirst()]).train()
    checkpoint = torch.load(tmp_path / "b" / "checkpoints" / "iter_000001" / "state.pt", weights_only=True)
    assert checkpoint["trainer"]["monitor"]["baseline"]["count"] == 8
    reward = LengthReward()  # the resumed process measures no normalisation: the baseline comes from the checkpoint
    PPOTrainer(PPOConfig(**settings(models, tmp_path / "b")), reward_funcs=[reward], callbacks=[reward],
               resume=True).train()
    assert history(tmp_path / "b") == whole


def test_bad_monitor_judges_are_one_line(models, tmp_path, capsys):
    with pytest.raises(UsageError, match=r"^monitor_judges: reward function file .*missing\.py not found"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "a", monitor_judges=[str(tmp_path / "missing.py:f")])),
                   reward_funcs=[LengthReward()])
    with pytest.raises(UsageError, match="^monitor_judges: functions and loaded models go to the trainer"):
        PPOConfig(**settings(models, tmp_path / "a", monitor_judges=[len]))
    with pytest.raises(UsageError, match=r"^monitor_judges: .*judges\.py has no 'nothing'"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "a")), reward_funcs=[LengthReward()],
                   monitor_judges=[f"{models['judges']}:nothing"])
    argv = ["train", "--policy-model", models["policy"], "--prompts", models["prompts"], "--reward-funcs",
            f"{models['judges']}:words", "--monitor-judges", f"{models['judges']}", "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "monitor_judges: reward function" in err[0] and "needs its function" in err[0]
    assert not (tmp_path / "c").exists()


def test_a_failing_judge_names_itself(models, tmp_path):
    def broken(completions, **columns):
        raise ValueError("no")

    trainer = PPOTrainer(PPOConfig(**settings(models, tmp_path / "a")), reward_funcs=[LengthReward()],
                         monitor_judges=[broken])
    with pytest.raises(UsageError, match="^monitor_judges: reward function broken raised ValueError: no"):
        trainer.train()


def test_monitor_judges_from_the_command_line_and_a_resume(models, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(models["judges"]).parent)  # a relative spec: config.yaml keeps it absolute
    run = tmp_path / "cli"
    argv = ["train", "--policy-model", models["policy"], "--prompts", models["prompts"], "--reward-funcs",
            "judges.py:words", "--monitor-judges", "judges.py:words", "--out", str(run), "--iterations", "1",
            "--batch-size", "4", "--minibatch-size", "4", "--max-new-tokens", "8", "--reward-norm-samples", "4",
            "--lora-rank", "4", "--advantage-estimator", "rloo", "--group-size", "2", "--dtype", "float32",
            "--report-to", "none", "--quiet"]
    assert main(argv) == 0
    assert main(["train", "--resume", str(run), "--iterations", "2", "--quiet"]) == 0  # judges from config.yaml
    rows = history(run)
    # the same function as reward and as judge: the same mean, and a config that names its file
    assert len(rows) == 2 and all(row["monitor/words"] == row["reward/words"] for row in rows)
    assert f"- {models['judges']}:words" in (run / "config.yaml").read_text()
