"""The trace batch: finished traces -> one padded TensorDict (one row per trace).

Keys (``N`` traces, ``L`` = longest trace):

=================  ===========  ===========================================================
key                shape/dtype  meaning
=================  ===========  ===========================================================
tokens             [N, L] i64   token ids (right-padded with ``pad_id``)
attention_mask     [N, L] bool  real (non-padding) positions
policy_mask        [N, L] bool  tokens the policy sampled (GAE steps, loss positions)
summary_mask       [N, L] bool  policy tokens that belong to a summary
sample_log_prob    [N, L] f32   log-prob at sampling time (0 where not a policy token)
reward             [N, L] f32   env reward at the last token of the response that earned it
episode_id         [N] i64      episode the trace belongs to (unique within a batch)
trace_index        [N] i64      position of the trace in its episode (0, 1, ...)
num_traces         [N] i64      number of traces of that episode
group_id           [N] i64      rollouts of the same task share a group (GRPO)
episode_reward     [N] f32      total reward of the episode
terminated         [N] bool     the episode ended by termination (submit / success)
truncated          [N] bool     the episode was cut short (limits, sandbox failure)
routed_experts     [N, L, M, k] MoE routes as the sampler chose them (``M`` MoE layers, top-``k``
                   u8 or i16    ids; present when any trace has routes; 255 in u8, -1 in i16 where a
                                token has none: padding, traces or tokens without a record;
                                :mod:`compactrl.policies.routing`)
=================  ===========  ===========================================================

Later stages add ``value``, ``advantage``, ``value_target`` ([N, L] f32).
Rows of one episode are stored in ``trace_index`` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from compactrl.policies.routing import no_route, routes_for_rows
from compactrl.types import Trace


@dataclass(frozen=True)
class EpisodeMeta:
    """Episode-level facts the batch needs beside its traces."""

    episode_id: int
    group_id: int
    terminated: bool
    truncated: bool


def stack_traces(
    episodes: Sequence[tuple[EpisodeMeta, Sequence[Trace]]], *, pad_id: int = 0
) -> TensorDict:
    """Stack the traces of finished episodes into a padded trace batch (see module doc)."""
    rows = [(meta, i, tr, len(traces)) for meta, traces in episodes for i, tr in enumerate(traces)]
    if not rows:
        raise ValueError("stack_traces needs at least one episode with at least one trace")
    n, length = len(rows), max(len(tr) for _, _, tr, _ in rows)
    tokens = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, length), dtype=torch.bool)
    pmask = torch.zeros((n, length), dtype=torch.bool)
    smask = torch.zeros((n, length), dtype=torch.bool)
    logp = torch.zeros((n, length), dtype=torch.float32)
    reward = torch.zeros((n, length), dtype=torch.float32)
    ep_reward = {}
    for meta, _, tr, _ in rows:
        ep_reward[meta.episode_id] = ep_reward.get(meta.episode_id, 0.0) + sum(tr.rewards.values())
    for r, (_meta, _i, tr, _) in enumerate(rows):
        tr.validate()
        k = len(tr)
        tokens[r, :k] = torch.tensor(tr.token_ids, dtype=torch.long)
        attn[r, :k] = True
        pmask[r, :k] = torch.tensor(tr.policy_mask, dtype=torch.bool)
        smask[r, :k] = torch.tensor(tr.summary_mask, dtype=torch.bool)
        lp = torch.tensor(tr.log_probs, dtype=torch.float32)
        logp[r, :k] = torch.where(pmask[r, :k] & ~lp.isnan(), lp, torch.zeros_like(lp))
        for pos, rew in tr.rewards.items():
            reward[r, pos] += rew
    batch = TensorDict(
        {
            "tokens": tokens,
            "attention_mask": attn,
            "policy_mask": pmask,
            "summary_mask": smask,
            "sample_log_prob": logp,
            "reward": reward,
            "episode_id": torch.tensor([m.episode_id for m, *_ in rows], dtype=torch.long),
            "trace_index": torch.tensor([i for _, i, _, _ in rows], dtype=torch.long),
            "num_traces": torch.tensor([k for *_, k in rows], dtype=torch.long),
            "group_id": torch.tensor([m.group_id for m, *_ in rows], dtype=torch.long),
            "episode_reward": torch.tensor([ep_reward[m.episode_id] for m, *_ in rows]),
            "terminated": torch.tensor([m.terminated for m, *_ in rows], dtype=torch.bool),
            "truncated": torch.tensor([m.truncated for m, *_ in rows], dtype=torch.bool),
        },
        batch_size=[n],
    )
    routes = routes_for_rows([tr.routed_experts for _, _, tr, _ in rows], length)
    if routes is not None:
        batch.set("routed_experts", routes)
    return batch


def sequence_keys(batch: TensorDict) -> list[str]:
    """Keys of the batch's per-position ``[N, L]`` entries (``L``: the width of ``tokens``)."""
    width = batch["tokens"].shape[-1]
    return [k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[-1] == width]


def concat_traces(batches: Sequence[TensorDict], *, pad_id: int = 0) -> TensorDict:
    """One trace batch from several: rows in order, ``[N, L]`` entries right-padded to the widest
    (``tokens`` with ``pad_id``, ``routed_experts`` with its sentinel, everything else with zeros), and ``episode_id`` / ``group_id``
    offset per batch so that they stay unique (each batch numbers its own episodes)."""
    if not batches:
        raise ValueError("concat_traces needs at least one batch")
    width = max(b["tokens"].shape[-1] for b in batches)
    routed = next((b["routed_experts"] for b in batches if "routed_experts" in b.keys()), None)
    parts, offset_ep, offset_group = [], 0, 0
    for b in batches:
        if routed is not None and "routed_experts" not in b.keys():  # a batch without routes: none recorded
            b = b.clone(False)
            b.set("routed_experts", torch.full((*b["tokens"].shape, *routed.shape[2:]), no_route(routed.dtype),
                                               dtype=routed.dtype))
        out = b.clone(False)
        missing = width - b["tokens"].shape[-1]
        for key in sequence_keys(b) if missing else ():
            value = b[key]
            pad = torch.full((value.shape[0], missing), pad_id if key == "tokens" else 0, dtype=value.dtype)
            out.set(key, torch.cat([value, pad], dim=-1))
        if "routed_experts" in b.keys() and missing:
            value = b["routed_experts"]
            pad = torch.full((value.shape[0], missing, *value.shape[2:]), no_route(value.dtype), dtype=value.dtype)
            out.set("routed_experts", torch.cat([value, pad], dim=1))
        out.set("episode_id", b["episode_id"] - int(b["episode_id"].min()) + offset_ep)
        out.set("group_id", b["group_id"] - int(b["group_id"].min()) + offset_group)
        offset_ep = int(out["episode_id"].max()) + 1
        offset_group = int(out["group_id"].max()) + 1
        parts.append(out)
    return torch.cat(parts, dim=0)
