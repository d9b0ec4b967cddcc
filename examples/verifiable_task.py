"""PPO on a task whose reward is true by construction: arithmetic problems checked exactly (ppo_rlhf.tasks.arithmetic),
with the held-out exact-match accuracy of the policy before and after training."""
from ppo_rlhf import PPOConfig, PPOTrainer
from ppo_rlhf.tasks.arithmetic import FORMAT_WEIGHT, answer_format, exact_match, problems

LEVEL = "add-tiny"  # SmolLM2-135M-Instruct starts near 18% here (bench/HISTORY.md); `ppo-rlhf task list` shows others


def accuracy(trainer: PPOTrainer, rows: list[dict], seed: int = 0) -> float:
    """Held-out exact match: one reply per problem, sampled as in training, from a fixed seed."""
    import torch

    from ppo_rlhf.models.rollout import generate_rollout

    torch.manual_seed(seed)
    prompts = [row["prompt"] for row in rows]
    rollout = generate_rollout(trainer.model, trainer.processing_class, prompts, trainer.config.max_new_tokens,
                               trainer.config.temperature, batch_size=32)
    return sum(exact_match(prompts, rollout.reply_texts, rollout.reply_ids, [r["answer"] for r in rows])) / len(rows)


def main(heldout: int = 200, **settings):  # settings override the defaults below, e.g. main(iterations=2)
    config = PPOConfig(**{"policy_model": "smollm2", "out": "runs/verifiable_task", "iterations": 30,
                          "batch_size": 16, "minibatch_size": 8, "max_new_tokens": 64,
                          "reward_weights": [1.0, FORMAT_WEIGHT],  # the format term: small, reported on its own
                          "critic_warmup_iterations": 3, **settings})  # no reward model: the critic starts cold
    trainer = PPOTrainer(config, reward_funcs=[exact_match, answer_format],
                         train_dataset=problems(LEVEL, "train"))  # {"prompt", "answer"} rows; answer reaches rewards
    test = problems(LEVEL, "heldout", heldout)  # never a training problem (tests/tasks/test_tasks.py)
    before = accuracy(trainer, test)  # the LoRA adapter starts at zero: this is the start policy
    trainer.train()  # RUN/history.jsonl: reward/exact_match and reward/answer_format per iteration
    after = accuracy(trainer, test)
    print(f"held-out exact match on {len(test)} {LEVEL} problems: {before:.1%} -> {after:.1%}")
    return before, after


if __name__ == "__main__":
    main()
