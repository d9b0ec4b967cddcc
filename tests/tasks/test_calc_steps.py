"""The calc-steps task: its calculator, its disjoint splits and its checker on multi-turn completions."""

from ppo_rlhf.multiturn.calls import call_tool, first_tool_call
from ppo_rlhf.tasks.arithmetic import exact_match
from ppo_rlhf.tasks.calc_steps import calc, problems


def test_the_calculator_is_exact_and_refuses_other_code():
    assert calc("37 * 48 + 215") == "1991" and calc("(2 - 5) * 3") == "-9" and calc("12x3") == "36"
    assert calc("__import__('os')").startswith("error:") and calc("2 ** 99").startswith("error:")
    observation, error = call_tool(first_tool_call("<tool>calc(37 * 48 + 215)</tool>"), {"calc": calc}, 1, 1.0)
    assert (observation, error) == ("1991", False)


def test_train_and_heldout_never_share_a_problem():
    train, heldout = problems("train", 400), problems("heldout", 200)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in heldout}
    assert len({r["prompt"] for r in train}) == 400 and problems("train", 5, seed=1) != problems("train", 5)
    row = train[0]
    question = row["prompt"].split("What is ")[1].split("?")[0]
    assert calc(question) == row["answer"]
    assert exact_match([row["prompt"]], [f"So the result is\nAnswer: {row['answer']}"], [[]], [row["answer"]]) == [1.0]
