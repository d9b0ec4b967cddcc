"""`ppo-rlhf CMD --help` and a bad flag answer before any heavy library loads (issue 31: --help at once).

Each command runs in a fresh interpreter, which then reports which heavy modules it imported. No timing
assertions: on a loaded machine they would be flaky; the imports are what make --help slow (torch alone: seconds).
"""

from __future__ import annotations

import argparse
import json
import os
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
