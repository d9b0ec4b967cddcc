import json
import random

import pytest

from ppo_rlhf.cli import main
from ppo_rlhf.models.loading import load_sequence_classifier, load_tokenizer
from ppo_rlhf.study.length_bias import length_fit, length_scale
from ppo_rlhf.study.pairs import read_pairs
from ppo_rlhf.study.reward_model import (
    RewardModelTraining,
    bradley_terry_logits,
    evaluate_pairs,
    load_pair_source,
    pair_order,
    pair_scores,
    prompt_order,
    train_reward_model,
)

import tiny

WORDS = "the quick brown fox jumps over lazy dog cat king queen house story energy".split()


def synthetic_pairs(n: int, seed: int = 0) -> list[dict]:
    """A learnable preference: the chosen reply ends with "happy", the rejected one with "sad"; the words
    before are random, so lengths vary independently of the label."""
    rng = random.Random(seed)

    def words() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))

    return [{"prompt": f"Story {i}.", "chosen": f"{words()} happy", "rejected": f"{words()} sad"} for i in range(n)]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tokenizer):
    return str(tiny.eos_prone_policy(tokenizer, tmp_path_factory.mktemp("base") / "base", extra=0.0))


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in synthetic_pairs(48)))
    return path


def test_learns_a_synthetic_preference_and_reloads(tmp_path, base, pairs_file):
    out = tmp_path / "rm"
    info = train_reward_model(pairs_file, out_dir=out, training=RewardModelTraining(
        base=base, epochs=2, lr=3e-2, batch_size=8, lora_rank=4, heldout_fraction=0.25, seed=0, max_length=128,
        dtype="float32"))
    assert info["train_pairs"] == 36 and info["heldout_pairs"] == 12 and info["dropped_too_long"] == 0
    # The random head already leans the right way (accuracy ~1 at margin ~0): training must widen the margin.
    assert info["after"]["accuracy"] >= 0.9
    assert info["after"]["mean_margin"] > info["before"]["mean_margin"] + 1.0
    assert -1 <= info["after"]["length_corr"] <= 1
    assert info["train_loss"][-1] < info["train_loss"][0]
    assert (out / "adapter_config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert json.loads((out / "rm_info.json").read_text())["after"] == info["after"]
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    assert not list(tmp_path.glob(".rm*"))  # no temporary folder left behind

    # Reloaded through models (LoRA merged), the held-out pairs score as they did at the end of training.
    heldout = read_pairs(pairs_file)
    random.Random(0).shuffle(heldout)
    again = evaluate_pairs(load_sequence_classifier(str(out)), load_tokenizer(str(out)), heldout[:12], batch_size=8)
    assert again["accuracy"] == info["after"]["accuracy"]
    assert again["mean_margin"] == pytest.approx(info["after"]["mean_margin"], abs=1e-4)


def test_trains_with_a_bf16_backbone(tmp_path, base, pairs_file):
    import torch

    from ppo_rlhf.models.precision import weight_dtypes

    out = tmp_path / "rm"
    info = train_reward_model(pairs_file, out_dir=out, training=RewardModelTraining(
        base=base, epochs=2, lr=3e-2, batch_size=8, lora_rank=4, heldout_fraction=0.25, seed=0, max_length=128,
        dtype="bfloat16"))
    assert info["dtype"] == "bfloat16" and info["after"]["accuracy"] >= 0.9
    # Learning is read on the held-out pairs: their mean margin grows from ~0 to several nats. The training loss's
    # epoch means are no test at this aggressive lr: on an AMX-BF16 CPU the second epoch's mean rose (0.67 -> 1.89:
    # a few pairs overshot to large losses) while held-out accuracy went to 1.0 and the margin to 6.3.
    assert info["after"]["mean_margin"] > info["before"]["mean_margin"] + 1.0
    loaded = load_sequence_classifier(str(out), torch.bfloat16)  # the saved LoRA + head, merged, backbone in bf16
    assert loaded.score.weight.dtype == torch.float32 and torch.bfloat16 in weight_dtypes(loaded)


def test_heldout_pairs_file_and_learning_curve(tmp_path, base, pairs_file):
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(p) + "\n" for p in synthetic_pairs(10, seed=7)))
    out = tmp_path / "rm"
    info = train_reward_model(pairs_file, out_dir=out, heldout_source=heldout, training=RewardModelTraining(
        base=base, epochs=2, lr=3e-2, batch_size=4, lora_rank=4, seed=0, max_length=128))
    assert info["train_pairs"] == 48 and info["heldout_pairs"] == 10  # every pair trains; the file is held out
    curve = json.loads((out / "learning_curve.json").read_text())
    assert curve == info["learning_curve"]
    # before training, after 1/8 (6 pairs: 2 steps of 4), 1/4, 1/2 and all of the first pass, after both epochs
    assert [(point["pairs"], point["epochs"]) for point in curve] == [(0, 0), (8, 1), (12, 1), (24, 1), (48, 1),
                                                                      (48, 2)]
    assert {key: curve[-1][key] for key in info["after"]} == info["after"]
    assert curve[0]["accuracy"] == info["before"]["accuracy"]
    assert all(0 <= point["accuracy"] <= 1 for point in curve)


def test_every_epoch_is_measured_and_the_callback_gets_each_held_out_margin(tmp_path, base, pairs_file):
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(p) + "\n" for p in synthetic_pairs(10, seed=7)))
    seen = []
    training = RewardModelTraining(base=base, epochs=3, lr=3e-2, batch_size=16, lora_rank=4, seed=0, max_length=128,
                                   shuffle_pairs=True)
    info = train_reward_model(pairs_file, out_dir=tmp_path / "rm", training=training, heldout_source=heldout,
                              on_heldout=lambda point, pairs, margins: seen.append((point, pairs, margins)))
    curve = info["learning_curve"]
    assert [(point["pairs"], point["epochs"]) for point in curve][-3:] == [(48, 1), (48, 2), (48, 3)]
    assert [point for point, _, _ in seen] == curve  # one call per learning-curve point
    for point, pairs, margins in seen:
        assert len(pairs) == len(margins) == 10 and point["accuracy"] == sum(m > 0 for m in margins) / 10
    assert info["shuffle_pairs"] is True and info["after"]["accuracy"] == curve[-1]["accuracy"]


def test_the_length_term_s_logit_by_hand():
    import torch

    chosen, rejected, gaps = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0]), torch.tensor([10, -4])
    assert bradley_terry_logits(chosen, rejected, gaps).tolist() == [1.0, -0.5]
    # + 0.5 * gap / 5: + 1.0 and - 0.4
    with_length = bradley_terry_logits(chosen, rejected, gaps, torch.tensor(0.5), scale=5.0)
    assert with_length.tolist() == pytest.approx([2.0, -0.9])


def length_biased_pairs(n: int, seed: int = 0) -> list[dict]:
    """synthetic_pairs whose chosen reply is usually the longer: 3 extra words in 3 of every 4 pairs."""
    pairs = synthetic_pairs(n, seed)
    for i, pair in enumerate(pairs):
        pair["chosen" if i % 4 else "rejected"] = "the cat and " + pair["chosen" if i % 4 else "rejected"]
    return pairs


def test_the_length_term_trains_but_the_saved_model_scores_without_it(tmp_path, base):
    from ppo_rlhf.study.reward_model import sequence_lengths

    pairs = tmp_path / "biased.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in length_biased_pairs(32)))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(p) + "\n" for p in length_biased_pairs(8, seed=7)))
    common = dict(base=base, epochs=1, lr=3e-2, batch_size=8, lora_rank=4, seed=0, max_length=128, dtype="float32")
    info = train_reward_model(pairs, out_dir=tmp_path / "rm", heldout_source=heldout,
                              training=RewardModelTraining(length_head=True, length_tolerance=2, **common))
    # the length expert starts at what length alone says of the training pairs: the longer reply mostly wins
    gaps = [a - b for a, b in sequence_lengths(load_tokenizer(base), read_pairs(pairs))]
    head = info["length_head"]
    assert head["scale_tokens"] == pytest.approx(length_scale(gaps), abs=1e-3)
    assert head["start_weight"] == pytest.approx(length_fit([g / length_scale(gaps) for g in gaps]), abs=1e-5)
    assert head["start_weight"] > 0 and head["weight"] != head["start_weight"]  # trained with the rest
    assert info["heldout"]["tolerance"] == 2 and info["heldout"]["all"]["pairs"] == 8
    assert info["heldout"]["all"]["accuracy"][0] == info["after"]["accuracy"]

    # saved, it is a plain one-output classifier whose margins are r(chosen) - r(rejected) alone, as measured
    out = tmp_path / "rm"
    saved = json.loads((out / "adapter_config.json").read_text())
    plain = train_reward_model(pairs, out_dir=tmp_path / "plain", heldout_source=heldout,
                               training=RewardModelTraining(**common))
    assert plain["length_head"] is None
    assert saved == json.loads((tmp_path / "plain" / "adapter_config.json").read_text())
    model = load_sequence_classifier(str(out))
    assert model.config.num_labels == 1
    again = evaluate_pairs(model, load_tokenizer(str(out)), read_pairs(heldout), batch_size=8)
    assert again["mean_margin"] == pytest.approx(info["after"]["mean_margin"], abs=1e-4)


def test_shuffled_pairs_mix_prompts_in_a_batch():
    import torch

    mixed = [{"prompt": f"P{k % 3}"} for k in range(9)]
    order = pair_order(mixed, torch.Generator().manual_seed(0), shuffle_pairs=True)
    assert sorted(order) == list(range(9))
    prompts = [mixed[k]["prompt"] for k in order]
    assert any(len(set(prompts[i : i + 3])) > 1 for i in (0, 3, 6))  # not one prompt's pairs per run of 3
    together = pair_order(mixed, torch.Generator().manual_seed(0), shuffle_pairs=False)
    assert together == prompt_order(mixed, torch.Generator().manual_seed(0))


def test_each_reply_is_scored_once_and_a_prompt_s_pairs_stay_together(base, monkeypatch):
    import torch

    import ppo_rlhf.models.scores as scores_module  # (reward_model imports it where used, after its file checks)

    model, tokenizer = load_sequence_classifier(base, init_score_head=True), load_tokenizer(base)
    replies = ["happy dog", "sad cat", "the king", "a queen story"]
    pairs = [{"prompt": "Story 1.", "chosen": a, "rejected": b} for i, a in enumerate(replies) for b in replies[i + 1:]]
    scored_rows = []
    original = scores_module.reward_scores

    def counting(model, input_ids, attention_mask, batch_size=None):
        scored_rows.append(len(input_ids))
        return original(model, input_ids, attention_mask, batch_size)

    monkeypatch.setattr(scores_module, "reward_scores", counting)
    with torch.no_grad():
        chosen, rejected, gap = pair_scores(model, tokenizer, pairs)
        one_by_one = [pair_scores(model, tokenizer, [pair]) for pair in pairs]
    assert scored_rows[0] == 4  # 6 pairs of 4 replies: 4 conversations, not 12
    assert chosen.tolist() == pytest.approx([c.item() for c, _, _ in one_by_one], abs=1e-5)
    assert rejected.tolist() == pytest.approx([r.item() for _, r, _ in one_by_one], abs=1e-5)
    assert gap.tolist() == [g.item() for _, _, g in one_by_one]

    mixed = [{"prompt": f"P{k % 3}"} for k in range(9)]
    order = prompt_order(mixed, torch.Generator().manual_seed(0))
    assert sorted(order) == list(range(9))
    prompts = [mixed[k]["prompt"] for k in order]
    assert all(len(set(prompts[i : i + 3])) == 1 for i in (0, 3, 6))  # each prompt's pairs in one run


def test_drops_pairs_over_max_length(tmp_path, base, pairs_file):
    from ppo_rlhf.errors import UsageError

    with pytest.raises(UsageError, match="fit in --max-length 5"):
        train_reward_model(pairs_file, out_dir=tmp_path / "rm", training=RewardModelTraining(base=base, max_length=5))


def ultrafeedback_rows(n: int) -> dict:
    rows = {"prompt": [], "chosen": [], "rejected": [], "score_chosen": [], "score_rejected": []}
    for pair in synthetic_pairs(n, seed=1):
        user = {"role": "user", "content": pair["prompt"]}
        rows["prompt"].append(pair["prompt"])
        rows["chosen"].append([user, {"role": "assistant", "content": pair["chosen"]}])
        rows["rejected"].append([user, {"role": "assistant", "content": pair["rejected"]}])
        rows["score_chosen"].append(8.0)
        rows["score_rejected"].append(3.0)
    return rows


def test_ultrafeedback_style_dataset(tmp_path, base, monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_dict(ultrafeedback_rows(12))

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    source = "hf:HuggingFaceH4/ultrafeedback_binarized:train_prefs"
    pairs = load_pair_source(source)
    assert calls == [("HuggingFaceH4/ultrafeedback_binarized", "train_prefs")]
    assert pairs[0] == {k: v for k, v in synthetic_pairs(12, seed=1)[0].items()}
    code = main(["reward-model", "train", "--pairs", source, "--base", base, "--out", str(tmp_path / "rm"),
                 "--epochs", "1", "--lora-rank", "2", "--heldout-fraction", "0.25"])
    assert code == 0
    assert json.loads((tmp_path / "rm/rm_info.json").read_text())["pairs"] == 12


def test_bad_arguments(tmp_path, base, pairs_file):
    common = ["reward-model", "train", "--pairs", str(pairs_file), "--base", base, "--out", str(tmp_path / "rm")]
    assert main(common + ["--heldout-fraction", "1.5"]) == 2
    assert main(common + ["--lr", "0"]) == 2
    assert main(["reward-model"]) == 2  # no action
    assert main(["reward-model", "train", "--pairs", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)]) == 2


def test_the_training_settings_are_checked_when_made():
    from ppo_rlhf.errors import UsageError

    for bad, message in (({"epochs": 0}, "--epochs, --batch-size and --lora-rank must be >= 1"),
                         ({"lr": 0.0}, "--lr must be > 0, got 0.0"),
                         ({"heldout_fraction": 1.0}, r"--heldout-fraction must be in \(0, 1\), got 1.0"),
                         ({"length_tolerance": -1}, "--length-tolerance must be >= 0, got -1")):
        with pytest.raises(UsageError, match=message):
            RewardModelTraining(**bad)
