"""The vLLM backend on a real vLLM engine (its own environment, .venv-vllm; its own process, vllm_server.py).

One engine for the whole module (a start takes 30-100 s on a shared 2-core CPU): a tiny llama saved as a folder,
with head_dim 32 (vLLM's CPU attention has no smaller head size). Skipped, with the reason, where `make venv-vllm`
did not install the engine.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from ppo_rlhf.config import build_config
from ppo_rlhf.models import generation
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.models.generation import VLLMGenerator, VLLMServer
from ppo_rlhf.models.loading import LoraSettings, add_policy_lora
from ppo_rlhf.models.logprobs import token_logprobs
from ppo_rlhf.models.rollout import eos_token_ids
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop
from ppo_rlhf.train import train

import tiny

PYTHON = generation.vllm_python()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(
    PYTHON is None, reason="no vLLM engine: .venv-vllm is missing or has no vllm (`make venv-vllm`; a failed "
                           "install leaves .venv-vllm/install.log)")]

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time",
           "I love this day", "The quick brown fox", "This is terrible", "A cat in a house"]
TEMPERATURE = 0.7
# Per-token KL(vLLM || HF policy) over the whole vocabulary, float32 on both sides. Measured ~1e-7 after a sync
# (kernel rounding); an unsynced engine is ~1e-1 away, so the tolerance separates the two by orders of magnitude.
KL_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("vllm")
    # replies end early about half the time (an EOS-leaning random model), so both stop conditions happen
    policy = tiny.eos_prone_policy(tokenizer, root / "policy", extra=0.3, head_dim=32)
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    server = VLLMServer(str(policy), PYTHON, dtype="float32", seed=1, max_logprobs=len(tokenizer))
    yield {"server": server, "policy": policy, "reward": reward, "prompts": prompts, "root": root}
    server.close()


def lora_policy(folder, seed: int = 0):
    policy = add_policy_lora(AutoModelForCausalLM.from_pretrained(folder).eval(), LoraSettings(rank=4, alpha=8))
    torch.manual_seed(seed)
    with torch.no_grad():  # an adapter far from zero: the merged policy is far from the engine's start weights
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return policy


def engine_vs_policy(server: VLLMServer, policy, tokenizer, prompt_ids: list[list[int]]):
    """Per sampled token: KL(vLLM's next-token distribution || the policy's), and |log-prob difference| of the
    sampled token; vLLM's processed log-probs (after temperature) against our log_softmax(logits / T)."""
    vocab = len(tokenizer)
    reply = server.request({"op": "generate", "prompt_ids": prompt_ids, "full": True,
                            "seeds": list(range(len(prompt_ids))),
                            "params": {"temperature": TEMPERATURE, "top_k": -1, "top_p": 1.0, "max_tokens": 6,
                                       "logprobs": vocab}})
    kls, diffs = [], []
    for prompt, tokens, sampled, top in zip(prompt_ids, reply["token_ids"], reply["logprobs"], reply["top"]):
        engine_lp = torch.full((len(tokens), vocab), float("-inf"), dtype=torch.float64)
        for step, table in enumerate(top):
            for token, logprob in table.items():
                engine_lp[step, int(token)] = logprob
        with torch.no_grad():
            logits = policy(input_ids=torch.tensor([prompt + tokens])).logits[0].double()
        ours = torch.log_softmax(logits[len(prompt) - 1: -1] / TEMPERATURE, dim=-1)
        p_engine = engine_lp.exp()
        kls.append((p_engine * (engine_lp - ours)).nansum(-1))
        diffs.append((torch.tensor(sampled, dtype=torch.float64) - ours[torch.arange(len(tokens)), tokens]).abs())
    return torch.cat(kls), torch.cat(diffs)


def test_engine_samples_with_our_settings(engine, tokenizer):
    eos = [tokenizer.eos_token_id]
    gen = VLLMGenerator(engine["server"], tokenizer, eos, max_new_tokens=16, temperature=TEMPERATURE)
    rollout = gen.generate(PROMPTS)
    assert rollout.prompt_ids == [chat_prompt_ids(tokenizer, p) for p in PROMPTS]
    for reply, finished in zip(rollout.reply_ids, rollout.finished.tolist()):
        assert all(token not in eos for token in reply[:-1])  # stops at the first EOS, which it keeps
        assert (reply[-1] in eos) == finished
        assert len(reply) <= 16 and (finished or len(reply) == 16)  # the token cap
    assert 0 < int(rollout.finished.sum()) < len(PROMPTS)  # both stop conditions were exercised
    group = gen.generate([PROMPTS[0]] * 4)  # a GRPO group: equal prompts, independent replies
    assert len({tuple(reply) for reply in group.reply_ids}) > 1


def test_sync_makes_the_engine_sample_from_the_lora_policy(engine, tokenizer):
    policy = lora_policy(engine["policy"])
    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in PROMPTS[:4]]
    kl_before, _ = engine_vs_policy(engine["server"], policy, tokenizer, prompt_ids)
    gen = VLLMGenerator(engine["server"], tokenizer, [tokenizer.eos_token_id], 8, TEMPERATURE)
    gen.sync(policy)
    kl, diff = engine_vs_policy(engine["server"], policy, tokenizer, prompt_ids)
    print(f"KL per token before sync: mean {kl_before.mean():.2e}; after: mean {kl.mean():.2e} max {kl.max():.2e}, "
          f"max |log-prob diff| of the sampled tokens {diff.max():.2e}")
    assert kl_before.mean() > 100 * KL_TOLERANCE  # the check can fail: the adapter moved the distribution
    assert kl.max() < KL_TOLERANCE
    assert diff.max() < 1e-3  # vLLM's returned log-probs are the tempered ones ("processed_logprobs")


def config(engine, out, **overrides) -> TrainConfig:
    values = dict(policy_model=str(engine["policy"]), reward_model=str(engine["reward"]),
                  prompts=str(engine["prompts"]), out=str(out), generation_backend="vllm", iterations=2,
                  batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=4, lora_rank=4,
                  checkpoint_every=1, tensorboard=False, quiet=True, policy_lr=1e-3, value_lr=1e-3, dtype="float32")
    values.update(overrides)
    return build_config(TrainConfig, values)


@pytest.fixture
def shared_engine(engine, monkeypatch):
    """The trainer's VLLMGenerator.create gets the module's engine instead of starting another (it checks the
    arguments it would have started one with)."""
    started = []

    def server(model_path, python, **settings):
        started.append((model_path, python, settings))
        return engine["server"]

    monkeypatch.setattr(generation, "VLLMServer", server)
    return started


def test_engine_dtype_is_the_policy_s_resolved_dtype(engine, shared_engine, tmp_path):
    """`dtype: auto` is resolved (bf16 on a CPU with bf16 instructions, else fp32) before the engine is started."""
    import torch

    from ppo_rlhf.models.precision import resolve_dtype

    PPOLoop(config(engine, tmp_path / "run", dtype="auto"))
    expected = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    assert [settings["dtype"] for _, _, settings in shared_engine] == [expected]


def test_trainer_scores_vllm_tokens_with_its_own_logprobs(engine, shared_engine, tmp_path):
    trainer = PPOLoop(config(engine, tmp_path / "run"))
    assert shared_engine == [(str(engine["policy"]), PYTHON, {"dtype": "float32", "seed": 1, "max_model_len": 0})]
    assert trainer.generator.eos == eos_token_ids(trainer.policy, trainer.tokenizer)
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0
    rollout = trainer.rollout(PROMPTS[:4])
    assert trainer.generator.synced == 1 and rollout.logprobs is None  # no engine log-probs reach the trainer
    batch = trainer.score(rollout)
    expected = token_logprobs(trainer.policy, rollout.input_ids, rollout.attention_mask, trainer.cfg.temperature)
    act = batch.action_mask.bool()
    assert torch.equal(batch.old_logprobs[act], expected[act])  # what the PPO loss's ratio divides by
    assert torch.equal(batch.kl, torch.zeros_like(batch.kl))  # policy == reference before any update


def test_two_iteration_run_completes_and_resumes(engine, shared_engine, tmp_path, monkeypatch):
    cfg = config(engine, tmp_path / "run")
    original = PPOLoop.iteration

    def dies_at_2(self, index):
        if index == 1:  # after iteration 1's checkpoint
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(PPOLoop, "iteration", dies_at_2)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(PPOLoop, "iteration", original)
    run = train(cfg, resume=True)
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in history] == [0, 1]
    assert all(row["gen_tokens_per_s"] > 0 for row in history)
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000002"
