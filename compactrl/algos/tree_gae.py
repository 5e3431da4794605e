"""GAE over trace *trees*: episodes whose agent spawned sub-agents.

A black-box session (:mod:`compactrl.gateway.traces`) is a tree: each agent's traces form a chain
(``prev_trace``: the trace a compaction replaced), and a sub-agent's first trace hangs off its
``parent_trace`` at ``spawn_position`` (the last token of the response that started it).

Semantics (``boundary="bootstrap"``). One time-ordered stream per episode, as in
:func:`~compactrl.algos.gae.trace_gae`, where time is the order in which a blocking sub-agent runs:

* within an agent: its traces in chain order, each in position order (compaction boundaries
  bootstrap exactly as in ``trace_gae``);
* a child's whole subtree runs right after its spawn token and before the parent's next policy
  token; children spawned at the same token run in ``trace_index`` order (first call first).

So the next value of the spawn token is the value of the child's first policy token, and the next
value of the child's last token is the value of the parent's next policy token: the child's outcome
(its rewards, and what the parent achieves with its result) flows back into the spawn point's
advantage, and the child is credited by how the parent does after it returns. ``done`` is set only
at the episode's last step. For a tree without children this is ``trace_gae`` with
``boundary="bootstrap"`` exactly (tested), and with ``gamma = lambda = 1`` every token's advantage
is the episode's reward-to-go minus its value, as in any GAE. ``boundary="cut"`` has no tree
semantics (every trace alone) and is ``trace_gae``'s.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from tensordict import TensorDictBase

from compactrl.algos.gae import gae, length_adaptive_lambda, trace_gae

TREE_KEYS = ("parent_trace", "spawn_position", "prev_trace")


def _episode_rows(batch: TensorDictBase) -> dict[int, dict[int, int]]:
    ep, ti = batch["episode_id"].tolist(), batch["trace_index"].tolist()
    rows: dict[int, dict[int, int]] = {}
    for r, (e, t) in enumerate(zip(ep, ti)):
        if t in rows.setdefault(e, {}):
            raise ValueError(f"episode {e} has trace_index {t} twice")
        rows[e][t] = r
    return rows


def tree_order(batch: TensorDictBase) -> list[tuple[int, int]]:
    """``(row, position)`` of every policy token, episode after episode, in the order above."""
    policy = batch["policy_mask"].cpu().numpy()
    parent, spawn, prev = (batch[k].tolist() for k in TREE_KEYS)
    order: list[tuple[int, int]] = []
    for e, by_index in sorted(_episode_rows(batch).items()):
        nxt, children, roots = {}, {}, []
        for t, r in sorted(by_index.items()):
            if prev[r] >= 0:
                nxt[by_index[prev[r]]] = r
            elif parent[r] >= 0:
                children.setdefault(by_index[parent[r]], []).append((spawn[r], t, r))
            else:
                roots.append(r)
        if len(roots) != 1:
            raise ValueError(f"episode {e} must have exactly one root trace (no parent, no prev), got {len(roots)}")
        # an explicit stack of per-trace event streams: chains and sub-agent depth never recurse
        stack = [_events(roots[0], nxt, children, policy)]
        while stack:
            kind, x = next(stack[-1], ("end", None))
            if kind == "end":
                stack.pop()
            elif kind == "token":
                order.append(x)
            else:
                stack.append(_events(x, nxt, children, policy))
    return order


def _events(row: int, nxt: dict, children: dict, policy: np.ndarray):
    """A trace's policy tokens, each child trace right after the token it was spawned at (a child
    spawned before any policy token first), then the trace that continues this one."""
    pos = np.flatnonzero(policy[row]).tolist()
    after: dict[int, list[int]] = {}
    for s, _t, child in sorted(children.get(row, [])):
        after.setdefault(bisect.bisect_right(pos, s), []).append(child)
    yield from (("trace", c) for c in after.get(0, []))
    for i, p in enumerate(pos):
        yield "token", (row, p)
        yield from (("trace", c) for c in after.get(i + 1, []))
    if row in nxt:
        yield "trace", nxt[row]


def tree_gae(batch: TensorDictBase, *, gamma: float, lmbda: float | None = None, boundary: str = "bootstrap",
             length_adaptive_alpha: float | None = None, value_lmbda: float | None = None,
             truncation: str = "bootstrap_last", **cut_kwargs) -> TensorDictBase:
    """Write ``advantage`` and ``value_target`` into a trace batch whose episodes may be trees.

    Arguments as :func:`~compactrl.algos.gae.trace_gae`; a batch without the tree keys, or with
    ``boundary="cut"``, is passed to it unchanged.
    """
    if boundary == "cut" or any(k not in batch.keys() for k in TREE_KEYS):
        return trace_gae(batch, gamma=gamma, lmbda=lmbda, boundary=boundary, value_lmbda=value_lmbda,
                         length_adaptive_alpha=length_adaptive_alpha, truncation=truncation, **cut_kwargs)
    if boundary != "bootstrap":
        raise ValueError(f"boundary must be one of ('bootstrap', 'cut'), got {boundary!r}")
    if truncation not in ("bootstrap_last", "terminal"):
        raise ValueError(f"truncation must be one of ('bootstrap_last', 'terminal'), got {truncation!r}")
    if (lmbda is None) == (length_adaptive_alpha is None):
        raise ValueError(f"give exactly one of lmbda and length_adaptive_alpha, got lmbda={lmbda}, "
                         f"length_adaptive_alpha={length_adaptive_alpha}")
    value = batch["value"]
    n_rows, width = value.shape
    order = tree_order(batch)
    advantage = torch.zeros(n_rows * width, dtype=torch.float32, device=value.device)
    target = torch.zeros_like(advantage)
    if order:
        rows = np.array([r for r, _ in order])
        where = torch.from_numpy(rows * width + np.array([p for _, p in order])).to(value.device)
        episode = batch["episode_id"].cpu().numpy()[rows]
        done = np.r_[episode[1:] != episode[:-1], True]
        open_end = done & ~batch["terminated"].cpu().numpy()[rows] & (truncation == "bootstrap_last")
        v = value.reshape(-1)[where].float()
        r = batch["reward"].reshape(-1)[where].float()
        if length_adaptive_alpha is not None:
            segment = np.r_[0, np.cumsum(done[:-1])]
            lam = length_adaptive_lambda(torch.from_numpy(np.bincount(segment)[segment]), length_adaptive_alpha)
        else:
            lam = float(lmbda)
        kw = dict(gamma=gamma, terminated=torch.from_numpy(done & ~open_end), next_value=v)
        adv, vt = gae(r, v, torch.from_numpy(done), lmbda=lam, **kw)
        if value_lmbda is not None:
            vt = gae(r, v, torch.from_numpy(done), lmbda=value_lmbda, **kw)[1]
        advantage[where], target[where] = adv.float(), vt.float()
    batch.set("advantage", advantage.view(n_rows, width))
    batch.set("value_target", target.view(n_rows, width))
    return batch
