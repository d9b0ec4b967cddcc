"""`ppo-rlhf CMD --help` and a bad flag answer before any heavy library loads (issue 31: --help at once).

Each command runs in a fresh interpreter, which then reports which heavy modules it imported. No timing
assertions: on a loaded machine they would be flaky; the imports are what make --help slow (torch alone: seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ppo_rlhf import cli

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "datasets", "matplotlib", "scipy", "wandb")

# Runs each argv (a JSON list of argvs in sys.argv[1]) through cli.main, then prints one JSON object:
# {"runs": [[exit code, stdout, stderr], ...], "heavy": [heavy modules imported by any of them]}.
WRAPPER = """
import contextlib, io, json, sys
from ppo_rlhf.cli import main
runs = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:  # argparse's --help
            code = exit.code
    runs.append([code, out.getvalue(), err.getvalue()])
heavy = sorted(name for name in json.loads(sys.argv[2]) if name in sys.modules)
print(json.dumps({"runs": runs, "heavy": heavy}))
"""


def run_fresh(argvs: list[list[str]]) -> tuple[list[tuple[int, str, str]], list[str]]:
    result = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(argvs), json.dumps(HEAVY)],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    return [tuple(run) for run in report["runs"]], report["heavy"]


def actions(command: str) -> list[str]:
    """The sub-actions of a command (`reward-model train`), read from its parser."""
    parser = cli.build_parser(only=command)
    command_parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return [name for a in command_parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_help_and_a_bad_flag_load_no_heavy_library(command):
    helps = [[command, "--help"]] + [[command, action, "--help"] for action in actions(command)]
    runs, heavy = run_fresh([*helps, [command, "--no-such-flag"]])
    for argv, (code, out, err) in zip(helps, runs):
        assert code == 0 and "usage: ppo-rlhf " + " ".join(argv[:-1]) in out, (argv, code, out[-500:], err[-500:])
    code, out, err = runs[-1]
    assert code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err, (code, err)
    assert heavy == [], f"`ppo-rlhf {command} --help` imports {heavy}: import them inside the functions that need them"


def test_top_level_help_loads_no_heavy_library():
    runs, heavy = run_fresh([["--help"], [], ["no-such-command"]])
    (help_code, help_out, _), (bare_code, bare_out, _), (bad_code, _, bad_err) = runs
    assert help_code == 0 and all(name in help_out for name in cli.COMMANDS)
    assert bare_code == 2 and bare_out == help_out  # no command: the same help, but an exit code that says "error"
    assert bad_code == 2 and "unknown command 'no-such-command'" in bad_err
    assert heavy == []


def test_a_missing_study_dependency_is_one_line(monkeypatch, capsys):
    """The study's dependencies are an extra: a command that needs one missing says which, and how to install it."""
    def run(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr("ppo_rlhf.study.report.run", run)
    assert cli.main(["report", "runs/r", "--out", "report"]) == 2
    assert capsys.readouterr().err == ("ppo-rlhf report: error: needs matplotlib, a dependency of the study: "
                                       "pip install 'ppo-rlhf[study]'\n")


def command_parsers():
    """(prog, parser) of every command and sub-action, read from the parsers the CLI builds."""
    for command in cli.COMMANDS:
        top = cli.build_parser(only=command)
        stack = [next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]]
        while stack:
            parser = stack.pop()
            yield parser.prog, parser
            stack += [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                      for sub in action.choices.values()]


def test_every_option_says_what_it_is_without_history_or_issue_numbers():
    """Help is for a newcomer: every option has a help text, and none of them carries an issue number, a date, a
    measured time or a pointer into the benchmarks' history (those belong to bench/HISTORY.md)."""
    history = re.compile(r"\bissue\b|\b20\d\d-\d\d-\d\d\b|\d+(\.\d+)? ?(s|min|h|ms)\b|bench/|HISTORY\.md", re.I)
    for prog, parser in command_parsers():
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"{prog} {action.option_strings[0]} has no help"
            assert not history.search(action.help), f"{prog} {action.option_strings[0]}: {action.help}"
        assert not history.search(parser.description or ""), prog


@pytest.mark.parametrize("command", ["train", "compare"])
def test_train_and_compare_open_with_an_example_and_group_their_options(command):
    text = dict(command_parsers())[f"ppo-rlhf {command}"].format_help()
    usage, _, rest = text.partition("\n\n")
    assert len(usage.splitlines()) == 1, usage  # the usage line, not 60 lines of flags
    assert rest.index("examples:\n  ppo-rlhf " + command) < rest.index("options:")
    for group in ("training: models and data:", "training: sampling:", "training: rewards:", "training: optimisers:"):
        assert group in text
    for flag, takes in (("--prompts", "FILE"), ("--reward-funcs", "FILE.py:FUNC|MODEL"), ("--tools", "FILE.py:FUNC"),
                        ("--environment", "FILE.py:FACTORY"), ("--policy-model", "MODEL"), ("--out", "RUN_DIR"),
                        ("--generation-backend", "{hf,vllm}"), ("--batch-size", "INT")):
        assert f"{flag} {takes}" in text, flag


def test_top_level_help_says_where_to_start():
    text = cli.build_parser().format_help()
    start = text.index("start here:")
    assert start < text.index("positional arguments:")  # before the list of commands
    assert "ppo-rlhf demo --quick" in text[start:] and "ppo-rlhf train" in text[start:]
    assert "example:\n  ppo-rlhf demo --quick --out runs/demo-quick" in text
    assert "section" not in text


def test_an_unknown_flag_gets_the_closest_one(capsys):
    assert cli.main(["train", "--batchsize", "4"]) == 2
    assert capsys.readouterr().err == ("ppo-rlhf train: error: unrecognized arguments: --batchsize 4; did you mean "
                                       "'--batch-size'? (see ppo-rlhf train --help)\n")
    assert cli.main(["train", "--max-new", "4"]) == 2  # a shortened flag: the flags it begins
    assert "did you mean '--max-new-tokens'?" in capsys.readouterr().err
    assert cli.main(["train", "--zzz"]) == 2  # nothing close: no guess
    assert capsys.readouterr().err == ("ppo-rlhf train: error: unrecognized arguments: --zzz (see ppo-rlhf train "
                                       "--help)\n")


def test_no_progress_bars_when_stderr_is_not_a_terminal():
    """A bar redraws its line with carriage returns: in a log file that is one line of kilobytes. The CLI turns every
    tqdm bar off when stderr is not a terminal (here a pipe), before any command imports tqdm."""
    script = ("import sys; from ppo_rlhf.cli import no_bars_off_a_terminal; no_bars_off_a_terminal(); "
              "from tqdm.auto import tqdm; bar = tqdm(range(3)); print(bar.disable); list(bar)")
    env = {key: value for key, value in os.environ.items() if key != "TQDM_DISABLE"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**env, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "True" and "\r" not in result.stderr
