"""Reward functions (rewards.py): every kind of spec, weights and None, each bad output's one-line error, and the
default reward model's scores passing through bit for bit."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.loading import load_sequence_classifier
from ppo_rlhf.models.scores import RewardModel, score_texts
from ppo_rlhf.rewards import (
    CombinedReward,
    ModelReward,
    RewardFunctionError,
    is_reward_model_spec,
    resolve_reward_funcs,
)
from ppo_rlhf.utils.paths import check_reward_spec

from tiny import save_tiny, tiny_causal_lm, tiny_reward_model, tiny_tokenizer

PROMPTS = ["Tell me a story.", "What is 2 + 2?", "Say hello."]
REPLIES = ["Once upon a time there was a cat.", "4", "Hello! How are you today?"]
IDS = [[5, 6, 7], [8], [9, 10]]
COLUMNS = [{"answer": "cat"}, {"answer": "4"}, {"answer": None}]


def call(funcs, weights=None, prompts=PROMPTS, replies=REPLIES, columns=COLUMNS):
    return CombinedReward(funcs, weights)(prompts, replies, IDS, columns)


def one_line_error(funcs, weights=None, **kwargs) -> str:
    with pytest.raises(RewardFunctionError) as error:
        call(resolve_reward_funcs(funcs), weights, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def reward_tokenizer():
    """Another tokenizer than the policy's (tests' `tokenizer`): its own vocabulary and a distinct pad token."""
    return tiny_tokenizer(distinct_pad=True, vocab_size=280)


@pytest.fixture(scope="module")
def reward_folder(tmp_path_factory, reward_tokenizer):
    return save_tiny(tiny_reward_model(reward_tokenizer, seed=3), reward_tokenizer,
                     tmp_path_factory.mktemp("rewards") / "my_rm")


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


# ------------------------------------------------------------------------------------------------ spec kinds
def test_a_callable_gets_keywords_completion_ids_and_every_column():
    seen = {}

    def exact_match(prompts, completions, completion_ids, answer, **kwargs):
        seen.update(prompts=prompts, completion_ids=completion_ids, answer=answer, kwargs=kwargs)
        return [None if a is None else float(a in c) for c, a in zip(completions, answer)]

    funcs = resolve_reward_funcs([exact_match, length])
    assert [func.name for func in funcs] == ["exact_match", "length"]
    columns = [{**row, "level": i} for i, row in enumerate(COLUMNS)]
    total, means = call(funcs, columns=columns)
    assert seen == {"prompts": PROMPTS, "completion_ids": IDS, "answer": ["cat", "4", None],
                    "kwargs": {"level": [0, 1, 2]}}
    assert total.tolist() == [1.0 + 33, 1.0 + 1, 25.0]  # no answer, no exact_match: the length alone
    assert means == {"reward/exact_match": 1.0, "reward/length": 59 / 3}


def test_trajectory_ids_are_a_keyword_only_when_given_and_no_column_may_take_the_name():
    seen = []

    def count(completion_ids, **kwargs):
        seen.append(kwargs)
        return [float(len(ids)) for ids in completion_ids]

    combined = CombinedReward(resolve_reward_funcs([count]))
    combined.scores(PROMPTS, REPLIES, IDS, COLUMNS)  # a single-turn run's call
    trajectories = [[1, *ids] for ids in IDS]
    combined.scores(PROMPTS, REPLIES, IDS, COLUMNS, trajectories)  # a multi-turn run's
    assert seen == [{"prompts": PROMPTS, "completions": REPLIES, "answer": ["cat", "4", None]},
                    {"prompts": PROMPTS, "completions": REPLIES, "answer": ["cat", "4", None],
                     "trajectory_ids": trajectories}]
    with pytest.raises(UsageError, match="the dataset column 'trajectory_ids' has the name of a reward-function"):
        combined.scores(PROMPTS, REPLIES, IDS, [{"trajectory_ids": 1}] * 3)


def test_file_spec_module_spec_and_names(tmp_path, monkeypatch):
    rewards_file = tmp_path / "my_rewards.py"
    rewards_file.write_text(
        "def short(completions, **kwargs):\n"
        "    return [1.0 if len(c) < 10 else 0.0 for c in completions]\n"
        "def shouting(completions, **kwargs):\n"
        "    return [float(c.isupper()) for c in completions]\n"
    )
    package = tmp_path / "my_reward_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text("def words(completions, **kwargs):\n    return [len(c.split()) for c in "
                                        "completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    funcs = resolve_reward_funcs([f"{rewards_file}:short", f"{rewards_file}:shouting", "my_reward_pkg.scoring:words",
                                  f"{rewards_file}:short", functools.partial(length), lambda completions, **k: k])
    assert [f.name for f in funcs] == ["short", "shouting", "words", "short_2", "length", "<lambda>"]
    assert funcs[0].func.__module__ == funcs[1].func.__module__  # one file imported once
    total, means = call(funcs[:3])
    assert total.tolist() == [0.0 + 0.0 + 8, 1.0 + 0.0 + 1, 0.0 + 0.0 + 5]
    assert means == {"reward/short": 1 / 3, "reward/shouting": 0.0, "reward/words": 14 / 3}


def test_reward_model_folder_with_another_tokenizer(reward_folder, reward_tokenizer, tokenizer):
    (func,) = resolve_reward_funcs(str(reward_folder), dtype=torch.float32, device="cpu", batch_size=2)
    assert isinstance(func, ModelReward) and func.name == "my_rm"
    assert func.tokenizer.get_vocab() == reward_tokenizer.get_vocab() != tokenizer.get_vocab()
    assert not func.shares_tokenizer(tokenizer) and func.shares_tokenizer(reward_tokenizer)
    expected = score_texts(func.model, reward_tokenizer, PROMPTS, REPLIES, batch_size=2)
    total, means = call([func])
    assert torch.equal(total, expected)
    assert means == {"reward/my_rm": pytest.approx(float(expected.double().mean()))}
    assert is_reward_model_spec(str(reward_folder)) and not is_reward_model_spec("my_rewards.py:short")


def test_a_reward_model_reads_chat_message_prompts(reward_folder):
    (func,) = resolve_reward_funcs(str(reward_folder))
    messages = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    assert torch.equal(call([func], prompts=messages)[0], call([func])[0])  # one user turn is the string prompt
    longer = [[{"role": "system", "content": "Be kind."}, *turns] for turns in messages]
    assert not torch.equal(call([func], prompts=longer)[0], call([func])[0])


def test_loaded_models_alone_or_with_their_tokenizer(reward_folder, reward_tokenizer, tokenizer):
    model = load_sequence_classifier(str(reward_folder))
    alone, paired = resolve_reward_funcs([model, (model, reward_tokenizer)])
    assert (alone.name, paired.name) == ("my_rm", "my_rm_2")
    assert alone.shares_tokenizer(reward_tokenizer)  # loaded from model.name_or_path
    assert torch.equal(call([alone])[0], call([paired])[0])
    fresh = tiny_reward_model(reward_tokenizer)  # no name_or_path: its tokenizer is needed
    with pytest.raises(UsageError, match=r"as a \(model, tokenizer\) tuple"):
        resolve_reward_funcs(fresh)
    with pytest.raises(UsageError, match="is a LlamaForCausalLM, not a sequence-classification model"):
        resolve_reward_funcs((tiny_causal_lm(tokenizer), tokenizer))
    with pytest.raises(UsageError, match="the tokenizer of my_rm is a str, not a transformers tokenizer"):
        resolve_reward_funcs((model, "tokenizer"))
    two_labels = tiny_reward_model(reward_tokenizer)
    two_labels.config.num_labels = 2
    with pytest.raises(UsageError, match="has 2 output labels, need 1"):
        resolve_reward_funcs((two_labels, reward_tokenizer))


def test_bad_specs_are_one_line(tmp_path):
    rewards_file = tmp_path / "r.py"
    rewards_file.write_text("THRESHOLD = 0.5\ndef ok(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    cases = {
        f"{tmp_path}/missing.py:ok": "reward function file .*missing.py not found",
        f"{rewards_file}:nope": "r.py has no 'nope'",
        f"{rewards_file}:THRESHOLD": "is a float, not a callable",
        f"{rewards_file}:": "'' after the colon is not a function name",
        f"{broken}:ok": "cannot import .*broken.py .*ModuleNotFoundError: No module named 'no_such_module_here'",
        "no_such_package.rewards:ok": "cannot import no_such_package.rewards",
        f"{tmp_path}/no_rm": "model folder .*no_rm not found",
        3: "reward function 3 is not a callable",
        None: "reward function None is not a callable",
    }
    for spec, message in cases.items():
        with pytest.raises(UsageError, match=message) as error:
            resolve_reward_funcs([spec])
        assert "\n" not in str(error.value)
    with pytest.raises(UsageError, match="no reward functions"):
        resolve_reward_funcs([])


def test_check_reward_spec_needs_no_import(tmp_path):
    """The torch-free check a config runs before loading: a missing file or folder, in one line."""
    with pytest.raises(UsageError, match="reward function file .*gone.py not found"):
        check_reward_spec(f"{tmp_path}/gone.py:f")
    with pytest.raises(UsageError, match="model folder ./runs/none not found"):
        check_reward_spec("./runs/none")
    with pytest.raises(UsageError, match="reward function my_rewards.py needs its function: my_rewards.py:NAME"):
        check_reward_spec("my_rewards.py")
    check_reward_spec("some_package.module:function")  # imported when the run loads
    check_reward_spec("org/hub-model")  # checked when loaded


# ------------------------------------------------------------------------------------------- weights and None
def test_weights_sum_over_the_functions_that_apply():
    def answered(completions, answer, **kwargs):
        return [None if a is None else float(a in c) for c, a in zip(completions, answer)]

    total, means = call(resolve_reward_funcs([answered, length]), weights=[2.0, 0.5])
    assert total.dtype == torch.float32 and total.device.type == "cpu"
    assert total.tolist() == [2.0 + 0.5 * 33, 2.0 + 0.5 * 1, 0.5 * 25]
    assert means == {"reward/answered": 1.0, "reward/length": (33 + 1 + 25) / 3}
    with pytest.raises(UsageError, match=r"1 reward weights for 2 reward functions \(answered, length\)"):
        CombinedReward(resolve_reward_funcs([answered, length]), [1.0])
    twice = resolve_reward_funcs(length) + resolve_reward_funcs(length)
    with pytest.raises(UsageError, match=r"reward functions need different names, got \['length', 'length'\]"):
        CombinedReward(twice)
    with pytest.raises(UsageError, match="reward weight nan is not a finite number"):
        CombinedReward(resolve_reward_funcs([length]), [math.nan])


def test_a_sample_no_function_scores_is_an_error():
    def answered(completions, answer, **kwargs):
        return [None if a is None else 1.0 for a in answer]

    message = one_line_error([answered])
    assert message == "no reward function (answered) scored the completion 'Hello! How are you today?': each " \
                      "returned None"


def test_numbers_tensors_arrays_and_bools_are_accepted():
    def as_bools(completions, **kwargs):
        return [c.startswith("4") for c in completions]

    def as_array(completions, **kwargs):
        return np.arange(len(completions), dtype=np.float32)

    def as_scalars(completions, **kwargs):
        return [torch.tensor(1.5), np.float64(2.0), 3]

    total, means = call(resolve_reward_funcs([as_bools, as_array, as_scalars]))
    assert total.tolist() == [0.0 + 0 + 1.5, 1.0 + 1 + 2.0, 0.0 + 2 + 3]
    assert means["reward/as_bools"] == 1 / 3


def test_chat_message_prompts_get_conversational_completions():
    seen = []

    def record(completions, **kwargs):
        seen.extend(completions)
        return [1.0] * len(completions)

    prompts = [[{"role": "user", "content": "Hi"}], "Plain"]
    CombinedReward(resolve_reward_funcs(record))(prompts, ["Hello", "Text"], IDS[:2], [{}, {}])
    assert seen == [[{"role": "assistant", "content": "Hello"}], "Text"]


# -------------------------------------------------------------------------------------------- bad outputs
def test_a_function_that_raises_names_the_completion_it_fails_on():
    def picky(completions, **kwargs):
        return [float(len(c) < 3) if c != "4" else 1 / 0 for c in completions]

    assert one_line_error([length, picky]) == \
        "reward function picky raised ZeroDivisionError: division by zero on the completion '4'"

    def only_batches(completions, **kwargs):
        if len(completions) > 1:
            raise ValueError("batch failed\nsecond line")
        return [0.0]

    assert one_line_error([only_batches]) == ("reward function only_batches raised ValueError: batch failed on a "
                                              "batch of 3 completions, the first 'Once upon a time there was a cat.'")


def test_bad_outputs_are_one_line_naming_function_and_completion():
    long_reply = "word " * 40 + "\nnext line"
    replies = [REPLIES[0], long_reply, REPLIES[2]]
    cases = {
        lambda completions, **k: [1.0, 2.0]: "returned 2 values for 3 completions (at the completion 'Hello!",
        lambda completions, **k: [1.0, "0.5", 2.0]: "returned '0.5' (a str), not a number or None, for the "
                                                    "completion 'word word",
        lambda completions, **k: [1.0, math.nan, 2.0]: "returned nan for the completion 'word word",
        lambda completions, **k: [1.0, 1.0, -math.inf]: "returned -inf for the completion 'Hello!",
        lambda completions, **k: None: "returned None, not a list of 3 numbers",
        lambda completions, **k: 1.0: "returned a float, not a list of 3 numbers",
    }
    for func, message in cases.items():
        text = one_line_error([func], replies=replies)
        assert text.startswith("reward function <lambda> ") and message in text, text
        assert len(text) < 200  # the long completion is shortened


def test_a_column_named_like_an_argument_is_refused():
    with pytest.raises(UsageError, match="the dataset column 'completions' has the name of a reward-function"):
        call(resolve_reward_funcs(length), columns=[{"completions": 1}] * 3)


# ------------------------------------------------------------------------------- the default reward model
class FixedScorer:
    """A scorer with awkward float32 values: -0.0, a subnormal, large and tiny numbers, a NaN."""

    model = tokenizer = None
    scores = torch.tensor([-0.0, 1e-45, 3.4e38, -1.1754944e-38, 0.1, math.nan], dtype=torch.float32)

    def score_texts(self, prompts, replies, batch_size):
        assert batch_size == 7
        return self.scores[: len(replies)].clone()


def test_one_reward_model_of_weight_one_is_its_scores_bit_for_bit(tiny_model_dirs, tokenizer):
    scorer = FixedScorer()
    reward = ModelReward.from_scorer(scorer, "rm", batch_size=7)
    n = len(scorer.scores)
    total, means = CombinedReward([reward], [1.0])(["p"] * n, ["r"] * n, [[1]] * n, [{}] * n)
    assert torch.equal(total.view(torch.int32), scorer.scores.view(torch.int32))  # NaN and -0.0 included
    assert math.isnan(means["reward/rm"])  # a reward model's NaN is not an error: the trainer skips the batch

    model = load_sequence_classifier(str(tiny_model_dirs["reward"]))
    real = RewardModel(model, tokenizer)
    expected = real.score_texts(PROMPTS, REPLIES, 2)
    total, _ = CombinedReward([ModelReward.from_scorer(real, "reward", batch_size=2)])(PROMPTS, REPLIES, IDS, COLUMNS)
    assert torch.equal(total.view(torch.int32), expected.view(torch.int32))


def test_a_reward_model_failure_is_not_reworded():
    """Only the user's functions get the one-line treatment: a reward model's error (e.g. out of memory) stays."""

    class FailingScorer:
        model = tokenizer = None

        def score_texts(self, prompts, replies, batch_size):
            raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="CUDA out of memory") as error:
        call([ModelReward.from_scorer(FailingScorer(), "rm")])
    assert not isinstance(error.value, UsageError)


def test_a_function_that_fails_on_a_chat_completion_is_shown_the_message_list_it_got():
    """After a chat prompt a completion is a list of messages (TRL's format): a function written for text fails on
    it, and the line shows the list, not the text it holds."""
    def strips(completions, **kwargs):
        return [float(len(c.strip())) for c in completions]

    prompts = [[{"role": "user", "content": "Hi"}]]
    with pytest.raises(RewardFunctionError) as caught:
        CombinedReward(resolve_reward_funcs([strips]))(prompts, ["Hello"], IDS[:1], [{}])
    assert str(caught.value) == (
        "reward function strips raised AttributeError: 'list' object has no attribute 'strip' on the completion "
        "[{'role': 'assistant', 'content': 'Hello'}] (after a chat prompt a completion is a list of messages, as in "
        "TRL: its text is completion[-1]['content'])")
