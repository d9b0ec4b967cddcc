"""generation_drop_finished (ppo_rlhf/models/decode.py): the decode loop that drops finished rows writes what HF
`generate` writes, draws the same random numbers, and computes only the rows still writing."""

import sys
from pathlib import Path

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models import decode
from ppo_rlhf.models.generation import HFGenerator, make_generator
from ppo_rlhf.models.loading import LoraSettings, add_policy_lora
from ppo_rlhf.models.rollout import TokenSampler, eos_token_ids, generate_rollout
from ppo_rlhf.ppo.train_config import TrainConfig

import tiny

# different lengths, so the prompts are left-padded by different amounts
PROMPTS = ["Hello!", "Tell me a story about a cat who lives in a small house.", "What is energy?", "Hi",
           "Once upon a time there was a king", "0 1 2", "I love this wonderful happy day", "?"]


def eos_prone(tokenizer, arch="llama", extra=0.5):
    """tiny.eos_prone_policy in memory: replies end after a few tokens, at different steps, some never."""
    model = tiny.tiny_causal_lm(tokenizer, arch)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight[:, 0] += 1.0
        weight[tokenizer.eos_token_id, 0] += extra
    return model


def forward_rows(model):
    """A list that collects the batch size of every forward of `model`, and the hook's handle."""
    sizes = []
    handle = model.register_forward_pre_hook(lambda _, args, kwargs: sizes.append(kwargs["input_ids"].shape[0]),
                                             with_kwargs=True)
    return sizes, handle


def both(model, tokenizer, seed=1, **kwargs):
    """(today's rollout, the dropping loop's), each sampled from `seed`, and the RNG state after each."""
    out = []
    for drop in (False, True):
        torch.manual_seed(seed)
        out.append((generate_rollout(model, tokenizer, PROMPTS, drop_finished=drop, **kwargs), torch.get_rng_state()))
    return out


def assert_same(today, drop, rng_today, rng_drop, record=True):
    assert drop.reply_ids == today.reply_ids  # the requirement: the same token ids
    assert torch.equal(drop.finished, today.finished) and torch.equal(drop.input_ids, today.input_ids)
    assert torch.equal(drop.action_mask, today.action_mask)
    assert torch.equal(rng_drop, rng_today)  # the same random stream: what is drawn after generation is unchanged
    if record:
        # equal but for rounding: once a single row is left, its matmuls (M = 1) round differently (found: 4e-6)
        torch.testing.assert_close(drop.logprobs, today.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(drop.entropy, today.entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("distinct_pad", [False, True])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_same_replies_and_random_stream_as_generate(arch, distinct_pad, temperature, top_p):
    tokenizer = tiny.tiny_tokenizer(distinct_pad=distinct_pad)
    model = eos_prone(tokenizer, arch, extra=0.45)  # (0.45: rows end at different steps, two or more run to the cap)
    (today, rng_today), (drop, rng_drop) = both(model, tokenizer, max_new_tokens=24, temperature=temperature,
                                                top_p=top_p, record_logprobs=True)
    assert_same(today, drop, rng_today, rng_drop)
    lengths = today.reply_lengths.tolist()
    assert len(set(lengths)) >= 3 and today.finished.any() and not today.finished.all()  # the cases asked for


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_finished_rows_leave_the_forward(arch, tokenizer):
    """Every forward after the prefill runs exactly the rows that have no EOS yet; generate runs all of them."""
    model = eos_prone(tokenizer, arch)
    sizes, handle = forward_rows(model)
    (today, rng_today), (drop, rng_drop) = both(model, tokenizer, max_new_tokens=24, temperature=0.7,
                                                record_logprobs=True)
    handle.remove()
    assert_same(today, drop, rng_today, rng_drop)
    lengths = today.reply_lengths.tolist()
    assert today.finished.all() and len(set(lengths)) >= 4  # every row ends, at different steps
    steps = max(lengths)
    assert sizes[:steps] == [len(PROMPTS)] * steps  # generate: the prefill, then every row at every step
    assert sizes[steps:] == [len(PROMPTS)] + [sum(n > s for n in lengths) for s in range(1, steps)]


def test_lora_policy_in_chunks_with_recorded_logprobs(tokenizer):
    """A PEFT-wrapped policy with a non-zero adapter, sampled in chunks of 3 (the chunks share the random stream)."""
    policy = add_policy_lora(eos_prone(tokenizer, extra=0.6), LoraSettings(rank=4))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    (today, rng_today), (drop, rng_drop) = both(policy, tokenizer, max_new_tokens=16, temperature=0.7, top_p=0.9,
                                                batch_size=3, record_logprobs=True)
    assert_same(today, drop, rng_today, rng_drop)
    assert today.finished.any() and not today.finished.all()
    with policy.disable_adapter():  # the reference model's sampling (tests/dist_worker.py samples so)
        (today, rng_today), (drop, rng_drop) = both(policy, tokenizer, max_new_tokens=8, temperature=1.0)
    assert_same(today, drop, rng_today, rng_drop, record=False)
    assert drop.logprobs is None


@pytest.mark.parametrize("max_new_tokens, eos_bias", [(1, 0.0), (5, 100.0)])
def test_edges_one_step_and_all_end_at_once(tokenizer, max_new_tokens, eos_bias):
    model = tiny.tiny_causal_lm(tokenizer)

    def bias(module, inputs, output):
        output = output.clone()
        output[..., tokenizer.eos_token_id] += eos_bias
        return output

    handle = model.get_output_embeddings().register_forward_hook(bias)
    (today, rng_today), (drop, rng_drop) = both(model, tokenizer, max_new_tokens=max_new_tokens, temperature=1.0,
                                                record_logprobs=True)
    handle.remove()
    assert_same(today, drop, rng_today, rng_drop)
    assert today.reply_lengths.tolist() == [1] * len(PROMPTS)


def test_synced_process_steps_on_with_one_row_until_its_peers_end(tokenizer, monkeypatch):
    """FSDP: a process whose replies all ended keeps calling forward (one row, nothing sampled) while a peer writes;
    its tokens and random stream are the unsynced loop's."""
    model = eos_prone(tokenizer)
    pad, eos = tokenizer.pad_token_id, eos_token_ids(model, tokenizer)
    width = max(len(p) for p in (tokenizer(p)["input_ids"] for p in PROMPTS))
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS]
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(2)
    alone = decode.decode_dropping_finished(model, ids, mask, TokenSampler(0.7), 30, eos, pad)
    rng_alone = torch.get_rng_state()
    steps = alone.shape[1]
    assert steps < 25
    peer_steps = steps + 3  # a peer still writing 3 steps after this process's rows all ended
    calls = []

    def anyone_writing(writing_here, synced, device):
        assert synced
        calls.append(writing_here)
        return writing_here or len(calls) < peer_steps

    monkeypatch.setattr(decode, "_anyone_writing", anyone_writing)
    sizes, handle = forward_rows(model)
    torch.manual_seed(2)
    synced = decode.decode_dropping_finished(model, ids, mask, TokenSampler(0.7), 30, eos, pad, synced=True)
    handle.remove()
    assert torch.equal(synced, alone) and torch.equal(torch.get_rng_state(), rng_alone)
    assert len(sizes) == peer_steps and sizes[steps:] == [1] * (peer_steps - steps)


def test_setting_reaches_the_generator_on_by_default_and_off_only_with_hf(tokenizer):
    base = dict(reward_model="rm", prompts="p.jsonl")
    generator = make_generator(build_config(TrainConfig, base), eos_prone(tokenizer), tokenizer)
    assert isinstance(generator, HFGenerator) and generator.drop_finished  # the default: it measured faster
    assert not make_generator(build_config(TrainConfig, base | {"generation_drop_finished": False}),
                              eos_prone(tokenizer), tokenizer).drop_finished
    # vLLM never steps finished replies: on is what it does, off cannot be honoured
    assert build_config(TrainConfig, base | {"generation_backend": "vllm"}).generation_drop_finished
    with pytest.raises(UsageError, match="generation_drop_finished: false"):
        build_config(TrainConfig, base | {"generation_backend": "vllm", "generation_drop_finished": False})


def test_benchmark_dry_run(tiny_model_dirs, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import generation_drop

    results = generation_drop.main(["--model", str(tiny_model_dirs["policy"]), "--rounds", "1", "--batches", "2,3",
                                    "--caps", "4", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert set(results) == {(4, 2), (4, 3)} and "| 4 | 3 |" in out
    for entry in results.values():
        assert entry["today"][0] > 0 and entry["drop"][0] > 0 and entry["same"][0] == entry["same"][1]
    assert generation_drop.finished_share([3, 1, 3]) == pytest.approx(1 - 4 / 6)
