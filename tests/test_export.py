"""Export (`ppo-rlhf export`, `save_policy`): an adapter folder that plain peft loads, a merged folder that plain
transformers loads and whose logits are the adapter policy's, the model card, the CLI's bad inputs, and the hub
upload against a fake client."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from ppo_rlhf.cli import main
from ppo_rlhf.config import build_config, read_yaml
from ppo_rlhf.errors import UsageError
from ppo_rlhf.export import (
    SMOLLM2_HUB_ID,
    export_run,
    last_history_line,
    model_card,
    push_to_hub,
    run_card,
    save_policy,
)
from ppo_rlhf.models.generation import HFGenerator
from ppo_rlhf.models.loading import LoraSettings, load_policy
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.train import train

import tiny

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer) -> Path:
    """A two-iteration tiny run with checkpoints 1 and 2; a large learning rate so that the adapter moves the
    logits well beyond float rounding."""
    root = tmp_path_factory.mktemp("export")
    tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    values = dict(policy_model=str(root / "policy"), reward_model=str(root / "reward"),
                  prompts=str(root / "prompts.jsonl"), out=str(root / "run"), iterations=2, batch_size=4,
                  minibatch_size=2, max_new_tokens=6, reward_norm_samples=4, lora_rank=4, policy_lr=0.01,
                  checkpoint_every=1, dtype="float32", tensorboard=False, quiet=True)
    train(build_config(TrainConfig, values))
    return root / "run"


def ids_of(tokenizer) -> torch.Tensor:
    messages = [{"role": "user", "content": "Tell me a story"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, return_tensors="pt").input_ids


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def adapter_policy(run_dir: Path, iteration: int) -> PeftModel:
    """The policy as evaluation sees it: the base with the checkpoint's adapter, by plain peft."""
    base = AutoModelForCausalLM.from_pretrained(read_yaml(run_dir / "config.yaml")["policy_model"])
    return PeftModel.from_pretrained(base, run_dir / "checkpoints" / f"iter_{iteration:06d}" / "policy").eval()


def generates(model, tokenizer) -> None:
    ids = ids_of(tokenizer)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=True,
                         pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids.shape[1]


def test_adapter_export_loads_with_plain_peft_and_generates(run_dir, tmp_path):
    out = export_run(run_dir, None, tmp_path / "adapter", merge=False)
    base = read_yaml(run_dir / "config.yaml")["policy_model"]
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    saved = load_file(out / "adapter_model.safetensors")  # the latest checkpoint's adapter, unchanged
    trained = load_file(run_dir / "checkpoints" / "iter_000002" / "policy" / "adapter_model.safetensors")
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)
    model = AutoPeftModelForCausalLM.from_pretrained(out).eval()  # the base found through adapter_config.json
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = ids_of(tokenizer)
    assert torch.equal(logits(model, ids), logits(adapter_policy(run_dir, 2), ids))
    generates(model, tokenizer)
    assert "library_name: peft" in (out / "README.md").read_text()


def test_merged_export_is_plain_transformers_with_the_adapter_policys_logits(run_dir, tmp_path):
    out = export_run(run_dir, 1, tmp_path / "merged", merge=True)
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not isinstance(model, PeftModel) and model.dtype == torch.float32  # the tiny base's own dtype
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = ids_of(tokenizer)
    policy = adapter_policy(run_dir, 1)
    expected = logits(policy, ids)
    torch.testing.assert_close(logits(model, ids), expected, rtol=1e-5, atol=1e-5)
    with policy.disable_adapter():  # the adapter moved the logits: the equality above says something
        assert (logits(policy, ids) - expected).abs().max() > 1e-3
    generates(model, tokenizer)
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "Iteration 0 " in card  # checkpoint 1's history


def trained_looking_policy(tiny_model_dirs, dtype: torch.dtype):
    """The tiny policy with a LoRA adapter whose B factors are not zero, as after training (a fresh one merges to 0)."""
    policy = load_policy(str(tiny_model_dirs["policy"]), LoraSettings(rank=4), dtype=dtype)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    return policy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_policy_leaves_the_policy_untouched_and_keeps_the_base_dtype(tiny_model_dirs, tokenizer, tmp_path, dtype):
    policy = trained_looking_policy(tiny_model_dirs, dtype)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    out = save_policy(policy, tokenizer, tmp_path / "m", merge=True, card="---\ntags: [ppo-rlhf]\n---\n# card\n")
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())  # not merged in place
    assert (out / "README.md").read_text().endswith("# card\n")
    assert AutoModelForCausalLM.from_pretrained(out).dtype == dtype
    save_policy(policy, tokenizer, out, merge=False, card="---\ntags: [ppo-rlhf]\n---\n")  # replaces an export
    assert (out / "adapter_config.json").is_file() and not (out / "config.json").exists()
    with pytest.raises(UsageError, match="PeftModel"):
        save_policy(policy.get_base_model(), tokenizer, tmp_path / "x", merge=True, card="")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_merged_export_and_the_sampling_copy_are_the_same_numbers(tiny_model_dirs, tokenizer, tmp_path, dtype):
    policy = trained_looking_policy(tiny_model_dirs, dtype)
    out = save_policy(policy, tokenizer, tmp_path / "m", merge=True, card="---\ntags: [ppo-rlhf]\n---\n")
    exported = load_file(out / "model.safetensors")
    generator = HFGenerator(policy, tokenizer, max_new_tokens=4, temperature=1.0, merged=True)
    generator.sync(policy)
    sampled = generator.copy.state_dict()
    assert exported and set(exported) <= set(sampled)  # (the tied lm_head is stored once)
    assert all(exported[k].dtype == sampled[k].dtype and torch.equal(exported[k], sampled[k]) for k in exported)
    # one rounding: the LoRA product added to W in fp32, the sum rounded once to W's dtype
    layer = policy.base_model.model.model.layers[0].self_attn.q_proj
    once = (layer.base_layer.weight.float() + layer.get_delta_weight("default").float()).to(dtype)
    assert torch.equal(exported["model.layers.0.self_attn.q_proj.weight"], once)


def test_card_names_base_data_rewards_settings_numbers_loading_and_license(run_dir):
    config = read_yaml(run_dir / "config.yaml")
    stats = last_history_line(run_dir / "history.jsonl")
    card = run_card(config, stats)
    assert card.startswith("---\n") and "- ppo-rlhf" in card and "- lora" in card
    assert "base_model:" not in card  # a local folder is no hub id
    assert f"`{config['policy_model']}`" in card and f"`{config['prompts']}`" in card
    assert f"`{config['reward_model']}`" in card
    assert "lora_rank: 4" in card and "policy_lr: 0.01" in card and not re.search(r"^\s*out:", card, re.M)
    assert "after 2 PPO iterations" in card and "Iteration 1 (phase policy)" in card
    assert f"| score | {stats['score']:.4g} |" in card and f"| kl | {stats['kl']:.4g} |" in card
    assert "AutoPeftModelForCausalLM.from_pretrained(path)" in card and "PeftModel.from_pretrained(base, path)" in card
    assert "base model's license applies" in card
    merged = run_card(config, stats, merged=True)
    assert "AutoModelForCausalLM.from_pretrained(path)" in merged and "Peft" not in merged

    alias = model_card("/cache/ppo_rlhf/SmolLM2-135M-Instruct.Q4_1-94597728", "p.jsonl",
                       ["rewards.py:exact (weight 2)", "runs/rm (weight 1)"], {"beta": 0.05}, None)
    assert f"base_model: {SMOLLM2_HUB_ID}" in alias and "license: apache-2.0" in alias
    assert f'from_pretrained("{SMOLLM2_HUB_ID}")' in alias and "dequantized" in alias
    assert "/cache/" not in alias  # the folder the alias resolved to on this machine is no name for the base
    assert "`rewards.py:exact (weight 2)`; `runs/rm (weight 1)`" in alias and "No iteration was recorded." in alias
    hub = model_card("Qwen/Qwen2.5-0.5B-Instruct", "p.jsonl", [], {}, None)
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct" in hub and "license:" not in hub


def test_reward_functions_and_weights_in_the_card(run_dir):
    config = {**read_yaml(run_dir / "config.yaml"), "reward_funcs": ["my.py:f", "runs/rm"],
              "reward_weights": [2.0, 1.0, 0.5]}
    reward_model = config["reward_model"]
    assert f"`{reward_model} (weight 2)`; `my.py:f (weight 1)`; `runs/rm (weight 0.5)`" in run_card(config, None)
    functions_only = {**config, "reward_model": None, "reward_weights": None}
    assert "- **Rewards:** `my.py:f`; `runs/rm`" in run_card(functions_only, None)


def test_cli_checks_come_before_torch_loads(run_dir, tmp_path):
    script = ("import sys; from ppo_rlhf.cli import main; code = main(sys.argv[1:]); "
              "print(code, 'torch' in sys.modules, 'transformers' in sys.modules, 'peft' in sys.modules)")
    for argv in ([str(tmp_path / "nope"), "--out", str(tmp_path / "e")], [str(run_dir), "--out", str(run_dir)],
                 [str(run_dir), "--out", str(tmp_path / "e"), "--push-to-hub", "a/b/c"]):
        result = subprocess.run([sys.executable, "-c", script, "export", *argv], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
        assert result.stdout.strip() == "2 False False False", (argv, result.stdout[-300:], result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ppo-rlhf export: error:"), err
    return err


def test_cli_exports_and_refuses_bad_inputs_in_one_line(run_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["export", str(run_dir), "--out", str(out), "--checkpoint", "1"]) == 0
    assert (out / "adapter_config.json").is_file() and "Iteration 0 " in (out / "README.md").read_text()
    assert "run directory" in one_line_error(capsys, ["export", str(tmp_path / "nope"), "--out", str(out)])
    assert "has no checkpoint for iteration 7 (has 1, 2)" in one_line_error(
        capsys, ["export", str(run_dir), "--out", str(out), "--checkpoint", "7"])
    listing = sorted(p.name for p in run_dir.iterdir())
    assert "not empty" in one_line_error(capsys, ["export", str(run_dir), "--out", str(run_dir)])
    assert sorted(p.name for p in run_dir.iterdir()) == listing  # the run directory is never replaced
    assert "is a file" in one_line_error(capsys, ["export", str(run_dir), "--out", str(run_dir / "config.yaml")])
    assert "--private needs --push-to-hub" in one_line_error(capsys, ["export", str(run_dir), "--out", str(out),
                                                                      "--private"])
    assert "not a hub repo id" in one_line_error(capsys, ["export", str(run_dir), "--out", str(out),
                                                          "--push-to-hub", "a/b/c"])
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "HF_HUB_OFFLINE" in one_line_error(capsys, ["export", str(run_dir), "--out", str(out),
                                                       "--push-to-hub", "me/policy"])
    assert main(["export", str(run_dir), "--out", str(out), "--merge"]) == 0  # replaces the earlier export
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()


class FakeHub:
    """Records HfApi calls; `fail` is raised by upload_folder."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.fail = fail

    def create_repo(self, *args, **kwargs):
        self.calls.append(("create_repo", args, kwargs))
        return "https://huggingface.co/me/policy"

    def upload_folder(self, *args, **kwargs):
        self.calls.append(("upload_folder", args, kwargs))
        if self.fail is not None:
            raise self.fail


def test_push_to_hub_creates_the_repo_and_uploads_the_folder(run_dir, tmp_path, capsys):
    out = export_run(run_dir, None, tmp_path / "adapter", merge=False)
    hub = FakeHub()
    assert push_to_hub(out, "me/policy", api=hub, private=True) == "https://huggingface.co/me/policy"
    assert hub.calls[0] == ("create_repo", ("me/policy",), {"private": True, "exist_ok": True})
    name, _, kwargs = hub.calls[1]
    assert name == "upload_folder" and kwargs["repo_id"] == "me/policy" and kwargs["folder_path"] == str(out)
    assert "local path" in capsys.readouterr().err  # the adapter names its tiny base by a local path: said
    failing = FakeHub(fail=OSError("401 Client Error: Unauthorized\nInvalid token"))
    with pytest.raises(UsageError, match=r"^push to the hub repo me/policy failed: 401 Client Error: Unauthorized$"):
        push_to_hub(out, "me/policy", api=failing)
    with pytest.raises(UsageError, match="not an exported folder"):
        push_to_hub(tmp_path / "missing", "me/policy", api=FakeHub())


@pytest.mark.smoke
def test_smollm2_export_names_the_hub_base_in_its_card_and_merges_exactly(tmp_path):
    from ppo_rlhf.models.loading import load_tokenizer

    policy = load_policy("smollm2", LoraSettings(rank=4))
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    tokenizer = load_tokenizer("smollm2")
    base = policy.peft_config["default"].base_model_name_or_path  # the local dequantized folder
    adapter = save_policy(policy, tokenizer, tmp_path / "a", merge=False,
                          card=model_card(base, "p.jsonl", [], {}, None))
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    card = (adapter / "README.md").read_text()
    assert f"base_model: {SMOLLM2_HUB_ID}" in card and "license: apache-2.0" in card
    merged = save_policy(policy, tokenizer, tmp_path / "m", merge=True,
                         card=model_card(base, "p.jsonl", [], {}, None, merged=True))
    ids = ids_of(tokenizer)
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(merged).eval(), ids),
                               logits(policy, ids), rtol=1e-4, atol=1e-3)
