"""Bad input, every command: malformed configs, flags and JSONL files (hypothesis-generated), every config
field's and command argument's bad values, bad model folders and run directories: exit code 2, one stderr line,
no traceback (tests/reliability.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_rlhf.cli import main
from ppo_rlhf.config import Bounds, Checked, FieldType, field_types
from ppo_rlhf.ppo.train_config import TrainConfig

import tiny
from reliability import HYPOTHESIS, REPO, expect_usage_error, flags, small


def assert_refused_before_loading(cases: list[tuple[list[str], str]], modules: tuple[str, ...]) -> None:
    """Each `ppo-rlhf ARGV` of `cases` exits 2 with one line on stderr holding its message, in a fresh process that
    never imported `modules` (the slow libraries: the refusal comes before they load)."""
    script = ("import sys; from ppo_rlhf.cli import main; code = main(sys.argv[1:]); "
              f"print(code, *(m in sys.modules for m in {modules!r}))")
    for argv, message in cases:
        result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
        assert result.stdout.strip() == "2" + " False" * len(modules), (argv, result.stdout[-300:],
                                                                         result.stderr[-300:])
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, (argv, result.stderr)


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
    text = expect_usage_error(argv(batch_size=4, minibatch_size=8), "minibatch-size")
    assert "--minibatch-size (8) must not exceed --batch-size (4)" in text
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
             (["compare", "--eval-prompts", missing], "--reward-model or --reward-funcs is required"),
             (["reward-model", "train", "--pairs", missing, "--out", str(tmp_path / "rm")], "missing.jsonl not found"),
             (["reward-model", "train", "--pairs", str(pairs), "--out", str(tmp_path / "rm"), "--base", str(empty)],
              "no config.json"),
             (["reward-model", "train", "--pairs", str(pairs), "--out", str(tmp_path / "rm"), "--heldout-pairs",
               missing], "missing.jsonl not found")]
    assert_refused_before_loading(cases, ('torch', 'transformers', 'matplotlib'))
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


def test_syntax_errors_unknown_judges_and_missing_checkpoints_are_refused_before_torch(tmp_path):
    """A reward, tool or environment file with a syntax error, an unknown judge, and a checkpoint the run does not
    have: one line and exit 2, with nothing printed before it and neither torch nor transformers imported."""
    prompts, broken = tmp_path / "prompts.jsonl", tmp_path / "broken.py"
    prompts.write_text('{"prompt": "p"}\n')
    broken.write_text("def score(completions, **kw):\n    return [1.0 for c in completions\n")
    run_dir = tmp_path / "run"  # a run directory with one complete checkpoint, iteration 2
    policy = run_dir / "checkpoints" / "iter_000002" / "policy"
    policy.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "../state.pt"):
        (policy / name).write_text("{}")
    (run_dir / "config.yaml").write_text("policy_model: smollm2\ntemperature: 1.0\nmax_new_tokens: 8\n"
                                         "reward_model: rm\n")
    train = ["train", "--prompts", str(prompts), "--out", str(tmp_path / "new")]
    cases = [(train + ["--reward-funcs", f"{broken}:score"], f"reward_funcs: reward function {broken}:score: "
                                                              f"{broken} line 2: '[' was never closed"),
             (train + ["--reward-model", "rm", "--environment", f"{broken}:make"], f"environment {broken}:make: "),
             (train + ["--reward-model", "rm", "--tools", f"{broken}:add"], f"tool {broken}:add: "),
             (["evaluate", str(run_dir), "--prompts", str(prompts), "--proxy", "my_rewards.py:correct", "--out",
               str(tmp_path / "e")], "reward function file my_rewards.py not found"),
             (["evaluate", str(run_dir), "--prompts", str(prompts), "--gold", "golden", "--out",
               str(tmp_path / "e")], "unknown judge 'golden'"),
             (["export", str(run_dir), "--checkpoint", "7", "--out", str(tmp_path / "x")],
              f"{run_dir} has no checkpoint for iteration 7 (has 2)")]
    assert_refused_before_loading(cases, ('torch', 'transformers', 'peft'))


def test_evaluate_refuses_bad_reward_specs_before_torch(tmp_path):
    """Issue 58 item 6: evaluate's --proxy and --gold take reward functions as train does; a missing file, a spec
    that is not file.py:function, a syntax error, a module that is not installed, and a run's reward function that
    was defined in the script that trained it (recorded as __main__:name): one line and exit 2, before torch loads."""
    prompts, broken = tmp_path / "prompts.jsonl", tmp_path / "broken.py"
    prompts.write_text('{"prompt": "p", "answer": "a"}\n')
    broken.write_text("def correct(completions, **kw):\n    return [1.0 for c in completions\n")
    runs = {}
    for name, rewards in (("run", "reward_model: rm\n"), ("script_run", "reward_funcs: ['__main__:correct']\n"),
                          ("env_run", "")):
        runs[name] = tmp_path / name
        runs[name].mkdir()
        (runs[name] / "config.yaml").write_text("policy_model: smollm2\ntemperature: 1.0\nmax_new_tokens: 8\n"
                                                + rewards)

    def evaluate(run: str, *flags: str) -> list[str]:
        return ["evaluate", str(runs[run]), "--prompts", str(prompts), "--out", str(tmp_path / "e"), *flags]

    cases = [(evaluate("run", "--proxy", str(tmp_path / "missing.py:correct")),
              f"reward function file {tmp_path / 'missing.py'} not found"),
             (evaluate("run", "--proxy", str(broken)), f"reward function {broken} needs its function: {broken}:NAME"),
             (evaluate("run", "--gold", f"{broken}:correct"),
              f"reward function {broken}:correct: {broken} line 2: '[' was never closed"),
             (evaluate("run", "--proxy", "no_such_module.rewards:correct"),
              "reward function no_such_module.rewards:correct: no module named 'no_such_module'"),
             (evaluate("run", "--proxy", "golden"), "unknown judge 'golden'; choose from vader"),
             (evaluate("script_run"), "the run's reward function __main__:correct was defined in the script that "
                                      "trained it and cannot be imported again; give --proxy file.py:function"),
             (evaluate("env_run"), "the run config names no reward_model or reward_funcs")]
    assert_refused_before_loading(cases, ('torch', 'transformers', 'peft'))
