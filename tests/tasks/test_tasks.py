"""The verifiable task (ppo_rlhf/tasks/arithmetic.py): splits that never share a problem, the exact checker and the
format term in TRL's reward-function convention, and `ppo-rlhf task` writing the JSONL datasets. Torch-free."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ppo_rlhf.cli import main
from ppo_rlhf.data import load_prompt_rows
from ppo_rlhf.errors import UsageError
from ppo_rlhf.tasks import arithmetic as tasks


@pytest.mark.parametrize("name", list(tasks.LEVELS))
def test_train_and_heldout_never_share_a_problem(name):
    train, heldout = (tasks.split_problems(name, split) for split in ("train", "heldout"))
    assert {p.key for p in train}.isdisjoint(p.key for p in heldout)
    assert len(heldout) >= 200  # enough for the held-out evaluation (issue 27, item 2)
    assert 0.2 < len(heldout) / (len(train) + len(heldout)) < 0.4
    # every seed and count draws from its own split: no held-out prompt ever reaches a training file
    heldout_prompts = {row["prompt"] for row in tasks.problems(name, "heldout")}
    for seed in range(3):
        assert heldout_prompts.isdisjoint(row["prompt"] for row in tasks.problems(name, "train", 100, seed))


def test_a_problem_and_its_commuted_form_are_one_problem():
    assert tasks.Problem(5, "+", 37).key == tasks.Problem(37, "+", 5).key
    assert tasks.Problem(37, "-", 5).key != tasks.Problem(5, "-", 37).key
    assert tasks.Problem(5, "+", 37).split == tasks.Problem(37, "+", 5).split
    assert tasks.Problem(37, "-", 5).answer == 32 and tasks.Problem(12, "*", 3).answer == 36


def test_problems_are_seeded_and_without_repeats():
    first, again, other = (tasks.problems("add-small", "train", 50, seed) for seed in (1, 1, 2))
    assert first == again and first != other
    assert len({row["prompt"] for row in first}) == 50
    row = first[0]
    question = row["prompt"].removeprefix("What is ").split("?")[0]
    assert str(eval(question)) == row["answer"]  # the answer column is the problem's exact answer (as text)
    with pytest.raises(UsageError, match="add-small has 255 heldout problems; asked for 1000"):
        tasks.problems("add-small", "heldout", 1000)
    with pytest.raises(UsageError, match="unknown task level 'add-huge'; choose from add-tiny, add-small"):
        tasks.problems("add-huge", "train")


def test_exact_match_reads_the_answer_line_else_the_last_integer():
    completions = ["37 + 5 = 42\nAnswer: 42", "The answer is 42.", "Answer: 41\nor maybe 42", "Answer: 42 or 43",
                   "forty-two", "1,042", "Answer: -3", "42.5"]
    answers = ["42", "42", "42", "42", "42", "1042", "-3", "42"]
    assert tasks.exact_match(["p"] * 8, completions, [[1]] * 8, answer=answers) == [1, 1, 0, 1, 0, 1, 1, 0]
    # TRL's conversational completions: a list of messages, the reply last
    chat = [[{"role": "assistant", "content": "Answer: 7"}], [{"role": "assistant", "content": "8"}]]
    assert tasks.exact_match(["p", "p"], chat, [[1], [1]], answer=["7", "7"], other_column=[1, 2]) == [1.0, 0.0]


def test_the_format_term_is_separate_and_asks_for_the_final_line():
    completions = ["37 + 5 = 42\nAnswer: 42", "Answer: 42.", "Answer: 42\nHope that helps!", "42", "answer: 42",
                   "Answer: -3\n\n"]
    assert tasks.answer_format(["p"] * 6, completions, [[1]] * 6, answer=["42"] * 6) == [1, 1, 0, 0, 0, 1]
    # the format earns nothing from exact_match and a right answer nothing from the format
    assert tasks.exact_match(["p"], ["Answer: 41"], [[1]], answer=["42"]) == [0.0]
    assert tasks.answer_format(["p"], ["42"], [[1]]) == [0.0]
    assert 0 < tasks.FORMAT_WEIGHT <= 0.2


def test_task_write_writes_train_and_heldout_jsonl(tmp_path, capsys):
    out = tmp_path / "add"
    assert main(["task", "write", "add-small", "--out", str(out), "--train", "40", "--heldout", "30"]) == 0
    train = load_prompt_rows(str(out / "train.jsonl"))
    heldout = load_prompt_rows(str(out / "heldout.jsonl"))
    assert len(train) == 40 and len(heldout) == 30
    assert set(train[0].columns) == {"answer"}  # the column exact_match reads
    assert {r.prompt for r in train}.isdisjoint(r.prompt for r in heldout)
    # existing files are never replaced without --overwrite
    before = (out / "train.jsonl").read_text()
    assert main(["task", "write", "add-small", "--out", str(out), "--train", "10"]) == 2
    assert "train.jsonl" in capsys.readouterr().err and (out / "train.jsonl").read_text() == before
    assert main(["task", "write", "add-small", "--out", str(out), "--train", "10", "--overwrite"]) == 0
    assert len((out / "train.jsonl").read_text().splitlines()) == 10
    assert json.loads((out / "heldout.jsonl").read_text().splitlines()[0]).keys() == {"prompt", "answer"}


def test_task_command_checks_its_arguments_in_one_line(tmp_path, capsys):
    assert main(["task", "write", "add-huge", "--out", str(tmp_path / "x")]) == 2
    assert "unknown task level 'add-huge'" in capsys.readouterr().err
    assert main(["task", "write", "add-small"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["task", "write", "add-small", "--out", str(tmp_path), "--train", "-1"]) == 2
    assert not (tmp_path / "train.jsonl").exists()
    assert main(["task", "list"]) == 0
    assert "add-small" in capsys.readouterr().out


def test_task_command_never_imports_torch(tmp_path):
    code = ("import sys; from ppo_rlhf.cli import main; "
            f"main(['task', 'write', 'add-tiny', '--out', {str(tmp_path)!r}]); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
