"""ppo-rlhf: a readable, from-scratch PPO trainer for RLHF on causal language models.

    from ppo_rlhf import PPOConfig, PPOTrainer

The public names are imported on first use (PEP 562), so `import ppo_rlhf` (the CLI reads `__version__` before it
checks anything) loads neither torch nor transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "PPOConfig": "ppo_rlhf.api",
    "PPOTrainer": "ppo_rlhf.api",
    "TrainerCallback": "ppo_rlhf.api",
    "TrainConfig": "ppo_rlhf.ppo.train_config",
    "UsageError": "ppo_rlhf.errors",
    "RewardFunctionError": "ppo_rlhf.rewards",
}
__all__ = ["PPOConfig", "PPOTrainer", "RewardFunctionError", "TrainConfig", "TrainerCallback", "UsageError",
           "__version__"]

if TYPE_CHECKING:
    from ppo_rlhf.api import PPOConfig, PPOTrainer, TrainerCallback
    from ppo_rlhf.errors import UsageError
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.rewards import RewardFunctionError


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'ppo_rlhf' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
