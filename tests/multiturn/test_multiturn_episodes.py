"""Multi-turn episodes on the tiny tokenizer with a scripted policy: the layout (policy tokens trainable, the
observations masked), tool calls, environments, the caps, and user code that raises, hangs or returns a wrong type."""

import copy
import time

import pytest
import torch

from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.chat import chat_prompt_ids, template_has_tools
from ppo_rlhf.models.rollout import Replies
from ppo_rlhf.multiturn.calls import first_tool_call, tool_schemas
from ppo_rlhf.multiturn.episodes import EpisodeLimits, run_episodes

LIMITS = EpisodeLimits(max_turns=4, max_tool_calls=2, max_new_tokens=40, max_episode_tokens=400, timeout=2.0)


def scripted(tokenizer, script: list[list[str]]):
    """A policy that says script[row][turn] (with EOS), log-prob -0.5 for every token."""
    eos = tokenizer.eos_token_id
    calls = {"turn": 0}

    def sample(trajectories, cap):
        turn = calls["turn"]
        calls["turn"] += 1
        ids = [tokenizer.encode(script[row][turn], add_special_tokens=False) + [eos]
               for row in range(len(script)) if turn < len(script[row])][: len(trajectories)]
        ids = [row[:cap] for row in ids]
        return Replies(ids, [True] * len(ids), [[-0.5] * len(r) for r in ids], [[1.0] * len(r) for r in ids])

    return sample


def add(a, b):
    return a + b


def test_plain_and_json_calls_parse():
    call = first_tool_call('I think <tool>add(2, b=3)</tool> then more')
    assert (call.name, call.args, call.kwargs) == ("add", (2,), {"b": 3})
    assert first_tool_call("<tool>calc(12*7+3)</tool>").args == ("12*7+3",)
    call = first_tool_call('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert (call.name, call.kwargs) == ("add", {"a": 1, "b": 2})
    assert first_tool_call("no call here") is None


def test_a_tool_turn_then_an_answer_is_one_sequence_with_the_result_masked(tokenizer):
    sample = scripted(tokenizer, [["<tool>add(2, 3)</tool>", "5"]])
    rollout, episodes = run_episodes(sample, tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id], LIMITS,
                                              {"add": add}, None)
    e, rewards = episodes[0], rollout.env_rewards
    assert (e.turns, e.tool_calls, e.tool_errors, e.answer) == (2, 1, 0, "5")
    text = tokenizer.decode(rollout.input_ids[0])
    assert "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n5<|im_end|>" in text  # the template's layout
    start = len(rollout.prompt_ids[0]) - 1
    mask = rollout.action_mask[0, start:].tolist()
    first = len(tokenizer.encode("<tool>add(2, 3)</tool>", add_special_tokens=False))
    observation = len(tokenizer.encode("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n",
                                       add_special_tokens=False)) + 1  # + the closing EOS the tool turn lacked
    assert mask == [1.0] * first + [0.0] * observation + [1.0] * 2  # "5" and its EOS
    assert torch.equal(rollout.logprobs[0] != 0, rollout.action_mask[0].bool())
    assert bool(rollout.finished[0]) and rewards.abs().sum() == 0


class Guess:
    """Guess the number 3; reward 1 when right, -0.1 per wrong guess."""

    def reset(self, prompt, **row):
        return "Guess a number."

    def step(self, text):
        right = text.strip() == "3"
        return ("right" if right else "higher"), (1.0 if right else -0.1), right


def test_an_environment_gives_observations_and_per_turn_rewards(tokenizer):
    sample = scripted(tokenizer, [["1", "3"], ["3"]])
    rollout, episodes = run_episodes(sample, tokenizer, ["Hello", "Hi"], [{}, {}],
                                              [tokenizer.eos_token_id], LIMITS, {}, Guess)
    assert [e.turns for e in episodes] == [2, 1]
    rewards = rollout.env_rewards
    assert rollout.prompts[0][-1]["content"] == "Hello\n\nGuess a number."
    ends = [(rollout.action_mask[0] * (rewards[0] != 0)).nonzero().flatten().tolist()]
    assert rewards[0].sum().item() == pytest.approx(0.9) and rewards[1].sum().item() == pytest.approx(1.0)
    # each reward sits on its turn's last policy token (the EOS)
    assert all(rollout.input_ids[0, i + 1].item() == tokenizer.eos_token_id for i in ends[0])


def test_caps_end_episodes(tokenizer):
    sample = scripted(tokenizer, [["<tool>add(1, 1)</tool>"] * 4])
    limits = EpisodeLimits(max_turns=4, max_tool_calls=1, max_new_tokens=40, max_episode_tokens=400, timeout=2.0)
    _, episodes = run_episodes(sample, tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id], limits,
                                  {"add": add}, None)
    assert (episodes[0].turns, episodes[0].tool_calls) == (2, 1)  # the second call is past the budget
    sample = scripted(tokenizer, [["<tool>nope(1)</tool>", "<tool>add(1)</tool>", "done"]])
    _, episodes = run_episodes(sample, tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id], LIMITS,
                                  {"add": add}, None)
    assert (episodes[0].turns, episodes[0].tool_errors) == (3, 2)  # an unknown tool, a missing argument


def test_user_code_that_raises_hangs_or_returns_the_wrong_type_stops_in_one_line(tokenizer):
    def broken(x):
        raise RuntimeError("disk on fire")

    def slow(x):
        time.sleep(5)
        return "late"

    def wrong(x):
        return {"a": 1}

    for tool, message in ((broken, "tool f (turn 1) raised RuntimeError: disk on fire"),
                          (slow, "tool f (turn 1) did not return within tool_timeout=0.2 s"),
                          (wrong, "tool f (turn 1) returned a dict, not text or a number")):
        limits = EpisodeLimits(4, 2, 40, 400, timeout=0.2)
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            run_episodes(scripted(tokenizer, [["<tool>f(1)</tool>"]]), tokenizer, ["Hello"], [{}],
                         [tokenizer.eos_token_id], limits, {"f": tool}, None)

    with pytest.raises(UsageError, match=r"^tool f \(tools\.py:broken, turn 1\) raised RuntimeError: disk on fire$"):
        run_episodes(scripted(tokenizer, [["<tool>f(1)</tool>"]]), tokenizer, ["Hello"], [{}],
                     [tokenizer.eos_token_id], LIMITS, {"f": broken}, None, {"f": "tools.py:broken"})

    class BadStep(Guess):
        def step(self, text):
            return "only text"

    with pytest.raises(UsageError, match=r"environment step \(turn 1\) returned str"):
        run_episodes(scripted(tokenizer, [["1"]]), tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id], LIMITS, {},
                     BadStep)
    with pytest.raises(UsageError, match=r"environment step \(turn 1\) of my_env\.py:make_env returned str"):
        run_episodes(scripted(tokenizer, [["1"]]), tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id], LIMITS, {},
                     BadStep, {"environment": "my_env.py:make_env"})

    def no_factory():
        raise OSError("no board")

    with pytest.raises(UsageError, match=r"^environment factory my_env\.py:make_env \(turn 0\) raised OSError"):
        run_episodes(scripted(tokenizer, [["1"]]), tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id], LIMITS, {},
                     no_factory, {"environment": "my_env.py:make_env"})


HERMES = ("{%- if tools %}<|im_start|>system\nYou may call: {% for tool in tools %}{{ tool | tojson }}{% endfor %}"
          "<|im_end|>\n{%- endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% endif %}")


def documented_add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def test_a_template_with_a_tool_format_describes_the_tools_and_its_json_calls_run(tokenizer):
    hermes = copy.deepcopy(tokenizer)
    hermes.chat_template = HERMES
    assert template_has_tools(hermes) and not template_has_tools(tokenizer)  # tiny's ChatML, like SmolLM2's
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    limits = EpisodeLimits(max_turns=4, max_tool_calls=2, max_new_tokens=200, max_episode_tokens=400, timeout=2.0)
    rollout, episodes = run_episodes(scripted(hermes, [[call, "5"]]), hermes, ["Hello"], [{}],
                                     [hermes.eos_token_id], limits, {"add": documented_add}, None)
    prompt = hermes.decode(rollout.prompt_ids[0])
    assert prompt.startswith('<|im_start|>system\nYou may call: {"type": "function", "function": {"name": "add", '
                             '"description": "Add two integers."')
    assert '"a": {"type": "integer", "description": "the first"}' in prompt
    assert (episodes[0].tool_calls, episodes[0].tool_errors, episodes[0].answer) == (1, 0, "5")
    assert "<|im_start|>tool\n5<|im_end|>" in hermes.decode(rollout.input_ids[0])
    # without a tool format the prompt is the plain chat template's: the prompt's own words say how to call
    plain, _ = run_episodes(scripted(tokenizer, [["5"]]), tokenizer, ["Hello"], [{}], [tokenizer.eos_token_id],
                            LIMITS, {"add": documented_add}, None)
    assert plain.prompt_ids[0] == chat_prompt_ids(tokenizer, "Hello")


def test_a_tool_without_a_documented_signature_still_gets_a_schema():
    def lookup(word: str, limit=3):
        """Find a word.

        More text that is not the description."""

    assert tool_schemas({"find": lookup}) == [{"type": "function", "function": {
        "name": "find", "description": "Find a word.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}, "limit": {"type": "string"}},
                       "required": ["word"]}}}]


def test_the_context_check_of_a_multi_turn_run_names_max_episode_tokens(tokenizer):
    """A multi-turn trajectory's cap is max_episode_tokens: the prompt-length check names that setting."""
    from types import SimpleNamespace

    from ppo_rlhf import PPOConfig
    from ppo_rlhf.data import PromptRow
    from ppo_rlhf.ppo.build import check_prompt_lengths, trajectory_cap

    assert trajectory_cap(PPOConfig(tools=["tools.py:f"], max_episode_tokens=512)) == (512, "max_episode_tokens")
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    with pytest.raises(UsageError, match=r"^p\.jsonl:1: the prompt \(\d+ tokens\) \+ max_episode_tokens=512 exceed"):
        check_prompt_lengths([PromptRow("Hello", where="p.jsonl:1")], tokenizer, [model], 512,
                             cap_name="max_episode_tokens")


def test_a_tool_call_cut_off_by_the_cap_is_counted_and_said(tokenizer):
    from ppo_rlhf.multiturn.episodes import cut_call_warning

    call = "<tool>add(2, 3)</tool>"
    cap = len(tokenizer.encode(call, add_special_tokens=False)) - 2  # the closing tag never comes
    limits = EpisodeLimits(max_turns=2, max_tool_calls=2, max_new_tokens=cap, max_episode_tokens=400, timeout=2.0)
    _, episodes = run_episodes(scripted(tokenizer, [[call], ["5"]]), tokenizer, ["Hello", "Hi"], [{}, {}],
                               [tokenizer.eos_token_id], limits, {"add": add}, None)
    assert [e.cut_calls for e in episodes] == [1, 0] and episodes[0].tool_calls == 0
    assert cut_call_warning(episodes, cap) == (
        f"in 1 of 2 episodes a tool call was cut off by max_new_tokens={cap} (a turn's cap) before it closed, so the "
        "tool was never called (an episode that ends so is unfinished: with eos_rule on it scores unfinished_score); "
        "raise max_new_tokens")
    assert cut_call_warning(episodes[1:], cap) is None
