"""The calc-steps task: its calculator, its disjoint splits, its checker on multi-turn completions, the `task`
command and the report's tool-use sentence and table."""

from ppo_rlhf.cli import main
from ppo_rlhf.data import load_prompt_rows
from ppo_rlhf.multiturn.calls import call_tool, first_tool_call
from ppo_rlhf.tasks.arithmetic import exact_match, task_tools
from ppo_rlhf.tasks.calc_steps import DEMONSTRATION, POOL, calc, problems
from ppo_rlhf.tasks.report import model_table, tool_sentence


def test_the_calculator_is_exact_and_refuses_other_code():
    assert calc("37 * 48 + 215") == "1991" and calc("(2 - 5) * 3") == "-9" and calc("12x3") == "36"
    assert calc("__import__('os')").startswith("error:") and calc("2 ** 99").startswith("error:")
    observation, error = call_tool(first_tool_call("<tool>calc(37 * 48 + 215)</tool>"), {"calc": calc}, 1, 1.0)
    assert (observation, error) == ("1991", False)


def test_train_and_heldout_never_share_a_problem():
    train, heldout = problems("train", 400), problems("heldout", 200)
    asked = lambda rows: {r["prompt"][-1]["content"] for r in rows}  # noqa: E731
    assert not asked(train) & asked(heldout)
    assert len(asked(train)) == 400 and problems("train", 5, seed=1) != problems("train", 5)
    row = train[0]
    demonstrated = call_tool(first_tool_call(DEMONSTRATION[1]["content"]), {"calc": calc}, 1, 1.0)[0]
    assert row["prompt"][:-1] == DEMONSTRATION and demonstrated == DEMONSTRATION[2]["content"] == "975"
    question = row["prompt"][-1]["content"].split("What is ")[1].split("?")[0]
    assert calc(question) == row["answer"]
    assert exact_match([row["prompt"]], [f"So the result is\nAnswer: {row['answer']}"], [[]], [row["answer"]]) == [1.0]


def test_the_task_command_knows_calc_steps(tmp_path, capsys):
    assert main(["task", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    (line,) = [line for line in listed if line.startswith("calc-steps ")]
    assert "37 * 48 + 215 = 1991" in line
    assert main(["task", "write", "calc-steps", "--out", str(tmp_path)]) == 0
    train, heldout = (load_prompt_rows(str(tmp_path / f"{split}.jsonl")) for split in ("train", "heldout"))
    assert (len(train), len(heldout)) == (POOL["train"], POOL["heldout"])
    assert [{"prompt": r.prompt, **r.columns} for r in heldout[:50]] == problems("heldout", 50)  # a prefix
    assert task_tools("calc-steps") == [calc] and task_tools("add-tiny") == []
    assert main(["task", "evaluate", str(tmp_path), "--level", "calc-stepz", "--out", str(tmp_path / "e")]) == 2
    assert "unknown task level 'calc-stepz'; choose from add-tiny" in capsys.readouterr().err


def summary(tool_use: float, calls: float, errors: float, turns: float, iteration: int | None) -> dict:
    return {"model": "start" if iteration is None else f"ppo step {iteration}", "run": iteration and "ppo",
            "iteration": iteration, "tool_use": tool_use, "tool_calls": calls, "tool_errors": errors, "turns": turns,
            "accuracy": {"mean": 0.5, "lo": 0.4, "hi": 0.6}, "accuracy_change": {"mean": 0.1, "lo": 0.0, "hi": 0.2},
            "kl": 1.0, "formatted": 0.5, "finished": 1.0, "tokens": 20.0}


def test_the_report_says_tool_use_before_and_after_from_the_numbers():
    models = [summary(0.125, 0.2, 0.05, 1.2, None), summary(0.9, 1.1, 0.0, 2.1, 20)]
    assert tool_sentence(models) == (
        "Tool use: at the start 12% of episodes called a tool (0.20 calls, 0.05 tool errors and 1.20 turns per "
        "episode); after 20 iterations 90% of episodes called a tool (1.10 calls, 0.00 tool errors and 2.10 turns "
        "per episode). A tool error is a call the tool could not make (an unknown tool, arguments it does not take).")
    header, rows = model_table(models)
    assert header[-4:] == ["tool use", "tool calls", "tool errors", "turns"] and rows[1][-4:] == \
        ["90%", "1.10", "0.00", "2.10"]
    one_reply = [{k: v for k, v in s.items() if k not in ("tool_use", "tool_calls", "tool_errors", "turns")}
                 for s in models]
    assert tool_sentence(one_reply) == "" and len(model_table(one_reply)[0]) == 7
