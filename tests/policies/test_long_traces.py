"""Long traces: log-probs and entropy in chunks, activation checkpointing (same values and gradients), and a
long trace's peak memory dropping with them, measured by counting every tensor the ops allocate."""

import copy
import dataclasses
import weakref

import pytest
import torch
from policy_helpers import cached_tiny, random_prompts, right_padded
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from compactrl.policies.critic import ValueModel
from compactrl.policies.sampling import SamplingConfig
from compactrl.policies.transformers_policy import TransformersPolicy, shift_token_log_probs

SAMPLINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=20), dict(temperature=1.3, top_p=0.9)]
CHUNKS = [1, 7, 16, 1000]  # 7 and 16 divide no row count here; 1000 is wider than the batch


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage that ops allocated and that are still alive, and the peak of it.

    Deterministic (it counts allocations, not the allocator's or the OS's view), so the same code gives
    the same figure on any CPU. A storage is freed when the tensor that brought it dies; autograd's saved
    tensors keep theirs alive, so what the backward needs is counted.
    """

    def __init__(self, vocab: int = 0):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0
        self.vocab, self.widest_rows = vocab, 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            if self.vocab and t.dim() >= 1 and t.shape[-1] == self.vocab:
                self.widest_rows = max(self.widest_rows, t.numel() // self.vocab)
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size and key not in self.live:
                self.live[key] = size
                self.now += size
                self.peak = max(self.peak, self.now)
                weakref.finalize(t, self._free, key)
        return out


def _batch(seed: int = 5):
    return right_padded(random_prompts(3, lo=12, hi=40, seed=seed))  # unequal lengths: right padding


def _policy(tokenizer, arch: str = "glm4_moe", **kwargs) -> TransformersPolicy:
    return TransformersPolicy(copy.deepcopy(cached_tiny(arch, hidden_size=64)), tokenizer, **kwargs)


def _values_and_grads(policy, tokens, mask, select=None, **kw):
    policy.model.zero_grad(set_to_none=True)
    lp, ent = policy.log_prob(tokens, mask, select, **kw)
    weights = torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)  # unequal weights: every position counts
    ((lp * weights).sum() + 0.3 * (ent * weights).sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


def _assert_same(a, b, atol=2e-5):
    lp_a, ent_a, grads_a = a
    lp_b, ent_b, grads_b = b
    assert torch.allclose(lp_a, lp_b, atol=atol, rtol=1e-5)
    assert torch.allclose(ent_a, ent_b, atol=atol, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, g in grads_a.items():
        scale = g.abs().max().clamp(min=1e-6)
        assert (g - grads_b[name]).abs().max() <= 1e-4 * scale + 1e-7, name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["plain", "temp-topk", "temp-topp"])
@pytest.mark.parametrize("with_select", [False, True], ids=["all", "select"])
def test_chunked_log_probs_and_entropies_equal_unchunked(tokenizer, sampling, with_select):
    tokens, mask = _batch()
    select = None
    if with_select:  # a policy-token-like share of the positions, some of them on padding
        select = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(1)) < 0.4
    policy = _policy(tokenizer, **sampling)
    reference = _values_and_grads(policy, tokens, mask, select)
    for chunk in CHUNKS:
        policy.logprob_chunk_tokens = chunk
        got = _values_and_grads(policy, tokens, mask, select)
        _assert_same(reference, got)
        assert torch.all(got[0][~mask] == 0) and torch.all(got[0][:, 0] == 0)
        if select is not None:
            assert torch.all(got[0][~select] == 0) and torch.all(got[1][~select] == 0)


@pytest.mark.timeout(60)
def test_chunked_log_probs_with_overrides_and_without_gradients(tokenizer):
    tokens, mask = _batch(seed=9)
    policy = _policy(tokenizer, temperature=0.8)
    with torch.no_grad():
        ref = policy.log_prob(tokens, mask, temperature=1.2, top_k=50)
        policy.logprob_chunk_tokens = 5
        got = policy.log_prob(tokens, mask, temperature=1.2, top_k=50)
    for a, b in zip(ref, got):
        assert torch.allclose(a, b, atol=2e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_shift_token_log_probs_in_chunks_equal_at_once(chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 21, 50, generator=g, requires_grad=True)
    tokens = torch.randint(0, 50, (3, 21), generator=g)
    mask = torch.ones(3, 21, dtype=torch.long)
    mask[1, 15:] = 0
    sampling = SamplingConfig(temperature=0.9, top_k=10)
    out = []
    for c in (0, chunk):
        logits.grad = None
        lp, ent = shift_token_log_probs(logits, tokens, mask, sampling, c)
        (lp.sum() + ent.sum()).backward()
        out.append((lp.detach(), ent.detach(), logits.grad.clone()))
    for a, b in zip(*out):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.timeout(60)
def test_chunking_off_is_the_full_logits_path_bit_for_bit(tokenizer):
    tokens, mask = _batch()
    policy = _policy(tokenizer)
    lp, ent = policy.log_prob(tokens, mask)
    m = mask.long()
    out = policy.model(input_ids=tokens, attention_mask=m, position_ids=(m.cumsum(-1) - 1).clamp(min=0),
                       use_cache=False)
    ref_lp, ref_ent = shift_token_log_probs(out.logits, tokens, m, policy.sampling)
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent)
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        _policy(tokenizer, logprob_chunk_tokens=-1)


def _checkpointed(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _saved_tensor_count(fn) -> int:
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return count


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_activation_checkpointing_gives_the_same_gradients(tokenizer, arch):
    tokens, mask = _batch()
    select = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(2)) < 0.5
    plain, checkpointed = _policy(tokenizer, arch), _policy(tokenizer, arch, activation_checkpointing=True)
    assert not checkpointed.model.training  # the learner trains in eval mode: checkpointing must engage there
    for chunk in (0, 9):
        plain.logprob_chunk_tokens = checkpointed.logprob_chunk_tokens = chunk
        _assert_same(_values_and_grads(plain, tokens, mask, select), _values_and_grads(checkpointed, tokens, mask, select))
    auxes = []
    for policy in (plain, checkpointed):  # the MoE load-balancing loss is recorded once, not again in the recompute
        policy.model.zero_grad(set_to_none=True)
        lp, _, aux = policy.log_prob(tokens, mask, return_aux_loss=True)
        (lp.sum() + 10 * aux).backward()
        auxes.append((aux.detach(), [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]))
    assert torch.allclose(auxes[0][0], auxes[1][0]) and len(auxes[0][1]) == len(auxes[1][1])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(auxes[0][1], auxes[1][1]))
    # it engaged: the decoder layers kept only their inputs, and every module is back in eval mode
    saved_plain = _saved_tensor_count(lambda: plain.log_prob(tokens, mask))
    saved_ckpt = _saved_tensor_count(lambda: checkpointed.log_prob(tokens, mask))
    assert saved_ckpt < saved_plain / 2
    assert not any(m.training for m in checkpointed.model.modules())


@pytest.mark.timeout(60)
def test_critic_activation_checkpointing_gives_the_same_gradients(tokenizer):
    tokens, mask = _batch()
    policy = _policy(tokenizer)
    critics = [ValueModel.from_policy(policy, head_init_std=0.05, activation_checkpointing=ac) for ac in (False, True)]
    critics[1].load_state_dict(critics[0].state_dict())
    grads = []
    for critic in critics:
        v = critic.value(tokens, mask)
        (v * torch.linspace(-1, 1, v.numel()).view_as(v)).sum().backward()
        grads.append((v.detach(), {n: p.grad for n, p in critic.named_parameters()}))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6)
    for name, g in grads[0][1].items():
        assert torch.allclose(g, grads[1][1][name], atol=1e-6, rtol=1e-4), name
    assert not _checkpointed(policy.model) and _checkpointed(critics[1].trunk)  # the copied trunk is the critic's
    checkpointed_policy = _policy(tokenizer, activation_checkpointing=True)
    assert not _checkpointed(ValueModel.from_policy(checkpointed_policy).trunk)
    assert _checkpointed(checkpointed_policy.model)


def _step_memory(policy, tokens, mask, vocab: int) -> tuple[int, int]:
    policy.model.zero_grad(set_to_none=True)
    with LiveBytes(vocab) as tracked:
        lp, ent = policy.log_prob(tokens, mask)
        (lp.sum() + 0.01 * ent.sum()).backward()
        del lp, ent
    return tracked.peak, tracked.widest_rows


@pytest.mark.timeout(120)
def test_a_long_traces_peak_memory_drops_with_chunks_and_checkpointing(tokenizer):
    vocab, length, chunk = 4096, 2048, 256
    tokens = torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    policy = _policy(tokenizer)
    full_peak, full_rows = _step_memory(policy, tokens, mask, vocab)
    policy.logprob_chunk_tokens = chunk
    chunked_peak, chunked_rows = _step_memory(policy, tokens, mask, vocab)
    logits_bytes = length * vocab * 4
    print(f"peak MiB: full {full_peak / 2**20:.1f}, chunked {chunked_peak / 2**20:.1f}")
    assert full_rows >= length - 1 and chunked_rows <= chunk  # no tensor wider than a chunk of positions
    # the unchunked step keeps several [T, vocab] float tensors (logits, log-softmax, its exp) alive
    assert full_peak > 3 * logits_bytes
    assert chunked_peak < full_peak / 3
    checkpointed = _policy(tokenizer, logprob_chunk_tokens=chunk, activation_checkpointing=True)
    both_peak, _ = _step_memory(checkpointed, tokens, mask, vocab)
    print(f"peak MiB: chunked + checkpointed {both_peak / 2**20:.1f}")
    assert both_peak < 0.75 * chunked_peak  # the decoder layers' activations are no longer all kept


@pytest.mark.timeout(60)
def test_the_learner_config_reaches_the_policy_and_the_critic(tokenizer):
    from compactrl.training.config import preset
    from compactrl.training.rollouts import build_policy
    from compactrl.training.trainer import build_critic

    cfg = preset("smoke")
    cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, logprob_chunk_tokens=128,
                                                               activation_checkpointing=True))
    policy, eval_policy = build_policy(cfg, tokenizer)
    assert policy.logprob_chunk_tokens == 128 and eval_policy.logprob_chunk_tokens == 0
    assert _checkpointed(policy.model)
    if cfg.rl.algo == "ppo":
        assert _checkpointed(build_critic(cfg, policy).trunk)
