"""Multi-turn PPO with a critic: the policy answers a * b + c and may call a calculator tool between its turns
(ppo_rlhf.tasks.calc_steps); the exact checker reads its last turn. docs/multi-turn.md explains the episode, the mask
and GAE across turns; `ppo-rlhf demo --task calc-steps` is the measured run."""
from ppo_rlhf import PPOConfig, PPOTrainer
from ppo_rlhf.tasks.arithmetic import FORMAT_WEIGHT, answer_format, exact_match
from ppo_rlhf.tasks.calc_steps import calc, problems

EPISODE = ("temperature", "top_p", "max_new_tokens", "max_turns", "max_tool_calls", "max_episode_tokens",
           "tool_timeout")


def heldout(trainer: PPOTrainer, rows: list[dict], seed: int = 0) -> tuple[float, float]:
    """(exact match, share of episodes that called the tool): one episode per held-out problem, as in training."""
    from ppo_rlhf.tasks.evaluate import task_records

    settings = {name: getattr(trainer.config, name) for name in EPISODE}
    records = task_records(trainer.model, trainer.processing_class, rows, settings, replies_per_prompt=1, seed=seed,
                           batch_size=32, tools=[calc])
    return (sum(r["correct"] for r in records) / len(records),
            sum(r["tool_calls"] > 0 for r in records) / len(records))


def main(heldout_problems: int = 200, **settings):  # settings override the defaults below, e.g. main(iterations=2)
    config = PPOConfig(**{"policy_model": "smollm2", "out": "runs/multi_turn", "iterations": 20, "batch_size": 16,
                          "minibatch_size": 8, "max_new_tokens": 40, "temperature": 0.7,
                          "max_turns": 3, "max_tool_calls": 2, "max_episode_tokens": 160,  # the episode's caps
                          "reward_weights": [1.0, FORMAT_WEIGHT], "critic_warmup_iterations": 1, **settings})
    trainer = PPOTrainer(config, reward_funcs=[exact_match, answer_format], train_dataset=problems("train"),
                         tools=[calc])  # plain functions; SmolLM2's prompt teaches <tool>calc(...)</tool>
    test = problems("heldout", heldout_problems)  # never a training problem
    before = heldout(trainer, test)
    trainer.train()  # history.jsonl: turns, tool_calls, tool_errors, masked_share per iteration
    after = heldout(trainer, test)
    print(f"held-out calc-steps exact match {before[0]:.1%} -> {after[0]:.1%}, "
          f"episodes calling the tool {before[1]:.0%} -> {after[1]:.0%}")
    return before, after


if __name__ == "__main__":
    main()
