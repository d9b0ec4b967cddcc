"""Issue 29: say what the machine does with the settings -- the dtype `auto` resolved to and why, a warning for bf16
emulated on a CPU, the `threads` setting -- at the start of a run, in run_info.json and in the report."""

from __future__ import annotations

import json

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.models import precision
from ppo_rlhf.models.precision import describe_dtype, resolve_dtype
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.report import write_report
from ppo_rlhf.train import train

import tiny

CPU = torch.device("cpu")


def cpu_with(monkeypatch, extensions: list[str]) -> None:
    """Pretend this CPU has these bf16 extensions (the real one's flags vary from machine to machine)."""
    monkeypatch.setattr(precision, "cpu_bf16_extensions", lambda cpuinfo=None: extensions)
    monkeypatch.setattr(precision, "_warned", set())


def test_cpu_bf16_extensions_from_cpuinfo():
    assert precision.cpu_bf16_extensions("flags\t\t: fpu avx512f avx512_bf16 amx_bf16\n") == ["AVX512-BF16",
                                                                                             "AMX-BF16"]
    assert precision.cpu_bf16_extensions("flags\t\t: fpu avx2\n") == []


def test_cpu_matrix_flags_names_the_sets_that_decide_matmul_speed():
    assert precision.cpu_matrix_flags("flags\t\t: fpu avx2 avx512f amx_bf16 avx512_bf16\n") == (
        "amx_bf16 avx512_bf16 avx512f avx2")
    assert precision.cpu_matrix_flags("flags\t\t: fpu avx2\n") == "avx2"
    assert precision.cpu_matrix_flags("flags\t\t: fpu sse4_2\n") == "none of amx_bf16/avx512_bf16/avx512f/avx2"


def test_describe_dtype_says_what_auto_became_and_why(monkeypatch):
    cpu_with(monkeypatch, [])
    assert describe_dtype("auto", CPU) == "auto -> float32 (no AVX512-BF16/AMX-BF16 on this CPU)"
    assert describe_dtype("float32", CPU) == "float32"
    cpu_with(monkeypatch, ["AMX-BF16"])
    assert describe_dtype("auto", CPU) == "auto -> bfloat16 (AMX-BF16)"


def test_bf16_on_a_cpu_without_native_bf16_warns_once(monkeypatch, capsys):
    cpu_with(monkeypatch, [])
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16 and resolve_dtype("bfloat16", CPU) == torch.bfloat16
    err = capsys.readouterr().err
    assert err.count("warning: dtype bfloat16 on a CPU without AVX512-BF16/AMX-BF16") == 1 and "emulated" in err
    cpu_with(monkeypatch, ["AVX512-BF16"])
    resolve_dtype("bfloat16", CPU)
    resolve_dtype("auto", CPU)
    assert capsys.readouterr().err == ""


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_run_start_applies_threads_prints_and_records_the_dtype(tmp_path, tokenizer, monkeypatch, capsys,
                                                               restore_threads):
    cpu_with(monkeypatch, [])
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, tmp_path / "reward")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Hello!", "Tell me a story"]))
    torch.set_num_threads(1)
    cfg = build_config(TrainConfig, dict(policy_model=str(policy), reward_model=str(reward), prompts=str(prompts),
                                         out=str(tmp_path / "run"), iterations=1, batch_size=2, minibatch_size=2,
                                         epochs=1, max_new_tokens=4, reward_norm_samples=2, lora_rank=2,
                                         tensorboard=False, threads=2))
    run_dir = train(cfg)
    assert torch.get_num_threads() == 2
    line = "dtype auto -> float32 (no AVX512-BF16/AMX-BF16 on this CPU), 2 threads, device cpu"
    assert line in capsys.readouterr().out
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["dtype"] == "auto" and info["resolved_dtype"] == "float32" and info["threads"] == 2
    assert "dtype: auto" in (run_dir / "config.yaml").read_text()  # the setting as given stays in the config
    page = write_report([run_dir], None, tmp_path / "report")
    assert "run: dtype auto -&gt; float32 (no AVX512-BF16/AMX-BF16 on this CPU), 2 threads" in page.read_text()
