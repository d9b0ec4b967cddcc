"""Reliability: bad input, numerical faults, kills and safety (tiny models only).

* bad input: hypothesis-generated malformed configs, flags and JSONL files, plus a fixed list of bad model
  folders and run directories, fed to `ppo_rlhf.cli.main` in-process: exit code 2, one stderr line, no traceback;
* numerical faults: a reward scorer that returns NaN, an injected inf gradient, a NaN loss: the step is skipped
  and logged, the weights do not move, and too many in a row stop the run with its last checkpoint intact;
* kills: `kill -9` of a `python -m ppo_rlhf train` subprocess (while generating, while writing a checkpoint, at a
  random moment), each followed by `--resume`: `latest` always names a complete checkpoint and the final history
  equals an uninterrupted run's;
* safety: torch.load only with weights_only=True, trust_remote_code never on by default or literally.

The counts of what was tried and survived are printed at the end of the session (tests/conftest.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppo_rlhf.cli import main
from ppo_rlhf.config import Bounds, Checked, FieldType, build_config, field_types
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop
from ppo_rlhf.train import train

import tiny

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time",
           "I love this day", "The quick brown fox", "This is terrible", "A cat in a house"]
TIME_KEYS = ("time_gen", "time_score", "time_update", "time_total", "gen_tokens_per_s")

# name -> [tried, survived]; printed by the pytest_terminal_summary hook of conftest.py
RELIABILITY_SURVIVAL: dict[str, list[int]] = {"bad inputs": [0, 0], "bad config values": [0, 0],
                                              "bad CLI arguments": [0, 0],
                                              "numerical faults": [0, 0], "kills": [0, 0]}

HYPOTHESIS = settings(max_examples=40, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@contextlib.contextmanager
def survival(kind: str):
    """Count one try of `kind`; it survived if the block finished without an assertion failing."""
    RELIABILITY_SURVIVAL[kind][0] += 1
    yield
    RELIABILITY_SURVIVAL[kind][1] += 1


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model_dirs):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bars are not ours; stderr is one error line
    yield from _env(tmp_path_factory, tiny_model_dirs)
    hf_logging.enable_progress_bar()


def _env(tmp_path_factory, tiny_model_dirs):
    root = tmp_path_factory.mktemp("reliability")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    yield {"policy": str(tiny_model_dirs["policy"]), "reward": str(tiny_model_dirs["reward"]),
           "prompts": str(prompts), "root": root}


def small(env, out, **overrides) -> dict:
    values = dict(policy_model=env["policy"], reward_model=env["reward"], prompts=env["prompts"], out=str(out),
                  iterations=2, batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=8,
                  lora_rank=4, checkpoint_every=1, tensorboard=False, quiet=True, policy_lr=1e-3, value_lr=1e-3,
                  dtype="float32")
    values.update(overrides)
    return values


def flags(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out.append(f"{flag}={value}")
    return out


def expect_usage_error(argv: list[str], *mentions: str, kind: str = "bad inputs") -> str:
    """main(argv) must return 2 with exactly one line on stderr naming one of `mentions`, and no traceback."""
    with survival(kind):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)  # any exception other than a UsageError propagates and fails the test
        text = err.getvalue().strip()
        assert code == 2, (argv, code, text)
        assert len(text.splitlines()) == 1, text
        assert text.startswith("ppo-rlhf"), text
        assert "Traceback" not in text + out.getvalue()
        if mentions:
            assert any(m in text for m in mentions), (mentions, text)
    return text


# ------------------------------------------------------------------------------------------ bad input

POSITIVE_INTS = ["iterations", "batch_size", "minibatch_size", "epochs", "max_new_tokens", "reward_norm_samples",
                 "lora_rank", "checkpoint_every", "sample_every", "max_skipped_steps", "max_prompt_tokens"]
POSITIVE_FLOATS = ["policy_lr", "value_lr", "adam_eps", "max_grad_norm", "temperature", "kl_target"]
UNIT_INTERVAL = ["gamma", "lam"]
ENUMS = {"dtype": ("auto", "float32", "bfloat16", "float16"), "loss_aggregation": ("token", "sequence")}
BOOLS = ["overwrite", "eos_rule", "adaptive_kl", "tensorboard", "quiet", "trust_remote_code"]
FIELDS = set(TrainConfig.__dataclass_fields__)
letters = st.text(alphabet="abcdfghjklmopqrsuvwxyz", min_size=1, max_size=8)  # no e/i/n/t: never a number or bool

bad_field_value = st.one_of(
    st.tuples(st.sampled_from(POSITIVE_INTS), st.one_of(st.integers(max_value=0), letters, st.just("1e400"),
                                                         st.floats(0.1, 1e3).filter(lambda x: not x.is_integer()))),
    st.tuples(st.sampled_from(POSITIVE_FLOATS), st.one_of(st.floats(max_value=0.0, allow_nan=False), letters,
                                                           st.sampled_from(["nan", "inf", "-inf", "1e999"]))),
    st.tuples(st.sampled_from(UNIT_INTERVAL), st.one_of(st.floats(1.001, 1e6), st.floats(-1e6, -0.001),
                                                        st.just("nan"))),
    st.tuples(st.just("clip_range"), st.one_of(st.floats(1.0, 1e6), st.floats(-1e6, 0.0), letters)),
    st.tuples(st.just("top_p"), st.one_of(st.floats(1.001, 1e6), st.floats(-1e6, 0.0))),
    st.tuples(st.sampled_from(sorted(ENUMS)), letters),
    st.tuples(st.just("device"), letters.map(lambda s: "no-such-" + s)),
)
yaml_only_value = st.one_of(  # wrong types only YAML can express
    st.tuples(st.sampled_from(BOOLS), letters.filter(lambda s: s not in ("yes", "off"))),
    st.tuples(st.sampled_from(POSITIVE_INTS + POSITIVE_FLOATS + ["prompts", "policy_model"]),
              st.one_of(st.lists(st.integers(), max_size=2), st.dictionaries(letters, st.integers(), max_size=2))),
)
unknown_key = st.from_regex(r"[a-z]{2,10}(_[a-z]{2,8})?", fullmatch=True).filter(
    lambda k: k not in FIELDS and k not in ("config", "resume"))  # (those two are real flags of `train`)


@HYPOTHESIS
@given(case=st.one_of(bad_field_value.map(lambda c: ("value",) + c), yaml_only_value.map(lambda c: ("yaml",) + c),
                      unknown_key.map(lambda k: ("unknown", k, 1))),
       via_yaml=st.booleans())
def test_malformed_configs_and_flags(env, case, via_yaml):
    kind, key, value = case
    out = env["root"] / "never_created"
    base = small(env, out)
    if kind == "yaml" or via_yaml:
        config = env["root"] / "bad.yaml"
        config.write_text(yaml.safe_dump({**base, key: value}))
        argv = ["train", "--config", str(config)]
    else:
        argv = ["train", *flags(base), f"--{key.replace('_', '-')}={value}"]
    text = expect_usage_error(argv, key, key.replace("_", "-"))
    assert kind != "unknown" or "unknown config key" in text or "unrecognized arguments" in text
    assert not out.exists()


# Every field of TrainConfig and every argument of every command, enumerated (a new field or flag is covered
# without touching this file): null, empty, wrong-typed and out-of-range values, each refused in one line.

TRAIN_FIELDS = field_types(TrainConfig)
FIELD_EXAMPLES = settings(HYPOTHESIS, max_examples=10)


def outside(bounds: Bounds, kind: type) -> list[st.SearchStrategy]:
    """Numbers just and far outside `bounds` (NaN and infinity are generated by the callers)."""
    found = []
    if bounds.low is not None:
        if kind is int:
            below = math.floor(bounds.low) if bounds.low_open else math.ceil(bounds.low) - 1
            found.append(st.integers(max_value=below))
        else:
            found.append(st.floats(max_value=bounds.low, exclude_max=not bounds.low_open, allow_nan=False,
                                   allow_infinity=False))
    if bounds.high is not None:
        if kind is int:
            above = math.ceil(bounds.high) if bounds.high_open else math.floor(bounds.high) + 1
            found.append(st.integers(min_value=above))
        else:
            found.append(st.floats(min_value=bounds.high, exclude_min=not bounds.high_open, allow_nan=False,
                                   allow_infinity=False))
    return found


def bad_text(field_type: FieldType) -> st.SearchStrategy[str]:
    """What a flag (always text) can carry that `field_type` refuses."""
    kind, cases = field_type.kind, [st.sampled_from(["", " ", "\t"])]
    if kind in (int, float):
        cases += [letters, st.sampled_from(["nan", "inf", "-inf", "1e999", "true", "null", "[1]"])]
        cases += [numbers.map(str) for numbers in outside(field_type.bounds, kind)]
        if kind is int:
            cases.append(st.floats(-1e6, 1e6).filter(lambda x: not x.is_integer()).map(str))
    if field_type.choices:
        cases.append(letters.filter(lambda s: s not in field_type.choices))
    return st.one_of(cases)


def bad_yaml_value(field_type: FieldType) -> st.SearchStrategy:
    """What a YAML value can be that `field_type` refuses: text as above, plus null, lists, maps and wrong types (a
    list field: a list holding a bad item, or a bad item alone; [] is a list field's "none")."""
    kind = field_type.kind
    if field_type.many:
        cases = [st.lists(bad_yaml_value(field_type.item), min_size=1, max_size=2), bad_text(field_type.item),
                 st.dictionaries(letters, st.integers(), max_size=2)]
        return st.one_of(cases if field_type.optional else [*cases, st.none()])
    cases = [bad_text(field_type), st.lists(st.integers(), max_size=2), st.dictionaries(letters, st.integers(),
                                                                                        max_size=2)]
    if not field_type.optional:
        cases.append(st.none())
    if kind is bool:
        cases += [letters, st.integers(), st.floats(allow_nan=False)]
    elif kind is str:
        cases += [st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False)]
    else:
        cases.append(st.booleans())
        cases += outside(field_type.bounds, kind)
    return st.one_of(cases)


@pytest.mark.parametrize("field", sorted(TRAIN_FIELDS))
@FIELD_EXAMPLES
@given(data=st.data(), via_yaml=st.booleans())
def test_every_config_field_refuses_bad_values(env, field, data, via_yaml):
    field_type = TRAIN_FIELDS[field]
    out = env["root"] / "never_created"
    base = small(env, out)
    if via_yaml or field_type.kind is bool:  # (a bool flag takes no value: its bad values are the CLI fuzz's)
        value = data.draw(bad_yaml_value(field_type), label="value")
        config = env["root"] / "bad_field.yaml"
        config.write_text(yaml.safe_dump({**base, field: value}))
        argv = ["train", "--config", str(config)]
    else:
        value = data.draw(bad_text(field_type), label="text")
        argv = ["train", *flags({k: v for k, v in base.items() if k != field}), f"--{field.replace('_', '-')}={value}"]
    expect_usage_error(argv, field, field.replace("_", "-"), kind="bad config values")
    assert not out.exists()


def command_arguments() -> list[tuple[tuple[str, ...], argparse.Action, list[argparse.Action]]]:
    """(command words, one argument, the command's other required arguments) for every argument of every command."""
    from ppo_rlhf.cli import COMMANDS, build_parser

    found = []

    def walk(words: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        actions = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]
        for action in actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk((*words, name), sub)
            else:
                required = [a for a in actions if a is not action and (a.required or not a.option_strings)
                            and not isinstance(a, argparse._SubParsersAction)]
                found.append((words, action, required))

    for command in COMMANDS:
        parser = build_parser(only=command)
        walk((command,), next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command])
    return found


COMMAND_ARGUMENTS = command_arguments()


def bad_argument(action: argparse.Action) -> st.SearchStrategy[str]:
    if isinstance(action.type, Checked):
        return bad_text(action.type.field_type)
    if action.choices:
        return st.one_of(st.just(""), letters.filter(lambda s: s not in action.choices))
    if action.nargs == 0:  # a flag given a value (--json=x, --eos-rule=x)
        return letters
    return st.sampled_from(["", " ", "\t"])  # a path, a name, a spec: never empty


@pytest.mark.parametrize("words, action, required", COMMAND_ARGUMENTS,
                         ids=[" ".join(w) + " " + (a.option_strings or [a.dest])[0] for w, a, _ in COMMAND_ARGUMENTS])
@settings(HYPOTHESIS, max_examples=6)
@given(data=st.data())
def test_every_command_argument_refuses_bad_values(env, monkeypatch, words, action, required, data):
    value = data.draw(bad_argument(action), label="value")
    fill = [f"{a.option_strings[0]}=x" if a.option_strings else "x" for a in required]  # parsed, never used
    if action.option_strings:
        argv = [*words, *fill, f"{action.option_strings[0]}={value}"]
        names = [*(s.lstrip("-") for s in action.option_strings), action.dest]  # (a config field's flag: its name)
    else:
        argv = [*words, *fill, value]
        names = [action.metavar or action.dest]
    monkeypatch.chdir(env["root"])  # (nothing may be written; if it were, it would land here, not in the repository)
    expect_usage_error(argv, *names, kind="bad CLI arguments")


def test_fuzz_covers_every_field_and_argument():
    assert set(TRAIN_FIELDS) == {f.name for f in dataclasses.fields(TrainConfig)}
    commands = {words[0] for words, _, _ in COMMAND_ARGUMENTS}
    from ppo_rlhf.cli import COMMANDS

    assert commands == set(COMMANDS)
    assert any(words == ("reward-model", "train") for words, _, _ in COMMAND_ARGUMENTS)  # nested subcommands too
    print(f"fuzzed {len(TRAIN_FIELDS)} TrainConfig fields and {len(COMMAND_ARGUMENTS)} command arguments")

@pytest.mark.parametrize("yaml_text, field", [("out:\n", "out"), ("batch_size:\n", "batch_size"), ("beta:\n", "beta"),
                                              ("eos_rule:\n", "eos_rule"), ("eos_rule: 0\n", "eos_rule"),
                                              ("out: ''\n", "out"), ("batch_size: [8]\n", "batch_size"),
                                              ("beta: {a: 1}\n", "beta"), ("seed: true\n", "seed"),
                                              ("iterations: ten\n", "iterations")])
def test_empty_and_wrong_typed_yaml_values_name_their_field(env, tmp_path, yaml_text, field):
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text.replace("\n", f"\nreward_model: {env['reward']}\nprompts: {env['prompts']}\n", 1))
    text = expect_usage_error(["train", "--config", str(config), "--out", str(tmp_path / "run")], field)
    assert text.startswith(f"ppo-rlhf train: error: {field}: expected"), text
    assert not (tmp_path / "run").exists()


def test_issue_13_messages(env, tmp_path, capsys):
    base = small(env, tmp_path / "run")
    argv = lambda **o: ["train", *flags({**base, **o})]  # noqa: E731
    expect_usage_error(["demo", "--out", ""], "out: expected a non-empty string")
    expect_usage_error(["demo", "--quick", "--out", "  "], "out: expected a non-empty string")
    assert "is a directory" in expect_usage_error(argv(prompts=str(tmp_path)), str(tmp_path))
    assert "is a directory" in expect_usage_error(argv(ptx_data=str(tmp_path)), "ptx_data")
    pairs = ["pairs", "--prompts", str(tmp_path), "--out", str(tmp_path / "p.jsonl"), "--model", env["policy"]]
    assert "is a directory" in expect_usage_error(pairs, str(tmp_path))  # every JSONL reader, not only train's
    (tmp_path / "file").write_text("x")
    assert "is a file, not a run directory" in expect_usage_error(["train", "--resume", str(tmp_path / "file")], "file")
    assert "is a file, not a model folder" in expect_usage_error(argv(policy_model=str(tmp_path / "file")),
                                                                 "policy_model")
    text = expect_usage_error(argv(batch_size=4, minibatch_size=8), "minibatch_size")
    assert "minibatch_size (8) must not exceed batch_size (4)" in text
    assert not (tmp_path / "run").exists()
    capsys.readouterr()
    assert main(["--version"]) == 0
    from ppo_rlhf import __version__

    assert capsys.readouterr().out.strip() == f"ppo-rlhf {__version__}"


def test_file_errors_come_before_the_config_dump_and_heavy_imports(env, tmp_path):
    """A missing prompts file is reported with nothing printed and neither torch nor transformers imported."""
    script = ("import sys; from ppo_rlhf.cli import main; code = main(sys.argv[1:]); "
              "print(code, 'torch' in sys.modules, 'transformers' in sys.modules, 'peft' in sys.modules)")
    for bad in (dict(prompts=str(tmp_path / "missing.jsonl")), dict(prompts=str(tmp_path)),
                dict(reward_model=str(tmp_path / "no_model")), dict(policy_model=str(tmp_path / "x.gguf"))):
        result = subprocess.run([sys.executable, "-c", script, "train", *flags(small(env, tmp_path / "run", quiet=False,
                                                                                     **bad))],
                                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                                timeout=120)
        assert result.stdout.strip() == "2 False False False", (bad, result.stdout[-300:])
        assert len(result.stderr.strip().splitlines()) == 1 and "error" in result.stderr, result.stderr


def test_every_command_checks_its_named_files_before_importing_torch(tmp_path):
    """Issue 29 item 9: a missing file or empty value named to any command is one line and exit 2, and neither torch
    nor transformers (nor matplotlib, for the demo) was imported to say so."""
    empty, missing = tmp_path / "empty_folder", str(tmp_path / "missing.jsonl")
    empty.mkdir()
    pairs, prompts = tmp_path / "pairs.jsonl", tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "p"}\n')
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    run_dir = tmp_path / "run"  # a run directory whose config evaluate accepts, evaluated on a missing prompts file
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("policy_model: smollm2\ntemperature: 1.0\nmax_new_tokens: 8\n"
                                         "reward_model: rm\n")
    cases = [(["memory", "--config", str(empty)], "no config.json"),
             (["demo", "--out", ""], "out: expected a non-empty string"),
             (["demo", "--out", str(tmp_path / "demo"), "--model", str(empty)], "no config.json"),
             (["pairs", "--prompts", missing, "--out", str(tmp_path / "p.jsonl")], "missing.jsonl not found"),
             (["pairs", "--prompts", missing, "--out", str(tmp_path / "p.jsonl"), "--model", str(empty)],
              "missing.jsonl not found"),
             (["prompts", "--out", str(tmp_path / "p"), "--model", str(empty)], "no config.json"),
             (["prompts", "--source", missing, "--out", str(tmp_path / "p")], "missing.jsonl not found"),
             (["evaluate", str(run_dir), "--prompts", missing, "--out", str(tmp_path / "e")],
              "missing.jsonl not found"),
             (["evaluate", str(run_dir), "--prompts", str(prompts), "--proxy", f"rm:{empty}", "--out",
               str(tmp_path / "e")], "no config.json"),
             (["compare", "--eval-prompts", missing], "reward_model or reward_funcs is required"),
             (["reward-model", "train", "--pairs", missing, "--out", str(tmp_path / "rm")], "missing.jsonl not found"),
             (["reward-model", "train", "--pairs", str(pairs), "--out", str(tmp_path / "rm"), "--base", str(empty)],
              "no config.json"),
             (["reward-model", "train", "--pairs", str(pairs), "--out", str(tmp_path / "rm"), "--heldout-pairs",
               missing], "missing.jsonl not found")]
    script = ("import sys; from ppo_rlhf.cli import main; code = main(sys.argv[1:]); "
              "print(code, *(m in sys.modules for m in ('torch', 'transformers', 'matplotlib')))")
    for argv, message in cases:
        result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
        assert result.stdout.strip() == "2 False False False", (argv, result.stdout[-300:], result.stderr[-300:])
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, (argv, result.stderr)
    assert not (tmp_path / "demo").exists()


BAD_LINE = {
    "bad_json": '{"prompt": "unclosed',
    "not_object": '["a list"]',
    "missing_field": '{"text": "no prompt key"}',
    "non_string": '{"prompt": 42}',
    "empty_prompt": '{"prompt": "   "}',
}
BAD_PAIR_LINE = {
    "bad_json": "{nope}",
    "missing_chosen": '{"prompt": "p", "rejected": "r"}',
    "non_string_rejected": '{"prompt": "p", "chosen": "c", "rejected": 3}',
    "bad_score": '{"prompt": "p", "chosen": "c", "rejected": "r", "score_chosen": "high"}',
}


@HYPOTHESIS
@given(command=st.sampled_from(["train", "pairs", "reward-model"]), good_before=st.integers(0, 4),
       flaw=st.sampled_from(["empty", "blank", "bad_utf8", *BAD_LINE, *BAD_PAIR_LINE]))
def test_malformed_prompt_and_pair_files(env, command, good_before, flaw):
    path = env["root"] / f"bad_{command}.jsonl"
    pairs = command == "reward-model"
    good = '{"prompt": "p", "chosen": "c", "rejected": "r"}' if pairs else json.dumps({"prompt": "Hello there"})
    bad_lines = BAD_PAIR_LINE if pairs else BAD_LINE
    if flaw in ("bad_json",) or flaw in bad_lines:
        body = (good + "\n") * good_before + bad_lines[flaw] + "\n" + good + "\n"
    elif flaw == "bad_utf8":
        body = (good + "\n") * good_before + '{"prompt": "\udcff"}\n'
    elif flaw == "blank":
        body = "\n  \n" * (good_before + 1)
    elif flaw == "empty":
        body = ""
    else:  # a flaw of the other file kind: make it a plain bad-JSON line
        body = (good + "\n") * good_before + "not json\n"
    path.write_bytes(body.encode("utf-8", "surrogateescape"))
    line = f"{path}:{good_before + 1}:"
    out = env["root"] / "never_created_out"
    if command == "train":
        argv = ["train", *flags(small(env, out, prompts=str(path)))]
    elif command == "pairs":
        argv = ["pairs", "--prompts", str(path), "--out", str(out), "--model", env["policy"]]
    else:
        argv = ["reward-model", "train", "--pairs", str(path), "--out", str(out), "--base", env["policy"]]
    text = expect_usage_error(argv, str(path))
    if flaw in ("empty", "blank"):
        assert "empty" in text
    else:
        assert line in text, (line, text)
    assert not out.exists()


def save_with(tokenizer, model, folder: Path) -> str:
    return str(tiny.save_tiny(model, tokenizer, folder))


def test_bad_models_files_and_run_dirs(env, tokenizer):
    root = env["root"] / "fixed_cases"
    root.mkdir()
    base = small(env, root / "run")
    argv = lambda **o: ["train", *flags({**base, **o})]  # noqa: E731

    # models: a reward model with two outputs, a tokenizer without pad token or chat template, offline hub ids
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    two_labels = AutoModelForSequenceClassification.from_config(tiny._config("llama", len(tokenizer), tokenizer,
                                                                             num_labels=2))
    expect_usage_error(argv(reward_model=save_with(tokenizer, two_labels, root / "rm2")), "2 output labels")
    no_pad = tiny.tiny_tokenizer()
    no_pad.pad_token = None
    expect_usage_error(argv(policy_model=save_with(no_pad, tiny.tiny_causal_lm(tokenizer), root / "nopad")),
                       "pad token")
    no_chat = tiny.tiny_tokenizer()
    no_chat.chat_template = None
    expect_usage_error(argv(policy_model=save_with(no_chat, tiny.tiny_causal_lm(tokenizer), root / "nochat")),
                       "chat template")
    expect_usage_error(argv(policy_model="no-such-org/no-such-model"), "no-such-org/no-such-model")
    expect_usage_error(argv(policy_model=str(root / "missing_folder")), "missing_folder")
    expect_usage_error(argv(reward_model=env["prompts"]), "prompts.jsonl")  # a file, not a model folder

    # prompts: too long for the cap, too long for the context, missing, a folder
    long_prompts = root / "long.jsonl"
    long_prompts.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": "the fox " * 200}) + "\n")
    assert ":2:" in expect_usage_error(argv(prompts=str(long_prompts)), "max_prompt_tokens")
    expect_usage_error(argv(max_new_tokens=600), "context")  # the tiny models have 512 positions
    expect_usage_error(argv(prompts=str(root / "nope.jsonl")), "nope.jsonl")
    expect_usage_error(argv(prompts=str(root)), str(root))

    # configs: missing, not YAML, not a mapping
    expect_usage_error(["train", "--config", str(root / "none.yaml")], "none.yaml")
    (root / "bad.yaml").write_text("a: [1, 2\n")
    expect_usage_error(["train", "--config", str(root / "bad.yaml")], "not valid YAML")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    expect_usage_error(["train", "--config", str(root / "list.yaml")], "mapping")
    (root / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    expect_usage_error(["train", "--config", str(root / "binary.yaml")], "binary.yaml")

    # the command line itself and the other commands
    expect_usage_error(["no-such-command"], "no-such-command")
    expect_usage_error(["train", "--no-such-flag"], "no-such-flag")
    expect_usage_error(["prompts", "--out", str(root / "p"), "--train", "many"], "--train")
    expect_usage_error(["reward-model", "train", "--pairs", "x.jsonl", "--out", str(root / "rm"), "--heldout-fraction",
                        "2"],
                       "heldout")
    expect_usage_error(["evaluate", str(root / "no_run"), "--prompts", env["prompts"], "--out", str(root / "ev")],
                       "no_run")
    expect_usage_error(["train", "--resume", str(root / "no_run")], "no_run")
    (root / "empty_run").mkdir()
    expect_usage_error(["train", "--resume", str(root / "empty_run")], "config.yaml")

    # run directories are never replaced without --overwrite, and bad input never removes them even with it
    precious = root / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("keep me")
    expect_usage_error(argv(out=str(precious)), "--overwrite")
    expect_usage_error(argv(out=str(precious), overwrite=True, prompts=str(root / "nope.jsonl")), "nope.jsonl")
    expect_usage_error(argv(out=str(precious / "keep.txt")), "is a file")
    assert (precious / "keep.txt").read_text() == "keep me"


# ------------------------------------------------------------------------------------ numerical faults


def read_history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def adapters(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    found = {}
    for name in ("policy", "value"):
        found |= {f"{name}.{k}": v for k, v in load_file(folder / name / "adapter_model.safetensors").items()}
    return found


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def nan_scores(monkeypatch):
    """Make the reward model return NaN during the iterations in the returned set (not while measuring the norm)."""
    poisoned: set[int] = set()
    raw, iteration = PPOLoop.raw_scores, PPOLoop.iteration

    def scores(self, rollout):
        result = raw(self, rollout)
        return torch.full_like(result, float("nan")) if getattr(self, "_poisoned", False) else result

    def one_iteration(self, index):
        self._poisoned = index in poisoned
        try:
            return iteration(self, index)
        finally:
            self._poisoned = False

    monkeypatch.setattr(PPOLoop, "raw_scores", scores)
    monkeypatch.setattr(PPOLoop, "iteration", one_iteration)
    return poisoned


def test_nan_reward_batch_is_skipped_and_the_run_continues(env, tmp_path, nan_scores):
    from ppo_rlhf.ppo.dashboard import dashboard_line

    with survival("numerical faults"):
        nan_scores.add(1)  # (eos_rule off: it would replace the NaN score of an unfinished reply by a fixed one)
        cfg = build_config(TrainConfig, small(env, tmp_path / "run", iterations=4, epochs=2, eos_rule=False))
        run = train(cfg)
        history = read_history(run)
        assert [row["iteration"] for row in history] == [0, 1, 2, 3]
        assert [row["skipped_steps"] for row in history] == [0, 4, 0, 0]  # 2 epochs x 2 minibatches skipped
        assert "skipped 4" in dashboard_line(history[1]) and "skipped" not in dashboard_line(history[0])
        ckpt = run / "checkpoints"
        assert same(adapters(ckpt / "iter_000001"), adapters(ckpt / "iter_000002")), "a NaN batch moved the weights"
        assert not same(adapters(ckpt / "iter_000002"), adapters(ckpt / "iter_000003")), "training stopped moving"


def test_always_nan_stops_with_the_last_good_checkpoint(env, tmp_path, nan_scores):
    from ppo_rlhf.ppo.checkpoint import latest_checkpoint, load_checkpoint

    with survival("numerical faults"):
        nan_scores.update(range(1, 10))
        out = tmp_path / "run"
        text = expect_usage_error(["train", *flags(small(env, out, iterations=6, max_skipped_steps=2, eos_rule=False))],
                                  "consecutive")
        assert "iter_000002" in text
        assert [row["iteration"] for row in read_history(out)] == [0, 1]  # every finished iteration is logged
        latest = latest_checkpoint(out, ("policy", "value"))
        pointer = (out / "checkpoints" / "latest").read_text().strip()
        assert latest is not None and latest.name == pointer == "iter_000002"
        assert same(adapters(out / "checkpoints" / "iter_000001"), adapters(latest))
        trainer = PPOLoop(build_config(TrainConfig, small(env, out)))
        iteration, state, history = load_checkpoint(latest, ("policy", "value"))
        trainer.load_state_dict(state)
        assert iteration == 2 and len(history) == 2


def test_inf_gradient_and_nan_loss_never_reach_the_weights(env, tmp_path, monkeypatch):
    cfg = build_config(TrainConfig, small(env, tmp_path / "run", epochs=2, max_skipped_steps=100))
    trainer = PPOLoop(cfg)
    params = {f"policy.{n}": p for n, p in trainer.policy.named_parameters() if p.requires_grad}
    params |= {f"value.{n}": p for n, p in trainer.value_model.named_parameters() if p.requires_grad}

    def snapshot():
        return {n: p.detach().clone() for n, p in params.items()}

    lora = next(p for n, p in params.items() if "lora_B" in n and n.startswith("policy."))
    with survival("numerical faults"):  # an inf gradient on one LoRA matrix
        before = snapshot()
        handle = lora.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        stats, _ = trainer.iteration(0)
        handle.remove()
        assert stats["skipped_steps"] == 4 and trainer.consecutive_skips == 4
        assert same(before, snapshot()) and not trainer.policy_optimizer.state and not trainer.value_optimizer.state

    with survival("numerical faults"):  # a NaN policy loss (the trainer's own method, so the patch surely applies)
        policy_loss = trainer.policy_loss

        def nan_loss(*args, **kwargs):
            loss, numbers = policy_loss(*args, **kwargs)
            return loss * float("nan"), {**numbers, "pg_loss": float("nan")}

        monkeypatch.setattr(trainer, "policy_loss", nan_loss)
        stats, _ = trainer.iteration(1)
        monkeypatch.undo()
        assert stats["skipped_steps"] == 4 and same(before, snapshot())

    stats, _ = trainer.iteration(2)  # and a healthy step moves the weights again
    assert stats["skipped_steps"] == 0 and trainer.consecutive_skips == 0 and not same(before, snapshot())


# ---------------------------------------------------------------------------------------------- kills


def check_latest(run: Path) -> str | None:
    """`latest`, if present, names a complete, readable checkpoint whose history has its iteration count."""
    from safetensors.torch import load_file

    pointer = run / "checkpoints" / "latest"
    if not pointer.exists():  # killed before its first checkpoint was complete
        return None
    name = pointer.read_text().strip()
    folder = run / "checkpoints" / name
    saved = torch.load(folder / "state.pt", weights_only=True)
    assert saved["iteration"] == int(name.split("_")[1])
    for model in ("policy", "value"):
        assert load_file(folder / model / "adapter_model.safetensors")
        json.loads((folder / model / "adapter_config.json").read_text())
    assert len((folder / "history.jsonl").read_text().splitlines()) == saved["iteration"]
    return name


def test_kill_9_and_resume_gives_the_uninterrupted_history(env, tmp_path):
    values = small(env, None, iterations=6, sample_every=5)
    del values["out"]
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}

    def launch(*args: str) -> subprocess.Popen:
        log = open(tmp_path / f"stderr_{time.monotonic_ns()}.txt", "w")
        return subprocess.Popen([sys.executable, "-m", "ppo_rlhf", "train", *args], cwd=REPO, env=child_env,
                                stdout=subprocess.DEVNULL, stderr=log)

    uninterrupted = tmp_path / "a"
    killed = tmp_path / "b"
    reference = launch(*flags(values), f"--out={uninterrupted}")  # runs alongside the killed one
    rng = random.Random(20240607)
    checkpoints = killed / "checkpoints"

    def writing_checkpoint() -> bool:
        return checkpoints.is_dir() and any(".tmp-" in p.name for p in os.scandir(checkpoints))

    # (when to kill, after the history file of this launch appeared)
    plans = [("while generating the first batch, before any checkpoint", lambda started: True),
             ("while writing a checkpoint", lambda started: writing_checkpoint()),
             ("at a random moment", lambda started, delay=rng.uniform(0.2, 2.0): time.monotonic() - started > delay)]
    proc = launch(*flags(values), f"--out={killed}")
    for what, due in plans:
        launched = time.time_ns()
        started = None
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            history = killed / "history.jsonl"
            if started is None and history.exists() and history.stat().st_mtime_ns > launched:  # written by this launch
                started = time.monotonic()
            if started is not None and due(started):
                break
            time.sleep(0.002)
        if proc.poll() is not None:  # finished before the kill: nothing to survive
            break
        with survival("kills"):
            in_checkpoint = writing_checkpoint()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            print(f"killed {what} (checkpoint write in progress: {in_checkpoint}); latest = {check_latest(killed)}")
        proc = launch("--resume", str(killed))
    assert proc.wait(timeout=300) == 0
    assert reference.wait(timeout=300) == 0

    def history(run: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in read_history(run)]

    assert RELIABILITY_SURVIVAL["kills"][0] >= 2, "the run finished before it could be killed"
    assert check_latest(killed) == "iter_000006"
    assert history(killed) == history(uninterrupted)
    assert (killed / "samples.jsonl").read_text() == (uninterrupted / "samples.jsonl").read_text()
    assert not [p for p in checkpoints.iterdir() if ".tmp-" in p.name], "leftovers of a killed checkpoint write"


# --------------------------------------------------------------------------------------------- safety


def test_weights_load_safely_and_remote_code_is_opt_in():
    import inspect

    import ppo_rlhf.models.loading as models

    sources = {str(path): path.read_text() for path in (REPO / "ppo_rlhf").rglob("*.py")}
    for name, text in sources.items():
        for match in re.finditer(r"torch\.load\(", text):
            depth, end = 1, match.end()
            while depth and end < len(text):  # the whole call, up to its matching parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            assert "weights_only=True" in text[match.end(): end], f"{name}: torch.load without weights_only=True"
        assert not re.search(r"trust_remote_code\s*=\s*True", text), f"{name} passes trust_remote_code=True"
        assert not re.search(r"\bpickle\.loads?\(|\bnp\.load\([^)]*allow_pickle\s*=\s*True", text), f"{name} unpickles"
    assert TrainConfig.trust_remote_code is False
    for fn_name, fn in inspect.getmembers(models, inspect.isfunction):
        parameter = inspect.signature(fn).parameters.get("trust_remote_code")
        assert parameter is None or parameter.default is False, fn_name
    from ppo_rlhf.cli import build_parser

    args = build_parser(only="train").parse_args(["train"])
    assert not hasattr(args, "trust_remote_code")  # the config default (False) applies unless the flag is given
