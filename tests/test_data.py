"""Prompt datasets (ppo_rlhf/data.py): every source format, the one-line errors naming file, row and column,
chat-message prompts through the chat template, and `train` refusing a bad prompts file before torch loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppo_rlhf.data import PromptRow, check_prompt_source, load_prompt_rows
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.chat import chat_prompt_ids, conversation_ids, prompt_text
from ppo_rlhf.study.prompts import read_jsonl, read_prompts

import tiny

datasets = pytest.importorskip("datasets")

REPO = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is 2 + 2?"}]
ROWS = [{"prompt": "Say hi.", "answer": "hi"}, {"prompt": MESSAGES, "answer": "four"}]


def prompts_and_columns(rows: list[PromptRow]) -> list[tuple]:
    return [(row.prompt, row.columns) for row in rows]


EXPECTED = [("Say hi.", {"answer": "hi"}), (MESSAGES, {"answer": "four"})]
# a datasets column holds one type: chat messages in every row
TABLE_ROWS = [{"prompt": [{"role": "user", "content": "Say hi."}], "answer": "hi"}, ROWS[1]]
TABLE_EXPECTED = [(row["prompt"], {"answer": row["answer"]}) for row in TABLE_ROWS]


# ---------------------------------------------------------------- formats


def test_jsonl_with_bom_and_crlf_keeps_extra_columns(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n\r\n".join(json.dumps(r) for r in ROWS).encode() + b"\r\n")
    rows = load_prompt_rows(str(path))
    assert prompts_and_columns(rows) == EXPECTED
    assert [row.where for row in rows] == [f"{path}:1", f"{path}:3"]
    assert read_jsonl(path) == [(1, ROWS[0]), (3, ROWS[1])]  # every JSONL reader: the pairs file's too
    path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    assert read_prompts(path) == ["a", "b"]


def test_json_arrays_pretty_compact_and_wrapped_name_the_line_of_each_row(tmp_path):
    pretty, compact, wrapped = tmp_path / "pretty.json", tmp_path / "compact.json", tmp_path / "wrapped.json"
    pretty.write_text(json.dumps(ROWS, indent=2))
    compact.write_text(json.dumps(ROWS))
    wrapped.write_text(json.dumps({"version": 1, "data": ROWS}, indent=1))
    for path in (pretty, compact, wrapped):
        assert prompts_and_columns(load_prompt_rows(path)) == EXPECTED, path
    assert [row.where for row in load_prompt_rows(pretty)] == [f"{pretty}:2", f"{pretty}:6"]
    assert wrapped.read_text().split("\n")[3:8:4] == ["  {", "  {"]  # the rows' lines (the wrapper is "{" at 1)
    assert [row.where for row in load_prompt_rows(wrapped)] == [f"{wrapped}:4", f"{wrapped}:8"]
    one_line = tmp_path / "one_line.json"  # json.dump without indent: a wrapper on one line
    one_line.write_text(json.dumps({"data": ROWS}))
    assert prompts_and_columns(load_prompt_rows(one_line)) == EXPECTED


def test_csv_and_tsv_with_quotes_bom_and_crlf(tmp_path):
    path = tmp_path / "p.csv"
    path.write_bytes(b'\xef\xbb\xbfprompt,answer\r\n"Hello, world",4\r\n\r\n"two\r\nlines",5\r\n')
    rows = load_prompt_rows(path)
    assert prompts_and_columns(rows) == [("Hello, world", {"answer": "4"}), ("two\r\nlines", {"answer": "5"})]
    assert [row.where for row in rows] == [f"{path}:2", f"{path}:4"]  # the line each row starts on
    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\tquestion\n7\tWhy is the sky blue?\n")
    assert prompts_and_columns(load_prompt_rows(tsv, prompt_column="question")) == [
        ("Why is the sky blue?", {"id": "7"})]


def test_parquet_save_to_disk_and_a_local_dataset_folder(tmp_path):
    dataset = datasets.Dataset.from_list(TABLE_ROWS)
    dataset.to_parquet(str(tmp_path / "p.parquet"))
    dataset.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": dataset, "test": dataset.select([1])}).save_to_disk(str(tmp_path / "splits"))
    for source in (tmp_path / "p.parquet", tmp_path / "saved", tmp_path / "splits"):
        assert prompts_and_columns(load_prompt_rows(str(source))) == TABLE_EXPECTED, source
    assert load_prompt_rows(tmp_path / "p.parquet")[1].where == f"{tmp_path / 'p.parquet'} row 1"
    assert prompts_and_columns(load_prompt_rows(f"{tmp_path / 'splits'}:test")) == TABLE_EXPECTED[1:]
    with pytest.raises(UsageError, match="has no split 'dev' \\(splits: train, test\\)"):
        load_prompt_rows(f"{tmp_path / 'splits'}:dev")
    # the hub path: datasets.load_dataset on a folder of data files (a hub dataset's layout), no network
    folder = tmp_path / "hub_like" / "data"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TABLE_ROWS))
    rows = load_prompt_rows(str(tmp_path / "hub_like"))
    assert prompts_and_columns(rows) == TABLE_EXPECTED
    assert rows[1].where == f"{tmp_path / 'hub_like'} row 1"


def test_a_hub_id_and_its_split_go_to_load_dataset(monkeypatch):
    calls = []

    def fake_load(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list(TABLE_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    assert prompts_and_columns(load_prompt_rows("org/math")) == TABLE_EXPECTED
    rows = load_prompt_rows("org/math:test")
    assert calls == [("org/math", "train"), ("org/math", "test")]
    assert rows[0].where == "dataset org/math row 0"


def test_a_hub_id_that_cannot_load_says_both_readings(monkeypatch):
    def offline(name, split):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (OfflineModeIsEnabled)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UsageError) as caught:
        load_prompt_rows("org/nothing")
    assert str(caught.value) == ("prompts org/nothing: no such file or folder, and cannot load dataset org/nothing "
                                 "split train: Couldn't reach 'org/nothing' on the Hub (OfflineModeIsEnabled)")
    with pytest.raises(UsageError, match="^prompts file runs/missing.jsonl not found$"):
        load_prompt_rows("runs/missing.jsonl")  # a file name is never tried as a hub id


def test_in_memory_sources():
    assert prompts_and_columns(load_prompt_rows(datasets.Dataset.from_list(TABLE_ROWS))) == TABLE_EXPECTED
    rows = load_prompt_rows(["Say hi.", MESSAGES])
    assert prompts_and_columns(rows) == [("Say hi.", {}), (MESSAGES, {})]
    assert [row.where for row in rows] == ["dataset row 0", "dataset row 1"]
    assert prompts_and_columns(load_prompt_rows(ROWS)) == EXPECTED
    assert prompts_and_columns(load_prompt_rows([{"q": "Hi?", "id": 3}], prompt_column="q")) == [("Hi?", {"id": 3})]


def test_messages_lose_the_none_keys_datasets_adds():
    messages = [{"role": "user", "content": "Hi", "name": "ann"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Bye"}]
    rows = load_prompt_rows(datasets.Dataset.from_list([{"prompt": messages}]))  # a struct column: name=None added
    assert rows[0].prompt == messages


# ---------------------------------------------------------------- bad data: one line naming file, row and column


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("p.jsonl", '{"prompt": "ok"}\n{"text": "no prompt"}\n',
         ':2: no "prompt" column (columns found: text); expected rows like {"prompt": '),
        ("p.jsonl", '{"prompt": "ok"}\n{"prompt": "  "}\n', ':2: needs a non-empty "prompt" string or chat-message '
                                                          "list, got a blank string"),
        ("p.jsonl", '{"prompt": 42}\n', ':1: needs a non-empty "prompt" string or chat-message list like [{"role": '
                                        '"user", "content": "Write a haiku about the sea."}], got int 42'),
        ("p.jsonl", '{"prompt": []}\n', ':1: needs a non-empty "prompt" string or chat-message list'),
        ("p.jsonl", '{"prompt": [{"role": "user", "text": "hi"}]}\n',
         ':1: "prompt" message 1 needs a "role" and a "content" string, like {"role": "user", "content": '
         '"Write a haiku about the sea."}; found keys role, text'),
        ("p.jsonl", '{"prompt": [{"role": "user", "content": " "}]}\n', ':1: "prompt" messages have no text'),
        ("p.jsonl", '{"prompt": ["hi"]}\n', ':1: "prompt" message 1 needs a "role" and a "content" string'),
        ("p.jsonl", '{"prompt": "ok"}\n{"prompt": \n', ":2: not valid JSON (Expecting value); expected JSON Lines "
                                                     '(one object per line, like {"prompt": '),
        ("p.txt", "Write a poem about rain.\nAnother prompt\n", ":1: not valid JSON (this looks like plain text); "
                                                              "expected JSON Lines (one object per line"),
        ("p.json", '[\n  {"prompt": "ok"},\n  {"prompt": }\n]\n', ":3: not valid JSON (Expecting value)"),
        ("p.json", '[\n  {"prompt": "ok"},\n  "just a string"\n]\n', ":3: expected a JSON object, got str"),
        ("p.json", "", " is empty"),
        ("p.csv", "text,answer\nhi,1\n", ':2: no "prompt" column (columns found: text, answer)'),
        ("p.csv", "prompt,answer\nhi,1\nho\n", ":3: 1 fields, the header row has 2 (prompt, answer)"),
        ("p.csv", "prompt,answer\n", " has a header row and no rows"),
        ("p.parquet", "not parquet", " is not a readable Parquet file"),
    ],
)
def test_bad_files_are_one_line_naming_file_row_and_column(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_prompt_rows(str(path))
    error = str(caught.value)
    assert error.startswith(str(path)) and message in error and "\n" not in error, error


def test_bad_utf8_names_its_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    with pytest.raises(UsageError, match=f"^{path}:2: not valid UTF-8$"):
        load_prompt_rows(path)


def test_bad_tables_and_in_memory_sources(tmp_path):
    datasets.Dataset.from_list([{"text": "a", "id": 1}]).to_parquet(str(tmp_path / "p.parquet"))
    with pytest.raises(UsageError, match=f'^{tmp_path / "p.parquet"} has no "prompt" column \\(columns found: text, '
                                         "id\\); set prompt_column"):
        load_prompt_rows(tmp_path / "p.parquet")
    with pytest.raises(UsageError, match='^dataset row 1: needs a non-empty "prompt" string'):
        load_prompt_rows(datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": ""}]))
    with pytest.raises(UsageError, match='^dataset has no "prompt" column \\(columns found: question\\)'):
        load_prompt_rows(datasets.Dataset.from_list([{"question": "a"}]))
    with pytest.raises(UsageError, match="^dataset row 2: needs a non-empty prompt string or chat-message list like "
                                         ".*got NoneType None$"):
        load_prompt_rows(["a", "b", None])
    with pytest.raises(UsageError, match="DatasetDict \\(splits: train\\); pass one split"):
        load_prompt_rows(datasets.DatasetDict({"train": datasets.Dataset.from_list(TABLE_ROWS)}))
    with pytest.raises(UsageError, match="the prompt list is empty"):
        load_prompt_rows([])
    with pytest.raises(UsageError, match="got int"):
        load_prompt_rows(3)
    with pytest.raises(UsageError, match=f"^prompts {tmp_path / 'empty'} is a directory, not a file"):
        (tmp_path / "empty").mkdir()
        load_prompt_rows(tmp_path / "empty")


def test_string_only_readers_refuse_chat_messages_by_row(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with pytest.raises(UsageError, match=f"^{path}:2: a chat-message prompt; this command reads string prompts$"):
        read_prompts(path)


# ---------------------------------------------------------------- chat messages through the chat template


def test_chat_message_prompts_are_tokenised_with_the_template(tokenizer):
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert chat_prompt_ids(tokenizer, MESSAGES) == list(expected["input_ids"])
    text = tokenizer.decode(chat_prompt_ids(tokenizer, MESSAGES))
    assert text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>") and text.endswith("assistant\n")
    # a string is one user turn, bit for bit as before; a one-user-message list tokenises the same
    one_turn = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
    assert chat_prompt_ids(tokenizer, "Hi") == list(one_turn) == chat_prompt_ids(tokenizer, [MESSAGES[1] | {
        "content": "Hi"}])
    conversation = conversation_ids(tokenizer, MESSAGES, "Four.")
    whole = tokenizer.apply_chat_template(MESSAGES + [{"role": "assistant", "content": "Four."}], tokenize=True,
                                          return_dict=True)["input_ids"]
    assert conversation == list(whole)[: len(conversation)]
    assert tokenizer.decode(conversation).endswith("Four.<|im_end|>")


def test_prompt_text():
    assert prompt_text("Say hi.\nNow.") == "Say hi.\nNow."  # a string unchanged (samples stay as they were)
    assert prompt_text([{"role": "user", "content": "Hi"}]) == "Hi"
    assert prompt_text(MESSAGES) == "system: Answer in one word. | user: What is 2 + 2?"


def test_the_sample_line_shows_the_question_the_reply_answers():
    from ppo_rlhf.ppo.run import sample_line

    few_shot = [{"role": "user", "content": "Continue: Jo never could"}, {"role": "assistant", "content": "sew."},
                {"role": "user", "content": "Continue: The rain"}]
    assert sample_line(few_shot, -1.0, "fell.") == ("sample [-1.00] 'Continue: The rain' (after 2 earlier turns) -> "
                                                    "'fell.'")
    # a system message is no turn; a plain string prompt is its own question
    assert sample_line(MESSAGES, 0.5, "Four.") == "sample [+0.50] 'What is 2 + 2?' -> 'Four.'"
    assert sample_line("Say hi.", 0.0, "hi") == "sample [+0.00] 'Say hi.' -> 'hi'"
    # a long question is shown by its end, where the text the reply continues is
    long = 'Continue this text in one or two sentences: "Jo never could stitch an even hem; ... her rococo needlework."'
    assert sample_line(long, 0.0, "x") == ("sample [+0.00] '...ver could stitch an even hem; ... her rococo "
                                           "needlework.\"' -> 'x'")


def test_generate_rollout_with_message_prompts(tokenizer):
    from ppo_rlhf.models.rollout import generate_rollout

    policy = tiny.tiny_causal_lm(tokenizer)
    torch.manual_seed(0)
    prompts = [MESSAGES, "Hello!"]
    rollout = generate_rollout(policy, tokenizer, prompts, max_new_tokens=4, temperature=1.0)
    assert rollout.prompts == prompts
    assert rollout.prompt_ids == [chat_prompt_ids(tokenizer, p) for p in prompts]
    row = rollout.select([0])
    assert row.prompts == [MESSAGES] and row.input_ids[0, : len(rollout.prompt_ids[0])].tolist() == \
        rollout.prompt_ids[0]


# ---------------------------------------------------------------- checked before torch loads


def test_train_refuses_a_bad_prompts_file_before_importing_torch(tmp_path):
    reward = tmp_path / "rm"
    reward.mkdir()
    (reward / "config.json").write_text("{}")  # the file check only asks for a model folder
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([{"question": "a"}]).save_to_disk(str(saved))
    bad = {"p.txt": "Write a poem.\n", "p.jsonl": '{"text": "x"}\n', "p.json": '[{"prompt": ""}]',
           "p.csv": "text\nhi\n"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    script = ("import sys; from ppo_rlhf.cli import main; code = main(sys.argv[1:]); "
              "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    for source in [*(str(tmp_path / name) for name in bad), str(saved)]:
        argv = ["train", "--prompts", source, "--reward-model", str(reward), "--out", str(tmp_path / "run")]
        result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                                timeout=120)
        assert result.stdout.strip() == "2 False False", (source, result.stdout[-300:], result.stderr[-300:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and source in lines[0], (source, result.stderr)
    assert not (tmp_path / "run").exists()


def test_check_prompt_source_imports_no_torch(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(ROWS))
    script = ("import sys; from ppo_rlhf.data import check_prompt_source; rows = check_prompt_source(sys.argv[1]); "
              "print(len(rows), 'torch' in sys.modules, 'transformers' in sys.modules, 'datasets' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert result.stdout.strip() == "2 False False False", result.stderr[-300:]
    assert prompts_and_columns(check_prompt_source(str(path))) == EXPECTED
