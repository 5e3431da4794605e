"""The training loop: SFT warm start, critic pre-training, then collect -> advantages -> update -> evaluate.

:func:`train` reads top to bottom as the algorithm; each phase is a function of this module, and
the update step is :class:`~compactrl.training.update.Updater`. One run:

1. SFT warm start (:func:`sft_phase`): copy warm-up, then supervised steps on scripted
   demonstrations collected through the training wrapper;
2. PPO: a critic initialised from the SFT policy (:func:`build_critic`), pre-trained alone for
   ``rl.critic_pretrain_steps`` steps on fresh rollouts (:func:`critic_pretrain_phase`);
3. each iteration (:func:`rl_iteration`): collect ``episodes_per_iter`` whole episodes with the
   current policy; PPO: critic values for every token, then token-level GAE across trace
   boundaries (``boundary="bootstrap"``) or per trace (``"cut"``); GRPO: group-normalised outcome
   advantages; then ``epochs`` x ``minibatches`` policy steps, each after ``critic_updates`` critic
   steps;
4. every ``eval.every`` iterations: held-out success with the same wrapper (greedy by default);
5. append the metrics row, then write the checkpoint (see :mod:`~compactrl.training.run_dir`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from compactrl.collectors.batch import concat_traces
from compactrl.collectors.episodes import episode_time_totals
from compactrl.collectors.trace_collector import BATCH_TIME_KEYS, TraceCollector
from compactrl.eval.episodes import evaluate_policy
from compactrl.provenance import machine_stamp, stamp_markdown
from compactrl.training.config import TrainConfig, override
from compactrl.training.learner import Learner
from compactrl.training.ranks import make_learner
from compactrl.training.rollouts import (
    Rollouts,
    build_policy,
    evaluation_policy,
    make_env_fns,
    make_rollouts,
    report_lines,
)
from compactrl.training.run_dir import RunDir, rng_state, set_rng_state, time_report
from compactrl.training.sft import copy_warmup, sft_train, trim_padding

log = logging.getLogger(__name__)

PHASES = (("copy warm-up", "time/copy_warmup_s"), ("SFT", "time/sft_s"),
          ("critic pre-training", "time/critic_pretrain_s"), ("RL", "time/iteration_s"),
          ("evaluation", "time/eval_s"))
"""(name, metrics key) of each phase whose time the final line reports (summed over the rows)."""


# -- building blocks ------------------------------------------------------------------------------


def build_critic(cfg: TrainConfig, policy):
    """PPO's critic: the policy's trunk as it is now (after SFT), a value head starting at
    ``model.critic_head_init``; None for GRPO."""
    from compactrl.policies.critic import ValueModel

    if cfg.rl.algo != "ppo":
        return None
    return ValueModel.from_policy(policy, head_bias=cfg.model.critic_head_init,
                                  activation_checkpointing=cfg.learner.activation_checkpointing)


def make_demonstrator(kind: str, summary_quality: float, seed: int):
    """The scripted demonstrator ``kind`` (``SFTConfig.demonstrator``)."""
    from compactrl.policies.scripted.code import OraclePolicy
    from compactrl.policies.scripted.demonstrators import ReadingOrderOracle

    if kind == "oracle":
        return OraclePolicy(summary_quality=summary_quality, seed=seed)
    return ReadingOrderOracle(summary_quality=summary_quality, seed=seed, reproduce_first=kind == "reproduce_first")


def collect_demonstrations(cfg: TrainConfig, pad_id: int, *, split: str = "train", second: bool = False,
                           ) -> tuple[TensorDict, dict[str, float]]:
    """Scripted episodes with imperfect summaries, through the training wrapper, as one trace batch.

    Episodes that hit a limit are dropped unless ``sft.keep_truncated`` (see :class:`SFTConfig`);
    the returned statistics describe every collected episode. ``split`` chooses the task split
    (held-out demonstrations for diagnostics come from ``"test"``). ``second`` collects the second
    SFT phase's demonstrations (``sft.second_demonstrator`` at ``env.context_budget.budget``, on
    other tasks and with other dropped facts than the first phase's); otherwise ``sft.demonstrator``
    at ``sft.budget``.
    """
    kind = cfg.sft.second_demonstrator if second else cfg.sft.demonstrator
    budget = None if second else (cfg.sft.budget or None)
    seed = cfg.seed + 1000 * second
    demonstrator = make_demonstrator(kind, cfg.sft.summary_quality, seed)
    collector = TraceCollector(make_env_fns(cfg.env, split=split, count=cfg.env.num_envs, budget=budget),
                               demonstrator, episodes_per_batch=cfg.sft.demo_episodes, seed=seed + 7, pad_id=pad_id)
    try:
        demos = collector.next()
    finally:
        collector.shutdown()
    if not cfg.sft.keep_truncated and not bool(demos["truncated"].all()):
        demos = demos[~demos["truncated"]]
    return demos, collector.last_batch_stats


# -- the run's state -------------------------------------------------------------------------------


@dataclass
class Run:
    """What the phases share: config, run directory, models, the learner, the rollout source."""

    cfg: TrainConfig
    run: RunDir
    policy: Any
    eval_policy: Any
    pad_id: int
    progress: Any = None
    t_start: float = field(default_factory=time.perf_counter)
    elapsed_before: float = 0.0
    critic: Any = None
    """Set by :func:`start_rollouts` (after SFT), like the next two."""
    learner: Learner | None = None
    """The update step, weight syncs and learner checkpoints, in this process or on FSDP2 ranks."""
    rollouts: Rollouts | None = None
    """Where the training batches come from (:func:`~compactrl.training.rollouts.make_rollouts`)."""
    eval_bar: Any = None

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t_start

    def evaluate(self) -> dict[str, float]:
        """Held-out success (``eval.episodes`` episodes of the fixed ``eval.seed`` stream)."""
        e = self.cfg.eval
        if e.episodes == 0:
            return {}
        t0 = time.perf_counter()
        if self.eval_bar is None:  # one bar (or line) for all of the run's evaluations
            self.eval_bar = _bar(self.progress, "evaluation", sum(due for _, due, _ in schedule(self.cfg)))
        env_fns = make_env_fns(self.cfg.env, split=e.split, count=self.cfg.env.num_envs,
                               budget=e.context_budget or None)
        critic_row: dict[str, float] = {}
        policy = evaluation_policy(self.cfg, self.eval_policy, getattr(self.rollouts, "summarizer", None))
        agg, _ = evaluate_policy(env_fns, policy, episodes=e.episodes, seed=e.seed, pad_id=self.pad_id,
                                 on_batch=lambda batch: critic_row.update(self.score_critic(batch)))
        _advance(self.progress, self.eval_bar, f"success {agg.get('success_rate', 0.0):.2f}")
        return {**{f"eval/{k}": v for k, v in agg.items()}, **critic_row, "time/eval_s": time.perf_counter() - t0}

    def score_critic(self, batch) -> dict[str, float]:
        """PPO: the critic against the held-out outcomes (``critic/trace_start_auc`` and the rest of
        :func:`~compactrl.algos.diagnostics.critic_diagnostics`), with the run's advantage call; the
        calibration plot goes to ``plots/critic_calibration.png``. GRPO has no critic: nothing."""
        if self.cfg.rl.algo != "ppo" or self.learner is None:
            return {}
        from compactrl.algos.diagnostics import calibration_plot, critic_diagnostics

        batch = trim_padding(batch)
        self.learner.advantages(batch)
        calibration_plot(batch, self.run.path / "plots" / "critic_calibration.png")
        return {f"eval/{k}": v for k, v in critic_diagnostics(batch).items()}

    def checkpoint(self, iteration: int) -> None:
        """The learner's state into ``learner/iter-<k>`` (a DCP directory, every rank its shards), then the
        checkpoint file that names it; older learner directories go once the file is in place."""
        name = f"iter-{iteration:06d}"
        learner = self.learner.save(self.run.learner_dir(name))
        self.run.save_checkpoint({
            "iteration": iteration, "rows": len(self.run.rows()), "elapsed_s": self.elapsed(),
            "learner_dir": name, "learner": learner, "learner_ranks": self.cfg.learner.ranks,
            **self.rollouts.state_dict(), "rng": rng_state(),
            "policy_generator": self.policy.generator.get_state(), "config": self.cfg.to_dict(),
        })
        self.run.prune_learner_dirs(keep=name)

    def restore(self, state: dict[str, Any]) -> None:
        if "learner_dir" in state:
            self.learner.load(self.run.learner_dir(state["learner_dir"]), state["learner"])
        else:  # a checkpoint file from before the learner had its own directory (one process)
            self.learner.load_legacy(state)
        self.rollouts.load_state_dict(state, version=state["iteration"])
        set_rng_state(state["rng"])
        self.policy.generator.set_state(state["policy_generator"])
        self.elapsed_before = state["elapsed_s"]


# -- the loop --------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What :func:`train` returns: where the run is, the headline numbers and each phase's time."""

    run_dir: Path
    iterations: int
    sft_success: float | None
    final_success: float | None
    wall_clock_s: float
    phase_s: dict[str, float] = field(default_factory=dict)

    def summary_line(self) -> str:
        def pct(x):
            return "n/a" if x is None else f"{100 * x:.1f}%"

        phases = ", ".join(f"{name} {s / 60:.1f}" for name, s in self.phase_s.items() if s > 0)
        return (f"{self.iterations} RL iterations; {self.wall_clock_s / 60:.1f} min in all ({phases} min); "
                f"held-out success after SFT {pct(self.sft_success)} -> after RL {pct(self.final_success)}")


def train(cfg: TrainConfig, out: str | Path, *, resume: bool = False, progress: Any = None,
          iterations: int | None = None, learner: dict[str, Any] | None = None) -> TrainResult:
    """Run (or resume) a training run into ``out``; see the module docstring for the loop.

    A resumed run uses the configuration stored in ``out``; ``iterations`` (resume only) changes
    its ``rl.iterations``, so a finished run can be extended (its last checkpoint is the start), and
    ``learner`` (resume only: ``learner.ranks``, ``learner.launcher``) its learner's ranks (a checkpoint
    saved at N ranks loads at M).
    """
    t_start = time.perf_counter()
    with RunDir(out).claimed():  # one process at a time writes into a run directory
        cfg, run, state = open_run(cfg, out, resume=resume, iterations=iterations, learner=learner)
        r = setup(cfg, run, progress, t_start)
        run.record_machine(machine_stamp(), resume=resume)  # after setup: it sets the thread count
        try:
            return _train(r, cfg, run, state, progress)
        finally:
            if r.rollouts is not None:  # also when the run stops with an error: no engine process outlives it
                r.rollouts.close()
            if r.learner is not None:  # nor a learner rank
                r.learner.close()


def _train(r: Run, cfg: TrainConfig, run: RunDir, state: dict[str, Any] | None, progress: Any) -> TrainResult:
    plan = schedule(cfg)
    if state is None:
        row0: dict[str, Any] = {"iteration": 0, "provenance": run.machines()[-1]}
        if cfg.sft.enabled and cfg.sft.total_steps > 0:
            row0.update(sft_phase(r))
            r.policy.save_pretrained(run.sft_model_path)
        start_rollouts(r)  # the critic and the frozen summariser start from the SFT policy
        row0.update(r.rollouts.last_sync)
        row0.update(critic_pretrain_phase(r))
        if plan[0][1]:  # after pre-training, so row 0 scores the critic the policy updates start with
            row0.update(r.evaluate())
        row0["time/wall_clock_s"] = r.elapsed()
        run.append_row(row0)
        r.checkpoint(0)
        start = 1
    else:
        start_rollouts(r)
        r.restore(state)
        run.truncate_rows(state["rows"])
        start = state["iteration"] + 1
    bar = _bar(progress, "RL", cfg.rl.iterations, completed=start - 1)
    for it, evaluate, save in plan[start:]:
        row = rl_iteration(r, it, evaluate)
        run.append_row(row)
        if save:
            r.checkpoint(it)
        _advance(progress, bar, f"success {row.get('eval/success_rate', row.get('train/success_rate', 0.0)):.2f}")
        log.info("iteration %d: %s", it, {k: round(v, 4) for k, v in row.items() if isinstance(v, float)})
    r.rollouts.close()
    r.policy.save_pretrained(run.final_model_path)  # the trained policy, in Hugging Face format
    return _finish(run, cfg, r.elapsed())


def open_run(cfg: TrainConfig, out: str | Path, *, resume: bool, iterations: int | None,
             learner: dict[str, Any] | None = None) -> tuple[TrainConfig, RunDir, dict[str, Any] | None]:
    """The run directory (created, or checked and read back on resume), its config and last checkpoint."""
    if iterations is not None and not resume:
        raise ValueError("iterations: only a resumed run takes it (set rl.iterations in the config)")
    if learner and not resume:
        raise ValueError("learner: only a resumed run takes it (set learner.ranks in the config)")
    run = RunDir(out)
    run.create(cfg.to_json(), resume=resume)
    if not resume:
        return cfg, run, None
    cfg = TrainConfig.from_dict(run.read_config())
    state = run.load_checkpoint()
    if state is None:  # killed before the first checkpoint: start again, without a stale row 0
        run.truncate_rows(0)
    if iterations is not None and iterations != cfg.rl.iterations:
        done = state["iteration"] if state is not None else 0
        if iterations < done:
            raise ValueError(f"rl.iterations: the run has already done {done} iterations, got {iterations}")
        cfg = override(cfg, {"rl.iterations": iterations})
        run.write_config(cfg.to_json())
    if learner and any(cfg.to_dict()["learner"][k.split(".", 1)[1]] != v for k, v in learner.items()):
        cfg = override(cfg, learner)
        run.write_config(cfg.to_json())
    return cfg, run, state


def setup(cfg: TrainConfig, run: RunDir, progress: Any, t_start: float) -> Run:
    """Seeds, tokenizer, policy; the critic, update step and rollout source come in :func:`start_rollouts`."""
    from compactrl.tokenizer import shared_tokenizer

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = shared_tokenizer()
    policy, eval_policy = build_policy(cfg, tokenizer)
    return Run(cfg, run, policy, eval_policy, pad_id=tokenizer.pad_token_id or 0, progress=progress, t_start=t_start)


def start_rollouts(r: Run) -> None:
    """Critic (from the current policy), the learner and the rollout source (its frozen summariser,
    if any, a copy of the current policy; a resumed run then loads the checkpoint's).

    With ``learner.ranks > 1`` the ranks build their own critic from the policy they start from, and the
    trainer's process keeps none (``critic`` stays None: no held-out critic scoring)."""
    cfg = r.cfg
    r.critic = build_critic(cfg, r.policy) if cfg.learner.ranks == 1 else None
    r.learner = make_learner(cfg, r.policy, r.critic)
    r.rollouts = make_rollouts(cfg, r.policy, pad_id=r.pad_id, run=r.run)


def critic_pretrain_phase(r: Run) -> dict[str, float]:
    """PPO: ``rl.critic_pretrain_steps`` critic steps on fresh rollouts of the starting policy.

    The steps of :func:`critic_pretrain_batches`, run to the end; row 0's ``pretrain/*`` metrics.
    """
    total = r.cfg.rl.critic_pretrain_steps if r.critic is not None else 0
    if total == 0:
        return {}
    t0, rows = time.perf_counter(), []
    bar = _bar(r.progress, "critic pre-training", total)
    for steps, row in critic_pretrain_batches(r, total):
        rows.append(row)
        _advance(r.progress, bar, f"value loss {row.get('loss/critic', float('nan')):.3f}", steps)
    last = {f"pretrain/{k}": v for k, v in rows[-1].items()}
    return {**last, "pretrain/batches": float(len(rows)), "time/critic_pretrain_s": time.perf_counter() - t0}


def critic_pretrain_batches(r: Run, total: int):
    """Critic-only training on fresh batches until ``total`` critic steps; yields ``(steps, row)`` per batch.

    Each batch of ``episodes_per_iter`` episodes gets up to ``epochs x minibatches x
    critic_updates`` critic steps (no policy step). With ``rl.critic_pretrain_replay`` the batch
    joins a pool of every batch collected so far, values and targets are recomputed over the pool
    with the current critic, and the steps draw their minibatches from the whole pool (split into
    ``minibatches x batches`` parts, so a step costs what it does on one batch); ``row`` carries
    ``pool_episodes``.
    """
    pool: list = []
    done = 0
    while done < total:
        batch = r.rollouts.next()
        if r.cfg.rl.critic_pretrain_replay:
            pool.append(batch)
            batch = concat_traces(pool, pad_id=r.pad_id)
        r.learner.advantages(batch)
        step = min(r.learner.steps_per_batch(), total - done)
        row = r.learner.update(batch, train_policy=False, max_critic_steps=step,
                               minibatches=r.cfg.rl.minibatches * max(len(pool), 1))
        row["pool_episodes"] = float(len(torch.unique(batch["episode_id"])))
        done += step
        yield step, row


def schedule(cfg: TrainConfig) -> list[tuple[int, bool, bool]]:
    """``(iteration, evaluate, checkpoint)`` for iteration 0 (after SFT and critic pre-training) to
    ``rl.iterations``: evaluate every ``eval.every`` (and at 0 when ``eval.initial``), checkpoint
    every ``checkpoint_every``, both at the end."""
    last = cfg.rl.iterations
    return [(0, cfg.eval.initial, True)] + [
        (it, it % cfg.eval.every == 0 or it == last, it % cfg.checkpoint_every == 0 or it == last)
        for it in range(1, last + 1)]


def rl_iteration(r: Run, it: int, evaluate: bool) -> dict[str, Any]:
    """Collect, advantages, update, sync, (evaluate): one iteration's metrics row.

    ``time/iteration_s`` (without the evaluation) is ``time/collect_s + time/update_s + time/weight_sync_s``
    and also the sum of :data:`~compactrl.training.run_dir.TIME_COMPONENTS` (:func:`time_split`)."""
    t0 = time.perf_counter()
    batch = r.rollouts.next()
    t1 = time.perf_counter()
    r.learner.advantages(batch)
    stats = r.learner.update(batch)
    t2 = time.perf_counter()
    sync = r.learner.sync(r.rollouts, version=it)  # a failing sync raises here, before the next collection
    t3 = time.perf_counter()
    row = {"iteration": it, **{f"train/{k}": v for k, v in r.rollouts.last_batch_stats.items()}, **stats,
           **r.rollouts.last_batch_metrics, **r.rollouts.last_sync, **sync, "time/collect_s": t1 - t0,
           "time/update_s": t2 - t1, "time/weight_sync_s": t3 - t2, "time/iteration_s": t3 - t0,
           **time_split(r.rollouts, collect_s=t1 - t0, learner_s=t2 - t1, sync_s=t3 - t2)}
    if r.cfg.rollout.save_batches:  # after the update: with its values, advantages and learner log-probs
        r.run.save_batch(it, batch)
    if evaluate:
        row.update(r.evaluate())
    row["time/wall_clock_s"] = r.elapsed()
    return row


def time_split(rollouts: Rollouts, *, collect_s: float, learner_s: float, sync_s: float) -> dict[str, float]:
    """An iteration's time by phase (:data:`~compactrl.training.run_dir.TIME_COMPONENTS`), summing to
    ``collect_s + learner_s + sync_s``.

    A collector that generates and steps its envs in this process reports its batch's generation
    (summaries apart) and env time (``last_batch_time``, measured per round, so concurrent episodes are
    not counted twice); nothing was waited for. Any other source (Ray rollout workers, concurrent
    mini-swe-agent sessions) ran its episodes outside this loop: the collection is waiting (``wait_s``
    when the source measures it, else all of it), and the episodes' own summed times are the separate
    ``time/workers_*`` figures. ``time/other_s`` is the rest of the collection (requests, stacking
    traces, mismatch checks); it is clamped at 0 should the parts overshoot by rounding.
    """
    collector = getattr(rollouts, "collector", None)
    measured = getattr(collector, "last_batch_time", None)
    extra: dict[str, float] = {}
    if measured is not None:
        gen, summ, env = (float(measured.get(k, 0.0)) for k in BATCH_TIME_KEYS)
        wait = 0.0
    else:
        gen = summ = env = 0.0
        wait = min(float(rollouts.last_batch_stats.get("wait_s", collect_s)), collect_s)
        totals = episode_time_totals(getattr(collector, "last_episode_stats", ()))
        extra = {f"time/workers_{k}": v for k, v in totals.items()}
    parts = {"time/generate_s": gen, "time/summary_s": summ, "time/env_s": env, "time/learner_s": learner_s,
             "time/sync_s": sync_s, "time/wait_s": wait}
    other = collect_s + learner_s + sync_s - sum(parts.values())
    if other < -1e-6:
        log.warning("the iteration's phases add up to %.6f s more than its time: time/other_s clamped to 0", -other)
    return {**parts, "time/other_s": max(other, 0.0), **extra}


def _tail_loss(history: list[dict[str, float]]) -> float:
    """Mean loss over the last tenth of an optimiser loop's steps (nan when there were none)."""
    tail = history[-max(1, len(history) // 10):]
    return sum(x["loss"] for x in tail) / len(tail) if tail else float("nan")


def _bar(progress: Any, name: str, total: int, completed: int = 0):
    return progress.add_task(name, total=total, completed=completed, status="") if progress else None


def _advance(progress: Any, bar, status: str, steps: int = 1) -> None:
    if progress is not None:
        progress.update(bar, advance=steps, status=status)


def _fit_callback(progress: Any, bar):
    def on_step(step: int, row: dict[str, float]) -> None:
        _advance(progress, bar, f"nll {row['loss']:.3f}")
    return on_step


def sft_phase(r: Run) -> dict[str, float]:
    """Copy warm-up and the SFT phases on demonstrations; the metrics of row 0."""
    cfg, policy, s = r.cfg, r.policy, r.cfg.sft
    t0, t_copy, t_demos, row = time.perf_counter(), 0.0, 0.0, {}
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    fit = dict(batch_traces=s.batch_traces, weight_decay=s.weight_decay, micro_batch_tokens=s.micro_batch_tokens,
               generator=gen)
    if s.copy_steps or s.steps:  # the first phase (a second-phase-only run continues a pretrained model)
        demos, demo_stats = collect_demonstrations(cfg, r.pad_id)
        t_demos = time.perf_counter() - t0
        t1 = time.perf_counter()
        copy_history = copy_warmup(policy, demos, steps=s.copy_steps, lr=s.lr, generator=gen,
                                   on_step=_fit_callback(r.progress, _bar(r.progress, "copy warm-up", s.copy_steps)))
        t_copy = time.perf_counter() - t1
        history = sft_train(policy, demos, steps=s.steps, lr=s.lr, **fit,
                            on_step=_fit_callback(r.progress, _bar(r.progress, "SFT", s.steps)))
        row = {"sft/demo_success_rate": demo_stats.get("success_rate", 0.0),
               "sft/demo_traces": float(demos.batch_size[0]),
               "sft/demo_summary_tokens_per_episode": demo_stats.get("summary_tokens_per_episode", 0.0),
               "sft/final_nll": _tail_loss(history)}
        if copy_history:
            row["sft/copy_final_nll"] = copy_history[-1]["loss"]
    if s.second_demonstrator != "none" and s.second_steps:
        demos2, stats2 = collect_demonstrations(cfg, r.pad_id, second=True)
        bar = _bar(r.progress, f"SFT ({s.second_demonstrator})", s.second_steps)
        history2 = sft_train(policy, demos2, steps=s.second_steps, lr=s.second_lr, **fit,
                             on_step=_fit_callback(r.progress, bar))
        row.update({"sft/second_demo_success_rate": stats2.get("success_rate", 0.0),
                    "sft/second_demo_traces": float(demos2.batch_size[0]),
                    "sft/second_final_nll": _tail_loss(history2)})
    # time/sft_s: the SFT phase without the copy warm-up (demonstrations included)
    return {**row, "time/copy_warmup_s": t_copy, "time/sft_demos_s": t_demos,
            "time/sft_s": time.perf_counter() - t0 - t_copy}


def _finish(run: RunDir, cfg: TrainConfig, elapsed: float) -> TrainResult:
    rows = run.rows()
    evals = [x for x in rows if x.get("eval/success_rate") is not None]
    sft = evals[0]["eval/success_rate"] if evals and evals[0]["iteration"] == 0 else None
    final = evals[-1]["eval/success_rate"] if evals else None
    phases = {name: sum(float(x.get(key) or 0.0) for x in rows) for name, key in PHASES}
    run.plot()
    run.write_report(_report(cfg, rows, evals, elapsed, phases, run.machines()))
    run.close()
    iterations = max((x["iteration"] for x in rows), default=0)
    return TrainResult(run.path, iterations, sft, final, elapsed, phases)


def _report(cfg: TrainConfig, rows: list[dict], evals: list[dict], elapsed: float, phases: dict[str, float],
            machines: list[dict] = ()) -> str:
    ctx, s, rl = cfg.env.context_budget, cfg.sft, cfg.rl
    lmbda = f"adaptive (alpha {rl.lmbda_alpha})" if rl.lmbda == "adaptive" else f"{rl.lmbda}"
    lines = [f"# Training run ({rl.algo})", "",
             f"- env: `{cfg.env.env_id}` ({cfg.env.backend}, difficulty `{cfg.env.difficulty}`, "
             f"budget {ctx.budget} tokens)",
             f"- model: tiny `{cfg.model.arch}` (hidden {cfg.model.hidden_size}, {cfg.model.num_layers} layers, "
             f"{cfg.model.num_experts} experts)",
             f"- SFT: {s.steps if s.enabled else 0} steps on {s.demo_episodes} "
             f"`{s.demonstrator}` episodes (budget {s.budget or ctx.budget})"
             + (f", then {s.second_steps} steps on `{s.second_demonstrator}` episodes"
                if s.enabled and s.second_demonstrator != "none" and s.second_steps else "")
             + f" (summary quality {s.summary_quality})",
             f"- RL: {rl.iterations} iterations x {rl.episodes_per_iter} episodes, boundary `{rl.boundary}`, "
             f"gamma {rl.gamma}, lambda {lmbda}"
             + (f", {rl.critic_pretrain_steps} critic pre-training steps" if rl.algo == "ppo" else ""),
             *report_lines(cfg, rows),
             f"- wall-clock: {elapsed / 60:.1f} min ("
             + ", ".join(f"{k} {v / 60:.1f} min" for k, v in phases.items() if v > 0) + ")", "",
             "## Held-out success", "",
             f"Held-out episodes are decoded {_decoding(cfg.eval.temperature)}; training success is "
             f"sampled at temperature {cfg.model.temperature}.", "",
             "| iteration | success | 95% CI | traces/episode | summary tokens/episode |", "|---|---|---|---|---|"]
    for x in evals:
        sr, se = x["eval/success_rate"], x.get("eval/success_stderr", 0.0) or 0.0
        lines.append(f"| {x['iteration']} | {sr:.3f} | [{max(0, sr - 1.96 * se):.3f}, {min(1, sr + 1.96 * se):.3f}] "
                     f"| {x.get('eval/traces_per_episode', 0):.2f} | {x.get('eval/summary_tokens_per_episode', 0):.1f} |")
    if len(evals) >= 2:
        d = evals[-1]["eval/success_rate"] - evals[0]["eval/success_rate"]
        lines += ["", f"Held-out success after RL minus after SFT: **{d:+.3f}** ({len(rows) - 1} iterations)."]
    lines += ["", "![curves](plots/curves.png)", "", *time_report(rows)]
    for i, stamp in enumerate(machines):
        lines += [f"## Machine and software{f' (resume {i})' if i else ''}", "", *stamp_markdown(stamp), ""]
    if machines:
        lines += ["Absolute figures depend on the CPU's float kernels (AVX-512 and AVX2 kernels give other numbers "
                  "after hundreds of steps): compare runs made on one kind of CPU (docs/training.md).", ""]
    return "\n".join(lines)


def _decoding(temperature: float) -> str:
    return "greedily (temperature 0)" if temperature == 0 else f"at temperature {temperature}"


__all__ = ["train", "TrainResult", "build_critic", "collect_demonstrations", "make_demonstrator"]
