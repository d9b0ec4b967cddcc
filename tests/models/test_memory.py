"""Section 8.7's memory table, exact, and the LoRA and config-derived counts."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from ppo_rlhf import cli
from ppo_rlhf.models import memory

QWEN25_05B_SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)


def _gb(values: dict) -> list[str]:
    return [f"{values[k]:.1f}" for k in ("policy", "value", "reference", "reward", "total")]


@pytest.mark.parametrize("parameters, expected", [
    (494_032_768, ["7.9", "7.9", "1.0", "1.0", "17.8"]),
    (7_000_000_000, ["112.0", "112.0", "14.0", "14.0", "252.0"]),
    (70_000_000_000, ["1120.0", "1120.0", "140.0", "140.0", "2520.0"]),
])
def test_the_chapters_table(parameters, expected):
    row = memory.four_models(parameters)
    assert _gb(row) == expected
    assert f"{row['sft']:.1f}" == expected[0] and row["ratio"] == pytest.approx(2.25)


def test_default_output_is_the_chapters_block(capsys):
    assert cli.main(["memory"]) == 0
    out = capsys.readouterr().out
    assert ("  7B                       policy   112.0 GB  value   112.0 GB  reference   14.0 GB  reward   14.0 GB"
            "  total   252.0 GB  (SFT of the same model: 112.0 GB, so RLHF needs 2.25x)") in out
    assert "0.5B (our Qwen2.5-0.5B)  policy     7.9 GB" in out and "total    17.8 GB" in out
    assert "8,798,208 trainable parameters" in out


def test_fp32_counts_four_bytes_per_frozen_weight():
    row = memory.four_models(7_000_000_000, "fp32")
    assert _gb(row) == ["112.0", "112.0", "28.0", "28.0", "280.0"]


def test_lora_count_of_qwen25_05b_at_rank_16():
    assert memory.lora_parameters(memory.QWEN25_05B, rank=16) == 8_798_208  # the chapter's "8.8 million"


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_lora_count_matches_peft_on_the_qwen25_05b_shape():
    from peft import LoraConfig, get_peft_model

    with torch.device("meta"):  # the real shape, no weights allocated
        model = get_peft_model(AutoModelForCausalLM.from_config(Qwen2Config(**QWEN25_05B_SHAPE)),
                               LoraConfig(r=16, target_modules=list(memory.LORA_TARGETS)))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 8_798_208


def test_config_folder_counts_qwen25_05b_exactly(tmp_path, capsys):
    Qwen2Config(**QWEN25_05B_SHAPE).save_pretrained(tmp_path)
    assert cli.main(["memory", "--config", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shape"]["parameters"] == 494_032_768
    assert report["lora"]["trainable"] == 8_798_208
    assert _gb(report["four_models"]["mixed"][0]) == ["7.9", "7.9", "1.0", "1.0", "17.8"]
    act = report["activations"]
    assert act["logits_fp32"] == pytest.approx(16 * 512 * 151936 * 4 / 1e9)
    assert act["kv_cache_bf16"] == pytest.approx(2 * 24 * 2 * 64 * 512 * 16 * 2 / 1e9)


@pytest.mark.parametrize("text, count", [("7B", 7_000_000_000), ("494M", 494_000_000), ("0.5e9", 500_000_000),
                                         ("494032768", 494_032_768), ("1.5b", 1_500_000_000)])
def test_parameter_count_forms(text, count):
    assert memory.parse_parameter_count(text) == count


@pytest.mark.parametrize("argv", [["--params", "-3"], ["--params", "seven"], ["--config", "/no/such/model"],
                                  ["--lora-rank", "0"]])
def test_bad_input_is_a_one_line_error(capsys, argv):
    assert cli.main(["memory", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-rlhf memory: error:") and err.count("\n") == 1


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("family", [memory.QWEN25[0], memory.QWEN25[3]], ids=lambda f: f.name)
def test_qwen25_shapes_count_what_transformers_builds(family):
    config = Qwen2Config(hidden_size=family.hidden, intermediate_size=family.intermediate,
                         num_hidden_layers=family.layers,
                         num_attention_heads=family.heads, num_key_value_heads=family.kv_heads, vocab_size=family.vocab,
                         tie_word_embeddings=family.tied)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shape = family.shape()
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert shape.backbone_parameters == sum(p.numel() for p in model.base_model.parameters())


def test_params_alone_prints_lora_logits_and_kv_lines_of_the_nearest_shape(capsys):
    """docs/usage.md's `memory --params 7B`: the four-model rows at 7e9, and the LoRA/activation lines of Qwen2.5-7B."""
    assert cli.main(["memory", "--params", "7B", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    seven = memory.QWEN25[3].shape()
    assert report["shape"]["name"].startswith("Qwen2.5-7B, the Qwen2.5 shape nearest to 7,000,000,000 parameters")
    assert report["four_models"]["mixed"][0]["parameters"] == 7_000_000_000
    assert report["lora"]["trainable"] == memory.lora_parameters(seven, 16)
    assert report["activations"] == {"batch": 16, "seq_len": 512, "vocab": seven.vocab_size,
                                     **memory.activation_estimate(seven, 16, 512, seven.vocab_size)}
    assert cli.main(["memory", "--params", "7B"]) == 0
    text = capsys.readouterr().out
    assert "== LoRA setups for Qwen2.5-7B" in text and "logits fp32" in text and "KV cache (28 layers" in text
    assert memory.representative_shape(494_000_000).name.startswith("Qwen2.5-0.5B")
    assert memory.representative_shape(70_000_000_000).name.startswith("Qwen2.5-72B")


def test_config_takes_the_train_alias_and_names_a_folder_without_config_json(tmp_path, capsys, monkeypatch):
    import ppo_rlhf.models.loading as models

    Qwen2Config(**QWEN25_05B_SHAPE).save_pretrained(tmp_path / "qwen")
    asked = []
    # the alias resolves like `train` resolves it (no real weights here)
    monkeypatch.setattr(models, "resolve_model_path",
                        lambda name: asked.append(name) or str(tmp_path / "qwen") if name == "smollm2" else name)
    assert cli.main(["memory", "--config", "smollm2", "--json"]) == 0
    assert asked == ["smollm2"] and json.loads(capsys.readouterr().out)["shape"]["parameters"] == 494_032_768
    monkeypatch.undo()
    (tmp_path / "empty").mkdir()
    assert cli.main(["memory", "--config", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.strip().endswith("is not a model folder (no config.json)")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    assert cli.main(["memory", "--config", str(tmp_path / "adapter")]) == 2
    assert "has no config.json" in capsys.readouterr().err
