"""`TrainConfig`: every setting of a PPO run, one docstring per field (the help text of its flag and its comment
in the saved `config.yaml`), and the checks that reject bad values before anything is loaded: each field's type
hint says what it accepts (`PositiveInt`, `Literal[...]`), and `validate` checks the relations between fields."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from ppo_rlhf.config import (
    UNIT_INTERVAL,
    Bounds,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    check_value,
    did_you_mean,
    field_types,
    shown,
)
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.device import DtypeName, resolve_device

TrackerName = Literal["tensorboard", "wandb", "trackio", "all", "none"]


CRITIC_ESTIMATORS = ("gae", "ev-gated")
"""The advantage estimators that load, train and checkpoint a value model."""


def unknown_keywords(cls: type, unknown: list[str], given: dict[str, Any]) -> str:
    """Why `PPOConfig(**given)` refuses the keywords `unknown`: TRL's names with ours for each, or a misspelt field."""
    from ppo_rlhf.ppo.from_trl import TRL_DEFAULTS, our_names_for

    not_trl = [key for key in unknown if key not in TRL_DEFAULTS]
    if not_trl:
        fields = [field.name for field in dataclasses.fields(cls)]
        return f"PPOConfig has no field {not_trl[0]!r}{did_you_mean(not_trl[0], fields)}"
    shown = ", ".join(f"{key}=..." for key in unknown)
    return (f"PPOConfig({shown}): these are TRL's names; ppo-rlhf's are "
            f"{our_names_for({key: given[key] for key in unknown})}; or convert TRL's settings with "
            f"PPOConfig.from_trl({{{', '.join(repr(key) + ': ...' for key in unknown)}}}) (docs/from-trl.md)")


@dataclass
class TrainConfig:
    # what each flag takes, as `--help` shows it (`config.add_config_arguments`); not a field
    METAVARS: ClassVar[dict[str, str]] = {
        "policy_model": "MODEL", "reward_model": "MODEL", "value_model": "MODEL", "reward_funcs": "FILE.py:FUNC|MODEL",
        "monitor_judges": "FILE.py:FUNC|MODEL", "prompts": "FILE", "prompt_column": "COLUMN", "out": "RUN_DIR",
        "device": "DEVICE", "environment": "FILE.py:FACTORY", "tools": "FILE.py:FUNC", "ptx_data": "FILE",
        "push_to_hub": "REPO_ID"}

    # --- models and data
    policy_model: str = "smollm2"
    """Policy to train: a Hugging Face id, a local folder, a .gguf file, or "smollm2" (offline default)."""
    reward_model: str | None = None
    """Reward model (frozen): a folder written by `ppo-rlhf reward-model train` or any sequence-classification model
    with one output; the first of the run's rewards (reward_funcs add more; null: reward_funcs alone). When it is the
    run's only reward model and uses the policy's tokenizer, it also initialises the value model (value_model null)."""
    init_score_head: bool = False
    """Accept a reward or value model without a trained score head (e.g. a plain causal LM such as the policy's own
    folder) and give it a randomly initialised one-output head: every reward is then noise (for speed tests only; the
    value model's copy of the head trains, the reward's stays random). Off: such a model is refused."""
    reward_funcs: list[str] = field(default_factory=list)
    """More rewards, summed with the reward model's (weights: reward_weights): "path.py:function" or
    "module:function" (a Python function f(prompts, completions, completion_ids, **columns) -> list[float | None]), or a
    reward-model folder or hub id (it may use another tokenizer than the policy: it scores texts). The API also takes
    callables and loaded models (`PPOTrainer(config, reward_funcs=[...])`); config.yaml records their names."""
    reward_weights: list[float] | None = None
    """Weight of each reward, in order: reward_model (if set), then reward_funcs; a sample's reward is the weighted
    sum of those that are not None for it. null: every weight 1."""
    monitor_judges: list[str] = field(default_factory=list)
    """Second judges for the reward-hacking monitor, the same kinds as reward_funcs ("path.py:function",
    "module:function", a reward-model folder or hub id; the API also takes callables and loaded models): each scores
    every iteration's replies, its batch mean logged as `monitor/<name>` beside `reward/<name>`, and never enters the
    reward (nor the normalisation, the advantages or the random numbers). A reward rising while they stay flat is
    the reward model being gamed."""
    value_model: str | None = None
    """Initialisation of the value model (GAE): a sequence-classification folder or hub id using the policy's tokenizer.
    null: the reward model when the run has exactly one and it uses the policy's tokenizer (the chapter's), else the
    policy's base model with a new zero-initialised score head (a cold critic: see critic_warmup_iterations). A named
    value model's outputs are normalised by their own mean and std on the start replies (reward_norm.json), not the
    reward's: its raw scale is some other reward's."""
    prompts: str | None = None
    """Training prompts: a JSONL/JSON/CSV/Parquet file, a `datasets` save_to_disk folder or a hub dataset id (see
    `ppo-rlhf prompts`); the API also takes `train_dataset=`. Other columns reach the reward functions."""
    prompt_column: str = "prompt"
    """The prompts' column: a string, or a list of chat messages ({"role": ..., "content": ...})."""
    out: str = "runs/ppo"
    """Run directory: config, history, token table, TensorBoard and checkpoints go here."""
    overwrite: bool = False
    """Replace an existing run directory instead of refusing to touch it."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository (off unless you trust it)."""
    seed: Seed = 1
    """Seed of every random number: prompt order, sampling, initialisation of the LoRA adapters."""
    device: str = "auto"
    """"auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: DtypeName = "auto"
    """Storage and matmul dtype of the frozen base weights: "auto" (bfloat16 where the CPU has AVX512-BF16/AMX-BF16 or
    the GPU supports bf16, else float32), "bfloat16", "float16" (GPU) or "float32" (the chapter's run, bit-exact). LoRA,
    score heads, optimiser states, log-probs, KL, GAE and losses are fp32 in every case."""
    # --- the loop
    iterations: PositiveInt = 20
    """PPO iterations; each samples `batch_size` fresh replies."""
    batch_size: PositiveInt = 32
    """Replies per iteration: batch_size // group_size prompts, group_size replies to each."""
    minibatch_size: PositiveInt = 16
    """Replies per optimiser step."""
    micro_batch_size: NonNegativeInt = 0
    """Replies per forward/backward pass inside a minibatch (gradient accumulation, the per-token mean kept exact); 0 =
    the whole minibatch."""
    score_batch_size: NonNegativeInt = 0
    """Replies per forward pass when scoring (log-probs, values, rewards; no gradients, so no activations are kept and
    larger passes cost little memory); 0 = micro_batch_size."""
    epochs: PositiveInt = 2
    """Passes over each batch (the chapter's K)."""
    # --- sampling
    temperature: PositiveFloat = 0.7
    """Sampling temperature; the same temperature divides the logits in every log-probability (detail 4)."""
    top_p: Annotated[float, Bounds(low=0, high=1, low_open=True)] = 1.0
    """Nucleus sampling; 1.0 samples from the full tempered distribution, as PPO's log-probs assume."""
    max_new_tokens: PositiveInt = 128
    """Reply cap in tokens; a reply without EOS by then is unfinished."""
    max_prompt_tokens: PositiveInt = 512
    """Longest chat-templated training prompt in tokens; a longer one is an error naming its line (prompt +
    max_new_tokens must also fit the models' context)."""
    generation_batch_size: NonNegativeInt = 0
    """Prompts per generate call; 0 = the whole batch."""
    generation_drop_finished: bool = True
    """Drop finished rows while decoding (hf backend): after each step the replies that emitted EOS leave the batch
    and its KV cache (ppo_rlhf/models/decode.py) instead of being stepped with pad until the longest reply ends
    (false: Hugging Face `generate`). The same random numbers, so the same tokens wherever the smaller batch's matmuls
    round as the whole batch's did (float32: 415 of 416 SmolLM2 replies, tiny models always). Faster at every batch
    size and reply cap tried."""
    generation_merged_copy: bool = False
    """Sample from a copy of the policy with its LoRA adapter merged into the weights (hf backend; refreshed before
    each rollout; one more copy of the weights in memory): a decoding step skips the adapter's extra matmuls and
    casts. In bf16 the merged weights round once, so the sampled distribution differs from the training forward's
    about as much as the policy's own float32 evaluation does (per-token KL ~1e-3); scoring, log pi_old included,
    stays on the policy. For bf16 weights: faster decoding there (SmolLM2), slower in float32."""
    generation_backend: Literal["hf", "vllm"] = "hf"
    """"hf" (Hugging Face generate on the policy) or "vllm" (a vLLM engine in its own process and environment, `make
    venv-vllm`; weights synced from the policy each iteration, LoRA merged; the trainer recomputes every log-prob)."""
    old_logprobs: Literal["recompute", "generation"] = "recompute"
    """Where log pi_old and the entropy come from: "recompute" (one more forward of the policy after sampling; the first
    ratio is 1 and the first KL 0 to float rounding) or "generation" (recorded from the logits `generate` computes: one
    policy forward fewer per iteration, equal to recompute within ~1e-6 in float32; hf backend only)."""
    tis_cap: NonNegativeFloat = 0.0
    """Truncated importance sampling (Yao et al. 2025): weight each token's policy loss by min(pi_old / pi_rollout,
    tis_cap), pi_rollout the probability generate sampled the token with (bf16 generation and the training forward
    differ); 0 = off. Needs old_logprobs recompute and generation_backend hf."""
    # --- rewards
    reward_norm_samples: PositiveInt = 192
    """Start-policy replies used to measure the mean and std that normalise the reward model's score (detail 1)."""
    eos_rule: bool = True
    """Give a reply that never emitted EOS within the cap the fixed score `unfinished_score` (the EOS trick, detail 3).
    """
    unfinished_score: float = -1.0
    """Normalised score of an unfinished reply under the EOS rule."""
    beta: NonNegativeFloat = 0.05
    """Per-token KL penalty coefficient against the reference (adapter off)."""
    adaptive_kl: bool = False
    """Adapt beta towards `kl_target` with Ziegler et al.'s proportional controller."""
    kl_target: PositiveFloat = 6.0
    """Target KL (nats per reply) of the adaptive controller."""
    kl_horizon: PositiveInt = 10000
    """Horizon (in replies) of the adaptive controller."""
    kl_in: Literal["reward", "loss"] | None = None
    """Where the KL penalty goes: "reward" (-beta * KL_t on every reply token's reward, the chapter's) or "loss" (beta *
    KL_t of the current policy added to the policy loss, GRPO's); null = "loss" for grpo, "reward" otherwise."""
    kl_estimator: Literal["k1", "k2", "k3"] | None = None
    """Per-token KL estimate: k1 = log pi - log pi_ref, k2 = 0.5 (log pi - log pi_ref)^2, k3 = pi_ref/pi - 1 -
    log(pi_ref/pi); null = k3 with kl_in loss, k1 in the reward (unbiased: the principled choice there). In the loss
    (in expectation on the policy's own samples) k1's gradient is zero, so it is refused there; k2's is the gradient of
    KL(pi || pi_ref) and k3's the gradient of KL(pi_ref || pi)."""
    whiten_rewards: bool = False
    """Whiten the per-token rewards before GAE (detail 7; optional, off). GAE's alone (gae, ev-gated's critic part):
    rloo and grpo read each reply's total and refuse it."""
    # --- advantages and losses
    gamma: Annotated[float, UNIT_INTERVAL] = 1.0
    """Discount in GAE."""
    lam: Annotated[float, UNIT_INTERVAL] = 0.95
    """GAE lambda of the advantages (and of the value targets unless critic_lam is set)."""
    critic_lam: Annotated[float, UNIT_INTERVAL] | None = None
    """GAE lambda of the value targets (returns); null = lam. VC-PPO/VAPO use 1.0 (unbiased targets for the critic) with
    a lower lam for the advantages."""
    lam_length_alpha: PositiveFloat | None = None
    """Length-adaptive lambda of the advantages (VAPO): lam = 1 - 1 / (alpha * reply length) per reply, so a long
    reply's first tokens still see its score; null = the fixed lam. VAPO: 0.05."""
    clip_range: Annotated[float, Bounds(low=0, high=1, low_open=True, high_open=True)] = 0.2
    """PPO clip range epsilon: ratios are clipped to [1-eps, 1+eps]."""
    clip_range_low: Annotated[float, Bounds(low=0, high=1, low_open=True, high_open=True)] | None = None
    """Lower clip range: ratios are clipped from below at 1 - clip_range_low; null = clip_range."""
    clip_range_high: PositiveFloat | None = None
    """Upper clip range: ratios are clipped from above at 1 + clip_range_high; null = clip_range. DAPO's clip-higher:
    0.28 with clip_range 0.2."""
    dual_clip: Annotated[float, Bounds(low=1, low_open=True)] | None = None
    """Dual-clip c > 1 (Ye et al. 2020): a token with a negative advantage loses at most c * |A|, however far its ratio
    has grown; null = off. Usually 3."""
    value_clip_range: PositiveFloat = 0.2
    """Value clip range: the value may move at most this far from its old estimate per batch."""
    entropy_coef: NonNegativeFloat = 0.0
    """Entropy bonus c2 (usually 0 in RLHF)."""
    loss_aggregation: Literal["token", "sequence"] = "token"
    """"token": mean over all reply tokens of the minibatch (detail 8); "sequence": mean per reply, then over replies.
    """
    advantage_estimator: Literal["gae", "rloo", "grpo", "ev-gated"] = "gae"
    """"gae": GAE with a value model (PPO); "rloo": REINFORCE leave-one-out baseline over the group_size replies to a
    prompt (Chapter 6, no value model); "grpo": group-normalised rewards (no value model); "ev-gated": EVPO, per batch
    GAE's advantages while the critic's explained variance on the batch is above 0, else rloo's (the value model
    trains every iteration; history's ev_gate says which: 1 GAE, 0 rloo)."""
    group_size: PositiveInt = 1
    """Replies sampled per prompt (consecutive rows of a batch); rloo, grpo and ev-gated need >= 2."""
    grpo_eps: PositiveFloat = 1e-6
    """Added to the group std in GRPO's normalisation."""
    critic_warmup_iterations: NonNegativeInt = 0
    """Iterations at the start that train only the value model on fresh rollouts (the policy does not move), so the
    policy's first advantages come from a critic that has learnt something (GAE only). The policy's learning-rate
    schedule (its warm-up included) runs over the iterations after these; the value model's over all of them."""
    policy_start_ev: Annotated[float, Bounds(high=1)] | None = None
    """After critic_warmup_iterations, keep training only the value model until a batch's explained variance reaches
    this; the policy trains from then on (null: no gate; GAE only). How long the gate holds is not known in advance:
    the policy's learning-rate schedule counts on iterations - critic_warmup_iterations policy iterations, so each
    iteration the gate adds leaves a linear or cosine schedule one iteration short of its end (its last LR above 0)."""
    # --- multi-turn episodes (docs/multi-turn.md)
    environment: str | None = None
    """A multi-turn environment: "file.py:factory" or "module:factory", a callable returning an object with
    `reset(**row) -> observation text` and `step(reply text) -> (observation text, reward or None, done)`, one per
    episode; the API also takes `environment_factory=`. null: no environment (tools alone make a run multi-turn)."""
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call: "file.py:function" or "module:function", plain Python functions returning text or a
    number; the API also takes callables (`tools=[...]`). A call is the chat template's `<tool_call>` JSON where the
    template has a tool format (it then describes the tools in the prompt), else `<tool>name(arguments)</tool>` in a
    reply, which the prompt must teach (docs/multi-turn.md); its result comes back as the next observation."""
    max_turns: PositiveInt = 4
    """Most policy turns per episode (multi-turn runs); each turn's reply is capped at max_new_tokens."""
    max_tool_calls: NonNegativeInt = 4
    """Most tool calls per episode; a turn asking for more ends the episode."""
    max_episode_tokens: PositiveInt = 512
    """Most tokens after the prompt per episode, the policy's and the observations' together: the episode ends when a
    turn or an observation would pass it (the observation is then not appended)."""
    tool_timeout: PositiveFloat = 10.0
    """Seconds a tool call or an environment's reset/step may take; one that hangs longer stops the run with a line
    naming it and the turn."""
    turn_level_gae: bool = False
    """GAE with one step per turn (the value at each turn's first token, gamma and lambda per turn; oat/GEM, AReaL)
    instead of one per policy token (advantage_estimator gae). A single-turn reply is one step: A = its summed reward
    minus the value at its first token."""
    # --- optimisers
    policy_lr: PositiveFloat = 2e-5
    """AdamW learning rate of the policy's LoRA adapter."""
    value_lr: PositiveFloat = 5e-5
    """AdamW learning rate of the value model's LoRA adapter and score head."""
    adam_eps: PositiveFloat = 1e-5
    """Adam epsilon (detail 9)."""
    max_grad_norm: PositiveFloat = 1.0
    """Gradient norm clip, applied to each model separately (detail 9)."""
    lora_rank: PositiveInt = 16
    """LoRA rank of the policy and value adapters (all seven linear layers of every block)."""
    lora_alpha: PositiveFloat = 32.0
    """LoRA alpha (scale = alpha / rank)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule of both optimisers, stepped per optimiser step: constant, linear (to 0) or cosine (to 0)
    over the run."""
    warmup_iterations: NonNegativeInt = 0
    """Iterations of linear learning-rate warm-up at the start of the schedule."""
    # --- PPO-ptx: a language-modelling loss beside PPO's
    ptx_coef: NonNegativeFloat = 0.0
    """Coefficient of the language-modelling loss on ptx_data added to every policy step (InstructGPT's PPO-ptx); 0 =
    off."""
    ptx_data: str | None = None
    """Texts for the ptx loss: a JSONL file of {"text": ...} lines or a text file with one text per line (null: none).
    """
    ptx_batch_size: PositiveInt = 8
    """Texts per optimiser step in the ptx loss (cycling through ptx_data)."""
    ptx_max_tokens: Annotated[int, Bounds(low=2)] = 256
    """Each ptx text is cut to this many tokens."""
    # --- speed and memory
    threads: NonNegativeInt = 0
    """CPU threads of torch's operations (torch.set_num_threads, at the start of the run); 0 = torch's default (one per
    core, or OMP_NUM_THREADS). Lower it when other jobs share the cores: threads that wait for each other on a loaded
    machine cost far more than they gain (1 can be several times faster there)."""
    logprob_chunk: NonNegativeInt = 64
    """Positions per chunk of the LM head when computing log-probs (never the full-vocabulary log-softmax at once); 0 =
    one pass."""
    logprob_chunk_mb: NonNegativeFloat = 128.0
    """At most this many MB of fp32 logits per chunk: fewer positions per chunk for many rows x a wide vocabulary; 0 =
    no limit."""
    padding_free: bool = False
    """Scoring and update passes (log-probs, reference, values, reward scores) run each micro-batch's real tokens packed
    into one row, attention block-diagonal causal, instead of right-padded rows: no work on padding, the same numbers
    to float rounding (llama and qwen2 models)."""
    # --- logs and checkpoints
    checkpoint_every: PositiveInt = 10
    """Save a checkpoint every N iterations (and always at the end)."""
    keep_last_checkpoints: NonNegativeInt = 0
    """Keep only the newest N checkpoints, deleting older ones as each new one is written (0 = keep all). A SmolLM2
    checkpoint takes about 113 MB; `evaluate` scores the checkpoints that are kept."""
    sample_every: PositiveInt = 5
    """Write sample replies every N iterations to samples.jsonl (and show one)."""
    tensorboard: bool = True
    """Write TensorBoard scalars under RUN_DIR/tb (false drops "tensorboard" from report_to; kept for older configs)."""
    report_to: list[TrackerName] = field(default_factory=lambda: ["tensorboard"])
    """Trackers that receive every iteration's numbers: tensorboard (RUN_DIR/tb), wandb (`pip install
    'ppo-rlhf[wandb]'`), trackio (`'ppo-rlhf[trackio]'`); "all" the installed ones; "none" or [] none."""
    log_completions_every: NonNegativeInt = 10
    """Every N iterations, the batch's prompts, completions and each reward go to RUN_DIR/completions.jsonl and the
    trackers; 0 = never."""
    push_to_hub: str | None = None
    """After training, upload the policy (a PEFT adapter folder with a model card) to this hub repository id."""
    resume: bool = False
    """Continue the run in `out` from its latest checkpoint (the CLI: `--resume RUN_DIR`); a run without one starts
    from iteration 0."""
    max_skipped_steps: PositiveInt = 3
    """Stop after this many consecutive skipped (non-finite) optimiser steps; the last good checkpoint stays."""
    quiet: bool = False
    """No progress bar and no dashboard lines on stdout (history.jsonl is still written)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainConfig:
        """A keyword that is no field is a one-line UsageError: TRL's names (`output_dir`, `learning_rate`) get ours
        and `PPOConfig.from_trl`, others the closest field (the dataclass's own `__init__` would raise a TypeError)."""
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = [key for key in kwargs if key not in fields]
        if unknown:
            raise UsageError(unknown_keywords(cls, unknown, kwargs))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        """Built in Python (`PPOConfig(...)`), a config is checked as YAML keys and flags are: the same one-line
        UsageError for the same bad value."""
        for name in field_types(type(self)):  # paths as text (what YAML and flags give)
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                setattr(self, name, [os.fspath(item) if isinstance(item, os.PathLike) else item for item in value])
            elif isinstance(value, os.PathLike):
                setattr(self, name, os.fspath(value))
        require(isinstance(self.policy_model, str), "policy_model: a loaded model goes to the trainer: "
                "PPOTrainer(config, policy_model=model, processing_class=tokenizer)")
        for name in ("reward_funcs", "monitor_judges"):
            specs = getattr(self, name) if isinstance(getattr(self, name), list | tuple) else [getattr(self, name)]
            require(all(isinstance(spec, str) for spec in specs), f"{name}: functions and loaded models go to the "
                    f"trainer: PPOTrainer(config, {name}=[...]) (the config holds names: 'file.py:function', ...)")
        for name, field_type in field_types(type(self)).items():
            setattr(self, name, check_value(name, getattr(self, name), field_type))
        self.validate()

    def validate(self) -> None:
        """What the field types cannot say: relations between fields. (Each field's own type, interval and choices are
        checked by `ppo_rlhf.config.check_value` as it is read; `require_inputs` says what a run needs besides.)"""
        def setting(name: str) -> str:
            return shown(self, name)

        require(self.minibatch_size <= self.batch_size,
                f"{setting('minibatch_size')} must not exceed {setting('batch_size')}")
        require(self.batch_size % self.minibatch_size == 0,
                f"{setting('batch_size')} must be a multiple of {setting('minibatch_size')}")
        require(self.micro_batch_size <= self.minibatch_size,
                f"{setting('micro_batch_size')} must not exceed {setting('minibatch_size')}")
        require(self.advantage_estimator == "gae" or self.group_size >= 2,
                f"advantage_estimator {self.advantage_estimator} needs group_size >= 2 replies per prompt")
        require(self.batch_size % self.group_size == 0,
                f"{setting('batch_size')} must be a multiple of {setting('group_size')} (replies per prompt)")
        require(self.critic_warmup_iterations < self.iterations,
                f"{setting('critic_warmup_iterations')} must be less than {setting('iterations')}: the policy "
                "trains only in the iterations after the critic warm-up")
        require(self.warmup_iterations <= self.iterations,
                f"{setting('warmup_iterations')} must not exceed {setting('iterations')}")
        require(self.warmup_iterations <= self.iterations - self.critic_warmup_iterations,
                f"{setting('warmup_iterations')} must not exceed the policy's iterations, {setting('iterations')} - "
                f"{setting('critic_warmup_iterations')} = {self.iterations - self.critic_warmup_iterations}")
        require(self.ptx_coef == 0 or bool(self.ptx_data), "ptx_coef > 0 needs ptx_data (a file of texts)")
        require(self.tis_cap == 0 or (self.old_logprobs == "recompute" and self.generation_backend == "hf"),
                "tis_cap needs old_logprobs: recompute and generation_backend: hf (the rollout's own log-probs)")
        require(self.has_value_model or (self.critic_warmup_iterations == 0 and self.policy_start_ev is None),
                "critic_warmup_iterations and policy_start_ev need a value model (advantage_estimator gae or ev-gated)")
        require(not self.turn_level_gae or (self.has_value_model and self.lam_length_alpha is None),
                "turn_level_gae is GAE with one lambda (advantage_estimator gae or ev-gated, lam_length_alpha null)")
        require(not self.multi_turn or self.generation_backend == "hf",
                "multi-turn episodes (environment, tools) need generation_backend: hf (the vLLM backend samples whole "
                "replies in its own process: it cannot stop at a tool call and append the observation)")
        require(self.has_value_model or not self.whiten_rewards,
                "whiten_rewards whitens the per-token rewards GAE reads; rloo and grpo use each reply's total "
                "reward and would ignore it (advantage_estimator gae or ev-gated, or whiten_rewards: false)")
        require(self.has_value_model or (self.critic_lam is None and self.lam_length_alpha is None),
                "critic_lam and lam_length_alpha are GAE's lambdas (advantage_estimator gae or ev-gated)")
        require(not (self.kl_placement == "loss" and self.kl_kind == "k1"),
                "kl_in: loss with kl_estimator: k1 would do nothing: k1's gradient is zero in expectation on the "
                "policy's own samples; use k2 or k3 in the loss (k1 belongs in the reward)")
        require(self.old_logprobs == "recompute" or self.generation_backend == "hf",
                "old_logprobs: generation needs generation_backend hf (vLLM's log-probs are never trusted)")
        require(not self.generation_merged_copy or self.generation_backend == "hf",
                "generation_merged_copy is a setting of generation_backend hf (the vLLM backend merges the adapter "
                "into its engine's weights anyway)")
        require(not (self.generation_merged_copy and self.old_logprobs == "generation"),
                "generation_merged_copy with old_logprobs: generation would make log pi_old the merged copy's (its "
                "rounding differs from the policy's, and mismatch_kl, which compares the record with itself, would "
                "not show it); use old_logprobs: recompute")
        require(self.generation_drop_finished or self.generation_backend == "hf",
                "generation_drop_finished: false is a setting of generation_backend hf (vLLM never steps a finished "
                "reply)")
        if self.device not in ("auto", "cpu"):  # the others need torch: an unknown device or missing CUDA fails here
            resolve_device(self.device)

    @classmethod
    def from_trl(cls, trl_config: Any, num_processes: int = 1, **ours: Any) -> TrainConfig:
        """The settings of TRL 1.12's `PPOConfig` (the object or a dict of its fields) as a `PPOConfig`; `ours` sets
        ppo-rlhf fields directly (policy_model, prompts, out, ...). A TRL field with no equivalent here is refused in
        one line saying why (`ppo_rlhf.ppo.from_trl`, docs/from-trl.md)."""
        from ppo_rlhf.ppo.from_trl import settings_from_trl

        return cls(**settings_from_trl(trl_config, num_processes, **ours))

    def require_inputs(self, dataset: bool = False, flags: bool = False) -> None:
        """What a run cannot start without: a reward (reward_model or reward_funcs, or an environment, whose step may
        return rewards), one weight per reward, and prompts (`prompts`, or the trainer's `train_dataset`). (The
        trainer's `reward_funcs` are in reward_funcs by then.) A missing one is named as the user would give it: by its
        flag from the command line (`flags`), else by the config's field and the trainer's argument."""
        require(self.reward_count > 0 or self.environment is not None,
                "--reward-model or --reward-funcs is required (a reward-model folder or id, or file.py:function; or "
                "--environment, whose step returns rewards)"
                if flags else "reward_model or reward_funcs is required (a reward-model folder or id, or a reward "
                "function: PPOTrainer(config, reward_funcs=[...]); or an environment whose step returns rewards)")
        require(self.reward_weights is None or len(self.reward_weights) == self.reward_count,
                f"reward_weights has {len(self.reward_weights or [])} weights for {self.reward_count} rewards "
                "(reward_model, if set, then each of reward_funcs)")
        require(bool(self.prompts) or dataset,
                "--prompts is required (a JSONL file of prompts, see `ppo-rlhf prompts`)" if flags else
                "prompts are required: PPOTrainer(config, train_dataset=...) (a datasets.Dataset or a list of prompts) "
                "or PPOConfig(prompts=...) (a JSONL file, see `ppo-rlhf prompts`)")

    def check_files(self) -> None:
        """Every file and folder the config names exists and is of its kind. Called before the config is printed
        and before torch or a model is loaded; the files' contents are checked as they are read."""
        from ppo_rlhf.data import check_prompt_source
        from ppo_rlhf.ppo.trackers import check_report_to
        from ppo_rlhf.utils.paths import (
            check_function_spec,
            check_model_name,
            check_reward_spec,
            demo_output_hint,
            require_file,
        )

        for name in ("policy_model", "reward_model", "value_model"):
            if getattr(self, name) is not None:
                try:
                    check_model_name(getattr(self, name))
                except UsageError as error:
                    hint = demo_output_hint("--" + name.replace("_", "-"), getattr(self, name))
                    raise UsageError(f"{name}: {error}{hint}") from None
        for name in ("reward_funcs", "monitor_judges"):
            for spec in getattr(self, name):
                try:
                    check_reward_spec(spec)
                except UsageError as error:
                    raise UsageError(f"{name}: {error}") from None
        for spec, what in [(self.environment, "environment")] + [(tool, "tool") for tool in self.tools]:
            if spec is not None:  # (the API's objects are recorded by name: api.py checks them as objects)
                check_function_spec(spec, what)
        check_report_to(self.trackers)  # a tracker's missing package: one line now, not after the models load
        if self.prompts is not None:
            try:
                check_prompt_source(self.prompts, self.prompt_column)
            except UsageError as error:
                raise UsageError(f"{error}{demo_output_hint('--prompts', self.prompts)}") from None
        if self.ptx_data is not None:
            require_file("ptx_data", self.ptx_data)

    @property
    def kl_placement(self) -> str:
        """Where the KL penalty goes: kl_in, or its default (the loss for grpo, the reward otherwise)."""
        return self.kl_in or ("loss" if self.advantage_estimator == "grpo" else "reward")

    @property
    def kl_kind(self) -> str:
        """The per-token KL estimator: kl_estimator, or its default (k3 in the loss, k1 in the reward)."""
        return self.kl_estimator or ("k3" if self.kl_placement == "loss" else "k1")

    @property
    def reward_count(self) -> int:
        """How many rewards the config names: reward_model (if set) and each of reward_funcs."""
        return int(bool(self.reward_model)) + len(self.reward_funcs)

    @property
    def trackers(self) -> list[str]:
        """report_to, less "tensorboard" when the older `tensorboard: false` says so."""
        return [name for name in self.report_to if self.tensorboard or name != "tensorboard"]

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns: an environment or tools are set (the API's objects count, see api.py)."""
        return self.environment is not None or bool(self.tools)

    @property
    def has_value_model(self) -> bool:
        """Only GAE (and ev-gated, which uses GAE while its critic explains the batch) needs a critic; rloo and grpo
        neither load, train nor checkpoint one."""
        return self.advantage_estimator in CRITIC_ESTIMATORS

