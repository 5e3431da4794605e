"""Generalised advantage estimation over token streams, and across the traces of a rollout.

The maths is the reverse linear recurrence of GAE (Schulman et al., 2016)::

    delta_t = r_t + gamma * (1 - terminated_t) * V_next_t - V_t
    A_t     = delta_t + c_t * A_{t+1},      c_t = gamma * lambda_t * (1 - done_t)

with ``V_next_t = V_{t+1}`` inside an episode and ``next_value_t`` at an episode boundary that was
cut short. :func:`gae` solves it over time-ordered streams; :func:`trace_gae` turns a trace batch
(one row per trace, policy tokens are the time steps) into such a stream and writes the result back.

The solver is a blocked scan with a handful of torch calls per level, exact for any
``gamma * lambda`` including 1 (no division, no cancellation of prefix sums): the stream is cut
into blocks of ``_BLOCK`` steps; within a block the recurrence is a product with a fixed upper
triangular matrix of powers of ``gamma * lambda`` (one GEMM for the whole stream); blocks that
contain an episode boundary are solved with that matrix masked to their segments (one batched
GEMM); the values at the block starts form a recurrence ``_BLOCK`` times shorter, solved the same
way, and each block's carry is folded into its last step before the GEMM. Streams of at most
``_SCALAR_MAX`` steps (also the short carry streams of deeper levels) take a float64 scalar loop.
Per-token lambda takes a log-step scan within every block.

Threads: :func:`gae` and :func:`trace_gae` run with :data:`THREADS` intra-op threads (one by default)
and restore the caller's setting after. The scan is a chain of short, memory-bound torch calls; with
several threads each call waits for its workers to wake, which on a machine whose other cores are
busy costs more than the work (measured on two shared cores with one CPU burner: 1.9e7 tokens/s with
torch's two threads vs 1.9e8 with one at 1e6 tokens, 2.8e6 vs 8.1e7 at 1e5;
``benchmarks/gae_bench.py --threads-table``, ``benchmarks/results/gae_threads.md``).
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import torch
from tensordict import TensorDictBase

__all__ = ["gae", "gae_loop", "trace_gae", "length_adaptive_lambda", "THREADS"]

THREADS: int | None = 1
"""Intra-op threads :func:`gae` and :func:`trace_gae` run with (``None``: the caller's torch setting).

One by default: the scan never gains enough from more threads to pay for waking them on a busy
machine (see the module docstring). ``torch.set_num_threads`` is per calling thread with OpenMP, so
this does not slow other threads of the process."""


def _with_threads(fn):
    """Run ``fn`` with :data:`THREADS` intra-op threads, restoring the caller's number after."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        before = torch.get_num_threads()
        if THREADS is None or before <= THREADS:
            return fn(*args, **kwargs)
        torch.set_num_threads(THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return run

_BLOCK = 32
"""Steps per block. 32 balances the GEMM's K (work per token) against the number of levels."""

_SCALAR_MAX = 512
"""Streams (or carry streams) up to this length are solved by a float64 loop over Python floats:
below it every torch call (~5 us) costs more than the steps it would save."""

_GRAIN = 1 << 15
"""torch's parallel grain size: ops on fewer elements run on the calling thread. A multi-threaded
op on small data mostly waits for its worker threads to wake up (milliseconds on a busy machine),
so small work stays below it: streams of ``_BLOCK**2`` to ``_GRAIN / 2`` steps take the log-step
scan, and small block products are broadcast-multiply-sums instead of BLAS calls."""


def _small_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` (``x [..., M, K]``, ``w [..., K, J]``), without BLAS threads when small: a few
    broadcast-multiply-sums over row chunks whose products stay below the grain size."""
    per_row = x.shape[-1] * w.shape[-1] * (x.numel() // max(x.shape[-2] * x.shape[-1], 1))
    rows = max((_GRAIN - 1) // max(per_row, 1), 1)
    if x.shape[-2] > 4 * rows:
        return x @ w
    w = w.unsqueeze(-3)
    parts = [(c.unsqueeze(-1) * w).sum(-2) for c in x.split(rows, dim=-2)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, -2)


def _scalar_scan(x: torch.Tensor, coef: list[float]) -> torch.Tensor:
    out, acc = x.tolist(), 0.0
    for t in range(len(out) - 1, -1, -1):
        acc = out[t] + coef[t] * acc
        out[t] = acc
    return torch.tensor(out, dtype=x.dtype, device=x.device)


def _host_nonzero(mask: torch.Tensor) -> np.ndarray:
    """Indices of the true entries of a flattened bool tensor, on the host (numpy: ~8x torch on CPU)."""
    flat = mask.reshape(-1)
    if flat.device.type != "cpu":
        return torch.nonzero(flat).squeeze(1).cpu().numpy()
    return np.flatnonzero(flat.numpy())


def _doubling(x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``A_t = x_t + c_t A_{t+1}`` inside every row of ``[R, K]`` (``A_K = 0``) by log-step scan.

    Returns ``A`` and ``G`` with ``G_t = prod_{u=t}^{K-1} c_u``, the weight of what follows the row.
    Exact for any coefficients: products only shrink towards zero, nothing is divided. Rows are
    padded on the right (A with 0, G with 1) so that every step is two ops on fixed views.
    """
    rows, k = x.shape
    a = [torch.zeros((rows, 2 * k), dtype=x.dtype, device=x.device) for _ in range(2)]
    g = [torch.ones((rows, 2 * k), dtype=x.dtype, device=x.device) for _ in range(2)]
    a_head, g_head = [t.narrow(1, 0, k) for t in a], [t.narrow(1, 0, k) for t in g]
    a_head[0].copy_(x)
    g_head[0].copy_(c)
    d, cur = 1, 0
    while d < k:
        nxt = 1 - cur
        torch.addcmul(a_head[cur], g_head[cur], a[cur].narrow(1, d, k), out=a_head[nxt])
        torch.mul(g_head[cur], g[cur].narrow(1, d, k), out=g_head[nxt])
        d, cur = 2 * d, nxt
    return a_head[cur].contiguous(), g_head[cur]


def _pad_blocks(x: torch.Tensor, k: int = _BLOCK) -> torch.Tensor:
    rest = x.numel() % k
    if rest:
        x = torch.nn.functional.pad(x, (0, k - rest))
    return x.view(-1, k)


@functools.lru_cache(maxsize=256)
def _geometric(g: float, k: int, dtype: torch.dtype, device: str):
    """``w[s, t] = g^(s-t)`` for ``s >= t`` (one block of the recurrence as a matrix), its first
    column, and ``tail[t] = g^(k-t)`` (the weight of the next block's start at step ``t``).

    Powers are taken in float64 and rounded once, so ``g^k`` underflowing is harmless.
    """
    steps = torch.arange(k + 1, dtype=torch.float64)
    lag = steps[:, None] - steps[None, :]
    w = torch.where(lag >= 0, torch.tensor(g, dtype=torch.float64) ** lag.clamp(min=0), 0.0)
    w = w.to(dtype=dtype, device=device)
    return w[:k, :k].contiguous(), w[:k, 0].contiguous(), w[k, :k].contiguous()


_SEGMENT_SOLVE_MAX = 1 << 21
"""Most ``rows * K * K`` entries the masked-matrix solve of blocks with resets may build at once;
beyond, the log-step scan (more torch calls, no K*K memory) takes over."""


def _reset_blocks(x: torch.Tensor, g: float, reset: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact local solution and carry weight of blocks ``x [R, K]`` with resets (``reset [R, K]`` bool).

    Inside a block, step ``s`` reaches step ``t <= s`` iff no reset lies in ``[t, s-1]``, i.e. both
    have the same count of earlier resets: a masked copy of the block matrix, one batched GEMM.
    """
    rows, k = reset.shape
    w, _, tail = _geometric(g, k, x.dtype, str(x.device))
    if rows * k * k > _SEGMENT_SOLVE_MAX:
        return _doubling(x, torch.from_numpy(np.where(reset, 0.0, g)).to(x.device, x.dtype))
    before = np.concatenate([np.zeros((rows, 1), dtype=np.int64), np.cumsum(reset, 1)], 1)
    same = torch.from_numpy(before[:, :k, None] == before[:, None, :k]).to(x.device)
    local = _small_matmul(x[:, None, :], w * same).squeeze(1)
    open_tail = torch.from_numpy(before[:, :k] == before[:, k:]).to(x.device)
    return local, tail * open_tail


def _const_scan(x: torch.Tensor, g: float, resets: np.ndarray) -> torch.Tensor:
    """Solve ``A_t = x_t + c_t A_{t+1}`` over a 1-D stream with ``c_t = g`` except 0 at ``resets``.

    ``x`` may be overwritten (the last step of each block absorbs that block's carry).
    """
    n, dev = x.numel(), x.device
    k = _BLOCK // 2 if n * _BLOCK // 2 < _GRAIN else _BLOCK  # one serial block product when small
    if n <= _SCALAR_MAX:
        coef = [g] * n
        for t in resets.tolist():
            if t < n:
                coef[t] = 0.0
        return _scalar_scan(x, coef)
    if _BLOCK * _BLOCK < n and 2 * n < _GRAIN:  # padded [n/K, 2K] scan buffers stay below the grain
        coef = torch.full((n,), g, dtype=torch.float64, device=dev)
        coef[torch.from_numpy(resets).to(dev)] = 0.0
        return _general_scan(x.to(torch.float64), coef).to(x.dtype)
    xb = _pad_blocks(x, k)
    w, first_col, _ = _geometric(g, k, x.dtype, str(dev))
    # The stream's own end needs no reset (only zero padding follows) and would force a re-solve.
    blk, off = np.divmod(resets[resets < n - 1], k)
    rows_np = np.unique(blk[off < k - 1])  # a reset at a block's last step only cuts the carry
    local = None
    if rows_np.size:
        row_of = np.searchsorted(rows_np, blk).clip(max=rows_np.size - 1)
        mine = rows_np[row_of] == blk  # every reset of these rows, the block-end ones included
        reset = np.zeros((rows_np.size, k), dtype=bool)
        reset[row_of[mine], off[mine]] = True
        rows = torch.from_numpy(rows_np).to(dev)
        local, weight = _reset_blocks(xb[rows], g, reset)
    carry = None
    if xb.shape[0] > 1:
        first = (xb * first_col).sum(-1) if xb.numel() < _GRAIN else xb @ first_col
        if local is not None:
            first[rows] = local[:, 0]
        cut_rows = np.unique(blk)
        # carries are n/K long: float64 there costs little and keeps long sums exact
        starts = _const_scan(first.to(torch.float64), g**k, cut_rows).to(x.dtype)
        carry = torch.nn.functional.pad(starts[1:], (0, 1))
        clean = carry.index_fill(0, torch.from_numpy(cut_rows).to(dev), 0.0) if cut_rows.size else carry
        # g * carry folded into a block's last step makes the GEMM add g^(K-t) * carry at every t.
        xb[:, -1].add_(clean, alpha=g)
    a = _small_matmul(xb, w)
    if local is not None:
        a[rows] = local if carry is None else torch.addcmul(local, weight, carry[rows, None])
    return a.view(-1)[:n]


def _general_scan(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Solve ``A_t = x_t + c_t A_{t+1}`` over a 1-D stream with per-step coefficients ``c``.

    Callers pass float64: products of thousands of coefficients rounded to float32 would be off by
    thousands of ulps (the GEMM path instead rounds each power of ``g`` once).
    """
    n = x.numel()
    if n <= _SCALAR_MAX:
        return _scalar_scan(x, c.tolist())
    a, g = _doubling(_pad_blocks(x), _pad_blocks(c))
    if a.shape[0] == 1:
        return a.view(-1)[:n]
    starts = _general_scan(a[:, 0].contiguous(), g[:, 0].contiguous())
    carry = torch.nn.functional.pad(starts[1:], (0, 1))
    a.addcmul_(g, carry[:, None])
    return a.view(-1)[:n]


def _check_unit(name: str, x: float | torch.Tensor) -> None:
    lo, hi = (float(x), float(x)) if not isinstance(x, torch.Tensor) else map(float, torch.aminmax(x))
    if not (0.0 <= lo and hi <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got values in [{lo}, {hi}]")


def _validate(reward, value, done, terminated, next_value, lmbda) -> None:
    shape = value.shape
    if value.dim() == 0 or shape[-1] == 0:
        raise ValueError(f"value must have a non-empty time dimension last, got shape {tuple(shape)}")
    if not value.is_floating_point():
        raise ValueError(f"value must be a floating tensor, got {value.dtype}")
    named = {"reward": reward, "done": done, "terminated": terminated, "next_value": next_value}
    for name, t in named.items():
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like value")
    for name in ("done", "terminated"):
        t = named[name]
        if t is not None and t.dtype != torch.bool:
            raise ValueError(f"{name} must be a bool tensor, got {t.dtype}")
    if isinstance(lmbda, torch.Tensor):
        try:
            torch.broadcast_shapes(lmbda.shape, shape)
        except RuntimeError as err:
            raise ValueError(
                f"lmbda of shape {tuple(lmbda.shape)} does not broadcast to {tuple(shape)}"
            ) from err
    if terminated is not None and bool((terminated & ~done).any()):
        raise ValueError("terminated must imply done (a terminated step ends its episode)")


@_with_threads
def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lmbda: float | torch.Tensor,
    terminated: torch.Tensor | None = None,
    next_value: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates over time-ordered streams (time last: ``[T]`` or ``[*B, T]``).

    Within an episode the next value of step ``t`` is ``value[t+1]``. A step with ``done`` ends its
    episode (several episodes may follow each other in a stream): its next value is 0 when it is
    ``terminated`` (default: every done step is) and ``next_value[t]`` when it was cut short. The
    last step of every stream is a boundary too: when it is not terminated it bootstraps from
    ``next_value[..., -1]``. ``next_value`` is required exactly when some boundary is not terminated.

    ``lmbda`` is a float or a tensor broadcastable to the streams (per-token lambda, e.g.
    :func:`length_adaptive_lambda`); ``gamma`` a float. Both must lie in [0, 1].
    Returns ``(advantage, value_target)`` with ``value_target = advantage + value``.
    Equals TorchRL's ``generalized_advantage_estimate`` on the same streams; O(T) time and memory.
    """
    _validate(reward, value, done, terminated, next_value, lmbda)
    _check_unit("gamma", gamma)
    _check_unit("lmbda", lmbda)
    gamma = float(gamma)
    shape, t_len = value.shape, value.shape[-1]
    dtype = torch.promote_types(torch.promote_types(value.dtype, reward.dtype), torch.float32)
    reward, value = reward.reshape(-1, t_len).to(dtype), value.reshape(-1, t_len).to(dtype)
    done = done.reshape(-1, t_len)
    term = done if terminated is None else terminated.reshape(-1, t_len)
    rows = value.shape[0]
    # Rows are left-padded to whole blocks so that every row ends on a block's last step: its end
    # then only cuts a carry and never forces an exact re-solve of a block.
    width = -(-t_len // _BLOCK) * _BLOCK
    pad = width - t_len
    buf = torch.empty((rows, width), dtype=dtype, device=value.device)
    if pad:
        buf[:, :pad] = 0.0
    delta = buf[:, pad:]
    torch.sub(reward, value, out=delta)
    delta[:, :-1].add_(value[:, 1:], alpha=gamma)
    ends = _host_nonzero(done[:, :-1]) if t_len > 1 else np.zeros(0, dtype=np.int64)
    end_row, end_t = np.divmod(ends, max(t_len - 1, 1))
    _fix_boundaries(delta, reward, value, term, next_value, gamma, end_row, end_t)
    resets = np.concatenate([end_row * width + pad + end_t, np.arange(1, rows + 1) * width - 1])
    if isinstance(lmbda, torch.Tensor):
        coef = torch.zeros((rows, width), dtype=torch.float64, device=value.device)
        coef[:, pad:] = gamma * lmbda.to(torch.float64).expand(shape).reshape(-1, t_len)
        coef.view(-1)[torch.from_numpy(resets).to(value.device)] = 0.0
        adv = _general_scan(buf.view(-1).to(torch.float64), coef.view(-1)).to(dtype)
    else:
        adv = _const_scan(buf.view(-1), gamma * float(lmbda), resets)
    adv = adv.view(rows, width)[:, pad:]
    target = torch.add(adv, value, out=delta)  # delta is spent: its memory takes the value target
    return adv.reshape(shape), target.reshape(shape)


def _fix_boundaries(delta, reward, value, term, next_value, gamma, r, t) -> None:
    """Rewrite delta at episode ends: no ``value[t+1]`` there, but 0 or ``next_value[t]``."""
    t_len = value.shape[-1]
    nv = None if next_value is None else next_value.reshape(-1, t_len).to(value.dtype)
    if r.size:
        r, t = torch.from_numpy(r).to(value.device), torch.from_numpy(t).to(value.device)
        fixed = reward[r, t] - value[r, t]
        open_end = ~term[r, t]
        if bool(open_end.any()):
            if nv is None:
                raise ValueError("next_value is required: some done steps are not terminated (truncated)")
            fixed = fixed + gamma * torch.where(open_end, nv[r, t], torch.zeros_like(fixed))
        delta[r, t] = fixed
    open_last = ~term[:, -1]
    if bool(open_last.any()):
        if nv is None:
            raise ValueError(
                "next_value is required: the last step of a stream is not terminated, so it bootstraps "
                "from next_value[..., -1]"
            )
        delta[:, -1] += gamma * torch.where(open_last, nv[:, -1], torch.zeros_like(nv[:, -1]))


def gae_loop(
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lmbda: float | torch.Tensor,
    terminated: torch.Tensor | None = None,
    next_value: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition of :func:`gae` as a plain per-step loop in float64 (a reference; slow)."""
    _validate(reward, value, done, terminated, next_value, lmbda)
    shape, t_len = value.shape, value.shape[-1]
    f64 = torch.float64
    r, v = reward.reshape(-1, t_len).to(f64), value.reshape(-1, t_len).to(f64)
    d = done.reshape(-1, t_len)
    term = d if terminated is None else terminated.reshape(-1, t_len)
    nv = torch.zeros_like(v) if next_value is None else next_value.reshape(-1, t_len).to(f64)
    lam = torch.as_tensor(lmbda, dtype=f64).expand(shape).reshape(-1, t_len)
    adv = torch.zeros_like(v)
    nxt = torch.zeros(v.shape[0], dtype=f64)
    for t in reversed(range(t_len)):
        boundary = d[:, t] | (t == t_len - 1)
        if next_value is None and bool((boundary & ~term[:, t]).any()):
            raise ValueError("next_value is required: some boundary is not terminated")
        v_next = torch.where(boundary, nv[:, t], v[:, min(t + 1, t_len - 1)])
        delta = r[:, t] + gamma * (~term[:, t]).to(f64) * v_next - v[:, t]
        nxt = delta + gamma * lam[:, t] * (~boundary).to(f64) * nxt
        adv[:, t] = nxt
    return adv.reshape(shape), (adv + v).reshape(shape)


def length_adaptive_lambda(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """``lambda = 1 - 1 / (alpha * length)``, clipped to [0, 1] (VAPO's length-adaptive GAE)."""
    if not alpha > 0:
        raise ValueError(f"length_adaptive_alpha must be > 0, got {alpha}")
    return (1.0 - 1.0 / (alpha * length.clamp(min=1).to(torch.float64))).clamp(0.0, 1.0)


Boundary = Literal["bootstrap", "cut"]
Truncation = Literal["bootstrap_last", "terminal"]
CutReward = Literal["episode", "trace"]


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _episode_order(batch: TensorDictBase) -> np.ndarray:
    """Rows sorted by (episode_id, trace_index); every episode must be whole: traces 0..num_traces-1."""
    ep = batch["episode_id"].cpu().numpy()
    ti = batch["trace_index"].cpu().numpy()
    order = np.lexsort((ti, ep))
    ep_s, ti_s = ep[order], ti[order]
    starts = np.r_[True, ep_s[1:] != ep_s[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(ep_s.size), 0))
    expected = np.arange(ep_s.size) - first
    bad = ti_s != expected
    if "num_traces" in batch.keys():
        sizes = np.diff(np.r_[np.flatnonzero(starts), ep_s.size])
        bad |= batch["num_traces"].cpu().numpy()[order] != np.repeat(sizes, sizes)
    if bad.any():
        episode = int(ep_s[np.argmax(bad)])
        raise ValueError(
            f"episode {episode} is not whole in the batch: its rows must carry trace_index 0..num_traces-1 "
            f"exactly once (got trace indices {sorted(ti[ep == episode].tolist())})"
        )
    return order


def _require(batch: TensorDictBase, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in batch.keys()]
    if missing:
        raise ValueError(f"trace batch lacks {missing}; it has {sorted(batch.keys())}")


@_with_threads
def trace_gae(
    batch: TensorDictBase,
    *,
    gamma: float,
    lmbda: float | None = None,
    boundary: Boundary = "bootstrap",
    length_adaptive_alpha: float | None = None,
    truncation: Truncation = "terminal",
    value_lmbda: float | None = None,
    cut_reward: CutReward = "episode",
) -> TensorDictBase:
    """Write ``advantage`` and ``value_target`` ([N, L] float32, 0 off policy tokens) into a trace batch.

    Time steps are the policy tokens; an episode is its traces in ``trace_index`` order, each in
    position order. The batch needs ``value`` (the critic's value at each policy token) besides the
    keys of :func:`compactrl.collectors.batch.stack_traces`, and must hold whole episodes.

    * ``boundary="bootstrap"``: one stream per episode, ``done`` only at its last policy token, so
      the last token of a summary takes the next trace's first policy-token value as next value.
    * ``boundary="cut"``: every trace is an episode of its own. With ``cut_reward="episode"`` (what
      other frameworks do) the rollout's ``episode_reward`` sits on the last policy token of every
      trace and the per-token rewards are ignored; ``cut_reward="trace"`` keeps each trace's own rewards.
    * An episode that was not ``terminated`` has no next state to value. ``truncation="bootstrap_last"``
      bootstraps its end from its own last value (``delta = r + (gamma - 1) V_last``);
      ``"terminal"`` (default, as ``RLConfig.truncation``) treats the end as terminal, right when
      the limit is part of the task.
    * Exactly one of ``lmbda`` and ``length_adaptive_alpha``: the latter sets, per stream,
      ``lambda = 1 - 1/(alpha * n)`` with ``n`` the policy tokens of the episode (bootstrap) or of the
      trace (cut). ``value_lmbda`` decouples the critic's target (e.g. 1.0, as in VAPO) from the
      advantage's lambda; by default both use the same.
    """
    _choice("boundary", boundary, ("bootstrap", "cut"))
    _choice("truncation", truncation, ("bootstrap_last", "terminal"))
    _choice("cut_reward", cut_reward, ("episode", "trace"))
    if (lmbda is None) == (length_adaptive_alpha is None):
        raise ValueError(
            f"give exactly one of lmbda and length_adaptive_alpha, got lmbda={lmbda}, "
            f"length_adaptive_alpha={length_adaptive_alpha}"
        )
    _require(batch, ("value", "reward", "policy_mask", "episode_id", "trace_index", "terminated"))
    if boundary == "cut" and cut_reward == "episode":
        _require(batch, ("episode_reward",))
    value = batch["value"]
    n_rows, width = value.shape
    order = _episode_order(batch)
    row_s, col = np.divmod(
        _host_nonzero(batch["policy_mask"][torch.from_numpy(order).to(value.device)]), width
    )
    tok_row = order[row_s]  # original row of every policy token, in episode time order
    where = torch.from_numpy(tok_row * width + col).to(value.device)
    advantage = torch.zeros(n_rows * width, dtype=torch.float32, device=value.device)
    target = torch.zeros_like(advantage)
    if where.numel():
        adv, vt = _stream_gae(
            batch,
            where,
            tok_row,
            row_s,
            boundary=boundary,
            gamma=gamma,
            lmbda=lmbda,
            alpha=length_adaptive_alpha,
            truncation=truncation,
            value_lmbda=value_lmbda,
            cut_reward=cut_reward,
        )
        advantage[where], target[where] = adv, vt
    batch.set("advantage", advantage.view(n_rows, width))
    batch.set("value_target", target.view(n_rows, width))
    return batch


def _stream_gae(
    batch, where, tok_row, row_s, *, boundary, gamma, lmbda, alpha, truncation, value_lmbda, cut_reward
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the time-ordered policy tokens of a whole trace batch, as one stream."""
    dev = where.device
    value = batch["value"].reshape(-1)[where].float()
    reward = batch["reward"].reshape(-1)[where].float()
    episode = batch["episode_id"].cpu().numpy()[tok_row]
    trace_end = np.r_[row_s[1:] != row_s[:-1], True]
    episode_end = np.r_[episode[1:] != episode[:-1], True]
    open_end = episode_end & ~batch["terminated"].cpu().numpy()[tok_row]
    if truncation == "terminal":
        open_end[:] = False
    done = episode_end if boundary == "bootstrap" else trace_end
    if boundary == "cut" and cut_reward == "episode":
        ends = np.flatnonzero(trace_end)
        reward = torch.zeros_like(reward)
        reward[torch.from_numpy(ends).to(dev)] = batch["episode_reward"].float()[
            torch.from_numpy(tok_row[ends]).to(dev)
        ]
    lam: float | torch.Tensor
    if alpha is not None:
        segment = np.r_[0, np.cumsum(done[:-1])]
        length = torch.from_numpy(np.bincount(segment)[segment])
        lam = length_adaptive_lambda(length, alpha).to(dev)
    else:
        lam = float(lmbda)
    done_t, term_t = torch.from_numpy(done).to(dev), torch.from_numpy(done & ~open_end).to(dev)
    # next_value is read only at open ends, where it is the token's own value (bootstrap_last).
    kwargs = dict(gamma=gamma, terminated=term_t, next_value=value)
    adv, vt = gae(reward, value, done_t, lmbda=lam, **kwargs)
    if value_lmbda is not None:
        vt = gae(reward, value, done_t, lmbda=value_lmbda, **kwargs)[1]
    return adv, vt
