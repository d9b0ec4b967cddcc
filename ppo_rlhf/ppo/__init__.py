"""The algorithm: PPO for RLHF as the chapter writes it.

`objectives` (the losses and KL estimators: pure math), `advantages` (GAE, RLOO, GRPO, whitening), `experience`
(one iteration's tensors), `roles` (policy, reference, value and reward models), `trainer` (the rollout-score-update
loop in the chapter's order), `schedules`, `ptx`, `checkpoint`, `run` and `train_config` (the run and its settings:
`PPOConfig`), `checkpoint_files` and `hints` (finding checkpoints, and a hint's words, without torch), `dashboard`
and `trackers` (what a run records), `check` (the invariants of a correct PPO), `from_trl`, and the toy bandit of
section 8.3/8.4 (`toy`, `toy_command`).
"""
