"""ppo-rlhf: PPO for RLHF on causal language models, from the toy bandit to an evaluated run.

Each subcommand lives in its own module, imported only when it runs, so `ppo-rlhf memory` never pays for
importing transformers.

A command module provides `add_arguments(parser)` and `run(args) -> int`. Importing it loads no torch, transformers,
peft, datasets, matplotlib, scipy or wandb (they load inside `run`), so `--help` and a bad flag answer at once
(tests/test_cli_help.py).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from ppo_rlhf import __version__
from ppo_rlhf.config import did_you_mean
from ppo_rlhf.errors import Interrupted, RunError, UsageError
from ppo_rlhf.ppo.hints import from_command_line
from ppo_rlhf.utils.signals import EXIT_CODE as SIGTERM_EXIT_CODE
from ppo_rlhf.utils.signals import by_sigterm, sigterm_as_interrupt
from ppo_rlhf.utils.threads import use_threads

# The study's own dependencies (`pip install "ppo-rlhf[study]"`, pyproject.toml): the library and `train` run without
# them, and a command that needs one says so in one line.
STUDY_MODULES = ("matplotlib", "scipy", "sklearn", "vaderSentiment", "profanity_check")

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "toy": ("ppo_rlhf.ppo.toy_command", "why PPO clips, shown on a six-token bandit (no language model)"),
    "memory": ("ppo_rlhf.models.memory", "the memory the four models of RLHF (policy, reference, reward, value) need"),
    "prompts": ("ppo_rlhf.study.prompts", "build train and held-out prompt files"),
    "pairs": ("ppo_rlhf.study.pairs", "sample reply pairs and label them with a gold judge"),
    "reward-model": ("ppo_rlhf.study.reward_model", "train a Bradley-Terry reward model"),
    "train": ("ppo_rlhf.train", "run PPO on your prompts against a reward model or reward functions"),
    "task": ("ppo_rlhf.tasks.command",
             "verifiable arithmetic problems (train and held-out JSONL) with an exact checker"),
    "check": ("ppo_rlhf.ppo.check", "the invariants of a correct PPO, measured on a config's models before training"),
    "evaluate": ("ppo_rlhf.study.evaluate", "evaluate checkpoints on held-out prompts"),
    "export": ("ppo_rlhf.export", "a run's policy as a PEFT adapter or a merged transformers model, with a model card"),
    "compare": ("ppo_rlhf.study.compare", "the same budget with GAE (PPO), RLOO and GRPO; proxy and gold side by side"),
    "report": ("ppo_rlhf.study.report", "plots and a report page for runs and evaluations"),
    "demo": ("ppo_rlhf.study.demo", "the whole offline study end to end"),
}


START_HERE = """\
start here:
  ppo-rlhf demo --quick     the whole study on a small budget, offline: prompts, a reward model, PPO, a report
  ppo-rlhf train --help     PPO on your own prompts and rewards (the same as `from ppo_rlhf import PPOTrainer`)
  ppo-rlhf COMMAND --help   any command's options

example:
  ppo-rlhf demo --quick --out runs/demo-quick"""


# A command handed on to another module's `run` when one of its flags is given (the same parser and arguments; the
# first flag given wins): the study's demo and compare on a verifiable task (--task) are the tasks' own, so the study
# never imports the tasks; the over-optimisation study and the horizon comparison build on the demo's and compare's
# stages, so they are handed on rather than imported by them.
HANDED_ON: dict[str, list[tuple[str, str]]] = {
    "demo": [("task", "ppo_rlhf.tasks.demo"), ("overoptimisation", "ppo_rlhf.study.overoptimisation")],
    "compare": [("horizons", "ppo_rlhf.tasks.horizons"), ("task", "ppo_rlhf.tasks.compare")]}


def non_empty_text(text: str) -> str:
    """The type of every text argument without one of its own: an empty path or name is never meant."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def flag_hint(flag: str, options: list[str]) -> str:
    """"; did you mean '--epochs'?" for a misspelt or shortened flag (the options it begins, else the closest)."""
    options = [option for option in options if option != "--help"]
    begun = [option for option in options if option.startswith(flag)]
    if begun:
        return f"; did you mean {' or '.join(map(repr, begun[:3]))}?"
    return did_you_mean(flag, options)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a UsageError (one line on stderr, exit 2) instead of usage text + SystemExit."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --ep must not silently mean --epochs
        super().__init__(*args, **kwargs)
        self.register("type", None, non_empty_text)  # (subcommand parsers are OneLineParsers too)

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        action.type = str  # a subcommand's arguments pass through here unchecked: its own parser checks them
        return action

    def error(self, message: str):
        prog, hint = self.prog, ""
        if message.startswith("unrecognized arguments: "):  # raised by the top parser for a command's unknown flag
            command = self.command_parser()
            prog = command.prog if command is not None else prog
            flags = [word.split("=")[0] for word in message.split()[2:] if word.startswith("--")]
            options = [option for option in (command or self)._option_string_actions if option.startswith("--")]
            hint = next(filter(None, (flag_hint(flag, options) for flag in flags)), "")
        raise UsageError(f"{message}{hint} (see {prog} --help)")

    def command_parser(self) -> argparse.ArgumentParser | None:
        """The parser of the command given (the one subcommand this parser has arguments for), or None."""
        if self._subparsers is None:
            return None
        choices = self._subparsers._group_actions[0].choices
        assert isinstance(choices, dict)
        return next((parser for parser in choices.values() if len(parser._actions) > 1), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ppo-rlhf", description=f"{__doc__.splitlines()[0]}\n\n{START_HERE}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == only:
            importlib.import_module(module_name).add_arguments(command_parser)
    return parser


def no_bars_off_a_terminal() -> None:
    """Progress bars redraw their line with "\\r" several times a second: in a log file (stderr not a terminal) that
    is one line of kilobytes, and an error message lands glued to a bar's fragment. Off a terminal every tqdm bar is
    off (transformers', accelerate's and the study's): TQDM_DISABLE, which tqdm reads when it is imported, before any
    command loads it. A value the user set wins."""
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    no_bars_off_a_terminal()
    if argv[:1] in (["--version"], ["-V"]):
        print(f"ppo-rlhf {__version__}")
        return 0
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        parser = build_parser()
        if command is None:
            parser.print_help()
            return 0 if argv and argv[0] in ("-h", "--help") else 2
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(f"ppo-rlhf: error: unknown command {command!r}; {hint}choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        args = build_parser(only=command).parse_args(argv)
        module_name = COMMANDS[command][0]
        # (an unset flag is absent or None; a flag set false, e.g. --overoptimisation false, is not handed on)
        module_name = next((module for flag, module in HANDED_ON.get(command, [])
                            if getattr(args, flag, None) not in (None, False)), module_name)
        use_threads(getattr(args, "threads", None))  # a command that trains or samples: --threads (utils/threads.py)
        with from_command_line(), sigterm_as_interrupt():
            return int(importlib.import_module(module_name).run(args) or 0)
    except UsageError as error:
        print(f"ppo-rlhf {command}: error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in STUDY_MODULES:
            raise
        print(f"ppo-rlhf {command}: error: needs {error.name}, a dependency of the study: "
              "pip install 'ppo-rlhf[study]'", file=sys.stderr)
        return 2
    except RunError as error:
        print(f"ppo-rlhf {command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as error:  # errors.Interrupted says what to do next
        advice = f"; {error}" if isinstance(error, Interrupted) else ""
        if by_sigterm(error):  # a scheduler's preemption, `kill`: the work Ctrl-C keeps was kept
            print(f"ppo-rlhf {command}: terminated (SIGTERM){advice}", file=sys.stderr)
            return SIGTERM_EXIT_CODE
        print(f"ppo-rlhf {command}: interrupted{advice}", file=sys.stderr)
        return 130
