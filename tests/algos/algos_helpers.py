"""Shared builders for the algos tests: random whole episodes as traces, and tiny real models."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from compactrl.collectors.batch import EpisodeMeta, stack_traces
from compactrl.types import Trace


def random_trace(
    rng: np.random.Generator,
    *,
    index: int,
    episode: int,
    last: bool,
    reward: float | None,
    step_rewards: bool,
) -> Trace:
    """A trace: prompt, then turns (response + tool output), ending with a summary unless ``last``."""
    ids, pol, summ, rewards = [], [], [], {}

    def add(n: int, policy: bool, summary: bool = False) -> None:
        ids.extend(rng.integers(1, 50, size=n).tolist())
        pol.extend([policy] * n)
        summ.extend([summary] * n)

    add(int(rng.integers(1, 5)), False)
    for turn in range(int(rng.integers(1, 4))):
        add(int(rng.integers(1, 7)), True)
        if step_rewards and rng.random() < 0.5:
            rewards[len(ids) - 1] = float(rng.normal())
        if turn < 2 or not last:
            add(int(rng.integers(0, 4)), False)
    if last:
        if pol[-1] is False:
            add(int(rng.integers(1, 4)), True)
        if reward is not None:
            rewards[len(ids) - 1] = rewards.get(len(ids) - 1, 0.0) + reward
    else:
        add(int(rng.integers(1, 5)), True, summary=True)
    logp = [float(-rng.exponential()) if p else float("nan") for p in pol]
    return Trace(
        ids, pol, summ, logp, rewards, trace_index=index, episode_id=episode, ends_with_summary=not last
    )


def random_episodes(
    seed: int,
    n_episodes: int = 3,
    max_traces: int = 4,
    *,
    step_rewards: bool = False,
    truncated_share: float = 0.3,
    groups: int = 2,
    min_traces: int = 1,
):
    """Whole episodes with an outcome reward at the very last policy token (plus per-step ones if asked)."""
    rng = np.random.default_rng(seed)
    episodes = []
    for e in range(n_episodes):
        truncated = bool(rng.random() < truncated_share)
        n = int(rng.integers(min_traces, max_traces + 1))
        outcome = 0.0 if truncated else float(rng.integers(0, 2))
        traces = [
            random_trace(rng, index=i, episode=e, last=i == n - 1, reward=outcome, step_rewards=step_rewards)
            for i in range(n)
        ]
        meta = EpisodeMeta(episode_id=e, group_id=e % groups, terminated=not truncated, truncated=truncated)
        episodes.append((meta, traces))
    return episodes


def batch_with_values(episodes, seed: int = 0):
    batch = stack_traces(episodes)
    g = torch.Generator().manual_seed(seed)
    batch.set("value", torch.randn(batch["tokens"].shape, generator=g))
    return batch


def episode_stream(batch, episode_id: int):
    """The policy tokens of one episode in time order, built by plain loops: (where, rewards, values)."""
    episode, trace = batch["episode_id"].tolist(), batch["trace_index"].tolist()
    policy, reward, value = (batch[k].tolist() for k in ("policy_mask", "reward", "value"))
    where, rewards, values = [], [], []
    for _, r in sorted((trace[r], r) for r in range(len(episode)) if episode[r] == episode_id):
        for t, is_policy in enumerate(policy[r]):
            if is_policy:
                where.append((r, t))
                rewards.append(reward[r][t])
                values.append(value[r][t])
    return where, torch.tensor(rewards), torch.tensor(values)


class TinyActor(nn.Module):
    """A small causal LM with the actor protocol ``log_prob(tokens, mask) -> (logp, entropy)``.

    Embedding, then a causal running mean of the embeddings mixed by a linear layer (cheap on CPU,
    every position sees only its prefix), then a vocabulary head.
    """

    def __init__(self, vocab: int = 50, dim: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, vocab)

    def _hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.emb(tokens)
        steps = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)[None, :, None]
        return torch.tanh(self.mix(torch.cat([e, e.cumsum(1) / steps], -1)))

    def log_prob(self, tokens: torch.Tensor, attention_mask: torch.Tensor, select=None):
        logits = self.head(self._hidden(tokens))[:, :-1].float()
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        pad = torch.zeros_like(logp[:, :1])
        return torch.cat([pad, logp], 1), torch.cat([pad, entropy], 1)


class TinyCritic(TinyActor):
    """Same body with a scalar head: ``value(tokens, mask) -> [N, L]``."""

    def __init__(self, vocab: int = 50, dim: int = 16, seed: int = 1):
        super().__init__(vocab, dim, seed)
        self.value_head = nn.Linear(dim, 1)

    def value(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        v = self.value_head(self._hidden(tokens))[:, :-1, 0]  # value at t sees tokens[:t]
        return torch.cat([torch.zeros_like(v[:, :1]), v], 1)


@torch.no_grad()
def sample(actor: TinyActor, prompts: torch.Tensor, steps: int, generator: torch.Generator):
    """Sample ``steps`` tokens after ``prompts [B, P]``; returns tokens [B, P + steps] and their log-probs."""
    tokens, logps = prompts, []
    for _ in range(steps):
        logits = actor.head(actor._hidden(tokens))[:, -1]
        dist = torch.log_softmax(logits, -1)
        nxt = torch.multinomial(dist.exp(), 1, generator=generator)
        logps.append(dist.gather(-1, nxt))
        tokens = torch.cat([tokens, nxt], 1)
    return tokens, torch.cat(logps, 1)
