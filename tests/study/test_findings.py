"""The report's result sentences are generated from the numbers: made-up summaries of each kind give each wording."""

from ppo_rlhf.study.findings import (
    along_the_way_sentence,
    caveats,
    curve_sentence,
    headline,
    reward_model_sentence,
    run_sentence,
    settings_sentence,
    word_baseline_sentence,
)

START = {"model": "start", "run": None, "iteration": None}


def row(gold: tuple[float, float, float], proxy: tuple[float, float, float], kl: float = 4.2, run: str = "beta005",
        iteration: int = 20) -> dict:
    def change(m: tuple[float, float, float]) -> dict:
        return dict(zip(("mean", "lo", "hi"), m))

    return {"model": f"{run} step {iteration}", "run": run, "iteration": iteration, "kl": kl,
            "gold_change": change(gold), "proxy_change": change(proxy)}


def test_gain_that_excludes_zero_gives_the_real_share():
    text = run_sentence("PPO (beta 0.05)", row((0.30, 0.10, 0.50), (0.60, 0.40, 0.80), kl=3.14))
    assert text == ("PPO (beta 0.05) raised the gold score by 0.30 [+0.10, +0.50] start-model standard deviations at a "
                    "KL of 3.1 nats per reply from the start model (step 20); the proxy claimed +0.60 [+0.40, +0.80], "
                    "so about 50% of the claimed gain was real.")


def test_gold_interval_that_includes_zero_is_no_measurable_change():
    text = run_sentence("PPO (beta 0.05)", row((0.05, -0.10, 0.20), (0.80, 0.50, 1.10)))
    assert "did not measurably change the gold score (+0.05 [-0.10, +0.20]" in text
    assert "raised" not in text and "upper 95% bound is 25% of that claim, so most of the proxy's gain" in text
    # the demo's case (2026-12-03): a negative point estimate gives no negative share
    text = run_sentence("PPO (beta 0.05)", row((-0.03, -0.18, 0.12), (0.44, 0.27, 0.61)))
    assert text.endswith("the gold change's upper 95% bound is 27% of that claim, so most of the proxy's gain was not "
                         "real.")
    wide = run_sentence("PPO (beta 0.05)", row((0.1, -0.2, 0.6), (0.5, 0.3, 0.7)))
    assert wide.endswith("upper 95% bound is 120% of that claim: too uncertain to say how much of the gain was real.")


def test_proxy_up_gold_down_is_over_optimisation():
    text = run_sentence("PPO without a KL penalty (beta 0)", row((-0.40, -0.70, -0.10), (1.20, 0.90, 1.50), run="nokl"))
    assert "lowered the gold score by 0.40 [-0.70, -0.10]" in text
    assert "none of the claimed gain was real: the gold score fell while the proxy rose" in text and "%" not in text


def test_no_share_when_the_proxy_gain_includes_zero():
    text = run_sentence("PPO (beta 0.05)", row((0.02, -0.2, 0.3), (0.10, -0.05, 0.25)))
    assert "not distinguishable from zero either" in text and "%" not in text


def test_headline_caveats_and_reward_model():
    summary = [START, row((0.3, 0.1, 0.5), (0.6, 0.4, 0.8), iteration=10), row((0.2, -0.1, 0.5), (0.9, 0.6, 1.2)),
               row((-0.4, -0.7, -0.1), (1.2, 0.9, 1.5), run="nokl")]
    rm_info = {"heldout_pairs": 120, "train_pairs": 1600, "before": {"accuracy": 0.5},
               "after": {"accuracy": 0.7, "length_corr": 0.31},
               "learning_curve": [{"pairs": 0, "epochs": 0, "accuracy": 0.5},
                                  {"pairs": 800, "epochs": 1, "accuracy": 0.6},
                                  {"pairs": 1600, "epochs": 1, "accuracy": 0.7}]}
    evaluation = {"summary": summary, "settings": {"n_prompts": 40, "replies_per_prompt": 2}}
    study = {"runs": {"beta005": 0.05, "nokl": 0.0}, "rm_info": rm_info,
             "settings": {"model": "smollm2", "betas": "0.05,0", "iterations": 30, "batch_size": 16, "reply_cap": 48}}
    result, curves, reward_model, settings = headline(evaluation, study)
    # nokl has one checkpoint: no curve; beta005's step 10 gold interval excludes zero before its last checkpoint
    assert curves == curve_sentence("the beta 0.05 run", summary[1:3]) + " " + along_the_way_sentence(
        summary, {"beta005": "the beta 0.05 run", "nokl": "the run without a KL penalty"})
    assert "excluded zero in the beta 0.05 run at step 10 (KL 4.2)" in curves and "3 gold intervals" in curves
    assert "peaked at step 10" in curves and "the fall is not a measured one" in curves
    # the last checkpoint of each run, in the study's order
    assert result.startswith("PPO (beta 0.05) did not measurably change the gold score (+0.20 [-0.10, +0.50]")
    assert "(step 20)" in result and "PPO without a KL penalty (beta 0) lowered the gold score by 0.40" in result
    assert reward_model == reward_model_sentence(rm_info)
    assert "120 held-out pairs like the gold judge with accuracy 0.70 (chance is 0.50; 0.50 before training)" \
        in reward_model
    assert "+0.31" in reward_model and "still rising at the end (0.60 after 800 pairs, 0.70 after 1600)" in reward_model
    assert "40 held-out prompts x 2 replies" in settings and "(beta) 0.05,0" in settings
    notes = caveats(summary, evaluation["settings"], rm_info)
    assert "beta005: the gold change's 95% interval includes zero at step 20 +0.20 [-0.10, +0.50]." in notes
    assert not any("step 10" in note or note.startswith("nokl") for note in notes)
    assert any("Only 40 held-out prompts" in note for note in notes)
    assert any("only 120 held-out pairs" in note for note in notes)
    assert any("accuracy, 0.70, is below 0.75" in note for note in notes)
    # a study of the designed sizes, every interval clear of zero: no caveat
    clear = [START, row((0.3, 0.1, 0.5), (0.6, 0.4, 0.8))]
    big_rm = rm_info | {"heldout_pairs": 250, "after": {"accuracy": 0.8, "length_corr": None}}
    assert caveats(clear, {"n_prompts": 120}, big_rm) == []
    assert "difference is n/a" in reward_model_sentence(big_rm)


def test_proxy_unclear_after_a_real_gold_gain_says_so_without_either():
    """The smoke run's case: the gold change excludes zero, the proxy's does not ("either" would misread it)."""
    text = run_sentence("PPO (beta 0.05)", row((0.19, 0.02, 0.36), (-0.25, -1.25, 0.74)))
    assert text.startswith("PPO (beta 0.05) raised the gold score by 0.19 [+0.02, +0.36]")
    assert text.endswith("the proxy's own change, -0.25 [-1.25, +0.74], was not distinguishable from zero.")


def test_a_learning_curve_that_fell_is_not_called_flat():
    rm_info = {"heldout_pairs": 7, "train_pairs": 51, "before": {"accuracy": 0.43},
               "after": {"accuracy": 0.43, "length_corr": 0.26},
               "learning_curve": [{"pairs": 0, "epochs": 0, "accuracy": 0.43},
                                  {"pairs": 32, "epochs": 1, "accuracy": 0.57},
                                  {"pairs": 51, "epochs": 1, "accuracy": 0.43}]}
    text = reward_model_sentence(rm_info)
    assert "falling at the end (0.57 after 32 pairs, 0.43 after 51)" in text and "flat" not in text


def test_curve_sentence_calls_a_fall_measured_only_when_the_intervals_part():
    rising = [row((0.1 * k, 0.1 * k - 0.05, 0.1 * k + 0.05), (0.2 * k, 0.1, 0.3), kl=k, iteration=k) for k in (1, 2, 3)]
    assert "highest at the last checkpoint (+0.30 [+0.25, +0.35]): no sign of over-optimisation" in curve_sentence(
        "the beta 0.05 run", rising)
    peak = row((0.50, 0.40, 0.60), (0.5, 0.3, 0.7), kl=2.0, iteration=2)
    fell = row((0.10, 0.00, 0.20), (0.9, 0.7, 1.1), kl=5.0, iteration=4)
    text = curve_sentence("the run without a KL penalty", [fell, peak])
    assert text == ("Over its 2 evaluated checkpoints, the run without a KL penalty went to a KL of 5.0 nats; its gold "
                    "change peaked at step 2 (+0.50 [+0.40, +0.60], KL 2.0) and was 0.40 lower at step 4 (+0.10 "
                    "[+0.00, +0.20]), while the proxy rose from +0.50 to +0.90: gold fell while the proxy rose, the "
                    "over-optimisation Gao et al. describe.")
    overlapping = row((0.35, 0.20, 0.50), (0.9, 0.7, 1.1), kl=5.0, iteration=4)
    assert "the fall is not a measured one" in curve_sentence("the beta 0 run", [peak, overlapping])
    both_fell = row((0.10, 0.00, 0.20), (0.2, 0.0, 0.4), kl=5.0, iteration=4)
    assert curve_sentence("the beta 0 run", [peak, both_fell]).endswith("the proxy did not rise from +0.50 to +0.20.")


def test_word_baseline_sentence_compares_and_reads_the_trend():
    rising = [{"pairs": 464, "accuracy": 0.58}, {"pairs": 928, "accuracy": 0.60}, {"pairs": 1856, "accuracy": 0.64}]
    assert word_baseline_sentence(0.64, rising) == (
        "For scale, word counts alone (a logistic regression on the same training pairs) ranked the held-out pairs "
        "with accuracy 0.64 (0.60 after 928 pairs); the reward model did about as well. Word counts were still "
        "gaining with more pairs, so more labelled pairs are the first thing to try.")
    flat = [{"pairs": 928, "accuracy": 0.70}, {"pairs": 1856, "accuracy": 0.70}]
    text = word_baseline_sentence(0.80, flat)
    assert text.endswith("the reward model did 0.10 better.") and "still gaining" not in text
    assert word_baseline_sentence(0.60, flat).endswith("the reward model did 0.10 worse.")


def test_the_word_baseline_draws_the_conclusion_when_it_is_there():
    rm_info = {"heldout_pairs": 321, "train_pairs": 1856, "before": {"accuracy": 0.38},
               "after": {"accuracy": 0.64, "length_corr": 0.15},
               "learning_curve": [{"pairs": 928, "epochs": 1, "accuracy": 0.69},
                                  {"pairs": 1856, "epochs": 1, "accuracy": 0.64}]}
    summary = [START, row((0.0, -0.1, 0.1), (0.4, 0.2, 0.6))]
    study = {"runs": {"beta005": 0.05}, "rm_info": rm_info, "settings": {}}
    alone = headline({"summary": summary, "settings": {}}, study)[1]
    assert "falling at the end (0.69 after 928 pairs, 0.64 after 1856): more pairs of this kind" in alone
    baseline = [{"pairs": 928, "accuracy": 0.60}, {"pairs": 1856, "accuracy": 0.64}]
    both = headline({"summary": summary, "settings": {}}, study | {"word_baseline": baseline})[1]
    assert "falling at the end (0.69 after 928 pairs, 0.64 after 1856). For scale, word counts" in both
    assert "would likely not help" not in both and "more labelled pairs are the first thing to try" in both


def test_an_interval_of_zero_width_is_no_evidence():
    """The quick demo kept one held-out prompt: resampling it gives [x, x], which must not read as a measured change."""
    one_prompt = row((-0.49, -0.49, -0.49), (53.2, 53.2, 53.2), iteration=2)
    text = run_sentence("PPO (beta 0.05)", one_prompt)
    assert "did not measurably change the gold score" in text and "not distinguishable from zero either" in text
    peak = row((1.06, 1.06, 1.06), (33.3, 33.3, 33.3), iteration=1)
    assert "the fall is not a measured one" in curve_sentence("the beta 0.05 run", [peak, one_prompt])


def test_an_interval_that_excludes_zero_before_the_end_is_a_hint_weighed_against_the_count():
    # the demo's numbers of 2026-12-04: one gold interval of ten below zero, at beta 0.05 step 8
    labels = {"beta005": "the beta 0.05 run", "nokl": "the run without a KL penalty"}
    summary = [START] + [row((-0.10, -0.25, 0.05), (0.1, -0.1, 0.3), kl=0.3 * k, iteration=k) for k in (2, 4, 6)]
    summary += [row((-0.151, -0.291, -0.006), (0.207, 0.065, 0.349), kl=1.2, iteration=8),
                row((-0.113, -0.274, 0.046), (0.317, 0.164, 0.470), kl=1.86, iteration=10)]
    summary += [row((-0.05, -0.2, 0.1), (0.1 * k, 0.0, 0.2 * k), kl=0.5 * k, run="nokl", iteration=2 * k)
                for k in range(1, 6)]
    assert along_the_way_sentence(summary, labels) == (
        "Before the last checkpoint, the gold change's interval excluded zero in the beta 0.05 run at step 8 (KL 1.2): "
        "gold -0.15 [-0.29, -0.01], proxy +0.21 [+0.07, +0.35]. Read it as a hint, not a finding: 10 gold intervals "
        "were drawn at 95% each, and with no real change at least one would exclude zero by chance with probability "
        "up to 40%.")
    study = {"runs": {"beta005": 0.05, "nokl": 0.0}, "rm_info": None, "settings": {}}
    assert "Read it as a hint" in headline({"summary": summary, "settings": {}}, study)[1]
    # only the last checkpoint excluding zero is the run sentence's business, not a hint
    summary[4] = row((-0.15, -0.25, 0.05), (0.207, 0.065, 0.349), kl=1.2, iteration=8)
    summary[5] = row((-0.3, -0.5, -0.1), (0.3, 0.1, 0.5), kl=1.86, iteration=10)
    assert along_the_way_sentence(summary, labels) is None
    assert "Read it as a hint" not in " ".join(headline({"summary": summary, "settings": {}}, study))


def test_the_settings_sentence_says_one_reply_in_the_singular():
    # the full preset evaluates one reply a prompt; its report said "200 held-out prompts x 1 replies"
    one = settings_sentence({"settings": {}}, {"n_prompts": 200, "replies_per_prompt": 1})
    assert "evaluation on 200 held-out prompts x 1 reply per checkpoint, scores" in one
    two = settings_sentence({"settings": {}}, {"n_prompts": 100, "replies_per_prompt": 2})
    assert "evaluation on 100 held-out prompts x 2 replies per checkpoint, scores" in two


def test_the_settings_sentence_lists_the_arms_and_counts_seeds_in_words():
    arms = {"arms": "proxy,gold", "kl_targets": "1"}
    assert "; arms proxy, gold, 1 seed of the proxy arm, checkpoints" in settings_sentence(
        {"settings": arms | {"seeds": 1}}, {})
    assert "; arms proxy, gold, 3 seeds of the proxy arm, checkpoints" in settings_sentence(
        {"settings": arms | {"seeds": 3}}, {})


def test_hints_of_several_runs_name_the_arm_and_seed_of_each():
    # the full study of 2026-12-07 printed "in proxy the run without a KL penalty" for three seeds alike, and "Read
    # they as a hint"
    summary = [START]
    for run in ("proxy_nokl_s1", "proxy_nokl_s2"):
        summary += [row((-0.2, -0.35, -0.05), (0.1, -0.1, 0.3), kl=3.0, run=run, iteration=4),
                    row((0.5, 0.3, 0.7), (0.9, 0.7, 1.1), kl=12.0, run=run, iteration=16)]
    study = {"runs": {"proxy_nokl_s1": 0.0, "proxy_nokl_s2": 0.0}, "rm_info": None, "settings": {},
             "arms": {f"proxy_nokl_s{k}": {"arm": "proxy", "beta": 0.0, "seed": k} for k in (1, 2)}}
    text = " ".join(headline({"summary": summary, "settings": {}}, study))
    assert ("excluded zero in the proxy arm's run without a KL penalty (seed 1) at step 4 (KL 3.0): gold -0.20 "
            "[-0.35, -0.05], proxy +0.10 [-0.10, +0.30]; in the proxy arm's run without a KL penalty (seed 2) at "
            "step 4") in text
    assert "Read them as a hint, not a finding: 4 gold intervals" in text


def test_the_curve_sentence_says_why_a_fall_is_not_measured():
    peak = row((0.50, 0.40, 0.60), (0.5, 0.3, 0.7), kl=2.0, iteration=2)
    one_prompt = row((0.10, 0.10, 0.10), (0.9, 0.9, 0.9), kl=5.0, iteration=4)
    assert curve_sentence("the beta 0 run", [peak, one_prompt]).endswith(
        "but a gold interval cannot be formed from one prompt, so the fall is not a measured one.")
    overlapping = row((0.35, 0.20, 0.50), (0.9, 0.7, 1.1), kl=5.0, iteration=4)
    assert curve_sentence("the beta 0 run", [peak, overlapping]).endswith(
        "but the two gold intervals overlap, so the fall is not a measured one.")


def test_a_proxy_fall_says_it_is_held_out_and_not_the_training_batch():
    """Issue 29 item 15: the sentence sits beside a dashboard whose training score rose; it says which is which."""
    fell = row((-0.1, -0.3, 0.1), (-0.5, -0.8, -0.2)) | {"proxy_eos_change": {"mean": 0.05, "lo": -0.1, "hi": 0.2}}
    text = run_sentence("PPO (beta 0.05)", fell)
    assert "on held-out prompts PPO did not even raise the score it maximised, the proxy with the EOS rule " \
           "(+0.05 [-0.10, +0.20]" in text
    assert "training dashboard's score" in text and "measured on the training batches" in text


def test_a_proxy_fall_while_the_eos_rule_score_rose_says_the_policy_gained_by_finishing():
    """The 2026-12-06 demo's case: the proxy alone fell on held-out prompts while the score PPO maximised, the
    proxy with the EOS rule, rose with the share of finished replies; "did not even raise the score it maximised"
    was false there."""
    fell = row((-0.11, -0.25, 0.03), (-0.15, -0.27, -0.03), kl=1.03, iteration=10) | {
        "proxy_eos_change": {"mean": 0.21, "lo": 0.08, "hi": 0.33}, "finished": 0.69}
    text = run_sentence("PPO (beta 0.05)", fell, START | {"finished": 0.45})
    assert text.endswith("the proxy claimed -0.15 [-0.27, -0.03], a fall; what PPO maximised, the proxy with the EOS "
                         "rule (a fixed low score for a reply cut off at the cap), rose +0.21 [+0.08, +0.33] as the "
                         "share of finished replies went from 0.45 to 0.69: the policy gained by finishing its "
                         "replies, not by writing what the proxy scores higher.")
    assert "did not even raise" not in text
    older = run_sentence("PPO (beta 0.05)", row((-0.11, -0.25, 0.03), (-0.15, -0.27, -0.03)))
    assert older.endswith("the proxy claimed -0.15 [-0.27, -0.03], a fall on held-out prompts.")
