"""Models and sampling: loading models and tokenizers (`loading`), chat formatting (`chat`), generation backends
(`generation`, `rollout`, `decode`, `vllm_server`), the LoRA merge (`merge`), per-token log-probs and scores
(`logprobs`, `scores`), the padded and packed layouts (`padding`, `packing`), precision and the memory estimate
(`precision`, `memory`)."""
