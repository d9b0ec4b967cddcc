import copy

import pytest
import torch

from ppo_rlhf.errors import UsageError
from ppo_rlhf.models import logprobs, rollout
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.models.loading import LoraSettings, add_policy_lora, add_value_lora, load_causal_lm, load_tokenizer
from ppo_rlhf.models.logprobs import token_logprobs
from ppo_rlhf.models.padding import right_pad
from ppo_rlhf.models.rollout import build_batch, cut_at_eos, generate_rollout
from ppo_rlhf.models.scores import reward_inputs, reward_scores, score_texts, sequence_values

import tiny

ARCHS = ["llama", "qwen2"]
PROMPTS = ["Hello!", "Tell me a story about a cat who lives in a small house.", "What is energy?"]


@pytest.fixture(scope="module")
def tokenizers():
    return {False: tiny.tiny_tokenizer(), True: tiny.tiny_tokenizer(distinct_pad=True)}


def perturb_lora(model, scale=0.2):
    """LoRA B starts at zero (adapter = identity); make it matter."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, scale)


def bias_eos(model, eos_id, per_row_bias):
    """Add per_row_bias[b] to the EOS logit of batch row b at every step (generation keeps row order)."""

    def hook(module, inputs, output):
        output = output.clone()
        output[..., eos_id] += torch.tensor(per_row_bias, dtype=output.dtype)[: output.shape[0]].view(-1, 1)
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def random_batch(tokenizer, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in PROMPTS]
    reply_ids = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (5, 2, 7)]
    reply_ids[1].append(tokenizer.eos_token_id)  # a finished reply
    return prompt_ids, reply_ids


# ---------------------------------------------------------------- chat prompts and batches


def test_chat_prompt_ids_ends_with_assistant_header(tokenizer):
    ids = chat_prompt_ids(tokenizer, "Hello!")
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("distinct_pad", [False, True])
def test_build_batch_masks(tokenizers, distinct_pad):
    tok = tokenizers[distinct_pad]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompt_ids = [[5, 6, 7], [8, 9]]
    reply_ids = [[10, eos], [11, 12, 13, 14]]
    input_ids, attention_mask, action_mask = build_batch(prompt_ids, reply_ids, pad)
    assert input_ids.shape == (2, 6) and action_mask.shape == (2, 5)  # L = longest row, no extra columns
    assert input_ids.tolist() == [[5, 6, 7, 10, eos, pad], [8, 9, 11, 12, 13, 14]]
    assert attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    # position t is 1 iff input_ids[t+1] is a reply token; the closing EOS counts even when it equals pad
    assert action_mask.tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert action_mask.dtype == torch.float32 and input_ids.dtype == attention_mask.dtype == torch.long


def test_build_batch_rejects_empty_prompt():
    with pytest.raises(UsageError):
        build_batch([[]], [[1]], 0)


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("distinct_pad", [False, True])
def test_generate_stops_at_eos_and_marks_unfinished(tokenizers, arch, distinct_pad):
    tok = tokenizers[distinct_pad]
    model = tiny.tiny_causal_lm(tok, arch)
    # row 0 always says EOS first, row 1 never says EOS, row 2 is left to chance
    handle = bias_eos(model, tok.eos_token_id, [100.0, -100.0, 0.0])
    torch.manual_seed(0)
    r = generate_rollout(model, tok, PROMPTS, max_new_tokens=6, temperature=0.7)
    handle.remove()
    assert r.reply_ids[0] == [tok.eos_token_id] and r.finished[0]
    assert len(r.reply_ids[1]) == 6 and not r.finished[1] and tok.eos_token_id not in r.reply_ids[1]
    assert r.finished[2] == (tok.eos_token_id in r.reply_ids[2])
    assert r.reply_texts[0] == ""
    lengths = [len(p) + len(q) for p, q in zip(r.prompt_ids, r.reply_ids)]
    assert r.input_ids.shape == (3, max(lengths)) and r.action_mask.shape == (3, max(lengths) - 1)
    assert r.attention_mask.sum(1).tolist() == lengths
    assert r.action_mask.sum(1).tolist() == [len(q) for q in r.reply_ids] == r.reply_lengths.tolist()
    for row in range(3):
        assert r.input_ids[row, : lengths[row]].tolist() == r.prompt_ids[row] + r.reply_ids[row]


def test_generate_max_new_tokens_one_and_sub_batches(tokenizer):
    model = tiny.tiny_causal_lm(tokenizer)
    handle = bias_eos(model, tokenizer.eos_token_id, [-100.0])
    r = generate_rollout(model, tokenizer, PROMPTS, max_new_tokens=1, temperature=1.0, batch_size=1)
    handle.remove()
    assert [len(q) for q in r.reply_ids] == [1, 1, 1] and not r.finished.any()
    assert r.action_mask.sum().item() == 3


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_is_reproducible_and_batch_size_independent_shape(tokenizer, arch):
    policy = add_policy_lora(tiny.tiny_causal_lm(tokenizer, arch), LoraSettings(rank=4))
    perturb_lora(policy)
    torch.manual_seed(3)
    a = generate_rollout(policy, tokenizer, PROMPTS, max_new_tokens=5, temperature=0.7)
    torch.manual_seed(3)
    b = generate_rollout(policy, tokenizer, PROMPTS, max_new_tokens=5, temperature=0.7)
    assert a.reply_ids == b.reply_ids
    c = generate_rollout(policy, tokenizer, PROMPTS, max_new_tokens=5, temperature=0.7, batch_size=2)
    assert c.input_ids.shape[0] == 3 and c.action_mask.sum().item() == c.reply_lengths.sum().item()


def test_generate_bad_arguments(tokenizer):
    model = tiny.tiny_causal_lm(tokenizer)
    for kwargs in ({"temperature": 0.0}, {"max_new_tokens": 0}, {"top_p": 0.0}):
        args = {"max_new_tokens": 2, "temperature": 1.0} | kwargs
        with pytest.raises(UsageError):
            generate_rollout(model, tokenizer, PROMPTS, **args)


def test_select_retrims(tokenizer):
    model = tiny.tiny_causal_lm(tokenizer)
    handle = bias_eos(model, tokenizer.eos_token_id, [100.0, -100.0, 100.0])
    r = generate_rollout(model, tokenizer, PROMPTS, max_new_tokens=4, temperature=1.0)
    handle.remove()
    sub = r.select([2, 0])
    width = max(len(r.prompt_ids[i]) + len(r.reply_ids[i]) for i in (0, 2))
    assert sub.prompts == [PROMPTS[2], PROMPTS[0]]
    assert sub.input_ids.shape == (2, width) and sub.action_mask.shape == (2, width - 1)
    rebuilt = build_batch(sub.prompt_ids, sub.reply_ids, tokenizer.pad_token_id)
    for mine, expected in zip((sub.input_ids, sub.attention_mask, sub.action_mask), rebuilt):
        assert torch.equal(mine, expected)
    assert r.select(torch.tensor([1])).finished.tolist() == [False]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch_size", [None, 2])
def test_recorded_logprobs_equal_recomputed(tokenizer, arch, batch_size):
    """old_logprobs: generation. The log-probs and entropies generate records (KV cache, left padding) are the ones
    token_logprobs computes on the right-padded batch, on reply tokens only; finished rows stop at their EOS."""
    policy = add_policy_lora(tiny.tiny_causal_lm(tokenizer, arch), LoraSettings(rank=4))
    perturb_lora(policy)
    # per-row EOS biases (the hook also runs inside generate) only where row b of a call is row b of the batch
    handle = bias_eos(policy, tokenizer.eos_token_id, [3.0, -100.0, 0.0] if batch_size is None else [0.0] * 3)
    torch.manual_seed(5)
    r = generate_rollout(policy, tokenizer, PROMPTS, max_new_tokens=7, temperature=0.7, batch_size=batch_size,
                         record_logprobs=True)
    assert r.logprobs.shape == r.entropy.shape == r.action_mask.shape
    lp, ent = token_logprobs(policy, r.input_ids, r.attention_mask, 0.7, with_entropy=True)
    handle.remove()
    act = r.action_mask.bool()
    assert torch.allclose(r.logprobs[act], lp[act], atol=1e-5) and torch.allclose(r.entropy[act], ent[act], atol=1e-4)
    assert (r.logprobs[~act] == 0).all() and (r.entropy[~act] == 0).all()
    assert (r.logprobs[act] < 0).all()
    if batch_size is None:
        assert not r.finished[1] and r.reply_lengths[1] == 7  # the recording covers a row cut at the cap
    sub = r.select([2, 0])
    assert torch.equal(sub.logprobs, r.logprobs[[2, 0], : sub.input_ids.shape[1] - 1])
    assert generate_rollout(policy, tokenizer, PROMPTS[:1], max_new_tokens=2, temperature=0.7).logprobs is None


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_ignores_the_models_generation_defaults(tokenizer, arch):
    """Hub models ship generation defaults (top_k, repetition_penalty, min_p, a low temperature): none of them may
    reach the tokens, which come from softmax(logits / temperature), the distribution token_logprobs computes."""
    model = tiny.tiny_causal_lm(tokenizer, arch)
    model.generation_config.update(top_k=5, repetition_penalty=1.5, min_p=0.2, temperature=0.1, do_sample=True)
    torch.manual_seed(0)
    r = generate_rollout(model, tokenizer, PROMPTS, max_new_tokens=6, temperature=0.7, record_logprobs=True)
    full = token_logprobs(model, r.input_ids, r.attention_mask, 0.7, with_entropy=True)
    act = r.action_mask.bool()
    torch.testing.assert_close(r.logprobs[act], full[0][act], atol=1e-5, rtol=0)  # no penalty changed the scores
    torch.testing.assert_close(r.entropy[act], full[1][act], atol=1e-4, rtol=0)
    with torch.no_grad():
        logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask).logits[:, :-1]
    ranks = (logits > logits.gather(-1, r.input_ids[:, 1:, None])).sum(-1)  # tokens more likely than the drawn one
    assert (ranks[act] >= 5).any()  # top_k=5 was not applied: the near-uniform tiny model draws past the top 5


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_token_sampler_draws_from_the_tempered_nucleus(top_p):
    """40,000 draws from one row of logits: every token's frequency within 5 standard errors of its probability
    under softmax(logits / T), renormalised over the top-p nucleus; tokens outside it never drawn. The returned
    scores leave only the drawn token finite (generate runs greedy), and the record is the untruncated log-prob."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])
    rows = 40_000
    sampler = rollout.TokenSampler(temperature=0.7, top_p=top_p, record=True)
    torch.manual_seed(0)
    scores = sampler(torch.zeros(rows, 1, dtype=torch.long), logits.repeat(rows, 1))
    tokens = scores.argmax(-1)
    assert torch.isfinite(scores).sum(-1).eq(1).all() and (scores.gather(-1, tokens[:, None]) == 0).all()
    probs = torch.softmax(logits / 0.7, -1)
    torch.testing.assert_close(sampler.logprobs[0], probs.log()[tokens])
    entropy = -(probs[:-1] * probs[:-1].log()).sum()  # the -inf token has probability 0
    torch.testing.assert_close(sampler.entropies[0], entropy.expand(rows))
    ranked = probs.sort(descending=True).values
    kept = ranked.cumsum(0) - ranked < top_p
    nucleus = torch.where(probs >= ranked[kept].min(), probs, 0.0)
    expected = nucleus / nucleus.sum()
    frequency = torch.bincount(tokens, minlength=len(logits)) / rows
    standard_error = (expected * (1 - expected) / rows).sqrt()
    assert ((frequency - expected).abs() <= 5 * standard_error).all(), (frequency, expected)
    assert (frequency[expected == 0] == 0).all() and (expected == 0).sum() == (1 if top_p == 1.0 else 4)


def test_top_p_nucleus_matches_transformers():
    """The nucleus is the set HF's TopPLogitsWarper keeps, on random rows with ties and peaked rows."""
    from transformers import TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.cat([torch.randn(20, 50, generator=g) * 3, torch.randint(0, 3, (5, 50), generator=g).float()])
    for top_p in (0.05, 0.5, 0.9, 0.999):
        ours = rollout.top_p_nucleus(torch.softmax(logits, -1), top_p) > 0
        theirs = torch.isfinite(TopPLogitsWarper(top_p)(None, logits.clone()))
        # ties at the edge of the nucleus may be cut differently: compare the kept mass, and the sets away from ties
        torch.testing.assert_close((torch.softmax(logits, -1) * ours).sum(-1),
                                   (torch.softmax(logits, -1) * theirs).sum(-1))
        assert torch.equal(ours[:20], theirs[:20])


# ---------------------------------------------------------------- log-probs


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("distinct_pad", [False, True])
def test_token_logprobs_padding_invariant(tokenizers, arch, distinct_pad):
    tok = tokenizers[distinct_pad]
    model = tiny.tiny_causal_lm(tok, arch)
    prompt_ids, reply_ids = random_batch(tok)
    input_ids, attention_mask, _ = build_batch(prompt_ids, reply_ids, tok.pad_token_id)
    with torch.no_grad():
        batched = token_logprobs(model, input_ids, attention_mask, 0.7)
        for row, (p, q) in enumerate(zip(prompt_ids, reply_ids)):
            single = torch.tensor([p + q])
            alone = token_logprobs(model, single, torch.ones_like(single), 0.7)[0]
            torch.testing.assert_close(batched[row, : len(alone)], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_token_logprobs_match_full_logits_and_entropy(tokenizer, arch):
    model = tiny.tiny_causal_lm(tokenizer, arch)
    input_ids, attention_mask, _ = build_batch(*random_batch(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logp, entropy = token_logprobs(model, input_ids, attention_mask, 0.7, with_entropy=True, chunk_size=4)
        full = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1] / 0.7, -1)
    torch.testing.assert_close(logp, full.gather(-1, input_ids[:, 1:, None])[..., 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_equals_unchunked_with_gradients(tokenizer, arch):
    policy = add_policy_lora(tiny.tiny_causal_lm(tokenizer, arch), LoraSettings(rank=4))
    perturb_lora(policy)
    input_ids, attention_mask, action_mask = build_batch(*random_batch(tokenizer), tokenizer.pad_token_id)
    lora_param = next(p for n, p in policy.named_parameters() if "lora_A" in n)
    head_calls: list[int] = []
    policy.get_output_embeddings().register_forward_hook(lambda *_: head_calls.append(1))
    results, calls = [], []
    # one pass; 3 positions per chunk; 64 positions but a logits budget so small that each chunk is one position
    for chunk_size, chunk_mb in ((None, 0.0), (3, 0.0), (64, 1e-9)):
        policy.zero_grad()
        head_calls.clear()
        logp, entropy = token_logprobs(policy, input_ids, attention_mask, 0.7, with_entropy=True, chunk_size=chunk_size,
                                       chunk_mb=chunk_mb)
        ((logp + 0.1 * entropy) * action_mask).sum().backward()
        results.append((logp.detach(), entropy.detach(), lora_param.grad.clone()))
        calls.append(len(head_calls))
    for plain, *chunked in zip(*results):
        for other in chunked:
            torch.testing.assert_close(other, plain, atol=1e-5, rtol=1e-5)
    assert results[0][2].abs().sum() > 0
    positions = input_ids.shape[1] - 1  # forward and the checkpoint's recompute: two head calls per chunk
    assert calls == [1, 2 * -(-positions // 3), 2 * positions]


def test_frozen_head_gradient_formed_in_forward_is_exact():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(7, 5, dtype=torch.float64, generator=g)
    targets = torch.randint(0, 7, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda h: logprobs.FrozenHeadLogprobs.apply(h, weight, targets, 0.7), (hidden,))
    expected = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(logprobs.FrozenHeadLogprobs.apply(hidden, weight, targets, 0.7), expected)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_frozen_head_path_gradients_equal_full_logits(tokenizer, arch, chunk_size):
    """Without the entropy, training log-probs take FrozenHeadLogprobs; LoRA gradients equal plain autograd through
    the full [B, L, V] logits."""
    policy = add_policy_lora(tiny.tiny_causal_lm(tokenizer, arch), LoraSettings(rank=4))
    perturb_lora(policy)
    input_ids, attention_mask, action_mask = build_batch(*random_batch(tokenizer), tokenizer.pad_token_id)
    weights = torch.rand(action_mask.shape, generator=torch.Generator().manual_seed(1)) * action_mask
    assert logprobs._frozen_plain_head(policy.get_output_embeddings())
    lora = [p for n, p in policy.named_parameters() if "lora_" in n]
    grads = []
    for fused in (True, False):
        policy.zero_grad()
        if fused:
            logp = token_logprobs(policy, input_ids, attention_mask, 0.7, chunk_size=chunk_size)
        else:
            logits = policy(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1] / 0.7
            logp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None])[..., 0]
        (logp * weights).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in lora]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_first_skips_prompt_positions_only(tokenizer, chunk_size):
    """`first` = the shortest prompt - 1: the reply positions, their gradients and entropies are unchanged."""
    policy = add_policy_lora(tiny.tiny_causal_lm(tokenizer), LoraSettings(rank=4))
    perturb_lora(policy)
    prompt_ids, reply_ids = random_batch(tokenizer)
    input_ids, attention_mask, action_mask = build_batch(prompt_ids, reply_ids, tokenizer.pad_token_id)
    first = logprobs.first_reply_position(prompt_ids)
    assert first == min(len(p) for p in prompt_ids) - 1 and action_mask[:, :first].sum() == 0
    lora_param = next(p for n, p in policy.named_parameters() if "lora_A" in n)
    results = []
    for start in (0, first):
        policy.zero_grad()
        logp, entropy = token_logprobs(policy, input_ids, attention_mask, 0.7, with_entropy=True,
                                       chunk_size=chunk_size, first=start)
        assert logp.shape == entropy.shape == action_mask.shape
        ((logp + 0.1 * entropy) * action_mask).sum().backward()
        results.append((logp.detach() * action_mask, entropy.detach() * action_mask, lora_param.grad.clone()))
    for full, skipped in zip(*results):
        torch.testing.assert_close(skipped, full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        logp = token_logprobs(policy, input_ids, attention_mask, 0.7, first=first)
    assert torch.all(logp[:, :first] == 0)


@pytest.mark.parametrize("arch", ARCHS)
def test_reference_is_policy_with_adapter_disabled(tokenizer, arch):
    base = tiny.tiny_causal_lm(tokenizer, arch)
    input_ids, attention_mask, _ = build_batch(*random_batch(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        expected = token_logprobs(base, input_ids, attention_mask, 0.7)
        policy = add_policy_lora(copy.deepcopy(base), LoraSettings(rank=4))
        perturb_lora(policy)
        adapted = token_logprobs(policy, input_ids, attention_mask, 0.7)
        with policy.disable_adapter():
            reference = token_logprobs(policy, input_ids, attention_mask, 0.7)
    assert (adapted - expected).abs().max() > 1e-3  # the adapter matters
    torch.testing.assert_close(reference, expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- values and rewards


@pytest.mark.parametrize("arch", ARCHS)
def test_sequence_values_shape_and_shift(tokenizer, arch):
    value = add_value_lora(tiny.tiny_reward_model(tokenizer, arch), LoraSettings(rank=4))
    perturb_lora(value)
    input_ids, attention_mask, _ = build_batch(*random_batch(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        values = sequence_values(value, input_ids, attention_mask)
        assert values.shape == (3, input_ids.shape[1] - 1) and values.dtype == torch.float32
        t = 10
        changed = input_ids.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 1) % len(tokenizer)
        after = sequence_values(value, changed, attention_mask)
    torch.testing.assert_close(after[:, : t + 1], values[:, : t + 1])  # value t sees tokens 0..t only
    assert (after[:, t + 1] - values[:, t + 1]).abs().min() > 0


@pytest.mark.parametrize("distinct_pad", [False, True])
def test_reward_inputs_end_at_closing_eos(tokenizers, distinct_pad):
    tok = tokenizers[distinct_pad]
    input_ids, attention_mask = reward_inputs(tok, ["Hi", "Tell me a story"], ["Hello, how are you today?", "No."])
    last = attention_mask.sum(1) - 1
    assert input_ids[torch.arange(2), last].tolist() == [tok.eos_token_id] * 2
    assert attention_mask[:, -1].tolist().count(1) == 1  # right-padded to the longest row only
    text = tok.decode(input_ids[0, : last[0] + 1])
    assert text.endswith("<|im_start|>assistant\nHello, how are you today?<|im_end|>")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("distinct_pad", [False, True])
def test_reward_scores_read_last_real_token(tokenizers, arch, distinct_pad):
    tok = tokenizers[distinct_pad]
    rm = tiny.tiny_reward_model(tok, arch)
    prompts, replies = ["Hi", "Tell me a story about a cat"], ["Hello, how are you today?", "No."]
    input_ids, attention_mask = reward_inputs(tok, prompts, replies)
    with torch.no_grad():
        scores = reward_scores(rm, input_ids, attention_mask)
        padded = reward_scores(
            rm,
            torch.nn.functional.pad(input_ids, (0, 4), value=tok.pad_token_id),
            torch.nn.functional.pad(attention_mask, (0, 4)),
            batch_size=1,
        )
        for row in range(2):
            single = input_ids[row : row + 1, : int(attention_mask[row].sum())]
            direct = rm.score(rm.model(input_ids=single).last_hidden_state)[0, -1, 0]
            torch.testing.assert_close(scores[row], direct, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded, scores, atol=1e-5, rtol=0)
    torch.testing.assert_close(score_texts(rm, tok, prompts, replies, batch_size=1), scores, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- the real model


@pytest.mark.smoke
def test_smoke_smollm2_generates():
    tok = load_tokenizer("smollm2")
    assert tok.pad_token_id == tok.eos_token_id  # SmolLM2's pad is its EOS
    policy = add_policy_lora(load_causal_lm("smollm2"), LoraSettings(rank=4))
    torch.manual_seed(0)
    r = generate_rollout(policy, tok, ["Say hello.", "What is 2 + 2?"], max_new_tokens=12, temperature=0.7)
    assert len(r.reply_texts) == 2 and all(len(q) >= 1 for q in r.reply_ids)
    with torch.no_grad():
        logp = token_logprobs(policy, r.input_ids, r.attention_mask, 0.7)
    assert torch.isfinite(logp[r.action_mask.bool()]).all()


def test_right_pad_masks_by_length_not_by_pad_id():
    input_ids, attention_mask = right_pad([[5, 7, 0], [9]], pad_id=0, min_width=4)
    assert input_ids.tolist() == [[5, 7, 0, 0], [9, 0, 0, 0]]
    assert attention_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]  # the row's own trailing 0 is a token
    assert input_ids.dtype == attention_mask.dtype == torch.long


def test_a_reply_is_cut_after_its_first_eos():
    """One cut for every backend: the first EOS kept, what a backend pads after it dropped; no EOS: unfinished."""
    assert cut_at_eos([5, 6, 2, 2, 2], [2]) == ([5, 6, 2], True)
    assert cut_at_eos([5, 3, 6, 2], [2, 3]) == ([5, 3], True)
    assert cut_at_eos([5, 6, 7], [2]) == ([5, 6, 7], False)
