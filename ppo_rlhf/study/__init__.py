"""The chapter's offline study (`ppo-rlhf demo`): prompts, preference pairs labelled by a gold judge (`prompts`,
`pairs`, `judges`, `judge_specs`), the proxy reward model and its yardsticks (`reward_model`, `length_bias`,
`word_baseline`, `ensemble`), the optimisation arms (`arms`), the held-out evaluation with bootstrap intervals
(`evaluate`, `sampling`, `stats`, `curves`), the findings in words and the report (`findings`, `report`), the
end-to-end `demo`, the over-optimisation turn predicted and measured (`overoptimisation`, `gao`) and the estimator
`compare`. docs/DESIGN.md has a line for each."""
