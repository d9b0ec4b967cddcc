"""Tasks with a true reward: generated arithmetic problems with an exact checker (`arithmetic`, `ppo-rlhf task`:
`command`), the multi-turn calc-steps (`calc_steps`) and the environment tasks with a horizon knob (`horizon`:
`key_door`, `guess_number`), the held-out accuracy of a run's checkpoints (`evaluate`), the task's `demo` and
`report`, the estimator `compare` and its comparison over horizons (`horizons`, `comparison`, `screen`,
`horizon_stats`, `horizon_archive`). docs/DESIGN.md has a line for each."""
