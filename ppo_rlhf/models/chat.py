"""Chat formatting: the token ids of a prompt (for generation) and of a prompt-reply conversation (for scoring), and
a prompt's text for logs. A prompt is a string (one user turn) or a list of chat messages (`data.Prompt`), both
applied with the tokenizer's chat template; a multi-turn prompt may carry the tools' descriptions, which a template
with a tool format renders (`template_has_tools`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (for the annotations only: prompt_text serves code that runs before transformers loads)
    from transformers import PreTrainedTokenizerBase

    from ppo_rlhf.data import Prompt


def prompt_messages(prompt: Prompt) -> list[dict]:
    """The chat messages of a prompt: a string is one user turn."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def prompt_text(prompt: Prompt) -> str:
    """A readable form of a prompt for logs, samples and reward functions that want text: a string as is; a single
    user message its content; other messages "role: content" joined on one line by " | "."""
    messages = prompt_messages(prompt)
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return " | ".join(f"{m['role']}: {m['content']}" for m in messages)


def question_text(prompt: Prompt) -> tuple[str, int]:
    """(the last user message's content, how many user and assistant messages come before it): what a reply answers,
    for a log line; a few-shot chat opens with demonstrations, and its first message is one of them."""
    messages = prompt_messages(prompt)
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None:
        return prompt_text(prompt), 0
    return messages[last]["content"], sum(m["role"] in ("user", "assistant") for m in messages[:last])


def template_has_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template reads a `tools` variable: it has a tool format of its own (Hermes, Qwen2.5, Llama
    3.1), describing the tools in the prompt and asking for `<tool_call>` JSON. SmolLM2's template has none."""
    template = tokenizer.chat_template
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def _template_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool,
                  tools: list[dict] | None = None) -> list[int]:
    # return_dict=True: transformers 5 returns a BatchEncoding by default, 4.x a list; this works on both.
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True, tools=tools
    )
    return list(encoded["input_ids"])


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, tools: list[dict] | None = None) -> list[int]:
    """Token ids of a prompt's messages followed by the assistant header; `tools`: JSON schemas the template
    describes (only a template with a tool format uses them)."""
    return _template_ids(tokenizer, prompt_messages(prompt), add_generation_prompt=True, tools=tools)


def conversation_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, reply: str) -> list[int]:
    """Token ids of a (prompt, reply) conversation, ending at the assistant's closing EOS."""
    messages = prompt_messages(prompt) + [{"role": "assistant", "content": reply}]
    ids = _template_ids(tokenizer, messages, add_generation_prompt=False)
    # ChatML adds "\n" after <|im_end|>; the score must be read at <|im_end|> itself.
    while len(ids) > 1 and tokenizer.decode(ids[-1:]).strip() == "":
        ids.pop()
    return ids
