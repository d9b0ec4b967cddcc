"""The algorithm: PPO for RLHF as the chapter writes it.

`objectives` (the losses, KL estimators and reward shaping: pure math), `advantages` (GAE, RLOO, GRPO, EV-gated,
whitening), `experience` (one iteration's tensors), `roles` (policy, reference, value and reward models), `build` (the
models a run loads), `scoring` (the rewards, their normalisation and the hacking monitor, whose arithmetic is
`monitor`), `trainer` (the rollout-score-update loop in the chapter's order) and `stats` (its batch's numbers),
`schedules`, `ptx`, `checkpoint`, `run` and `train_config` (the run and its settings: `PPOConfig`),
`checkpoint_files` and `hints` (finding checkpoints, and a hint's words, without torch), `dashboard`, `trackers` and
`kl_spacing` (what a run records, and which checkpoints are evaluated), `check` (the invariants of a correct PPO),
`from_trl`, and the toy bandit of section 8.3/8.4 (`toy`, `toy_command`). docs/DESIGN.md has a line for each.
"""
