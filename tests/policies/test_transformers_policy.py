import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from policy_helpers import cached_tiny, random_prompts, right_padded

from compactrl.policies.sampling import SamplingConfig, draw, sampling_log_probs, truncate_logits
from compactrl.policies.transformers_policy import TransformersPolicy, batch_chunks, positions_from_mask
from compactrl.types import Policy, PolicyRequest, TokenResponse

FP32_TOL = 1e-4


def recompute(policy, prompts, gens, **kw):
    """Max |sampling log-prob - log_prob(...)| over every generated token."""
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    tokens, mask = right_padded(seqs)
    with torch.no_grad():
        lp, ent = policy.log_prob(tokens, mask, **kw)
    diff = 0.0
    for i, (p, g) in enumerate(zip(prompts, gens)):
        got = lp[i, len(p): len(p) + len(g.token_ids)]
        diff = max(diff, (got - torch.tensor(g.log_probs)).abs().max().item())
    return diff


# -- agreement between sampling and training ------------------------------------------------------

@pytest.mark.timeout(120)
def test_sampling_log_probs_equal_log_prob(arch, tokenizer):
    policy = TransformersPolicy(cached_tiny(arch), tokenizer, seed=0)
    prompts = random_prompts(8, seed=1)
    gens = policy.generate(prompts, 12)
    diff = recompute(policy, prompts, gens)
    print(f"{arch}: max |sample log-prob - log_prob| = {diff:.2e}")
    assert diff < FP32_TOL


@pytest.mark.timeout(120)
def test_agreement_with_temperature_top_k_top_p(tokenizer):
    policy = TransformersPolicy(cached_tiny("glm4_moe"), tokenizer, temperature=0.7, top_k=50, top_p=0.9, seed=3)
    prompts = random_prompts(8, seed=2)
    gens = policy.generate(prompts, 16)
    assert recompute(policy, prompts, gens) < FP32_TOL
    # sampled tokens lie in the truncated support, so their log-probs there are real numbers
    assert all(lp > -50 for g in gens for lp in g.log_probs)


@pytest.mark.timeout(60)
def test_log_prob_left_and_right_padding_agree(tokenizer):
    policy = TransformersPolicy(cached_tiny("qwen3_moe"), tokenizer)
    seqs = random_prompts(4, lo=3, hi=30, seed=5)
    tokens, mask = right_padded(seqs)
    left_t = torch.zeros_like(tokens)
    left_m = torch.zeros_like(mask)
    for i, s in enumerate(seqs):
        left_t[i, tokens.shape[1] - len(s):] = torch.tensor(s)
        left_m[i, tokens.shape[1] - len(s):] = True
    with torch.no_grad():
        r, _ = policy.log_prob(tokens, mask)
        lft, _ = policy.log_prob(left_t, left_m)
    for i, s in enumerate(seqs):
        assert torch.allclose(r[i, : len(s)], lft[i, tokens.shape[1] - len(s):], atol=FP32_TOL)


@pytest.mark.timeout(60)
def test_log_prob_shapes_padding_entropy_and_gradient(tokenizer):
    policy = TransformersPolicy(cached_tiny("mixtral"), tokenizer)
    tokens, mask = right_padded(random_prompts(3, lo=5, hi=20, seed=7))
    lp, ent, aux = policy.log_prob(tokens, mask, return_aux_loss=True)
    assert lp.shape == ent.shape == tokens.shape
    assert torch.all(lp[:, 0] == 0) and torch.all(ent[:, 0] == 0)
    assert torch.all(lp[~mask] == 0) and torch.all(ent[~mask] == 0)
    assert torch.all(lp[:, 1:][mask[:, 1:]] < 0)
    assert torch.all(ent[:, 1:][mask[:, 1:]] <= math.log(4096) + 1e-3)
    assert aux.ndim == 0 and torch.isfinite(aux)
    (-(lp.sum()) + ent.sum() + aux).backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    router = [n for n, p in policy.model.named_parameters() if n.endswith("mlp.gate.weight")]
    assert router and dict(policy.model.named_parameters())[router[0]].grad.abs().sum() > 0
    policy.model.zero_grad(set_to_none=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_k": 50}])
def test_log_prob_at_selected_positions_equals_the_full_log_prob_there(tokenizer, sampling):
    """``select`` runs the head only where asked: the same numbers there, 0 elsewhere, gradients flow."""
    import copy

    policy = TransformersPolicy(copy.deepcopy(cached_tiny("glm4_moe")), tokenizer, **sampling)
    tokens, mask = right_padded(random_prompts(3, lo=6, hi=20, seed=9))
    select = (torch.rand(tokens.shape, generator=torch.Generator().manual_seed(0)) < 0.5) & mask
    select[:, 0] = True  # nothing predicts the first token: 0 there even when selected
    full_lp, full_ent = policy.log_prob(tokens, mask)
    lp, ent = policy.log_prob(tokens, mask, select)
    torch.testing.assert_close(lp[select], full_lp[select], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ent[select], full_ent[select], rtol=1e-4, atol=1e-4)
    assert not lp[~select].any() and not ent[~select].any() and not lp[:, 0].any()
    assert lp.shape == tokens.shape
    lp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())
    with pytest.raises(ValueError, match="select"):
        policy.log_prob(tokens, mask, select[:, 1:])


# -- batched generation ---------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_batched_greedy_equals_one_by_one(tokenizer):
    policy = TransformersPolicy(cached_tiny("glm4_moe"), tokenizer, temperature=0.0)
    prompts = random_prompts(32, lo=3, hi=100, seed=11)
    assert len({len(p) for p in prompts}) > 16
    batched = policy.generate(prompts, 12)
    single = [policy.generate([p], 12)[0] for p in prompts]
    assert [b.token_ids for b in batched] == [s.token_ids for s in single]
    assert max(abs(a - b) for x, y in zip(batched, single) for a, b in zip(x.log_probs, y.log_probs)) < FP32_TOL


@pytest.mark.timeout(60)
def test_per_row_budgets_and_stop_at_end_of_turn(tokenizer):
    model = cached_tiny("qwen3_moe")
    greedy = TransformersPolicy(model, tokenizer, temperature=0.0)
    prompts = random_prompts(3, seed=13)
    free = greedy.generate(prompts, 12)
    # make the greedy token at step 4 of row 1 a stop token: generation must end exactly there
    stop_tok = free[1].token_ids[4]
    stopping = TransformersPolicy(model, tokenizer, temperature=0.0, stop_token_ids=[stop_tok])
    gens = stopping.generate(prompts, [12, 12, 3])
    first = free[1].token_ids.index(stop_tok)
    assert gens[1].token_ids == free[1].token_ids[: first + 1] and gens[1].finished
    assert len(gens[2].token_ids) <= 3
    assert all(len(g.log_probs) == len(g.token_ids) for g in gens)
    for g in gens:
        assert g.finished == (g.token_ids[-1] == stop_tok)
        assert stop_tok not in g.token_ids[:-1]


@pytest.mark.timeout(60)
def test_act_returns_token_responses_from_messages_or_ids(tokenizer):
    policy = TransformersPolicy(cached_tiny("glm4_moe"), tokenizer, max_new_tokens=8, seed=0)
    assert isinstance(policy, Policy)
    msgs = [{"role": "system", "content": "You fix code."}, {"role": "user", "content": "hi"}]
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    out = policy.act([PolicyRequest(messages=msgs), PolicyRequest(messages=msgs, prompt_token_ids=ids,
                                                                  max_new_tokens=5)])
    assert all(isinstance(r, TokenResponse) for r in out)
    assert len(out[0].token_ids) <= 8 and len(out[1].token_ids) <= 5
    for r in out:
        body = list(r.token_ids[:-1]) if r.finished else list(r.token_ids)
        assert str(r) == tokenizer.decode(body, skip_special_tokens=False)
        assert len(r.log_probs) == len(r.token_ids)


def test_prompt_longer_than_context_is_a_clear_error(tokenizer):
    policy = TransformersPolicy(cached_tiny("glm4_moe"), tokenizer)
    with pytest.raises(ValueError, match="context"):
        policy.act([PolicyRequest(messages=[], prompt_token_ids=[5] * 8192)])


@pytest.mark.timeout(60)
def test_seeded_sampling_reproduces(tokenizer):
    prompts = random_prompts(4, seed=17)
    a = TransformersPolicy(cached_tiny("mixtral"), tokenizer, seed=5).generate(prompts, 6)
    b = TransformersPolicy(cached_tiny("mixtral"), tokenizer, seed=5).generate(prompts, 6)
    c = TransformersPolicy(cached_tiny("mixtral"), tokenizer, seed=6).generate(prompts, 6)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_state_dict_passes_through(tokenizer, tmp_path):
    model = cached_tiny("qwen3_moe")
    policy = TransformersPolicy(model, tokenizer)
    assert policy.state_dict().keys() == model.state_dict().keys()
    policy.load_state_dict(model.state_dict())
    policy.save_pretrained(tmp_path)
    again = TransformersPolicy.from_pretrained(tmp_path)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in policy.state_dict().items())
    assert again.stop_token_ids == policy.stop_token_ids == [0, 2]


@pytest.mark.parametrize("kw,field", [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                                      ({"top_k": -2}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens")])
def test_bad_settings_name_the_field(tokenizer, kw, field):
    with pytest.raises(ValueError, match=field):
        TransformersPolicy(cached_tiny("qwen3_moe"), tokenizer, **kw)


# -- sampling maths -------------------------------------------------------------------------------

logits_st = st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=2, max_size=40, unique=True)


@given(values=logits_st, k=st.integers(0, 45), p=st.floats(0.01, 1.0))
def test_truncation_keeps_top_k_and_minimal_nucleus(values, k, p):
    logits = torch.tensor(values)
    kept = truncate_logits(logits, top_k=k, top_p=p) > torch.finfo(torch.float32).min
    order = torch.argsort(logits, descending=True)
    ranks_kept = kept[order]
    n = int(ranks_kept.sum())
    assert n >= 1 and bool(ranks_kept[:n].all())  # a prefix of the ranking survives
    if k:
        assert n <= k
    probs = truncate_logits(logits, top_k=k).softmax(-1)[order]
    # the nucleus is the smallest prefix whose mass reaches p (within float rounding)
    assert probs[: n - 1].sum() < p + 1e-5
    assert n == (min(k, len(values)) if k else len(values)) or probs[:n].sum() >= p - 1e-5


@given(values=logits_st, t=st.floats(0.05, 5.0))
def test_sampling_log_probs_normalised(values, t):
    lp = sampling_log_probs(torch.tensor([values]), SamplingConfig(temperature=t, top_p=0.8))
    assert abs(lp.exp().sum().item() - 1.0) < 1e-4


@given(mask=st.lists(st.booleans(), min_size=1, max_size=30))
def test_positions_count_real_tokens(mask):
    m = torch.tensor([mask])
    pos = positions_from_mask(m)[0]
    real = [i for i, b in enumerate(mask) if b]
    assert pos[real].tolist() == list(range(len(real)))


def test_draw_matches_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logp = probs.log().expand(20000, 5).contiguous()
    gen = torch.Generator().manual_seed(0)
    draws = draw(logp, SamplingConfig(), gen)
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert freq[4] == 0
    assert torch.allclose(freq, probs, atol=0.015), freq


@given(lengths=st.lists(st.integers(1, 300), max_size=40), rows=st.integers(1, 8), cap=st.integers(1, 2000))
def test_batch_chunks_cover_in_order_within_limits(lengths, rows, cap):
    lengths = sorted(lengths, reverse=True)
    chunks = batch_chunks(lengths, rows, cap)
    assert [i for c in chunks for i in c] == list(range(len(lengths)))
    for c in chunks:
        assert 1 <= len(c) <= rows
        assert len(c) == 1 or len(c) * lengths[c[0]] <= cap


@pytest.mark.timeout(60)
def test_token_capped_batches_give_the_same_tokens(tokenizer):
    prompts = random_prompts(6, lo=10, hi=60, seed=19)
    wide = TransformersPolicy(cached_tiny("qwen3_moe"), tokenizer, temperature=0.0).generate(prompts, 5)
    narrow = TransformersPolicy(cached_tiny("qwen3_moe"), tokenizer, temperature=0.0,
                                max_batch_tokens=80).generate(prompts, 5)
    assert [g.token_ids for g in wide] == [g.token_ids for g in narrow]
