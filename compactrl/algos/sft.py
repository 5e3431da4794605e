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
import re
from collections.abc import Callable

import torch
from tensordict import TensorDict

from compactrl.algos.packing import micro_batches

log = logging.getLogger(__name__)


def trim_padding(batch: TensorDict) -> TensorDict:
    """Drop the padding columns no row of ``batch`` uses (every [N, L] entry is cut to the longest row)."""
    length = int(batch["attention_mask"].sum(-1).max())
    full = batch["attention_mask"].shape[-1]
    if length == full:
        return batch
    out = batch.clone(False)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[-1] == full:
            out.set(key, value[:, :length])
    return out


def selected_log_probs(policy, tokens: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor, *,
                       with_entropy: bool = False, sampling=None):
    """``log p(tokens[t] | tokens[:t])`` at the positions ``select`` only (1-D, in row-major order).

    The LM head and softmax run only where a log-prob is needed (the policy tokens, ~15% of a
    trace), which is most of the cost of a step on a small model with a 4k vocabulary. Falls back
    to the policy's full ``log_prob`` when its model has no separate trunk and head. ``sampling``
    (a ``SamplingConfig``) chooses the distribution, like ``TransformersPolicy.log_prob``; None is
    the plain model distribution (temperature 1), as SFT wants. With ``with_entropy`` the entropy
    at the same positions is returned too.
    """
    model = getattr(policy, "model", None)
    trunk, head = getattr(model, "base_model", None), getattr(model, "lm_head", None) if model is not None else None
    if trunk is None or head is None or trunk is model:
        logp, ent = policy.log_prob(tokens, attention_mask)
        return (logp[select], ent[select]) if with_entropy else logp[select]
    from compactrl.policies.transformers_policy import SamplingConfig, positions_from_mask, sampling_log_probs

    mask = attention_mask.long()
    hidden = trunk(input_ids=tokens, attention_mask=mask, position_ids=positions_from_mask(mask),
                   use_cache=False).last_hidden_state
    sel = select[:, 1:] & attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    logp_all = sampling_log_probs(head(hidden[:, :-1][sel]), sampling or SamplingConfig())
    logp = logp_all.gather(-1, tokens[:, 1:][sel][:, None]).squeeze(-1)
    if not with_entropy:
        return logp
    return logp, -(logp_all.exp() * logp_all).sum(-1)


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
    """Train ``policy`` (anything with ``log_prob(tokens, attention_mask)`` and parameters) on ``demos``.

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
            select[:, 0] = False  # nothing predicts the first token
            log_probs.append(selected_log_probs(policy, mb["tokens"], mb["attention_mask"], select))
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
        return -selected_log_probs(policy, tokens, torch.ones_like(tokens), select).mean()

    # weight decay 0.01: AdamW's default, which the warm-up has always used
    return _fit(policy, batch_loss, steps=steps, lr=lr, weight_decay=0.01, max_grad_norm=max_grad_norm,
                on_step=on_step)


# -- the demonstrator ----------------------------------------------------------------------------------


class ReadingOrderOracle:
    """An oracle whose every choice a learner can imitate from its own context.

    :class:`~compactrl.policies.scripted.OraclePolicy` reads the file that holds each fact
    directly: it knows the location from the task's metadata, which a learned policy never sees,
    so imitating it teaches guessing. This demonstrator reads the candidate files in a fixed
    order that depends only on the task message's file list (``config/``, ``README.md``,
    ``docs/``, then the package's other modules), stops as soon as it has seen every fact, and
    then proceeds as the oracle does (view the bug file, replace, test, submit). Summaries are the
    oracle's, dropping each fact with probability ``1 - summary_quality``, so a lost fact makes
    the episode fail, as it would for an agent that trusted a bad summary.

    With ``reproduce_first`` it runs the tests once before fixing (``Next: run the tests, then
    fix KEY = V in FILE.``), views the bug file again when its stale line is neither in the current
    context nor stated by the latest summary, and a summary that drops a fact drops it everywhere: its ``next``
    line then names the constant without a value. So when the compaction falls between reading
    the facts and writing the fix, the fix is only as good as the summary.
    """

    def __init__(self, summary_quality: float = 1.0, seed: int = 0, chunk_lines: int = 25,
                 reproduce_first: bool = False) -> None:
        from compactrl.policies.scripted import OraclePolicy, _in_words, _observe

        class _Ordered(OraclePolicy):
            noted: frozenset[str] = frozenset()  # stale lines the latest summary states

            def _next_call(inner, know, task):  # noqa: N805 - closure over the outer demonstrator
                call = _next_read(know, task, inner.chunk_lines)
                if call is None and reproduce_first:
                    call = _reproduce_first(know, task, inner.chunk_lines, inner.noted)
                return call if call is not None else OraclePolicy._next_call(inner, know, task)

            def respond(inner, request):  # noqa: N805
                if not reproduce_first:
                    return OraclePolicy.respond(inner, request)
                inner.noted = _noted_stale_lines(request.messages)
                text = OraclePolicy.respond(inner, request)
                if not request.compaction_required and text.endswith("<tool>test</tool>"):
                    know = _observe(request.messages, request.task.metadata["facts"])
                    inner._guess_lost_facts(know, request.task.metadata)
                    if not know.fixed:  # the test before the fix: say what the fix will be
                        fix = OraclePolicy._next_call(inner, know, request.task)
                        text = f"Next: run the tests, then {_in_words(fix)}.\n<tool>test</tool>"
                return text

            def _summary(inner, know, task, messages):  # noqa: N805
                text = OraclePolicy._summary(inner, know, task, messages)
                if not reproduce_first:
                    return text
                text = text.replace("done: nothing yet\n", "")  # summaries must fit the response limit
                if not know.fixed:  # only the test before the fix has run
                    text = text.replace("done: tested", "done: ran the tests")
                call = inner._next_call(know, task)
                plan = OraclePolicy._next_call(inner, know, task) if call.name == "test" and not know.fixed else call
                if plan.name != "replace":
                    return text
                key = plan.new.split(" = ", 1)[0]
                if f"\n{key} = " in text:  # the fact survived: the plan, with the exact old line
                    words = f"replace {plan.old.strip()} in {plan.path}"
                else:  # a dropped fact is dropped everywhere
                    words = f"fix {key} in {plan.path}"
                return re.sub(r"\nnext: .*\n", lambda _: f"\nnext: {words}\n", text, count=1)

        self._oracle = _Ordered(summary_quality=summary_quality, seed=seed, chunk_lines=chunk_lines)

    def act(self, requests):
        return self._oracle.act(requests)


_NOTED = re.compile(r"^next: replace ([A-Z][A-Z0-9_]* = \S+) in ", re.M)


def _noted_stale_lines(messages) -> frozenset[str]:
    """The stale line the latest summary in ``messages`` says to replace (``next: replace KEY = OLD in FILE``)."""
    from compactrl.policies.scripted import SUMMARY_OPEN

    for msg in reversed(messages):
        content = msg.get("content", "")
        if msg.get("role") != "system" and SUMMARY_OPEN in content:
            return frozenset(_NOTED.findall(content))
    return frozenset()


def _reproduce_first(know, task, chunk_lines: int, noted: frozenset[str]):
    """Before the first fix: see the stale lines (in context or in the summary), then run the tests once."""
    from compactrl.envs.tools import ToolCall

    meta = task.metadata
    bug = meta["bug_file"]
    pending = [fix for fact, fix in zip(meta["facts"], meta["fix"]) if fact["key"] not in know.fixed]
    if not pending:
        return None
    seen = set(know.seen_lines.get(bug, {}).values()) | noted
    if any(fix["old"].rstrip("\n") not in seen for fix in pending):
        return ToolCall("view", path=bug, start=1, end=chunk_lines)
    if not know.tested_after_fix and not know.fixed:
        return ToolCall("test")
    return None


def reading_order(files: list[str], bug_file: str) -> list[str]:
    """Where facts may be stated, in the order a careful agent reads them (from the file list only)."""
    def rank(path: str) -> tuple[int, str]:
        if path.startswith("config/"):
            return (0, path)
        if path == "README.md":
            return (1, path)
        if path.startswith("docs/"):
            return (2, path)
        return (3, path)

    candidates = [p for p in files if p != bug_file and not p.startswith("tests/") and p.endswith((".md", ".toml", ".py"))
                  and p != "pyproject.toml" and not p.endswith("__init__.py")]
    return sorted(candidates, key=rank)


def _next_read(know, task, chunk_lines: int):
    """The next chunk to read while a fact is still unknown, or None when reading is done."""
    from compactrl.envs.tools import ToolCall

    meta = task.metadata
    if all(f["key"] in know.facts for f in meta["facts"]):
        return None
    for path in reading_order(sorted(task.files), meta["bug_file"]):
        total = task.files[path].count("\n") + (0 if task.files[path].endswith("\n") else 1)
        done = know.read.get(path, 0)
        if done < total:
            return ToolCall("view", path=path, start=done + 1, end=done + chunk_lines)
    return None
