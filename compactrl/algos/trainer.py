"""The training loop: SFT warm start, then collect -> advantages -> PPO epochs -> evaluate -> log.

:func:`train` reads top to bottom as the algorithm. Everything it calls is a small function of
this module or of its neighbours (:mod:`~compactrl.algos.gae`, :mod:`~compactrl.algos.sft`,
:mod:`~compactrl.algos.run_dir`, the losses). One iteration:

1. collect ``episodes_per_iter`` whole episodes with the current policy (:class:`TraceCollector`);
2. PPO: critic values for every token, then token-level GAE across trace boundaries
   (:func:`trace_gae`, ``boundary="bootstrap"`` or ``"cut"``); GRPO: group-normalised outcome
   advantages broadcast to every policy token;
3. ``epochs`` passes over the batch in ``minibatches`` optimiser steps, each accumulated over
   micro-batches packed by a token budget (the loss is normalised by the minibatch's policy-token
   count, so the split into micro-batches does not change the gradient); the critic takes
   ``critic_updates`` steps per policy step with its own learning rate, and alone during the
   first ``critic_warmup_iters`` iterations;
4. every ``eval.every`` iterations: held-out success with the same wrapper;
5. append the metrics row, then write the checkpoint (see :mod:`~compactrl.algos.run_dir`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from compactrl.algos.config import EnvConfig, TrainConfig, override
from compactrl.algos.evaluate import evaluate_policy
from compactrl.algos.losses import add_loss_normalizers
from compactrl.algos.packing import micro_batches, pack_rows, row_lengths
from compactrl.algos.run_dir import RunDir, rng_state, set_rng_state
from compactrl.algos.sft import copy_warmup, selected_log_probs, sft_train, trim_padding
from compactrl.collectors.trace_collector import TraceCollector, summarize_episodes

log = logging.getLogger(__name__)


# -- building blocks ------------------------------------------------------------------------------


def make_env_fns(cfg: EnvConfig, *, split: str, count: int, budget: int | None = None) -> list[Callable]:
    """``count`` constructors of the wrapped training env (``budget`` overrides the context budget)."""
    import gymnasium as gym

    import compactrl  # noqa: F401  (registers the env ids)

    kwargs = dict(
        backend=cfg.backend, difficulty=cfg.difficulty, split=split, max_turns=cfg.max_turns,
        budget=budget or cfg.context_budget, reserve=cfg.max_new_tokens, max_compactions=cfg.max_compactions,
        tool_output_cap=cfg.tool_output_cap, **json.loads(cfg.env_kwargs),
    )
    if cfg.tools:
        kwargs["tools"] = tuple(t.strip() for t in cfg.tools.split(",") if t.strip())
    return [lambda: gym.make(cfg.env_id, **kwargs) for _ in range(count)]


def build_policy(cfg: TrainConfig, tokenizer):
    """The trained policy (tiny MoE from a seeded init, or a saved model) and a greedy twin for evaluation."""
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy

    m = cfg.model
    if m.pretrained:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(m.pretrained, experts_implementation="grouped_mm")
    else:
        model = tiny_moe(m.arch, hidden_size=m.hidden_size, num_layers=m.num_layers, num_experts=m.num_experts,
                         experts_per_token=m.experts_per_token, seed=m.init_seed)
    common = dict(max_new_tokens=cfg.env.max_new_tokens, max_batch_size=cfg.env.num_envs * 4)
    policy = TransformersPolicy(model, tokenizer, temperature=m.temperature, seed=cfg.seed, **common)
    eval_policy = TransformersPolicy(model, tokenizer, temperature=cfg.eval.temperature, seed=cfg.eval.seed,
                                     **common)
    return policy, eval_policy


class SummaryRouter:
    """Acts with ``policy``, except that summaries are written by ``summarizer`` (a frozen summariser).

    Masking summary tokens out of the loss does not freeze the summariser when the weights are
    shared (the summaries still change as the policy trains); routing summary requests to a
    separate, never-updated copy does.
    """

    def __init__(self, policy, summarizer) -> None:
        self.policy, self.summarizer = policy, summarizer

    def act(self, requests):
        out: list[Any] = [None] * len(requests)
        for pol, want in ((self.summarizer, True), (self.policy, False)):
            idx = [i for i, r in enumerate(requests) if r.compaction_required == want]
            if idx:
                for i, resp in zip(idx, pol.act([requests[i] for i in idx])):
                    out[i] = resp
        return out


def collect_demonstrations(cfg: TrainConfig, pad_id: int, *, split: str = "train", second: bool = False,
                           ) -> tuple[TensorDict, dict[str, float]]:
    """Scripted episodes with imperfect summaries, through the training wrapper, as one trace batch.

    Episodes that hit a limit are dropped unless ``sft.keep_truncated`` (see :class:`SFTConfig`);
    the returned statistics describe every collected episode. ``split`` chooses the task split
    (held-out demonstrations for diagnostics come from ``"test"``). ``second`` collects the second
    SFT phase's demonstrations (``sft.second_demonstrator`` at ``env.context_budget``, on other
    tasks and with other dropped facts than the first phase's); otherwise ``sft.demonstrator`` at
    ``sft.budget``.
    """
    from compactrl.algos.sft import ReadingOrderOracle
    from compactrl.policies.scripted import OraclePolicy

    kind = cfg.sft.second_demonstrator if second else cfg.sft.demonstrator
    budget = cfg.env.context_budget if second else (cfg.sft.budget or cfg.env.context_budget)
    seed = cfg.seed + 1000 * second
    if kind == "oracle":
        demonstrator = OraclePolicy(summary_quality=cfg.sft.summary_quality, seed=seed)
    else:
        demonstrator = ReadingOrderOracle(summary_quality=cfg.sft.summary_quality, seed=seed,
                                          reproduce_first=kind == "reproduce_first")
    collector = TraceCollector(make_env_fns(cfg.env, split=split, count=cfg.env.num_envs, budget=budget),
                               demonstrator, episodes_per_batch=cfg.sft.demo_episodes, seed=seed + 7, pad_id=pad_id)
    try:
        demos = collector.next()
    finally:
        collector.shutdown()
    if not cfg.sft.keep_truncated and not bool(demos["truncated"].all()):
        demos = demos[~demos["truncated"]]
    return demos, collector.last_batch_stats


@torch.no_grad()
def critic_values(critic, batch: TensorDict, micro_batch_tokens: int) -> torch.Tensor:
    """``V`` at every position of ``batch``, computed over packed micro-batches."""
    out = torch.zeros(batch["tokens"].shape, dtype=torch.float32)
    lengths = row_lengths(batch["attention_mask"])
    for rows in pack_rows(lengths, micro_batch_tokens):
        width = max(int(lengths[rows].max()), 1)
        tokens, mask = batch["tokens"][rows, :width], batch["attention_mask"][rows, :width]
        out[rows, :width] = critic.value(tokens, mask).float()
    return out


def split_minibatches(batch: TensorDict, count: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Random disjoint row sets of near-equal policy-token counts (whole traces)."""
    n = batch.batch_size[0]
    order = torch.randperm(n, generator=generator)
    count = min(count, n)
    tokens = batch["policy_mask"].sum(-1)
    parts: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in order.tolist():  # greedy: next trace goes to the lightest part
        k = loads.index(min(loads))
        parts[k].append(i)
        loads[k] += int(tokens[i])
    return [torch.tensor(p) for p in parts if p]


# -- the update ------------------------------------------------------------------------------------


class LossPositionsActor(torch.nn.Module):
    """The policy as the loss sees it, with the LM head run only at the positions the loss reads.

    ``TransformersPolicy.log_prob`` computes logits and entropies at every position; the loss
    reads them at policy tokens only (~15% of a trace). Inside ``with actor.positions(mask):``,
    ``log_prob`` runs the trunk over every position but the head and softmax only where ``mask``
    is set, and returns ``[N, L]`` tensors that are 0 elsewhere (values there are never read: the
    mask must cover the loss's own mask). Outside the block it is the policy's ``log_prob``.
    Gradients flow into the policy's parameters as usual.
    """

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy = policy
        self._select: torch.Tensor | None = None

    @contextlib.contextmanager
    def positions(self, select: torch.Tensor):
        self._select = select
        try:
            yield self
        finally:
            self._select = None

    def log_prob(self, tokens: torch.Tensor, attention_mask: torch.Tensor):
        if self._select is None or self._select.shape != tokens.shape:
            return self.policy.log_prob(tokens, attention_mask)
        from compactrl.policies.transformers_policy import SamplingConfig

        s = self.policy.sampling
        sampling = SamplingConfig(temperature=s.logprob_temperature, top_k=s.top_k, top_p=s.top_p)
        select = self._select.clone()
        select[:, 0] = False  # nothing predicts the first token (the policy's log_prob gives 0 there)
        logp, ent = selected_log_probs(self.policy, tokens, attention_mask, select, with_entropy=True,
                                       sampling=sampling)
        out_lp = torch.zeros(tokens.shape, dtype=logp.dtype, device=tokens.device)
        out_ent = torch.zeros(tokens.shape, dtype=ent.dtype, device=tokens.device)
        rows = select & torch.cat([select.new_zeros(select.shape[0], 1),
                                   attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()], dim=1)
        return out_lp.masked_scatter(rows, logp), out_ent.masked_scatter(rows, ent)


def build_loss(cfg: TrainConfig, policy, critic):
    """The TorchRL loss module of ``cfg.rl.algo`` (critic PPO or GRPO), the policy seen through
    :class:`LossPositionsActor`; built by :func:`~compactrl.algos.losses.build_losses`."""
    from compactrl.algos.losses import build_losses

    return build_losses(cfg.rl, LossPositionsActor(policy), critic).module


def compute_advantages(batch: TensorDict, cfg: TrainConfig, critic) -> TensorDict:
    """PPO: critic values then token-level GAE over traces; GRPO: group-relative outcome advantage
    (:func:`~compactrl.algos.losses.advantage_estimator`)."""
    from compactrl.algos.losses import advantage_estimator

    if cfg.rl.algo == "ppo":
        batch["value"] = critic_values(critic, batch, cfg.rl.micro_batch_tokens)
    return advantage_estimator(cfg.rl)(batch)


def ppo_update(batch: TensorDict, *, loss_module, policy, critic, opt, critic_opt, cfg: TrainConfig,
               train_policy: bool, generator: torch.Generator) -> dict[str, float]:
    """``epochs`` x ``minibatches`` optimiser steps on ``batch``; returns mean diagnostics."""
    rl = cfg.rl
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for _ in range(rl.epochs):
        for rows in split_minibatches(batch, rl.minibatches, generator):
            mb = add_loss_normalizers(batch[rows], train_summaries=rl.train_summaries)
            if critic is not None:
                for _ in range(rl.critic_updates):
                    _add(sums, counts, _step(mb, loss_module.critic_loss, critic_opt, critic, rl, "critic"))
            if train_policy:
                _add(sums, counts, _step(mb, loss_module.actor_loss, opt, policy, rl, "policy",
                                         actor=loss_module.actor))
    return {k: v / counts[k] for k, v in sums.items()}


def _step(mb: TensorDict, loss_fn, opt, module, rl, name: str, actor=None) -> dict[str, float]:
    """One optimiser step of ``loss_fn`` over ``mb``, gradients accumulated over packed micro-batches.

    The loss terms are normalised by ``mb``'s whole token counts (``add_loss_normalizers``), so the
    accumulated gradient does not depend on how ``mb`` is packed. Diagnostics are token-weighted.
    """
    opt.zero_grad(set_to_none=True)
    stats: dict[str, float] = {}
    total = float(mb["policy_mask"].sum().clamp(min=1))
    for part in micro_batches(mb, rl.micro_batch_tokens):
        with actor.positions(part["policy_mask"] & part["attention_mask"]) if actor else contextlib.nullcontext():
            out = loss_fn(part)
        loss = sum(v for k, v in out.items() if k.startswith("loss_"))
        loss.backward()
        weight = float(part["policy_mask"].sum()) / total
        for k, v in out.items():
            if k == "num_loss_tokens_micro":
                continue
            key = f"loss/{k[5:]}" if k.startswith("loss_") else f"{name}/{k}"
            v = float(v.detach())
            stats[key] = stats.get(key, 0.0) + (v if k.startswith("loss_") else v * weight)
    stats[f"{name}/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(module.parameters(), rl.max_grad_norm))
    opt.step()
    return stats


def _add(acc: dict[str, float], counts: dict[str, int], new: dict[str, float]) -> None:
    for k, v in new.items():
        acc[k] = acc.get(k, 0.0) + v
        counts[k] = counts.get(k, 0) + 1


# -- the loop --------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What :func:`train` returns: where the run is and the headline numbers."""

    run_dir: Path
    iterations: int
    sft_success: float | None
    final_success: float | None
    wall_clock_s: float

    def summary_line(self) -> str:
        def pct(x):
            return "n/a" if x is None else f"{100 * x:.1f}%"

        return (f"{self.iterations} RL iterations in {self.wall_clock_s / 60:.1f} min; held-out success "
                f"after SFT {pct(self.sft_success)} -> after RL {pct(self.final_success)}")


def train(cfg: TrainConfig, out: str | Path, *, resume: bool = False, progress: Any = None,
          iterations: int | None = None) -> TrainResult:
    """Run (or resume) a training run into ``out``; see the module docstring for the loop.

    A resumed run uses the configuration stored in ``out``; ``iterations`` (resume only) changes
    its ``rl.iterations``, so a finished run can be extended (its last checkpoint is the start).
    """
    from compactrl.policies.critic import ValueModel
    from compactrl.tokenizer import load_tokenizer

    if iterations is not None and not resume:
        raise ValueError("iterations: only a resumed run takes it (set rl.iterations in the config)")
    t_start = time.perf_counter()
    run = RunDir(out)
    run.create(cfg.to_json(), resume=resume)
    if resume:
        cfg = TrainConfig.from_dict(run.read_config())
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer()
    pad_id = tokenizer.pad_token_id or 0
    policy, eval_policy = build_policy(cfg, tokenizer)
    ppo = cfg.rl.algo == "ppo"
    critic = None
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.rl.lr, weight_decay=0.0)
    critic_opt = None
    eval_fns = make_env_fns(cfg.env, split=cfg.eval.split, count=cfg.env.num_envs,
                            budget=cfg.eval.context_budget or None)
    state = run.load_checkpoint() if resume else None
    elapsed_before = 0.0

    def evaluate() -> dict[str, float]:
        if cfg.eval.episodes == 0:
            return {}
        agg, _ = evaluate_policy(eval_fns, eval_policy, episodes=cfg.eval.episodes, seed=cfg.eval.seed, pad_id=pad_id)
        return {f"eval/{k}": v for k, v in agg.items()}

    if state is None:
        row0: dict[str, Any] = {"iteration": 0}
        if cfg.sft.enabled and cfg.sft.steps > 0:
            row0.update(_sft_phase(cfg, policy, pad_id, progress))
            policy.save_pretrained(run.sft_model_path)
        if ppo:
            critic = ValueModel.from_policy(policy)
            critic_opt = torch.optim.AdamW(critic.parameters(), lr=cfg.rl.critic_lr, weight_decay=0.0)
        if cfg.eval.initial:
            row0.update(evaluate())
        row0["time/wall_clock_s"] = time.perf_counter() - t_start
        run.append_row(row0)
        start = 1
    else:
        if ppo:
            critic = ValueModel.from_policy(policy)
            critic_opt = torch.optim.AdamW(critic.parameters(), lr=cfg.rl.critic_lr, weight_decay=0.0)
        start = state["iteration"] + 1
        elapsed_before = state["elapsed_s"]
        run.truncate_rows(state["rows"])
    if resume and iterations is not None and iterations != cfg.rl.iterations:
        done = start - 1 if state is not None else 0
        if iterations < done:
            raise ValueError(f"rl.iterations: the run has already done {done} iterations, got {iterations}")
        cfg = override(cfg, {"rl.iterations": iterations})
        run.write_config(cfg.to_json())

    rollout_policy = policy
    if cfg.rl.frozen_summarizer:
        frozen, _ = build_policy(cfg, tokenizer)
        frozen.load_state_dict(policy.state_dict() if state is None else state["frozen_summarizer"])
        frozen.requires_grad_(False)
        rollout_policy = SummaryRouter(policy, frozen)
    collector = TraceCollector(
        make_env_fns(cfg.env, split="train", count=cfg.env.num_envs), rollout_policy,
        episodes_per_batch=cfg.rl.episodes_per_iter, group_size=cfg.rl.group_size if not ppo else 1,
        seed=cfg.seed + 1, pad_id=pad_id, give_task_to_policy=False,
    )
    update_gen = torch.Generator().manual_seed(cfg.seed + 2)
    if state is not None:
        policy.load_state_dict(state["policy"])
        opt.load_state_dict(state["opt"])
        if critic is not None:
            critic.load_state_dict(state["critic"])
            critic_opt.load_state_dict(state["critic_opt"])
        collector.load_state_dict(state["collector"])
        set_rng_state(state["rng"])
        policy.generator.set_state(state["policy_generator"])
        update_gen.set_state(state["update_generator"])
    loss_module = build_loss(cfg, policy, critic)

    def checkpoint(iteration: int) -> None:
        run.save_checkpoint({
            "iteration": iteration, "rows": len(run.rows()), "elapsed_s": elapsed_before + time.perf_counter() - t_start,
            "policy": policy.state_dict(), "opt": opt.state_dict(),
            "critic": critic.state_dict() if critic is not None else None,
            "critic_opt": critic_opt.state_dict() if critic_opt is not None else None,
            "frozen_summarizer": rollout_policy.summarizer.state_dict() if cfg.rl.frozen_summarizer else None,
            "collector": collector.state_dict(), "rng": rng_state(),
            "policy_generator": policy.generator.get_state(), "update_generator": update_gen.get_state(),
            "config": cfg.to_dict(),
        })

    if state is None:
        checkpoint(0)
    task = progress.add_task("RL", total=cfg.rl.iterations, completed=start - 1, status="") if progress else None
    for it in range(start, cfg.rl.iterations + 1):
        t_iter = time.perf_counter()
        batch = trim_padding(collector.next())                                       # 1. collect
        t_collect = time.perf_counter() - t_iter
        compute_advantages(batch, cfg, critic)                                      # 2. advantages
        train_policy = not ppo or it > cfg.rl.critic_warmup_iters                   # 3. update
        upd = ppo_update(batch, loss_module=loss_module, policy=policy, critic=critic, opt=opt,
                         critic_opt=critic_opt, cfg=cfg, train_policy=train_policy, generator=update_gen)
        collector.update_policy_weights_(policy)
        row = {"iteration": it, **{f"train/{k}": v for k, v in collector.last_batch_stats.items()}, **upd}
        row["time/collect_s"] = t_collect
        row["time/iteration_s"] = time.perf_counter() - t_iter
        if it % cfg.eval.every == 0 or it == cfg.rl.iterations:                     # 4. evaluate
            row.update(evaluate())
        row["time/wall_clock_s"] = elapsed_before + time.perf_counter() - t_start
        run.append_row(row)                                                          # 5. log, checkpoint
        if it % cfg.checkpoint_every == 0 or it == cfg.rl.iterations:
            checkpoint(it)
        if progress:
            sr = row.get("eval/success_rate", row.get("train/success_rate", 0.0))
            progress.update(task, advance=1, status=f"success {sr:.2f}")
        log.info("iteration %d: %s", it, {k: round(v, 4) for k, v in row.items() if isinstance(v, float)})
    collector.shutdown()
    policy.save_pretrained(run.final_model_path)  # the trained policy, in Hugging Face format
    return _finish(run, cfg, elapsed_before + time.perf_counter() - t_start)


def _tail_loss(history: list[dict[str, float]]) -> float:
    """Mean loss over the last tenth of an optimiser loop's steps (nan when there were none)."""
    tail = history[-max(1, len(history) // 10):]
    return sum(r["loss"] for r in tail) / len(tail) if tail else float("nan")


def _sft_phase(cfg: TrainConfig, policy, pad_id: int, progress: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    demos, demo_stats = collect_demonstrations(cfg, pad_id)
    t_demos = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    copy_bar = progress.add_task("copy warm-up", total=cfg.sft.copy_steps, status="") if progress else None
    sft_bar = progress.add_task("SFT", total=cfg.sft.steps, status="") if progress else None

    def advance(bar):
        def on_step(step: int, row: dict[str, float]) -> None:
            if progress:
                progress.update(bar, advance=1, status=f"nll {row['loss']:.3f}")
        return on_step

    t_copy = time.perf_counter()
    copy_history = copy_warmup(policy, demos, steps=cfg.sft.copy_steps, lr=cfg.sft.lr, generator=gen,
                               on_step=advance(copy_bar))
    t_copy = time.perf_counter() - t_copy
    history = sft_train(policy, demos, steps=cfg.sft.steps, lr=cfg.sft.lr, batch_traces=cfg.sft.batch_traces,
                        weight_decay=cfg.sft.weight_decay, micro_batch_tokens=cfg.sft.micro_batch_tokens, generator=gen, on_step=advance(sft_bar))
    second: dict[str, float] = {}
    if cfg.sft.second_demonstrator != "none" and cfg.sft.second_steps:
        demos2, stats2 = collect_demonstrations(cfg, pad_id, second=True)
        bar = progress.add_task(f"SFT ({cfg.sft.second_demonstrator})", total=cfg.sft.second_steps, status="") \
            if progress else None
        history2 = sft_train(policy, demos2, steps=cfg.sft.second_steps, lr=cfg.sft.second_lr,
                             batch_traces=cfg.sft.batch_traces, weight_decay=cfg.sft.weight_decay,
                             micro_batch_tokens=cfg.sft.micro_batch_tokens, generator=gen,
                             on_step=advance(bar))
        second = {
            "sft/second_demo_success_rate": stats2.get("success_rate", 0.0),
            "sft/second_demo_traces": float(demos2.batch_size[0]),
            "sft/second_final_nll": _tail_loss(history2),
        }
    return {
        **second,
        "sft/demo_success_rate": demo_stats.get("success_rate", 0.0),
        "sft/demo_traces": float(demos.batch_size[0]),
        "sft/demo_summary_tokens_per_episode": demo_stats.get("summary_tokens_per_episode", 0.0),
        "sft/final_nll": _tail_loss(history),
        **({"sft/copy_final_nll": copy_history[-1]["loss"]} if copy_history else {}),
        "time/copy_warmup_s": t_copy,
        "time/sft_demos_s": t_demos,
        "time/sft_s": time.perf_counter() - t0,
    }


def _finish(run: RunDir, cfg: TrainConfig, elapsed: float) -> TrainResult:
    rows = run.rows()
    evals = [r for r in rows if r.get("eval/success_rate") is not None]
    sft = evals[0]["eval/success_rate"] if evals and evals[0]["iteration"] == 0 else None
    final = evals[-1]["eval/success_rate"] if evals else None
    run.plot()
    run.write_report(_report(cfg, rows, evals, elapsed))
    run.close()
    iterations = max((r["iteration"] for r in rows), default=0)
    return TrainResult(run.path, iterations, sft, final, elapsed)


def _report(cfg: TrainConfig, rows: list[dict], evals: list[dict], elapsed: float) -> str:
    lines = [f"# Training run ({cfg.rl.algo})", "",
             f"- env: `{cfg.env.env_id}` ({cfg.env.backend}, difficulty `{cfg.env.difficulty}`, "
             f"budget {cfg.env.context_budget} tokens)",
             f"- model: tiny `{cfg.model.arch}` (hidden {cfg.model.hidden_size}, {cfg.model.num_layers} layers, "
             f"{cfg.model.num_experts} experts)",
             f"- SFT: {cfg.sft.steps if cfg.sft.enabled else 0} steps on {cfg.sft.demo_episodes} "
             f"`{cfg.sft.demonstrator}` episodes (budget {cfg.sft.budget or cfg.env.context_budget})"
             + (f", then {cfg.sft.second_steps} steps on `{cfg.sft.second_demonstrator}` episodes"
                if cfg.sft.enabled and cfg.sft.second_demonstrator != "none" and cfg.sft.second_steps else "")
             + f" (summary quality {cfg.sft.summary_quality})",
             f"- RL: {cfg.rl.iterations} iterations x {cfg.rl.episodes_per_iter} episodes, boundary "
             f"`{cfg.rl.boundary}`", f"- wall-clock: {elapsed / 60:.1f} min", "",
             "## Held-out success", "", "| iteration | success | 95% CI | traces/episode | summary tokens/episode |",
             "|---|---|---|---|---|"]
    for r in evals:
        sr, se = r["eval/success_rate"], r.get("eval/success_stderr", 0.0) or 0.0
        lines.append(f"| {r['iteration']} | {sr:.3f} | [{max(0, sr - 1.96 * se):.3f}, {min(1, sr + 1.96 * se):.3f}] "
                     f"| {r.get('eval/traces_per_episode', 0):.2f} | {r.get('eval/summary_tokens_per_episode', 0):.1f} |")
    if len(evals) >= 2:
        d = evals[-1]["eval/success_rate"] - evals[0]["eval/success_rate"]
        lines += ["", f"Held-out success after RL minus after SFT: **{d:+.3f}** "
                      f"({len(rows) - 1} iterations)."]
    lines += ["", "![curves](plots/curves.png)", ""]
    return "\n".join(lines)


__all__ = ["train", "TrainResult", "SummaryRouter", "summarize_episodes", "make_env_fns", "build_policy"]
