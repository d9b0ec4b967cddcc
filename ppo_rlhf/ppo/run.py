"""A PPO run around the loop (`PPOLoop`): the run directory, reward normalisation, the dashboard, the per-token
table, samples, atomic checkpoints and resuming. `api.PPOTrainer.train` runs it; the `train` command builds that
object (ppo_rlhf/train.py). Reading a run back (its config, its checkpoints by name or KL target) is here too.

Importing this module loads no torch (the run directory is checked before the models load): the functions that need
it import it."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from ppo_rlhf.config import read_yaml, to_yaml
from ppo_rlhf.errors import Interrupted, UsageError, UserCodeFailed, require
from ppo_rlhf.ppo import hints
from ppo_rlhf.ppo.dashboard import dashboard_line, dashboard_notes, history_line, token_table_text
from ppo_rlhf.ppo.kl_spacing import parse_targets, pick_by_kl, read_kls
from ppo_rlhf.utils.files import atomic_write_text, keep_iterations_before
from ppo_rlhf.utils.lock import hold
from ppo_rlhf.utils.paths import require_run_dir
from ppo_rlhf.utils.signals import sigterm_as_interrupt

if TYPE_CHECKING:
    from ppo_rlhf.ppo.experience import Experience
    from ppo_rlhf.ppo.trackers import Trackers
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop


def token_table(trainer: PPOLoop, experience: Experience) -> tuple[list[dict[str, Any]], int]:
    """Every number of one reply of the batch (section 8.6): the shortest finished one, or the first."""
    finished = [i for i in range(len(experience.prompts)) if bool(experience.finished[i])]
    row = min(finished, key=lambda i: len(experience.reply_ids[i])) if finished else 0
    positions = experience.action_mask[row].nonzero().flatten().tolist()
    rows = []
    for t, position in enumerate(positions):
        token_id = int(experience.input_ids[row, position + 1])
        rows.append({
            "t": t,
            "token": trainer.tokenizer.decode([token_id]),
            "token_id": token_id,
            "logp_old": float(experience.old_logprobs[row, position]),
            "logp_ref": float(experience.ref_logprobs[row, position]),
            "value": float(experience.old_values[row, position]),
            "reward": float(experience.rewards[row, position]),
            "advantage": float(experience.raw_advantages[row, position]),
            "return": float(experience.returns[row, position]),
            "advantage_whitened": float(experience.advantages[row, position]),
        })
    return rows, row


def write_token_table(run_dir: Path, trainer: PPOLoop, experience: Experience) -> None:
    rows, row = token_table(trainer, experience)
    info = {"prompt": experience.prompts[row], "reply": experience.reply_texts[row],
            "finished": bool(experience.finished[row]),
            "raw_score": float(experience.raw_scores[row]), "score": float(experience.scores[row]),
            "advantage_estimator": trainer.cfg.advantage_estimator,
            "note": "advantage is before whitening (GAE: return = advantage + value); advantage_whitened is what "
                    "the policy loss uses (rloo and grpo do not whiten: the same)",
            "rows": rows}
    atomic_write_text(run_dir / "token_table.json", json.dumps(info, indent=1))
    header = (f"prompt: {info['prompt']!r}\nreply: {info['reply']!r}\n"
              f"raw score {info['raw_score']:+.3f}, normalised {info['score']:+.3f}, finished {info['finished']}\n")
    atomic_write_text(run_dir / "token_table.txt", token_table_text(rows, header, trainer.cfg.advantage_estimator))


def write_samples(run_dir: Path, index: int, experience: Experience, count: int = 4) -> str:
    lines = [json.dumps({"iteration": index, "prompt": experience.prompts[i], "reply": experience.reply_texts[i],
                         "finished": bool(experience.finished[i]), "score": float(experience.scores[i])})
             for i in range(min(count, len(experience.prompts)))]
    with open(run_dir / "samples.jsonl", "a") as handle:
        handle.write("\n".join(lines) + "\n")
    return sample_line(experience.prompts[0], float(experience.scores[0]), experience.reply_texts[0])


def sample_line(prompt: Any, score: float, reply: str) -> str:
    """The console's line for one sample: its score, the question the reply answers (the last user message) and the
    reply, both cut short: the question to its last 60 characters, where what the reply answers or continues is (the
    demo's "Continue this text ...: <text>" showed only its instruction), the reply to its first 120."""
    from ppo_rlhf.models.chat import question_text

    question, earlier = question_text(prompt)
    after = f" (after {earlier} earlier turn{'s' if earlier != 1 else ''})" if earlier else ""
    shown = question if len(question) <= 60 else "..." + question[-57:]
    return f"sample [{score:+.2f}] {shown!r}{after} -> {reply[:120]!r}"


def check_run_dir(cfg: TrainConfig) -> None:
    """Refuse a non-empty run directory without overwrite (before anything is loaded or removed)."""
    run_dir = Path(cfg.out)
    require(not run_dir.exists() or run_dir.is_dir(), f"run directory {run_dir} is a file")
    if run_dir.exists() and any(run_dir.iterdir()):
        require(cfg.overwrite, f"run directory {run_dir} is not empty; {hints.continue_or_replace(run_dir)}")


def prepare_run_dir(cfg: TrainConfig) -> Path:
    run_dir = Path(cfg.out)
    check_run_dir(cfg)
    if run_dir.exists() and any(run_dir.iterdir()):  # (--overwrite: check_run_dir refused it otherwise)
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


FILE_FIELDS = ("prompts", "ptx_data", "out")  # model fields are resolved by resolve_model_path


def absolute_if_local(name: str) -> str:
    """A path that exists made absolute; anything else (a hub id) as it is."""
    return str(Path(name).expanduser().resolve()) if Path(name).expanduser().exists() else name


def saved_spec(spec: str) -> str:
    """A reward function spec as config.yaml keeps it: its file or model folder absolute."""
    from ppo_rlhf.utils.paths import function_spec

    parts = function_spec(spec)
    if parts is None:
        return absolute_if_local(spec)
    return f"{absolute_if_local(parts[0])}:{parts[1]}" if parts[0].endswith(".py") else spec


def saved_config(cfg: TrainConfig) -> TrainConfig:
    """The config as config.yaml keeps it: model names resolved and every path absolute, so that `evaluate RUN` and
    `train --resume RUN` read the same files from any directory (`resume` itself is not kept)."""
    from ppo_rlhf.models.loading import resolve_model_path  # lazy: torch

    files: dict[str, Any] = {name: absolute_if_local(getattr(cfg, name)) for name in FILE_FIELDS if getattr(cfg, name)}
    models: dict[str, Any] = {name: resolve_model_path(getattr(cfg, name))
                              for name in ("policy_model", "reward_model", "value_model")
                              if getattr(cfg, name) is not None}
    return dataclasses.replace(cfg, **files, **models, reward_funcs=[saved_spec(s) for s in cfg.reward_funcs],
                               monitor_judges=[saved_spec(s) for s in cfg.monitor_judges], resume=False)


def record_machine(trainer: PPOLoop, run_dir: Path, log: Callable[[str], None]) -> None:
    """What this machine made of the settings, as one line at the start and in run_info.json (config.yaml keeps the
    settings as given, e.g. `dtype: auto`; a resumed run records the machine it continues on)."""
    import torch  # lazy

    from ppo_rlhf.models.precision import describe_dtype, dtype_name

    cfg = trainer.cfg
    info = {"dtype": cfg.dtype, "resolved_dtype": dtype_name(trainer.dtype),
            "dtype_note": describe_dtype(cfg.dtype, trainer.device), "threads": torch.get_num_threads(),
            "device": str(trainer.device)}
    log(f"dtype {info['dtype_note']}, {info['threads']} thread{'s' if info['threads'] != 1 else ''}, device "
        f"{info['device']}")
    if trainer.dist.is_main:
        atomic_write_text(run_dir / "run_info.json", json.dumps(info, indent=1))


def run_training(trainer: PPOLoop, resume: bool, callbacks: list | tuple = (), owner: Any = None) -> Path:
    """Run (or continue, `resume`) the loaded `trainer`: run directory, normalisation, iterations, checkpoints; the
    callbacks are called with `owner` (the public trainer). Returns the run directory. The run directory is locked
    meanwhile (lock.py: the one place a run takes its lock); Ctrl-C or SIGTERM raises `Interrupted`, which names the
    latest checkpoint and how to continue. A new run that fails before its first iteration finished leaves no run
    directory behind (`discard_start`): nothing was trained, and the same command, once fixed, starts afresh."""
    cfg = trainer.cfg
    with hold(cfg.out), sigterm_as_interrupt():
        main = trainer.dist.is_main  # with several processes only rank 0 writes the run directory and logs
        fresh, existed = not resume and main, Path(cfg.out).exists()
        run_dir = Path(cfg.out) if resume or not main else prepare_run_dir(cfg)
        trainer.dist.barrier()
        log = (lambda message: None) if cfg.quiet or not main else tqdm.write
        history: list[str] = []  # the finished iterations' lines (run_iterations appends to it)
        try:
            record_machine(trainer, run_dir, log)
            start, history = start_or_resume(trainer, run_dir, resume, log)
            notify(callbacks, "on_train_begin", owner)
            run_iterations(trainer, run_dir, start, history, log, callbacks, owner)
        except KeyboardInterrupt:
            raise Interrupted(how_to_continue(run_dir, tuple(trainer.models))) from None
        except Exception as error:
            if fresh and not history:
                discard_start(run_dir, existed)
            if isinstance(error, UserCodeFailed):  # what was kept, after discard_start has had its say
                raise UserCodeFailed(f"{error}; {how_to_continue(run_dir, tuple(trainer.models), fixed=True)}"
                                     ) from error
            raise
        notify(callbacks, "on_train_end", owner)
    return run_dir


def discard_start(run_dir: Path, existed: bool) -> None:
    """Remove what a new run wrote before it failed: its run directory was empty (or replaced by overwrite) when it
    started, so every file in it is the run's own; the folder itself goes too unless it was there before."""
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for path in run_dir.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def how_to_continue(run_dir: Path, models: tuple[str, ...], fixed: bool = False) -> str:
    """What an interrupted run says: its latest checkpoint and the command that continues it (`fixed`: once the
    user's code that stopped it is fixed)."""
    from ppo_rlhf.ppo.checkpoint_files import latest_checkpoint

    then = "once it is fixed, " if fixed else ""
    if not (run_dir / "config.yaml").is_file():
        return f"nothing was written yet: {then}{hints.start_again()}"
    last = latest_checkpoint(run_dir, models)
    where = f"the latest checkpoint is {last.name}" if last else "no checkpoint yet (it starts again from iteration 0)"
    return f"{where}; {then}continue with: {hints.continue_run(run_dir)}"


def notify(callbacks: list | tuple, event: str, *args: Any) -> bool:
    """Call `event` on every callback that has it, in order; True when any of them returned True."""
    answers = [getattr(callback, event)(*args) for callback in callbacks if hasattr(callback, event)]
    return any(answer is True for answer in answers)


def start_or_resume(trainer: PPOLoop, run_dir: Path, resume: bool, log: Callable[[str], None]
                    ) -> tuple[int, list[str]]:
    """(iterations done, history lines so far): from the latest checkpoint when resuming and there is one, else from
    the start (config.yaml and the reward normalisation measured and written). Sets the trainer's normalisation."""
    from ppo_rlhf.ppo.checkpoint import clean_partial_writes, latest_checkpoint, load_checkpoint  # lazy: torch

    cfg, main, models = trainer.cfg, trainer.dist.is_main, tuple(trainer.models)  # no "value" for rloo / grpo
    checkpoint = latest_checkpoint(run_dir, models) if resume else None
    if resume and main:
        clean_partial_writes(run_dir)  # half-written checkpoints and files of a killed run
        if checkpoint is None:  # killed before its first checkpoint: nothing to continue from, and say so
            print(f"no checkpoint yet in {run_dir}: starting from iteration 0", file=sys.stderr)
            shutil.rmtree(run_dir / "tb", ignore_errors=True)  # else TensorBoard shows both starts' step 0
    norm_file = run_dir / "reward_norm.json"
    if checkpoint is not None:
        start, state, history = load_checkpoint(checkpoint, models)
        try:
            trainer.load_state_dict(state)
        except UsageError as error:
            raise UsageError(f"checkpoint {checkpoint}: {error}") from None
        norm = json.loads(norm_file.read_text())
        log(f"resuming {run_dir} from {checkpoint.name} (iteration {start} of {cfg.iterations})")
    else:
        if main:
            atomic_write_text(run_dir / "config.yaml", to_yaml(saved_config(cfg)))
        norm = trainer.measure_reward_norm()  # every process: the statistics are gathered over all of them
        same = f"std 0: all {norm['n']} replies scored the same; scores are shifted, not scaled"
        note = {"note": same} if norm["std"] == 0 else {}
        if main:
            atomic_write_text(norm_file, json.dumps({**norm, **note}, indent=1))
        history, start = [], 0
        spread = note.get("note") or f"std {norm['std']:.3f}"
        critic = {"own": f"; value model's own: mean {norm.get('value_mean', 0):+.3f} "
                         f"std {norm.get('value_std', 1):.3f}",
                  "identity": "; the cold critic's values (a zero head) are read as they are"}
        log(f"reward normalisation over {norm['n']} start-policy replies: mean {norm['mean']:+.3f} {spread} "
            f"(finished {norm['finished']:.2f})" + critic.get(trainer.critic_scale or "", ""))
        warn_unfinished(cfg, norm, main)
    trainer.reward_mean, trainer.reward_std = norm["mean"], norm["std"] or 1.0  # std 0: shifted, not scaled
    # a critic that is not the reward model (PPOLoop.critic_scale) has its own; a run begun before a cold critic had
    # them (no value_mean in its file) goes on reading its values through the reward's, as it was trained
    trainer.value_norm = (norm["value_mean"], norm["value_std"]) if "value_mean" in norm else None
    if main:
        atomic_write_text(run_dir / "history.jsonl", "".join(history))
    if resume and main:
        keep_iterations_before(run_dir / "samples.jsonl", start)  # a killed run wrote them after its checkpoint
    return start, history


def warn_unfinished(cfg: TrainConfig, norm: dict[str, Any], main: bool) -> None:
    """One line on stderr, even when quiet, when the EOS rule replaces most of the start replies' rewards."""
    from ppo_rlhf.ppo.check import unfinished_warning

    warning = unfinished_warning(cfg, norm["finished"], norm["n"])
    if warning and main:
        print(f"warning: {warning}", file=sys.stderr)


def run_iterations(trainer: PPOLoop, run_dir: Path, start: int, history: list[str],
                   log: Callable[[str], None], callbacks: list | tuple = (), owner: Any = None) -> None:
    """Iterations `start` .. cfg.iterations - 1, each logged (rank 0) and checkpointed every checkpoint_every (older
    checkpoints beyond keep_last_checkpoints deleted), and when a callback's on_iteration_end(owner, stats) returns
    True (then the run stops). Ctrl-C writes the last finished iteration's checkpoint first (one process), from a copy
    of the trainer's state taken when that iteration finished: the interrupted iteration may have moved the weights,
    the optimisers, the prompt order and the RNGs, and none of that is kept."""
    from ppo_rlhf.ppo.checkpoint import latest_checkpoint, list_checkpoints, rng_state  # lazy: torch
    from ppo_rlhf.ppo.trackers import make_trackers  # lazy: wandb/trackio when named
    from ppo_rlhf.ppo.trainer import TrainingStopped  # lazy: torch
    from ppo_rlhf.rewards import RewardFunctionError  # lazy: torch

    cfg, main, models = trainer.cfg, trainer.dist.is_main, tuple(trainer.models)
    trackers = make_trackers(cfg.trackers if main else [], run_dir, dataclasses.asdict(saved_config(cfg)), start)
    said: set[str] = set()  # the dashboard's notes given so far (dashboard_notes: each once a run)
    # (disable None: no bar off a terminal, where its redraws would fill a log with one line of fragments)
    progress = tqdm(range(start, cfg.iterations), desc="ppo", initial=start, total=cfg.iterations,
                    disable=cfg.quiet or None)
    # (iterations done, trainer state, RNG states, history) after the last finished iteration no checkpoint holds.
    # One process only: with several, state_dict is a collective that interrupted processes would not all reach.
    unsaved: tuple[int, dict[str, Any], dict[str, Any], list[str]] | None = None
    try:
        for index in progress:
            stats, experience = trainer.iteration(index)
            history.append(history_line(stats))
            done = index + 1
            due = done % cfg.checkpoint_every == 0 or done == cfg.iterations
            if not due and trainer.dist.world_size == 1:  # a copy: the state's tensors are the live ones
                unsaved = (done, copy.deepcopy(trainer.state_dict()), rng_state(), list(history))
            if main:
                record_iteration(run_dir, index, stats, history[-1], experience, trainer, trackers, log, said)
                progress.set_postfix(score=f"{stats['score']:+.2f}", kl=f"{stats['kl']:.2f}", fin=f"{stats['fin']:.2f}")
            stop = notify(callbacks, "on_iteration_end", owner, stats)
            if due or stop:
                state = trainer.state_dict()  # every process (FSDP gathers shards, DeepSpeed partitions)
                if main:
                    write_checkpoint(run_dir, done, trainer, state, history)
                unsaved = None
                trainer.dist.barrier()  # nobody runs ahead of a checkpoint being written
            if stop:
                log(f"stopped by a callback after iteration {index} (checkpoint iter_{done:06d})")
                break
    except KeyboardInterrupt:
        saved = [iteration for iteration, _ in list_checkpoints(run_dir, models)]
        if main and unsaved is not None and unsaved[0] > max(saved, default=0):
            done, state, rng, lines = unsaved
            write_checkpoint(run_dir, done, trainer, state, lines, rng)
        raise
    except (TrainingStopped, RewardFunctionError) as error:  # history.jsonl holds every finished iteration
        last = latest_checkpoint(run_dir, models)  # name the checkpoint to resume from
        where = f"latest checkpoint {last.name}" if last else "no checkpoint was written yet"
        raise type(error)(f"{error}; {where}") from None
    finally:
        trackers.close()


def completion_rows(trainer: PPOLoop, experience: Experience) -> list[dict[str, Any]]:
    """The batch as a completions table: prompt (text), completion, normalised score, each reward's value."""
    from ppo_rlhf.models.chat import prompt_text

    batch_rewards = trainer.scoring.batch_rewards
    by_function = batch_rewards.by_function if batch_rewards is not None else {}
    return [{"prompt": prompt_text(experience.prompts[i]), "completion": experience.reply_texts[i],
             "score": float(experience.scores[i]),
             **{f"reward/{name}": values[i] for name, values in by_function.items()}}
            for i in range(len(experience.prompts))]


def write_checkpoint(run_dir: Path, done: int, trainer: PPOLoop, state: dict[str, Any], history: list[str],
                     rng: dict[str, Any] | None = None) -> None:
    """Write checkpoint `done` (rank 0), then delete the checkpoints keep_last_checkpoints does not keep."""
    from ppo_rlhf.ppo.checkpoint import prune_checkpoints, save_checkpoint  # lazy: torch

    save_checkpoint(run_dir, done, trainer.models, state, history, rng)
    prune_checkpoints(run_dir, trainer.cfg.keep_last_checkpoints, done, tuple(trainer.models))


def record_iteration(run_dir: Path, index: int, stats: dict[str, Any], line: str, experience: Experience,
                     trainer: PPOLoop, trackers: Trackers, log: Callable[[str], None], said: set[str]) -> None:
    """Rank 0's record of one iteration: the token table (first iteration), its history `line`, the trackers, the
    dashboard line (and, the first time a number on it is "-" or the KL negative, why: `said` remembers), every
    sample_every iterations the samples, every log_completions_every the completions."""
    if index == 0:
        write_token_table(run_dir, trainer, experience)
    with open(run_dir / "history.jsonl", "a") as handle:
        handle.write(line)
    trackers.log(stats, index)
    log(dashboard_line(stats))
    for note in dashboard_notes(stats, said):
        log(note)
    if index % trainer.cfg.sample_every == 0:
        log(write_samples(run_dir, index, experience))
    every = trainer.cfg.log_completions_every
    if every and index % every == 0:
        trackers.log_completions(completion_rows(trainer, experience), index)


# ------------------------------------------------------------------------------------------- reading a run back


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The config.yaml of a run, checked for the keys evaluation needs."""
    run_dir = require_run_dir(str(run_dir))
    config = read_yaml(run_dir / "config.yaml")
    missing = [key for key in ("policy_model", "temperature", "max_new_tokens") if key not in config]
    require(not missing, f"{run_dir / 'config.yaml'} lacks {', '.join(missing)}")
    return config


def select_checkpoints(run_dir: Path, which: str, full_models: bool = False) -> list[tuple[int, Path]]:
    """(iteration, folder) of the checkpoints named by `which`: "all", "latest", iterations like "10,20", or KL targets
    like "kl:1,2,4" (per target the first checkpoint whose training KL reached it, and the last: kl_spacing.py). Each
    policy must be a PEFT adapter, or with `full_models` also a plain transformers model folder (the caller loads
    both)."""
    from ppo_rlhf.ppo.checkpoint_files import latest_checkpoint, list_checkpoints

    found = list_checkpoints(run_dir)
    require(bool(found), f"{run_dir} has no complete checkpoints (checkpoints/iter_*/state.pt)")
    if which.startswith("kl:"):
        picked = checkpoint_targets(run_dir, which, [iteration for iteration, _ in found])
        chosen = [(iteration, folder) for iteration, folder in found if iteration in picked]
    elif which == "all":
        chosen = found
    elif which == "latest":
        latest = latest_checkpoint(run_dir)
        if latest is None:
            raise UsageError(f"{run_dir}/checkpoints/latest is missing or names no complete checkpoint")
        chosen = [(iteration, folder) for iteration, folder in found if folder.name == latest.name]
    else:
        try:
            wanted = [int(part) for part in which.split(",") if part.strip()]
        except ValueError:
            raise UsageError(f"--checkpoints must be all, latest or iterations like 10,20; got {which!r}") from None
        require(bool(wanted), f"--checkpoints must be all, latest or iterations like 10,20; got {which!r}")
        by_iteration = dict(found)
        absent = [str(i) for i in wanted if i not in by_iteration]
        available = ", ".join(str(i) for i, _ in found)
        require(not absent, f"{run_dir} has no checkpoint for iteration {', '.join(absent)} (has {available})")
        chosen = [(i, by_iteration[i]) for i in sorted(set(wanted))]
    for _, folder in chosen:
        policy = folder / "policy"
        require((policy / "adapter_config.json").is_file() or (full_models and (policy / "config.json").is_file()),
                f"{policy} is not a PEFT adapter folder{' or a transformers model folder' if full_models else ''}")
    return chosen


def checkpoint_targets(run_dir: Path, which: str, iterations: list[int]) -> dict[int, list[float | str]]:
    """{iteration: the KL targets it stands for} of a "kl:1,2,4" choice among the checkpoints `iterations`."""
    require((Path(run_dir) / "history.jsonl").is_file(), f"{run_dir} has no history.jsonl to read the KL from")
    return pick_by_kl(read_kls(run_dir), iterations, parse_targets(which.removeprefix("kl:")))
