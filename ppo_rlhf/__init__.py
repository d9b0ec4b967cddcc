"""ppo-rlhf: a readable, from-scratch PPO trainer for RLHF on causal language models."""

__version__ = "0.1.0"
