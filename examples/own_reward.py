"""PPO on your own task: reward functions reading a dataset column, and a critic without a reward model."""
from ppo_rlhf import PPOConfig, PPOTrainer

dataset = [{"prompt": f"What is {a} plus {b}? Answer with the number only.", "answer": str(a + b)}
           for a in range(1, 9) for b in range(1, 9)]


def correct(prompts, completions, completion_ids, answer, **columns):
    return [float(a in c) for c, a in zip(completions, answer)]  # one float (or None) per completion


def brief(completions, **columns):
    return [-len(c) / 200 for c in completions]


def main(**settings):  # settings override the defaults below, e.g. main(iterations=2)
    config = PPOConfig(**{"policy_model": "smollm2", "out": "runs/own_reward", "iterations": 20, "max_new_tokens": 32,
                          "reward_weights": [1.0, 0.5], "critic_warmup_iterations": 3, **settings})
    trainer = PPOTrainer(config, reward_funcs=[correct, brief], train_dataset=dataset)
    trainer.train()  # RUN/history.jsonl: score, reward/correct, reward/brief, ev, ... per iteration
    return trainer.save_model(f"{config.out}/final")  # a PEFT adapter folder with a model card


if __name__ == "__main__":
    main()
