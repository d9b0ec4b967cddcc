"""Tasks with a true reward: generated arithmetic problems with an exact checker (`arithmetic`, `ppo-rlhf task`), the
held-out accuracy of a run's checkpoints (`evaluate`), and the task's `demo`, `report` and estimator `compare`."""
