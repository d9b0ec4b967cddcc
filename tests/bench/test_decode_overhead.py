"""bench/decode_overhead.py on a tiny random model: every variant's process builds the preset's trainer, generates
with and without the adapter and from the merged copy, profiles one generation, and the table compares like with
like (issue 45 item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import tiny  # noqa: E402


def trained_adapter(model, folder: Path) -> Path:
    """A LoRA adapter of the preset's shape (r 16, alpha 32, the 7 linear layers) that is not zero, as training
    leaves it (a fresh one's B is zero: merging it would change nothing)."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets,
                                                  init_lora_weights=False))
    peft_model.save_pretrained(folder)
    return folder


def test_a_dry_run_measures_each_variant_against_the_bounds(tmp_path):
    tokenizer = tiny.tiny_tokenizer()
    folder = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path / "policy")
    adapter = trained_adapter(tiny.tiny_causal_lm(tokenizer), tmp_path / "adapter")
    out = tmp_path / "decode.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_overhead.py"), "--model", str(folder),
                           "--adapter", str(adapter), "--variants", "passive-1,default-1", "--rounds", "1",
                           "--batches", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["bounds_ms"]["weights_read"] > 0 and result["bounds_ms"]["compute"] > 0
    for name in ("passive-1", "default-1"):
        variant, [run] = result["variants"][name], result["runs"][name]
        assert run["threads"] == 1 and run["batch_size"] == 16  # the preset's batch, one thread as asked
        assert variant["ms_per_step"] > 0 and variant["ms_per_step_no_adapter"] > 0 and variant["ops_per_step"] > 0
        assert len(run["replies"]) == 16
    assert result["runs"]["passive-1"][0]["omp_wait_policy"] == "PASSIVE"
    assert result["runs"]["default-1"][0]["omp_wait_policy"] is None
    # the same seeds and prompts: the first variant matches itself, and the table says how the other compares
    assert result["variants"]["passive-1"]["same_replies"] == [16, 16]
    assert "| default-1 |" in proc.stdout and "bounds: weights-read" in proc.stdout
    # the merged copy: timed, its refresh apart, compared with the adapter path on the adapter path's own replies
    for name in ("passive-1", "default-1"):
        variant, [run] = result["variants"][name], result["runs"][name]
        assert variant["ms_per_step_merged"] > 0 and run["merge_seconds"] > 0 and run["ops_per_step_merged"] > 0
        assert run["adapter"] == str(adapter) and variant["merged_same_replies"][1] == 16
        kl_mean, kl_max = variant["kl_policy_merged"]
        assert -1e-6 <= kl_mean <= kl_max < 0.5  # the same function, rounded differently: close, and measured
        assert variant["policy_generation_gap"][0] >= 0
    assert "adapter / merged time" in proc.stdout
