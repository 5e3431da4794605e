"""Supervised warm start: next-token NLL on the policy tokens of scripted demonstrations.

Demonstrations are collected exactly like RL rollouts (same env, same ContextBudget wrapper, same
:class:`~compactrl.collectors.TraceCollector`), from a scripted policy whose summaries are
deliberately imperfect, so the warm-started model writes summaries that RL can improve. Only the
tokens the demonstrator produced (``policy_mask``, summaries included) are trained on; the
prompt, tool outputs and padding are context.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from tensordict import TensorDict

from compactrl.algos.packing import micro_batches
from compactrl.collectors.batch import sequence_keys

log = logging.getLogger(__name__)


def trim_padding(batch: TensorDict) -> TensorDict:
    """Drop the padding columns no row of ``batch`` uses (every [N, L] entry is cut to the longest row)."""
    length = int(batch["attention_mask"].sum(-1).max())
    if length == batch["attention_mask"].shape[-1]:
        return batch
    out = batch.clone(False)
    for key in sequence_keys(batch) + (["routed_experts"] if "routed_experts" in batch.keys() else []):
        out.set(key, batch[key][:, :length])
    return out


def model_log_probs(policy, tokens: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """``log p(tokens[t] | tokens[:t])`` under the plain model distribution (temperature 1, no
    truncation, whatever the policy samples with) at the positions ``select``, 1-D in row-major
    order; the policy's LM head runs only there (``TransformersPolicy.log_prob(select=...)``)."""
    select = select.bool().clone()
    select[:, 0] = False  # nothing predicts the first token
    logp, _ = policy.log_prob(tokens, attention_mask, select, temperature=1.0, top_k=0, top_p=1.0)
    return logp[select]


def nll_loss(log_probs: torch.Tensor, policy_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over the policy tokens (per-token normalisation)."""
    mask = policy_mask.to(log_probs.dtype)
    return -(log_probs * mask).sum() / mask.sum().clamp(min=1.0)


def cosine_lr(step: int, total: int, base: float, *, warmup: int = 10, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay from ``base`` to ``floor * base``."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _fit(
    policy,
    batch_loss: Callable[[int], torch.Tensor],
    *,
    steps: int,
    lr: float,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """The supervised optimiser loop shared by SFT and the copy warm-up.

    AdamW with a cosine schedule (:func:`cosine_lr`); ``batch_loss(step)`` draws the step's batch
    and returns its loss. Returns one metrics dict per step (``loss``, ``grad_norm``, ``lr``).
    """
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr,
                            weight_decay=weight_decay, betas=(0.9, 0.98))
    history = []
    policy.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, steps, lr)
        loss = batch_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        opt.step()
        row = {"loss": float(loss.detach()), "grad_norm": float(grad_norm), "lr": opt.param_groups[0]["lr"]}
        history.append(row)
        if on_step is not None:
            on_step(step, row)
    policy.eval()
    return history


def sft_train(
    policy,
    demos: TensorDict,
    *,
    steps: int,
    lr: float,
    batch_traces: int,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    micro_batch_tokens: int = 8192,
    generator: torch.Generator | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``policy`` (a :class:`~compactrl.policies.TransformersPolicy`) on ``demos``.

    Each step draws ``batch_traces`` traces uniformly without replacement (reshuffled every
    epoch). The loss is the mean NLL over the step's policy tokens. The step's traces run through
    the model in length-packed micro-batches of at most ``micro_batch_tokens`` positions
    (:func:`~compactrl.algos.packing.micro_batches`), each trimmed to its own longest trace: the
    loss is the same mean over the same tokens, with less padding to attend over. Returns one
    metrics dict per step (``loss``, ``grad_norm``, ``lr``).
    """

    if steps == 0:
        return []
    n = demos.batch_size[0]
    order, cursor = torch.randperm(n, generator=generator), 0

    def batch_loss(step: int) -> torch.Tensor:
        nonlocal order, cursor
        if cursor + batch_traces > n:
            order, cursor = torch.randperm(n, generator=generator), 0
        idx = order[cursor:cursor + batch_traces]
        cursor += batch_traces
        log_probs = []
        for mb in micro_batches(demos[idx], micro_batch_tokens):
            select = mb["policy_mask"] & mb["attention_mask"]
            log_probs.append(model_log_probs(policy, mb["tokens"], mb["attention_mask"], select))
        return -torch.cat(log_probs).mean()

    return _fit(policy, batch_loss, steps=steps, lr=lr, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                on_step=on_step)


def copy_warmup(
    policy,
    demos: TensorDict,
    *,
    steps: int,
    lr: float,
    batch: int = 32,
    span: int = 48,
    prefix: int = 16,
    max_grad_norm: float = 1.0,
    generator: torch.Generator | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Teach in-context copying on the demonstrations' own text, before SFT.

    A pretrained language model arrives able to repeat what its context says (a file path from
    the task message, a value from a config line); a randomly initialised tiny model does not,
    and the demonstrations hold only a few such copy events per trace, so SFT alone needs
    thousands of steps before the model copies anything (it learns the tool language first and
    then writes plausible but wrong paths and values). Each sequence here is ``prefix`` tokens of
    demonstration text, then a ``span`` of demonstration text twice; the loss is the NLL of the
    repeat. This stands in for the base model's pretraining: it uses no labels and no task
    knowledge. Returns one metrics dict per step (``loss``, ``grad_norm``, ``lr``).
    """
    if steps == 0:
        return []
    flat = demos["tokens"][demos["attention_mask"].bool()]
    if flat.numel() <= span + prefix:
        raise ValueError(f"demos: expected more than {span + prefix} tokens of text, got {flat.numel()}")
    offsets = torch.arange(span + prefix)

    def batch_loss(step: int) -> torch.Tensor:
        starts = torch.randint(0, flat.numel() - span - prefix, (batch, 2), generator=generator)
        head = flat[starts[:, :1] + offsets[:prefix]]
        body = flat[starts[:, 1:] + offsets[:span]]
        tokens = torch.cat([head, body, body], dim=1)
        select = torch.zeros_like(tokens, dtype=torch.bool)
        select[:, prefix + span + 1:] = True  # the first repeated token cannot be predicted
        return -model_log_probs(policy, tokens, torch.ones_like(tokens), select).mean()

    # weight decay 0.01: AdamW's default, which the warm-up has always used
    return _fit(policy, batch_loss, steps=steps, lr=lr, weight_decay=0.01, max_grad_norm=max_grad_norm,
                on_step=on_step)
