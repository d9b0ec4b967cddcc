"""Issue 43's design on made-up numbers and tiny texts: the arms' rewards through the library's own reward_funcs,
checkpoints picked by KL, the pooled curves, the goal check in words, and the demo's presets."""

import argparse
import json

import numpy as np
import pytest

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.ppo.kl_spacing import checkpoint_kl, parse_targets, pick_by_kl, read_kls
from ppo_rlhf.rewards import CombinedReward, resolve_reward_funcs
from ppo_rlhf.study import demo as demo_module
from ppo_rlhf.study.arms import arm_reward, length_sign, parse_arms, run_label
from ppo_rlhf.study.curves import arm_curves
from ppo_rlhf.study.demo import FULL, DemoConfig, runs
from ppo_rlhf.study.findings import caveats, eos_sentences, goal_sentences, reach_sentence
from ppo_rlhf.study.judges import make_judge
from ppo_rlhf.study.stats import pooled_bootstrap

REPLIES = ["What a wonderful, happy day!", "I hate this awful, terrible mess.", "The fox jumps.", ""]


def rewards_of(specs: list[str], prompts: list) -> list[float]:
    combined = CombinedReward(resolve_reward_funcs(specs))
    return combined(prompts, REPLIES, [[1]] * len(REPLIES), [{}] * len(REPLIES))[0].tolist()


def test_gold_arm_scores_with_the_gold_judge_through_reward_funcs():
    spec = arm_reward("gold", "/rm", "gold", 1)["reward_funcs"]
    assert spec == ["ppo_rlhf.study.arms:gold_reward"]
    expected = make_judge("gold").score([""] * 4, REPLIES)
    assert rewards_of(spec, ["p"] * 4) == pytest.approx(expected, abs=1e-7)  # (float32, as the trainer holds it)
    # chat prompts: the completions come as conversations, the judge reads their text
    chat = [[{"role": "user", "content": "p"}]] * 4
    assert rewards_of(spec, chat) == pytest.approx(expected, abs=1e-7)
    assert expected[0] > 0 > expected[1]  # friendly above, hostile below: it is the judge, not a constant
    assert arm_reward("gold", "/rm", "vader", 1)["reward_funcs"] == ["ppo_rlhf.study.arms:vader_reward"]
    assert arm_reward("gold", "/rm", "rm:/judge", 1)["reward_funcs"] == ["/judge"]  # a reward-model gold: its folder


def test_length_arm_rewards_word_counts_signed_by_the_pairs():
    assert rewards_of(arm_reward("length", "/rm", "gold", 1)["reward_funcs"], ["p"] * 4) == [5, 6, 3, 0]
    assert rewards_of(arm_reward("length", "/rm", "gold", -1)["reward_funcs"], ["p"] * 4) == [-5, -6, -3, 0]
    longer = {"chosen": "a b c", "rejected": "a"}
    shorter = {"chosen": "a", "rejected": "a b"}
    tie = {"chosen": "a b", "rejected": "c d"}
    assert length_sign([longer, shorter, tie]) == 1  # one each way: a tie goes to longer
    assert length_sign([longer, shorter, shorter, tie, tie, tie]) == -1
    # every arm's critic starts from the proxy reward model; only the proxy arm's reward is it
    assert arm_reward("proxy", "/rm", "gold", 1) == {"reward_model": "/rm", "reward_funcs": [], "value_model": None,
                                                     "monitor_judges": ["ppo_rlhf.study.arms:gold_reward"]}
    # the monitor shows what the arm does not optimise: the proxy beside the gold's reward, both beside length's
    assert arm_reward("gold", "/rm", "gold", 1)["monitor_judges"] == ["/rm"]
    assert arm_reward("length", "/rm", "gold", 1)["monitor_judges"] == ["ppo_rlhf.study.arms:gold_reward", "/rm"]
    assert {arm_reward(arm, "/rm", "gold", 1)["value_model"] for arm in ("gold", "length")} == {"/rm"}


def test_arms_and_targets_are_checked():
    assert parse_arms("gold, proxy") == ["gold", "proxy"]
    for bad in ("", "proxy,golden", "proxy,proxy"):
        with pytest.raises(UsageError, match="arms"):
            parse_arms(bad)
    assert parse_targets("0.5,1,8") == [0.5, 1.0, 8.0]
    for bad in ("1,x", "2,1", "0,1", "1,1", "nan"):
        with pytest.raises(UsageError, match="KL targets"):
            parse_targets(bad)
    assert run_label("proxy", 0.0, 3) == "proxy_nokl_s3" and run_label("gold", 0.05, 1) == "gold_beta005_s1"


def test_checkpoints_are_picked_by_training_kl(tmp_path):
    # history row k: the batch checkpoint iter_k sampled; a NaN row (a skipped batch) is left out
    kls = [0.0, 0.2, 0.7, 1.0, 1.4, 2.6, 3.1, 4.4, 9.0, float("nan")]
    (tmp_path / "history.jsonl").write_text(
        "\n".join(json.dumps({"iteration": i, "kl": kl}) for i, kl in enumerate(kls)) + "\n")
    read = read_kls(tmp_path)
    assert 9 not in read and read[8] == 9.0
    # smoothed over the rows within one iteration: iter_2 (0.2 + 0.7 + 1.0) / 3 = 0.633, iter_3 1.033, iter_4 1.667,
    # iter_6 (2.6 + 3.1 + 4.4) / 3 = 3.367, iter_8 (4.4 + 9.0) / 2 = 6.7 (row 9 is NaN), iter_10 nothing near: nan
    assert checkpoint_kl(read, 3) == pytest.approx((0.7 + 1.0 + 1.4) / 3)
    assert checkpoint_kl(read, 8) == pytest.approx(6.7)
    assert np.isnan(checkpoint_kl(read, 11))
    picked = pick_by_kl(read, [2, 4, 6, 8, 10], [0.5, 1, 2, 4, 8])
    # 0.5: iter_2 (0.633); 1: iter_4 (1.667; iter_2 is below); 2: iter_6 (3.367); 4: iter_8 (6.7); 8: never; last
    assert picked == {2: [0.5], 4: [1.0], 6: [2.0], 8: [4.0], 10: ["last"]}
    # a jump past two targets: one checkpoint stands for both; the last may stand for a target too
    assert pick_by_kl(read, [2, 8], [1, 2, 4]) == {8: [1.0, 2.0, 4.0, "last"]}


def records_of(model: str, run: str | None, values: list[list[float]], finished: bool = True) -> list[dict]:
    """Records of one model: values[prompt][reply] = (proxy, gold, length) each the same number, for brevity."""
    return [{"model": model, "run": run, "prompt_index": p, "reply_index": r, "proxy": 2 * v, "gold": v,
             "length": -v, "proxy_eos": 2 * v, "gold_eos": v, "length_eos": -v, "finished": finished}
            for p, replies in enumerate(values) for r, v in enumerate(replies)]


def test_arm_curves_pool_seeds_matched_by_kl_target():
    start = [[0.0, 0.0], [1.0, 1.0], [0.0, 0.5]]
    s1 = [[1.0, 0.0], [2.0, 1.0], [0.5, 0.5]]
    s2 = [[0.0, 0.0], [1.0, 3.0], [1.0, 0.5]]
    gold = [[0.5, 0.5], [1.5, 1.5], [0.5, 1.0]]
    records = (records_of("start", None, start) + records_of("p1 step 4", "p1", s1)
               + records_of("p2 step 6", "p2", s2) + records_of("g step 2", "g", gold))
    summary = [{"run": None, "model": "start", "kl": 0.0, "finished": 1.0, "tokens": 10.0},
               {"run": "p1", "model": "p1 step 4", "iteration": 4, "kl": 1.5, "kl_targets": [1.0, "last"],
                "finished": 1.0, "tokens": 12.0},
               {"run": "p2", "model": "p2 step 6", "iteration": 6, "kl": 2.5, "kl_targets": ["last"],
                "finished": 0.5, "tokens": 14.0},
               {"run": "g", "model": "g step 2", "iteration": 2, "kl": 1.1, "kl_targets": [1.0, "last"],
                "finished": 1.0, "tokens": 8.0}]
    arms = {"p1": {"arm": "proxy", "beta": 0.0, "seed": 1}, "p2": {"arm": "proxy", "beta": 0.0, "seed": 2},
            "g": {"arm": "gold", "beta": 0.0, "seed": 1}}
    curves = arm_curves(records, summary, arms, n_boot=500)
    assert [(p["arm"], p["target"], p["seeds"], p["iterations"]) for p in curves] == [
        ("proxy", 1.0, [1], [4]), ("proxy", "last", [1, 2], [4, 6]), ("gold", 1.0, [1], [2]),
        ("gold", "last", [1], [2])]
    last = curves[1]
    assert last["kl"] == 2.0 and last["finished"] == 0.75 and last["tokens"] == 13.0
    changes = np.array([s1, s2]) - np.array(start)  # gold change per seed, prompt and reply
    assert last["gold_change"] == dict(zip(("mean", "lo", "hi"), pooled_bootstrap(changes, n_boot=500)))
    assert last["gold_change"]["mean"] == pytest.approx(5.5 / 12)  # by hand: (2.5 + 3.0) / 12 replies
    assert last["proxy_change"]["mean"] == pytest.approx(11 / 12) and last["length_change"]["mean"] == -5.5 / 12
    assert last["gap_change"]["mean"] == pytest.approx(5.5 / 12)  # proxy 2x gold: the gap is gold's change


def point(arm: str, target, kl: float, gold: tuple, gap: tuple = (0.0, -0.1, 0.1), seeds=(1,)) -> dict:
    interval = dict(zip(("mean", "lo", "hi"), gold))
    return {"arm": arm, "beta": 0.0, "target": target, "kl": kl, "seeds": list(seeds), "finished": 0.9,
            "tokens": 40.0, "gold_change": interval, "gap_change": dict(zip(("mean", "lo", "hi"), gap)),
            "proxy_change": interval, "length_change": interval, "proxy_eos_change": interval,
            "gold_eos_change": dict(zip(("mean", "lo", "hi"), (0.6, 0.4, 0.8))), "length_eos_change": interval}


def test_goal_check_says_which_part_was_met_and_which_failed():
    curves = [point("gold", 1.0, 1.2, (0.2, -0.05, 0.45)), point("gold", "last", 6.0, (0.5, 0.3, 0.7)),
              point("proxy", 1.0, 1.1, (0.1, -0.1, 0.3), seeds=(1, 2, 3)),
              point("proxy", "last", 8.2, (-0.1, -0.3, 0.1), gap=(0.4, 0.2, 0.6), seeds=(1, 2, 3))]
    text = goal_sentences(curves)
    assert text[1] == ("Part one was met: the gold arm raised the gold score at 1 of its 2 points, most at the last "
                       "checkpoint (KL 6.0), +0.50 [+0.30, +0.70].")
    assert text[2] == ("Part two was met: in the proxy arm the proxy's change exceeded the gold's by +0.40 [+0.20, "
                       "+0.60] at the last checkpoint (KL 8.2, 3 seeds).")
    # 2 gold-arm intervals and 2 x 2 proxy-arm ones (gold and gap): 1 - 0.95^6 = 26%
    assert text[3].startswith("The goal asks for one interval out of several: 6 were checked") and "26%" in text[3]
    flat = [point("gold", "last", 3.0, (0.1, -0.1, 0.3)), point("proxy", "last", 2.0, (-0.2, -0.5, 0.1))]
    text = goal_sentences(flat)
    # one point each: said so, not "at none of its 1 point"
    assert text[1].startswith("Part one failed: the gold arm's gold change did not rise above zero at its one point "
                              "(+0.10 [-0.10, +0.30] at the last checkpoint (KL 3.0))")
    assert text[2] == ("Part two failed: at the proxy arm's one point neither the gold change nor the gap between "
                       "proxy and gold changes excluded zero (the largest gold change -0.20 [-0.50, +0.10] at the last "
                       "checkpoint (KL 2.0), the largest gap +0.00 [-0.10, +0.10] at the last checkpoint (KL 2.0)).")
    flat_twice = [*flat, point("gold", 1.0, 1.0, (0.0, -0.2, 0.2)), point("proxy", 1.0, 1.0, (0.0, -0.2, 0.2))]
    text = goal_sentences(flat_twice)
    assert text[1].startswith("Part one failed: the gold arm's gold change rose above zero at none of its 2 points "
                              "(its highest, +0.10 [-0.10, +0.30]")
    assert text[2].startswith("Part two failed: at none of the proxy arm's 2 points did the gold change or the gap")
    assert goal_sentences([])[1:3] == ["Part one cannot be checked: the gold arm was not run.",
                                       "Part two cannot be checked: the proxy arm was not run."]
    eos = eos_sentences(curves, {"finished": 0.45, "tokens": 53.0}, 96)[0]
    assert eos.startswith("What the EOS rule did (a reply cut off at the 96-token cap scores a fixed -1 in training): "
                          "the start model finished 0.45 of its replies (53 tokens); at the last checkpoint, the gold "
                          "arm (PPO on the gold judge) finished 0.90 of its replies (40 tokens on average) and changed "
                          "the score it maximised, the gold with the EOS rule, by +0.60 [+0.40, +0.80], the gold "
                          "itself by +0.50 [+0.30, +0.70] (the rule's part, from the replies it finished or cut off: "
                          "+0.10); the proxy arm")


def test_presets_and_runs(monkeypatch):
    chosen = []
    monkeypatch.setattr(demo_module, "demo", chosen.append)
    parser = argparse.ArgumentParser()
    demo_module.add_arguments(parser)
    assert demo_module.run(parser.parse_args(["--full", "--seeds", "4"])) == 0
    full = chosen[-1]
    assert full.full and full.seeds == 4  # a flag given beats the preset
    assert full.eval_prompts == FULL["eval_prompts"] >= 200 and full.kl_targets == "0.5,1,2,4,8"
    assert max(parse_targets(full.kl_targets)) >= 8 and full.reply_cap > 64
    assert [run_label(*run) for run in runs(full)] == [
        "proxy_nokl_s1", "proxy_nokl_s2", "proxy_nokl_s3", "proxy_nokl_s4", "gold_nokl_s1", "length_nokl_s1"]
    default = build_config(DemoConfig, {})
    assert default.seeds == 1 and default.arms == "proxy,gold" and max(parse_targets(default.kl_targets)) >= 8
    assert full.arms == "proxy,gold,length"
    assert [run_label(*run) for run in runs(build_config(DemoConfig, {"betas": "0.05,0", "arms": "gold,proxy"}))] == [
        "gold_beta005_s1", "gold_nokl_s1", "proxy_beta005_s1", "proxy_nokl_s1"]
    with pytest.raises(UsageError, match="--quick, --full or --overoptimisation"):
        build_config(DemoConfig, {"quick": True, "full": True})
    with pytest.raises(UsageError, match="KL targets"):
        build_config(DemoConfig, {"kl_targets": "4,2"})


def test_the_full_preset_shares_every_stage_before_the_evaluation_with_the_demo():
    # `make demo-full` copies a finished demo's folder: only the new seeds and the evaluation may run again
    default, full = build_config(DemoConfig, {}), build_config(DemoConfig, FULL)
    for stage in ("prompts", "pairs", "reward model", "ppo"):
        assert demo_module.stage_settings(full, stage) == demo_module.stage_settings(default, stage), stage
    assert demo_module.stage_settings(full, "evaluation") != demo_module.stage_settings(default, "evaluation")
    assert set(runs(default)) < set(runs(full))  # the demo's runs are the full study's first ones


def test_reach_sentence_names_the_targets_not_reached():
    curves = [point("proxy", 1.0, 1.1, (0, -1, 1)), point("proxy", 2.0, 2.3, (0, -1, 1)),
              point("proxy", "last", 3.0, (0, -1, 1)), point("gold", "last", 0.4, (0, -1, 1))]
    assert reach_sentence(curves, [1, 2, 4, 8]) == (
        "KL targets reached by the runs' training KL (nats per reply; in the runs of several seeds, by any): proxy "
        "reached 1, 2, not 4, 8 (KL 3.0 at its last checkpoint); gold reached none, not 1, 2, 4, 8 (KL 0.4 at its "
        "last checkpoint).")
    notes = caveats([], {"n_prompts": 150}, None, {"eval_prompts": 200})
    assert notes == ["Only 150 held-out prompts were kept of the 200 the evaluation asked for (raise "
                     "--heldout-candidates)."]
