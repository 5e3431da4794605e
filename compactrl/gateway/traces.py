"""Recorded sessions -> trace trees -> the trace batch.

Calls are taken in arrival order. Per agent (conversation, see :mod:`compactrl.gateway.app`):

* a call whose prompt ids extend the agent's current trace (its previous prompt + response) continues
  that trace: the new prompt tokens (tool output, the next user turn) are appended as context, the
  sampled ids as policy tokens;
* a call whose prompt does not (the agent compacted, truncated or restarted its context) starts a
  new trace of the same agent, linked to the one it replaces (``prev``);
* the first call of another agent within the session (a sub-agent: a different conversation root)
  starts a *child* trace: its ``parent`` is the current trace of ``X-Parent-Agent-Id`` when given,
  else of the agent that called last, and its ``spawn_position`` the last token of that trace so far
  (the end of the response that spawned it).

With ``n > 1`` the choice a trace continues with is the one the next prompt extends (choice 0 when
none does); the other choices stay in the records only. The session's reward sits on the last
policy token of the root agent's last trace. :func:`sessions_to_batch` stacks the traces with
:func:`~compactrl.collectors.batch.stack_traces` and adds the tree as ``parent_trace``,
``spawn_position`` and ``prev_trace`` ([N] i64, -1 where none), indices being ``trace_index``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from compactrl.collectors.batch import EpisodeMeta, stack_traces
from compactrl.gateway.recording import CallRecord, Session
from compactrl.policies.routing import decode_routes, merge_routes, no_route
from compactrl.types import Trace


@dataclass
class TraceNode:
    """One reconstructed trace and its place in the session's tree."""

    agent: str
    token_ids: list[int] = field(default_factory=list)
    policy_mask: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    """Indices of the calls this trace is made of."""
    policy_versions: list[int] = field(default_factory=list)
    prev: int = -1
    """The trace of the same agent this one replaced (its context was compacted or restarted)."""
    parent: int = -1
    """For an agent's first trace: the trace that spawned it."""
    spawn_position: int = -1
    """Position in ``parent``'s tokens after which the child ran."""
    routed_experts: Any = None
    """MoE routes per position so far (:func:`compactrl.policies.routing.merge_routes`), or None."""

    def extend(self, prompt: Sequence[int], ids: Sequence[int], log_probs: Sequence[float],
               routes: str | None = None) -> None:
        new = list(prompt[len(self.token_ids):])
        self.token_ids += new + list(ids)
        self.policy_mask += [False] * len(new) + [True] * len(ids)
        self.log_probs += [float("nan")] * len(new) + list(log_probs)
        decoded = decode_routes(routes)
        if decoded is not None and len(decoded) == len(prompt) + len(ids):
            self.routed_experts = merge_routes(self.routed_experts, decoded)

    def routes(self) -> Any:
        """``[len(token_ids), layers, k]`` routes (the sentinel where none was recorded), or None."""
        r = self.routed_experts
        if r is None or len(r) == len(self.token_ids):
            return r
        pad = np.full((len(self.token_ids) - len(r), *r.shape[1:]), no_route(r.dtype), dtype=r.dtype)
        return np.concatenate([r, pad])

    def extended_by(self, prompt: Sequence[int]) -> bool:
        n = len(self.token_ids)
        return bool(self.calls) and len(prompt) >= n and list(prompt[:n]) == self.token_ids


def _chosen(calls: list[CallRecord], k: int) -> int:
    """The choice of call ``k`` that the agent's next call extends (0 when none does)."""
    call = calls[k]
    if len(call.choices) == 1:
        return 0
    nxt = next((c for c in calls[k + 1:] if c.agent == call.agent), None)
    for i, ch in enumerate(call.choices):
        seq = call.prompt_ids + ch.token_ids
        if nxt is not None and nxt.prompt_ids[:len(seq)] == seq:
            return i
    return 0


def build_tree(session: Session) -> list[TraceNode]:
    """The traces of one session, in order of their first call (see the module doc)."""
    nodes: list[TraceNode] = []
    current: dict[str, int] = {}  # agent -> its current trace
    last_agent: str | None = None
    calls = sorted(session.calls, key=lambda c: c.index)
    for k, call in enumerate(calls):
        choice = call.choices[_chosen(calls, k)]
        cur = current.get(call.agent)
        if cur is None or not nodes[cur].extended_by(call.prompt_ids):
            node = TraceNode(call.agent)
            if cur is not None:
                node.prev = cur
            elif nodes:
                spawner = call.parent_agent if call.parent_agent in current else last_agent
                node.parent = current[spawner]
                node.spawn_position = len(nodes[node.parent].token_ids) - 1
            nodes.append(node)
            cur = current[call.agent] = len(nodes) - 1
        node = nodes[cur]
        node.extend(call.prompt_ids, choice.token_ids, choice.log_probs, choice.routed_experts)
        node.calls.append(call.index)
        node.policy_versions.append(call.policy_version)
        last_agent = call.agent
    return nodes


def session_traces(session: Session, episode_id: int = 0) -> tuple[list[Trace], list[TraceNode]]:
    """The session's traces as :class:`Trace` records (reward on the root's last policy token)."""
    nodes = build_tree(session)
    traces = [
        Trace(token_ids=list(n.token_ids), policy_mask=list(n.policy_mask), summary_mask=[False] * len(n.token_ids),
              log_probs=list(n.log_probs), trace_index=i, episode_id=episode_id,
              ends_with_summary=any(m.prev == i for m in nodes), routed_experts=n.routes())
        for i, n in enumerate(nodes)
    ]
    if session.reward is not None and nodes:
        root = nodes[0].agent
        last = max(i for i, n in enumerate(nodes) if n.agent == root and any(n.policy_mask))
        traces[last].rewards[max(p for p, m in enumerate(nodes[last].policy_mask) if m)] = float(session.reward)
    return traces, nodes


def sessions_to_batch(sessions: Sequence[Session], *, pad_id: int = 0, group_ids: Sequence[int] | None = None
                      ) -> TensorDict:
    """Finished sessions as one trace batch (the white-box format) plus the tree keys."""
    episodes, tree = [], []
    for e, session in enumerate(sessions):
        traces, nodes = session_traces(session, e)
        if not traces:
            raise ValueError(f"session {session.name!r} has no calls")
        meta = EpisodeMeta(episode_id=e, group_id=e if group_ids is None else int(group_ids[e]),
                           terminated=session.finished, truncated=not session.finished)
        episodes.append((meta, traces))
        tree += [(n.parent, n.spawn_position, n.prev) for n in nodes]
    batch = stack_traces(episodes, pad_id=pad_id)
    links = torch.tensor(tree, dtype=torch.long)
    batch.set("parent_trace", links[:, 0])
    batch.set("spawn_position", links[:, 1])
    batch.set("prev_trace", links[:, 2])
    return batch
