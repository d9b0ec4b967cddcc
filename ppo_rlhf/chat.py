"""Chat formatting: the token ids of a prompt (for generation) and of a prompt-reply conversation (for scoring)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def _template_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    # return_dict=True: transformers 5 returns a BatchEncoding by default, 4.x a list; this works on both.
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Token ids of a one-turn user prompt followed by the assistant header."""
    return _template_ids(tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True)


def conversation_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, reply: str) -> list[int]:
    """Token ids of a (prompt, reply) conversation, ending at the assistant's closing EOS."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
    ids = _template_ids(tokenizer, messages, add_generation_prompt=False)
    # ChatML adds "\n" after <|im_end|>; the score must be read at <|im_end|> itself.
    while len(ids) > 1 and tokenizer.decode(ids[-1:]).strip() == "":
        ids.pop()
    return ids
