"""A batch of multi-turn episodes, sampled turn by turn and laid out as one sequence per episode.

Each turn, every unfinished episode's trajectory so far is extended by one policy reply (sampled together, log-probs
recorded). A reply with a tool call ends at the call and gets the tool's result as the next observation; without
one it goes to the environment's `step`, whose observation comes next (no environment: the reply is the answer and
the episode ends). An episode ends when the environment says done, at max_turns, when a turn asks for a tool call
past max_tool_calls, or when the next turn or observation would pass max_episode_tokens.

The trajectory is one right-padded row: prompt, then every turn's tokens and the observations between them
(rendered by the chat template as "tool" or "user" messages). The action mask is 1 on the policy's tokens only, so the
losses, the KL, the entropy and GAE never read the observations (docs/multi-turn.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ppo_rlhf.errors import UsageError, UserCodeFailed, require
from ppo_rlhf.models.chat import chat_prompt_ids, prompt_messages, template_has_tools
from ppo_rlhf.models.padding import right_pad
from ppo_rlhf.models.rollout import Replies, Rollout
from ppo_rlhf.multiturn.calls import ToolCall, call_tool, first_tool_call, guarded, opens_tool_call, tool_schemas


@dataclass
class EpisodeLimits:
    max_turns: int
    max_tool_calls: int
    max_new_tokens: int  # per turn
    max_episode_tokens: int  # after the prompt, policy and observations together
    timeout: float  # seconds for a tool call or an environment's reset/step


@dataclass
class Episode:
    prompt_ids: list[int]
    env: Any = None
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    policy: list[int] = field(default_factory=list)  # 1 on the policy's tokens, 0 on the observations'
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # the environment's reward of each turn, at its last token
    answer: str = ""  # the last turn's text
    answer_ids: list[int] = field(default_factory=list)  # the last turn's tokens (the closing EOS when it has one)
    ended_with_eos: bool = False
    done: bool = False
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    cut_calls: int = 0  # turns that began a tool call and hit their token cap before closing it

    def append(self, tokens: list[int], policy: bool, logprobs: list[float] | None = None,
               entropies: list[float] | None = None) -> None:
        self.tokens += tokens
        self.policy += [int(policy)] * len(tokens)
        self.logprobs += logprobs or [0.0] * len(tokens)
        self.entropies += entropies or [0.0] * len(tokens)
        self.rewards += [0.0] * len(tokens)


class Observations:
    """The token ids the chat template puts between the end of a policy turn and the start of the next: the closing
    EOS when the turn has none (it stopped at a tool call or its cap), the template's glue after it, the observation
    as a `role` message and the assistant header."""

    def __init__(self, tokenizer, eos: list[int]):
        self.tokenizer, self.eos = tokenizer, eos
        self.glue: dict[str, tuple[int, list[int], list[int]]] = {}  # role -> (closing EOS, glue, header)

    def ids(self, text: str, role: str, ended_with_eos: bool) -> list[int]:
        if role not in self.glue:
            self.glue[role] = self._glue(role)
        closing, glue, header = self.glue[role]
        middle = self.tokenizer.encode(text, add_special_tokens=False)
        return ([] if ended_with_eos else [closing]) + glue + middle + header

    def _glue(self, role: str) -> tuple[int, list[int], list[int]]:
        # render a conversation with a marker message and read the template's pieces around it
        marker = "\u2063obs\u2063"
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        before = self._ids(base, False)
        after = self._ids(base + [{"role": role, "content": marker}], True)
        ends = [i for i, token in enumerate(before) if token in self.eos]
        require(bool(ends) and after[: len(before)] == before,
                f"the chat template cannot append a {role!r} message after an assistant turn token by token")
        text = self.tokenizer.decode(after[len(before):])
        head, found, tail = text.partition(marker)
        require(bool(found), f"the chat template does not render a {role!r} message's content as it is")
        encode = lambda piece: self.tokenizer.encode(piece, add_special_tokens=False)  # noqa: E731
        return before[ends[-1]], before[ends[-1] + 1 :] + encode(head), encode(tail)

    def _ids(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                     tokenize=True, return_dict=True)
        return list(encoded["input_ids"])


Sample = Callable[[list[list[int]], int], Replies]  # (trajectories so far, token cap) -> replies, log-probs recorded


def _reset(env: Any, prompt: Any, columns: dict[str, Any], timeout: float, of: str) -> Any:
    what = f"environment reset (turn 0){of}"
    observation = guarded(what, env.reset, timeout=timeout, prompt=prompt, **columns)
    if not (observation is None or isinstance(observation, str)):
        raise UserCodeFailed(f"{what} returned a {type(observation).__name__}, not text or None")
    if not observation:
        return prompt
    messages = prompt_messages(prompt)
    last = messages[-1]
    return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{observation}"}]


def _step(env: Any, text: str, turn: int, timeout: float, of: str) -> tuple[str, float | None, bool]:
    what = f"environment step (turn {turn}){of}"
    out = guarded(what, env.step, text, timeout=timeout)
    ok = (isinstance(out, tuple) and len(out) == 3 and isinstance(out[0], str) and isinstance(out[2], bool)
          and (out[1] is None or (isinstance(out[1], int | float) and not isinstance(out[1], bool))))
    if not ok:
        raise UserCodeFailed(f"{what} returned {type(out).__name__} {str(out)[:60]!r}, not (observation text, reward "
                             "or None, done)")
    return out


def _cut_at(tokenizer, tokens: list[int], end: int) -> int:
    """The fewest leading tokens whose text reaches character `end` (the end of a tool call)."""
    for count in range(1, len(tokens) + 1):
        if len(tokenizer.decode(tokens[:count], skip_special_tokens=True)) >= end:
            return count
    return len(tokens)


def run_episodes(sample: Sample, tokenizer, prompts: list, columns: list[dict[str, Any]], eos: list[int],
                 limits: EpisodeLimits, tools: dict[str, Callable], environment_factory: Callable | None,
                 names: dict[str, str] | None = None) -> tuple[Rollout, list[Episode]]:
    """One episode per prompt, `columns` its row's other dataset columns (for the environment's reset). Returns (the
    rollout: one row per episode, the action mask 1 on the policy's tokens, log-probs and entropies recorded,
    `env_rewards` the environment's reward of each turn at its last token, `columns` carried, `completion_ids` the last
    turn's tokens; the episodes, for their counts). `names` says how the user named their code ("environment" and each
    tool name to its "file.py:function"), for the line that stops the run when it fails."""
    names = names or {}
    of = f" of {names['environment']}" if names.get("environment") else ""
    require(bool(tools) or environment_factory is not None, "a multi-turn rollout needs tools or an environment")
    observations = Observations(tokenizer, eos)
    prompts, episodes = _start_episodes(tokenizer, list(prompts), columns, limits, tools, environment_factory, names,
                                        of)
    for turn in range(1, limits.max_turns + 1):
        active, caps = _with_room(episodes, limits)
        if not active:
            break
        replies = sample([e.prompt_ids + e.tokens for e in active], max(caps))
        for i, (episode, cap) in enumerate(zip(active, caps)):
            call = _record_turn(episode, tokenizer, replies, i, cap, turn, eos, bool(tools))
            observation, role = _answer_turn(episode, call, turn, limits, tools, names, of)
            if episode.done or turn == limits.max_turns:
                episode.done = True
                continue
            assert observation is not None  # (every way on without one set done above)
            ids = observations.ids(observation, role, episode.ended_with_eos)
            if len(episode.tokens) + len(ids) >= limits.max_episode_tokens:  # no room for the observation and a turn
                episode.done = True
            else:
                episode.append(ids, False)
    return _layout(tokenizer, prompts, columns, episodes)


def _start_episodes(tokenizer, prompts: list, columns: list[dict[str, Any]], limits: EpisodeLimits,
                    tools: dict[str, Callable], environment_factory: Callable | None, names: dict[str, str],
                    of: str) -> tuple[list, list[Episode]]:
    """(the prompts, each with its environment's first observation; an episode per prompt): every environment is
    made and reset before the first turn, since its observation is part of the prompt the policy first sees."""
    factory = f"environment factory {names['environment']}" if of else "environment_factory"
    # the template's own tool format where it has one (the prompt describes the tools), else the prompt's words
    described = tool_schemas(tools) if tools and template_has_tools(tokenizer) else None
    episodes = []
    for i, (prompt, row) in enumerate(zip(prompts, columns)):
        env = None
        if environment_factory is not None:
            env = guarded(f"{factory} (turn 0)", environment_factory, timeout=limits.timeout)
            prompts[i] = _reset(env, prompt, row, limits.timeout, of)
        episodes.append(Episode(chat_prompt_ids(tokenizer, prompts[i], described), env))
    return prompts, episodes


def _with_room(episodes: list[Episode], limits: EpisodeLimits) -> tuple[list[Episode], list[int]]:
    """(the episodes that take another turn, each one's token cap for it): an unfinished episode with no token left
    under max_episode_tokens is done here, so that no turn is sampled for it."""
    active = [e for e in episodes if not e.done]
    caps = [min(limits.max_new_tokens, limits.max_episode_tokens - len(e.tokens)) for e in active]
    for episode, cap in zip(active, caps):
        episode.done = cap <= 0
    return [e for e in active if not e.done], [c for c in caps if c > 0]


def _record_turn(episode: Episode, tokenizer, replies: Replies, i: int, cap: int, turn: int, eos: list[int],
                 has_tools: bool) -> ToolCall | None:
    """Append reply `i` to the episode as its policy turn, cut after its first tool call (the tool's result, not the
    policy, says what comes after the call); returns that call, if any."""
    tokens = replies.ids[i][:cap]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    call = first_tool_call(text) if has_tools else None
    if call is not None:  # the turn ends at its first call
        tokens = tokens[: _cut_at(tokenizer, tokens, call.end)]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
    episode.append(tokens, True, replies.logprobs[i][: len(tokens)], replies.entropies[i][: len(tokens)])
    episode.turns, episode.answer, episode.answer_ids = turn, text, tokens
    episode.ended_with_eos = bool(tokens) and tokens[-1] in eos
    if call is None and has_tools and not episode.ended_with_eos and len(tokens) == cap and opens_tool_call(text):
        episode.cut_calls += 1
    return call


def _answer_turn(episode: Episode, call: ToolCall | None, turn: int, limits: EpisodeLimits,
                 tools: dict[str, Callable], names: dict[str, str], of: str) -> tuple[str | None, str]:
    """(the observation after the turn, its chat role): the tool's result for a call, else the environment's step
    (its reward added at the turn's last token); None where the turn ends the episode (done set)."""
    if call is not None:
        if episode.tool_calls >= limits.max_tool_calls:
            episode.done = True
            return None, "tool"
        episode.tool_calls += 1
        observation, error = call_tool(call, tools, turn, limits.timeout, names.get(call.name))
        episode.tool_errors += error
        return observation, "tool"
    if episode.env is not None:
        observation, reward, episode.done = _step(episode.env, episode.answer, turn, limits.timeout, of)
        episode.rewards[-1] += reward or 0.0
        return observation, "user"
    episode.done = True
    return None, "tool"


def cut_call_warning(episodes: list[Episode], max_new_tokens: int) -> str | None:
    """One sentence when a turn of `episodes` hit its token cap in the middle of a tool call, else None."""
    cut = sum(e.cut_calls > 0 for e in episodes)
    if not cut:
        return None
    return (f"in {cut} of {len(episodes)} episodes a tool call was cut off by max_new_tokens={max_new_tokens} (a "
            "turn's cap) before it closed, so the tool was never called (an episode that ends so is unfinished: with "
            "eos_rule on it scores unfinished_score); raise max_new_tokens")


def _layout(tokenizer, prompts: list, columns: list[dict[str, Any]], episodes: list[Episode]
            ) -> tuple[Rollout, list[Episode]]:
    rows = [e.prompt_ids + e.tokens for e in episodes]
    input_ids, attention_mask = right_pad(rows, tokenizer.pad_token_id, min_width=2)
    width = input_ids.shape[1] - 1
    per_token = {name: torch.zeros((len(episodes), width)) for name in ("mask", "logprobs", "entropy", "rewards")}
    for row, e in enumerate(episodes):
        start = len(e.prompt_ids) - 1  # position t predicts token t+1
        for name, values in (("mask", e.policy), ("logprobs", e.logprobs), ("entropy", e.entropies),
                             ("rewards", e.rewards)):
            per_token[name][row, start : start + len(values)] = torch.tensor(values, dtype=torch.float32)
    if any(sum(e.policy) == 0 for e in episodes):
        raise UsageError("an episode has no policy token (max_new_tokens or max_episode_tokens too small)")
    rollout = Rollout(prompts=prompts, prompt_ids=[e.prompt_ids for e in episodes],
                      reply_ids=[e.tokens for e in episodes], reply_texts=[e.answer for e in episodes],
                      finished=torch.tensor([e.ended_with_eos for e in episodes], dtype=torch.bool),
                      input_ids=input_ids, attention_mask=attention_mask, action_mask=per_token["mask"],
                      logprobs=per_token["logprobs"], entropy=per_token["entropy"], env_rewards=per_token["rewards"],
                      columns=list(columns), completion_ids=[e.answer_ids for e in episodes])
    return rollout, episodes
