"""The chapter's offline study (`ppo-rlhf demo`): prompts, preference pairs labelled by a gold judge (`prompts`,
`pairs`, `judges`), the proxy reward model (`reward_model`, `word_baseline`), the held-out evaluation with bootstrap
intervals (`evaluate`, `stats`), the findings in words and the report (`findings`, `report`), the end-to-end `demo`
and the estimator `compare`."""
