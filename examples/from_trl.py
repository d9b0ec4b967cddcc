"""Coming from TRL: a TRL 1.12 PPO script's PPOConfig settings, converted to ppo-rlhf's (docs/from-trl.md).

TRL needs a reward model that shares the policy's tokenizer; ppo-rlhf takes reward models with their own tokenizer
or reward functions. Here the reward is the verifiable task's exact checker, on its training problems."""
from ppo_rlhf import PPOConfig, PPOTrainer
from ppo_rlhf.tasks.arithmetic import exact_match, problems

# what the TRL script gave `trl.experimental.ppo.PPOConfig(...)` (a PPOConfig object converts the same way)
TRL_SETTINGS = dict(
    output_dir="runs/from_trl", learning_rate=3e-6, per_device_train_batch_size=8, gradient_accumulation_steps=2,
    num_mini_batches=2, num_ppo_epochs=2, total_episodes=320, local_rollout_forward_batch_size=16,
    response_length=64, temperature=0.7, stop_token="eos", missing_eos_penalty=1.0, kl_coef=0.05,
    kl_estimator="k1", cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, gamma=1.0, lam=0.95, seed=42,
)


def main(**ours):  # ppo-rlhf's own fields (the models, the run directory) and overrides, e.g. main(iterations=2)
    # TRL's script also passed models and a tokenized dataset to its trainer; here they are named in the config
    config = PPOConfig.from_trl(TRL_SETTINGS, **{"policy_model": "smollm2", "critic_warmup_iterations": 3, **ours})
    print(f"batch {config.batch_size}, minibatch {config.minibatch_size}, {config.iterations} iterations, "
          f"{config.epochs} epochs, beta {config.beta} ({config.kl_kind} in the reward), lr {config.policy_lr}")
    trainer = PPOTrainer(config, reward_funcs=exact_match, train_dataset=problems("add-tiny", "train"))
    return trainer.train()  # the run directory: config.yaml (every converted setting), history.jsonl, checkpoints


if __name__ == "__main__":
    main()
