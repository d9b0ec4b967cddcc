"""Reward functions in TRL GRPOTrainer's convention, and their weighted sum: the raw score PPO maximises.

A reward function is called with keywords, once per batch:

    f(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns) -> list[float | None]

* `prompts`: the prompts as in the dataset, a string or a list of chat messages each.
* `completions`: the sampled replies, decoded without special tokens. As in TRL, a reply to a chat-message prompt is
  given as a conversation, `[{"role": "assistant", "content": text}]`; a reply to a string prompt as the text.
* `completion_ids`: each reply's token ids (the policy's tokenizer), unpadded, with the closing EOS when it has one.
  In a multi-turn run, as `completions`, the last turn's.
* `trajectory_ids` (multi-turn runs only): each episode's token ids after the prompt, every policy turn and the
  observations between them (tool results, an environment's messages, the chat template's glue).
* `columns`: every other column of the prompts' dataset rows, one list each (e.g. `answer=[...]`), so a function
  should take `**kwargs` for the ones it does not use.

It returns one number per completion, or None where it does not apply to that sample. A number is anything
`numbers.Real` (int, float, numpy scalars, and bool as 1.0 / 0.0, which TRL accepts too: `[c == a for ...]` is the
usual exact-match reward) or a 0-d tensor or array holding one; the whole list may also be a 1-D tensor or array.

What `resolve_reward_funcs` accepts for each function, and what it names it (the dashboard's `reward/<name>`):

* a callable: its `__name__` (a callable object's class name);
* "path/to/file.py:function" (the file is imported on its own) or "package.module:function": the function's name;
* a reward-model folder (e.g. one written by `ppo-rlhf reward-model train`) or hub id, a one-output sequence
  classifier loaded with its own tokenizer: the folder's name (a hub id's last part);
* a loaded sequence-classification model: as a `(model, tokenizer)` tuple, or alone when its tokenizer loads from
  `model.name_or_path`; named after that folder (else its class). It is put in eval mode and used where it is
  (its device and dtype are the caller's).

Names used twice get "_2", "_3", ... A reward model (`ModelReward`) scores each (prompt, completion) pair with its
own tokenizer and chat template, so it may use another tokenizer than the policy.

`CombinedReward` calls every function and adds their weighted values over the non-None ones. A function that
raises, returns a list of the wrong length, a non-number, NaN or inf, or a sample that no function scores, stops
the run with one line (`RewardFunctionError`) naming the function and the first offending completion. A reward
model's NaN or inf is not an error: it reaches the trainer, which skips that batch (as it always has).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ppo_rlhf.data import Prompt
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.models.loading import backbone_and_head, check_chat_tokenizer, load_reward_model, load_tokenizer
from ppo_rlhf.models.scores import RewardModel
from ppo_rlhf.utils.paths import check_reward_spec, function_spec

ARGUMENTS = ("prompts", "completions", "completion_ids", "trajectory_ids")  # the names no dataset column may take
SPEC_KINDS = ("a callable, a 'file.py:function' or 'module:function' string, a reward-model folder or hub id, "
              "or a sequence-classification model (alone or as a (model, tokenizer) tuple)")


class RewardFunctionError(UsageError):
    """A reward function failed or returned something unusable; the message names it and the completion."""


class RewardFunction(Protocol):
    name: str

    def __call__(self, prompts: list[Prompt], completions: list, completion_ids: list[list[int]],
                 **columns: list) -> Sequence[float | None]: ...


class FunctionReward:
    """A user's callable under its dashboard name, called with keywords as TRL calls it."""

    def __init__(self, func: Callable, name: str):
        self.func, self.name = func, name

    def __call__(self, prompts: list[Prompt], completions: list, completion_ids: list[list[int]],
                 **columns: list) -> Sequence[float | None]:
        return self.func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)


class ModelReward:
    """A frozen one-output sequence classifier as a reward function: each (prompt, completion) pair is chat-formatted
    with the model's OWN tokenizer and scored at the reply's closing EOS (`scores.score_texts`)."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, name: str, batch_size: int = 16):
        self.scorer, self.name, self.batch_size = RewardModel(model, tokenizer), name, batch_size

    @classmethod
    def from_scorer(cls, scorer: RewardModel, name: str, batch_size: int = 16) -> ModelReward:
        """Wrap a scorer the trainer already holds (e.g. `roles.Critic`, whose adapter off is the reward model): any
        object with `.model`, `.tokenizer` and `.score_texts(prompts, replies, batch_size)`. Loads nothing."""
        reward = cls(scorer.model, scorer.tokenizer, name, batch_size)
        reward.scorer = scorer  # its own score_texts: the Critic's turns its adapter off
        return reward

    @property
    def model(self) -> nn.Module:
        return self.scorer.model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.scorer.tokenizer

    def shares_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> bool:
        """Same vocabulary as `tokenizer`: then its model can read the policy's token ids (be the value model)."""
        return self.tokenizer.get_vocab() == tokenizer.get_vocab()

    def scores(self, prompts: list[Prompt], completions: list) -> torch.Tensor:
        """[B] float32 raw scores on the CPU, exactly the scorer's."""
        replies = [completion_text(completion) for completion in completions]
        return self.scorer.score_texts(prompts, replies, self.batch_size)

    def __call__(self, prompts: list[Prompt], completions: list, completion_ids: list[list[int]] | None = None,
                 **columns: list) -> list[float]:
        return self.scores(prompts, completions).tolist()


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The reply's text, from either completion format."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def as_completion(prompt: Prompt, reply: str) -> str | list[dict[str, str]]:
    """TRL's completion format: a conversation after a chat-message prompt, else the text."""
    return reply if isinstance(prompt, str) else [{"role": "assistant", "content": reply}]


# ------------------------------------------------------------------------------------------------ resolving specs
def import_function(spec: str, source: str, function: str, what: str = "reward function") -> Any:
    """The object `function` of a .py file (imported as a module of its own) or of an importable module; `what` names
    it in an error ("reward function", "tool", "environment")."""
    try:
        if source.endswith(".py"):
            path = Path(source).expanduser().resolve()
            name = f"ppo_rlhf_reward_{path.stem}_{abs(hash(path))}"
            module = sys.modules.get(name)  # two functions of one file: import it once
            if module is None:
                loader = importlib.util.spec_from_file_location(name, path)
                assert loader is not None and loader.loader is not None  # (a .py file's spec has a loader)
                module = importlib.util.module_from_spec(loader)
                sys.modules[name] = module  # as `import` does: dataclasses and pickling look modules up here
                try:
                    loader.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            module = importlib.import_module(source)
    except Exception as error:  # whatever the user's module raises while it loads: one line
        raise UsageError(f"cannot import {source} ({what} {spec}): {_describe(error)}") from error
    require(hasattr(module, function), f"{what} {spec}: {source} has no {function!r}")
    return getattr(module, function)


def reward_name(spec: Callable | nn.Module | str) -> str:
    """A reward's name in the history (`reward/<name>`): a function's name (a partial's: the wrapped function's); a
    loaded model's folder name (else its class); a reward model's folder name, or a hub id's last part. (How
    config.yaml records a reward is `api.spec_name`'s: torch-free, before anything loads.)"""
    if isinstance(spec, nn.Module):  # (before callables: a model is callable too)
        return Path(getattr(spec, "name_or_path", "") or "").name or type(spec).__name__
    if isinstance(spec, str):
        path = Path(spec).expanduser()
        return path.resolve().name if path.is_dir() else spec.rstrip("/").split("/")[-1]
    inner = getattr(spec, "func", spec)  # functools.partial: the wrapped function's name
    return getattr(inner, "__name__", None) or type(spec).__name__


def _loaded_model(model: nn.Module, tokenizer: PreTrainedTokenizerBase | None, trust_remote_code: bool,
                  batch_size: int) -> ModelReward:
    source = getattr(model, "name_or_path", "") or ""
    name = reward_name(model)
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    require(type(model).__name__.endswith("ForSequenceClassification"),
            f"reward model {name} is a {type(model).__name__}, not a sequence-classification model")
    require(num_labels == 1, f"reward model {name} has {num_labels} output labels, need 1")
    backbone_and_head(model)  # fails in one line unless it has a transformer body and a "score" head
    if tokenizer is None:
        require(bool(source), f"give the reward model {name} with its tokenizer, as a (model, tokenizer) tuple")
        tokenizer = load_tokenizer(source, trust_remote_code=trust_remote_code)
    check_chat_tokenizer(tokenizer, name)
    return ModelReward(model.eval(), tokenizer, name, batch_size)


def _folder_or_hub_model(spec: str, dtype: torch.dtype, device: torch.device | str, trust_remote_code: bool,
                         batch_size: int, init_score_head: bool) -> ModelReward:
    name = reward_name(spec)
    tokenizer = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    model = load_reward_model(spec, dtype, trust_remote_code, init_score_head).to(device)
    return ModelReward(model, tokenizer, name, batch_size)


def _is_model_tuple(spec: Any) -> bool:
    return isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], nn.Module)


def _resolve_one(spec: Any, dtype: torch.dtype, device: torch.device | str, trust_remote_code: bool,
                 batch_size: int, init_score_head: bool = False) -> RewardFunction:
    if isinstance(spec, ModelReward | FunctionReward):
        return spec
    if _is_model_tuple(spec):  # (model, tokenizer)
        return _loaded_model(spec[0], spec[1], trust_remote_code, batch_size)
    if isinstance(spec, nn.Module):  # before callables: a model is callable too
        return _loaded_model(spec, None, trust_remote_code, batch_size)
    if callable(spec):
        return FunctionReward(spec, reward_name(spec))
    require(isinstance(spec, str | Path), f"reward function {spec!r:.60} is not {SPEC_KINDS}")
    spec = str(spec)
    check_reward_spec(spec)
    parts = function_spec(spec)
    if parts is None:
        return _folder_or_hub_model(spec, dtype, device, trust_remote_code, batch_size, init_score_head)
    func = import_function(spec, *parts)
    require(callable(func), f"reward function {spec} is a {type(func).__name__}, not a callable")
    return FunctionReward(func, parts[1])


def resolve_reward_funcs(specs: Any, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                         trust_remote_code: bool = False, batch_size: int = 16,
                         init_score_head: bool = False) -> list[RewardFunction]:
    """The reward functions of `specs` (one spec or a list; the kinds are in the module docstring), each with a
    unique `name`. Reward models named by folder or hub id load here, in `dtype` on `device`, and score
    `batch_size` pairs per forward pass (`init_score_head`: accept a model without a trained score head, see
    `models.load_sequence_classifier`). Raises UsageError (one line) for a spec that is none of these."""
    specs = list(specs) if isinstance(specs, list | tuple) and not _is_model_tuple(specs) else [specs]
    require(len(specs) > 0, "no reward functions given")
    funcs = [_resolve_one(spec, dtype, device, trust_remote_code, batch_size, init_score_head) for spec in specs]
    seen: dict[str, int] = {}
    for func in funcs:
        seen[func.name] = seen.get(func.name, 0) + 1
        if seen[func.name] > 1:
            func.name = f"{func.name}_{seen[func.name]}"
    require(len({func.name for func in funcs}) == len(funcs), "reward function names clash after numbering: rename "
            f"one of {[func.name for func in funcs]}")
    return funcs


def is_reward_model_spec(spec: Any) -> bool:
    """Whether `spec` names or is a reward model (not a function), decided without loading or importing anything."""
    if isinstance(spec, str | Path):
        return function_spec(str(spec)) is None
    return isinstance(spec, ModelReward | nn.Module) or _is_model_tuple(spec)


# ---------------------------------------------------------------------------------------------- combining them
def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _quote(text: str, limit: int = 60) -> str:
    """A completion in an error line: shortened, and repr() keeps it on one line."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _as_given(completion: Any, text: str) -> str:
    """A completion in an error line as the function got it: the text, or, after a chat prompt, the list of messages
    it is (TRL's format), said so, since a function written for text fails on a list."""
    if not isinstance(completion, list):
        return _quote(text)
    role = completion[-1].get("role", "assistant") if completion and isinstance(completion[-1], dict) else "assistant"
    return (f"[{{'role': {role!r}, 'content': {_quote(text)}}}] (after a chat prompt a completion is a list of "
            "messages, as in TRL: its text is completion[-1]['content'])")


def _number(value: Any) -> float | None:
    """`value` as a float, None for None; raises TypeError (saying what it is) for a non-number."""
    if value is None:
        return None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a 0-d tensor or array, a numpy scalar
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{value!r:.40} (a {type(value).__name__})")
    return float(value)


@dataclass
class BatchRewards:
    """One batch's rewards: the weighted sum, and each function's values by name (None where not applicable)."""

    total: torch.Tensor  # [B] float32 on the CPU
    by_function: dict[str, list[float | None]]

    def means(self) -> dict[str, float]:
        """Each function's mean over the samples it scored, keyed "reward/<name>" (nan if it scored none)."""
        return scored_means("reward", self.by_function)


def scored_means(prefix: str, values: dict[str, list[float | None]]) -> dict[str, float]:
    """{"<prefix>/<name>": the mean of the values that are not None (nan: none)}: the rule of every reward's and
    monitor judge's mean in the history."""
    return {f"{prefix}/{name}": float(np.mean([v for v in scored if v is not None] or [np.nan]))
            for name, scored in values.items()}


class CombinedReward:
    """The weighted sum of reward functions over the ones that score each sample (weights default to 1 each).

    With one reward model of weight 1 the total is exactly that model's scores, bit for bit: each value is
    float32 -> float64 (exact), times 1.0 (exact), the first term is not added to a 0.0 start (which would turn
    -0.0 into 0.0), and float64 -> float32 gives back the same float32.

    A reward function that raises is called again on one sample at a time, to name the completion it fails on."""

    def __init__(self, funcs: list[RewardFunction], weights: Sequence[float] | None = None):
        require(len(funcs) > 0, "no reward functions given")
        weights = [1.0] * len(funcs) if weights is None else list(weights)
        require(len(weights) == len(funcs),
                f"{len(weights)} reward weights for {len(funcs)} reward functions ({', '.join(f.name for f in funcs)})")
        names = [func.name for func in funcs]
        require(len(set(names)) == len(names), f"reward functions need different names, got {names}")
        for weight in weights:
            require(isinstance(weight, numbers.Real) and not isinstance(weight, bool) and math.isfinite(weight),
                    f"reward weight {weight!r} is not a finite number")
        self.funcs, self.weights = funcs, [float(weight) for weight in weights]

    def __call__(self, prompts: list[Prompt], completions: list[str], completion_ids: list[list[int]],
                 columns: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, float]]:
        """(combined raw scores [B] float32 on the CPU, {"reward/<name>": mean}) of the replies `completions`
        (texts) to `prompts`; `columns` holds each prompt's other dataset columns."""
        scores = self.scores(prompts, completions, completion_ids, columns)
        return scores.total, scores.means()

    def scores(self, prompts: list[Prompt], completions: list[str], completion_ids: list[list[int]],
               columns: list[dict[str, Any]], trajectory_ids: list[list[int]] | None = None) -> BatchRewards:
        """As `__call__`, with each function's values per sample (for a completions table); `trajectory_ids` (a
        multi-turn run's) are passed as that keyword."""
        by_function = self.function_values(prompts, completions, completion_ids, columns, trajectory_ids)
        totals = []
        for row in range(len(prompts)):
            total = None
            for func, weight in zip(self.funcs, self.weights):
                value = by_function[func.name][row]
                if value is not None:
                    total = weight * value if total is None else total + weight * value
            if total is None:
                names = ", ".join(func.name for func in self.funcs)
                raise RewardFunctionError(f"no reward function ({names}) scored the completion "
                                          f"{_quote(completions[row])}: each returned None")
            totals.append(total)
        return BatchRewards(torch.tensor(totals, dtype=torch.float32), by_function)

    def function_values(self, prompts: list[Prompt], completions: list[str], completion_ids: list[list[int]],
                        columns: list[dict[str, Any]], trajectory_ids: list[list[int]] | None = None
                        ) -> dict[str, list[float | None]]:
        """Each function's checked values per sample by name, unweighted (also how the trainer scores its monitor
        judges, which never enter a total)."""
        size = len(prompts)
        require(size > 0 and len(completions) == size and len(completion_ids) == size and len(columns) == size
                and (trajectory_ids is None or len(trajectory_ids) == size),
                f"reward functions need as many completions, completion ids and column rows as prompts ({size})")
        keys = list(dict.fromkeys(key for row in columns for key in row))  # every column, in first-seen order
        for key in keys:
            require(key not in ARGUMENTS, f"the dataset column {key!r} has the name of a reward-function argument; "
                    "rename it")
        kwargs: dict[str, list] = {key: [row.get(key) for row in columns] for key in keys}
        if trajectory_ids is not None:
            kwargs["trajectory_ids"] = trajectory_ids
        formatted = [as_completion(prompt, reply) for prompt, reply in zip(prompts, completions)]
        return {func.name: self._values(func, prompts, formatted, completion_ids, kwargs, completions)
                for func in self.funcs}

    def _values(self, func: RewardFunction, prompts: list[Prompt], formatted: list,
                completion_ids: list[list[int]], kwargs: dict[str, list], texts: list[str]) -> list[float | None]:
        """The function's checked values for the batch."""
        try:
            returned = func(prompts, formatted, completion_ids, **kwargs)
        except Exception as error:
            if isinstance(func, ModelReward):  # not the user's code: a real failure (e.g. out of memory), as it is
                raise
            # the user's code: one line, naming the completion it fails on
            row = self._first_failing_row(func, prompts, formatted, completion_ids, kwargs)
            where = f"the completion {_as_given(formatted[row], texts[row])}" if row is not None else \
                f"a batch of {len(texts)} completions, the first {_as_given(formatted[0], texts[0])}"
            raise RewardFunctionError(f"reward function {func.name} raised {_describe(error)} on {where}") from error
        if hasattr(returned, "tolist") and getattr(returned, "ndim", None) == 1:  # a tensor or an array
            returned = returned.tolist()
        if not isinstance(returned, list | tuple):
            what = "None" if returned is None else f"a {type(returned).__name__}"
            raise RewardFunctionError(f"reward function {func.name} returned {what}, not a list of {len(texts)} "
                                      f"numbers (first completion {_as_given(formatted[0], texts[0])})")
        if len(returned) != len(texts):
            first = min(len(returned), len(texts) - 1)  # the first left without a value, or the last
            raise RewardFunctionError(f"reward function {func.name} returned {len(returned)} values for "
                                      f"{len(texts)} completions (at the completion "
                                      f"{_as_given(formatted[first], texts[first])})")
        values = []
        for value, text, given in zip(returned, texts, formatted):
            try:
                number = _number(value)
            except TypeError as error:
                raise RewardFunctionError(f"reward function {func.name} returned {error}, not a number or None, for "
                                          f"the completion {_as_given(given, text)}") from None
            # A reward model's NaN or inf is left to the trainer, which skips that batch (its behaviour before
            # reward functions existed); a function's is a bug in it.
            if number is not None and not math.isfinite(number) and not isinstance(func, ModelReward):
                raise RewardFunctionError(f"reward function {func.name} returned {number} for the completion "
                                          f"{_as_given(given, text)}")
            values.append(number)
        return values

    @staticmethod
    def _first_failing_row(func: RewardFunction, prompts: list[Prompt], formatted: list,
                           completion_ids: list[list[int]], kwargs: dict[str, list]) -> int | None:
        """The first sample the function raises on when called on it alone (None if every one passes alone)."""
        for row in range(len(prompts)):
            try:
                func(prompts[row : row + 1], formatted[row : row + 1], completion_ids[row : row + 1],
                     **{key: values[row : row + 1] for key, values in kwargs.items()})
            except Exception:
                return row
        return None
