"""Where a run's training batches come from: the :class:`Rollouts` protocol and its one factory.

A rollout source hands the trainer batches of whole episodes, takes the learner's new weights after
each update (the sync) and reports what that sync measured. :func:`make_rollouts` builds the source
the config asks for, so the loop never asks which one it has:

* ``rollout.source=env`` (the default): a :class:`~compactrl.collectors.TraceCollector` steps
  ``env.num_envs`` wrapped envs with the policy in the trainer's process;
* ``distributed.num_rollout_workers > 0``: a :class:`~compactrl.distributed.RayCollector`, rollout
  workers on Ray each building the policy from the config (:func:`worker_policy`);
* ``distributed.max_staleness > 0`` without rollout workers: a
  :class:`~compactrl.distributed.ThreadCollector`, rollouts on a thread of the trainer's process that
  go on while the learner trains (:func:`thread_collector`);
* ``rollout.source=mini_swe_agent``: an :class:`~compactrl.gateway.collector.AgentCollector`,
  mini-swe-agent on the env's tasks through a gateway in front of the policy;
* ``rollout.engine=vllm`` without rollout workers: either in-process source generating with a
  :class:`~compactrl.serving.vllm.policy.VLLMPolicy` (a vLLM engine process), synced after every
  update and checked on a probe batch (:class:`EngineRollouts`); with rollout workers, the Ray
  collector's engine actors own the engines.

``rl.frozen_summarizer`` routes summary requests to a frozen copy of the starting policy
(:class:`SummaryRouter`) in the in-process sources. The building blocks the trainer shares with the
sources are here too: the wrapped training envs (:func:`make_env_fns`) and the policy
(:func:`build_policy`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from tensordict import TensorDict

from compactrl.policies.routing import RouteRecorder, forward_routes, moe_routers, route_mismatch_metrics
from compactrl.training.config import EnvConfig, TrainConfig
from compactrl.training.sft import trim_padding

if TYPE_CHECKING:
    from compactrl.training.run_dir import RunDir

__all__ = ["Rollouts", "CollectorRollouts", "EngineRollouts", "make_rollouts", "SummaryRouter", "make_env_fns",
           "build_policy", "evaluation_policy", "worker_policy", "engine_settings", "engine_mismatch", "route_mismatch", "report_lines"]


@runtime_checkable
class Rollouts(Protocol):
    """A source of training batches, as the trainer uses it.

    Contract: :meth:`next` returns a trace batch (``compactrl.collectors.batch``) of whole episodes
    collected with the weights of the last :meth:`update_weights` (padding columns no row uses
    trimmed); ``last_batch_stats`` aggregates its episodes (``summarize_episodes``: the ``train/*``
    metrics) and ``last_batch_metrics`` holds the source's own figures about it (``{}`` when it has
    none). :meth:`update_weights` is the sync after an update, tagged with the iteration; its
    figures are ``last_sync`` (``{}`` when it measures nothing; after the factory, the start's).
    :meth:`state_dict` / :meth:`load_state_dict` carry what a checkpoint needs to resume the source.
    :meth:`close` releases every env, worker and engine process; it is idempotent.
    """

    last_batch_stats: dict[str, float]
    last_batch_metrics: dict[str, float]
    last_sync: dict[str, float]

    def next(self) -> TensorDict:
        """The next batch of whole episodes."""
        ...

    def update_weights(self, policy: Any, version: int, reference: Callable | None = None) -> None:
        """Bring the source to the learner ``policy``'s weights, as version ``version``. ``reference`` scores
        the engines' probe batch with the learner's own weights (a sharded learner's ranks); None: ``policy``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """``frozen_summarizer`` (its weights, or None) and ``collector`` (the task stream's counters and
        generator): the checkpoint's entries of the same names."""
        ...

    def load_state_dict(self, state: dict[str, Any], *, version: int) -> None:
        """Resume from a checkpoint of iteration ``version`` (after the learner's weights are restored)."""
        ...

    def close(self) -> None:
        """Release every env, worker and engine process. Idempotent."""
        ...


class CollectorRollouts:
    """A collector with the TorchRL-like surface (``next``, ``update_policy_weights_``,
    ``last_batch_stats``, ``state_dict``, ``load_state_dict``, ``shutdown``) as :class:`Rollouts`.

    ``policy`` is what the collector acts with (the trainer's policy, a :class:`SummaryRouter`, or
    the policy Ray workers start from); ``summarizer`` the frozen summariser, if any.
    """

    def __init__(self, collector: Any, policy: Any, summarizer: Any = None, learner: Any = None, *,
                 sampler_differs: bool = False) -> None:
        self.collector, self.policy, self.summarizer, self.learner = collector, policy, summarizer, learner
        self.sampler_differs = sampler_differs
        self.last_batch_metrics: dict[str, float] = {}

    @property
    def last_sync(self) -> dict[str, float]:
        """Nothing to measure: the collector's policy shares the learner's module, or its workers load the
        published weights before their next episodes."""
        return {}

    @property
    def last_batch_stats(self) -> dict[str, float]:
        return self.collector.last_batch_stats

    def next(self) -> TensorDict:
        batch = trim_padding(self.collector.next())
        if self.learner is not None and self.sampler_differs:  # an fp8 cache, a sampler copy a version behind
            self.last_batch_metrics = engine_mismatch(self.learner, batch)
        elif self.learner is not None:  # the sampler's routes against the learner's (the same model: ~0)
            self.last_batch_metrics = route_mismatch(self.learner, batch)
        return batch

    def update_weights(self, policy: Any, version: int, reference: Callable | None = None) -> None:
        self.collector.update_policy_weights_(policy)

    def state_dict(self) -> dict[str, Any]:
        return {"frozen_summarizer": self.summarizer.state_dict() if self.summarizer is not None else None,
                "collector": self.collector.state_dict()}

    def load_state_dict(self, state: dict[str, Any], *, version: int) -> None:
        if self.summarizer is not None:
            self.summarizer.load_state_dict(state["frozen_summarizer"])
        self.collector.load_state_dict(state["collector"])

    def close(self) -> None:
        self.collector.shutdown()


class EngineRollouts(CollectorRollouts):
    """An in-process collector generating with ``engine`` (a :class:`~compactrl.serving.vllm.policy.VLLMPolicy`).

    Every rollout of a batch comes from the engine's current version: the batch gets
    ``policy_version`` and ``last_batch_metrics`` the version and how far the engine's sampling
    log-probs are from the learner's before the update (:func:`engine_mismatch`). Collecting
    asynchronously (a :class:`~compactrl.distributed.ThreadCollector`), the engine generates on the
    collector's thread and each trace keeps the version that produced it. Each sync sends
    the learner's weights tagged with the iteration and checks them on the probe batch (a failing
    check raises, before the next collection); ``last_sync`` is the engine's report.
    """

    def __init__(self, collector: Any, policy: Any, engine: Any, learner: Any, summarizer: Any = None) -> None:
        super().__init__(collector, policy, summarizer)
        self.engine, self.learner = engine, learner

    @property
    def last_sync(self) -> dict[str, float]:
        """The engine's report of its last sync (after the factory: its start and first probe check)."""
        return self.engine.last_sync

    def next(self) -> TensorDict:
        batch = trim_padding(self.collector.next())
        version = self.engine.last_version
        # asynchronous (``distributed.max_staleness``): the mismatch includes the policy lag of the older traces
        self.last_batch_metrics = {"engine/version": float(version), **engine_mismatch(self.learner, batch)}
        if "policy_version" not in batch.keys():  # synchronous: every rollout from the engine's current version
            batch["policy_version"] = torch.full((batch.batch_size[0],), version, dtype=torch.long)
        return batch

    def update_weights(self, policy: Any, version: int, reference: Callable | None = None) -> None:
        extra = {"reference": reference} if reference is not None else {}
        self.collector.update_policy_weights_(policy, version=version, **extra)
        if self.engine.version != version:
            raise RuntimeError(f"the rollout collector did not sync the vLLM engine to version {version} "
                               f"(it holds {self.engine.version})")

    def load_state_dict(self, state: dict[str, Any], *, version: int) -> None:
        # the engine started from the pre-restore weights: bring it to the checkpoint's
        self.engine.update_weights(self.learner.model, version=version)
        super().load_state_dict(state, version=version)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.engine.close()


# -- the factory --------------------------------------------------------------------------------------


def make_rollouts(cfg: TrainConfig, policy: Any, *, pad_id: int, run: RunDir | None = None) -> Rollouts:
    """The rollout source ``cfg`` asks for (see the module docstring), acting with ``policy`` as it is now.

    Built in this order: the vLLM engine (``rollout.engine=vllm``, no rollout workers), the frozen
    summariser (``rl.frozen_summarizer``, a copy of ``policy``), the collector. Whatever fails after
    the engine started closes it.
    """
    differs = sampler_differs(cfg)
    if cfg.distributed.num_rollout_workers:
        return CollectorRollouts(ray_collector(cfg, policy, pad_id=pad_id, run=run), policy, learner=policy,
                                 sampler_differs=differs)
    engine = start_engine(cfg, policy, run) if cfg.rollout.engine == "vllm" else None
    try:
        acting = policy if engine is None else engine
        summarizer = frozen_summarizer(cfg, policy) if cfg.rl.frozen_summarizer else None
        if summarizer is not None:
            acting = SummaryRouter(acting, summarizer)
        collector = in_process_collector(cfg, acting, pad_id=pad_id, run=run, learner=policy, summarizer=summarizer)
    except BaseException:
        if engine is not None:
            engine.close()
        raise
    if engine is None:
        return CollectorRollouts(collector, acting, summarizer, learner=policy, sampler_differs=differs)
    return EngineRollouts(collector, acting, engine, policy, summarizer)


def sampler_differs(cfg: TrainConfig) -> bool:
    """Whether the transformers sampler may draw from other log-probs than the learner's: an fp8 KV cache
    (``rollout.kv_cache_dtype``) or a sampler that may be versions behind (``distributed.max_staleness``).
    Then every batch's ``mismatch/*`` (k3, max and mean |delta log p|) is measured as for the engine."""
    return cfg.rollout.kv_cache_dtype == "fp8" or cfg.distributed.max_staleness > 0


def frozen_summarizer(cfg: TrainConfig, policy: Any) -> Any:
    """A frozen copy of ``policy`` as it is now (``rl.frozen_summarizer``): separate weights, never trained."""
    frozen, _ = build_policy(cfg, policy.tokenizer)
    frozen.load_state_dict(policy.state_dict())
    frozen.requires_grad_(False)
    return frozen


def in_process_collector(cfg: TrainConfig, policy: Any, *, pad_id: int, run: RunDir | None, learner: Any = None,
                         summarizer: Any = None) -> Any:
    """The collector of ``rollout.source`` in the trainer's process, acting with ``policy``; with
    ``distributed.max_staleness > 0`` asynchronous, on a thread (:func:`thread_collector`)."""
    if cfg.rollout.source == "mini_swe_agent":
        return agent_collector(cfg, policy, pad_id=pad_id, run=run)
    from compactrl.collectors.trace_collector import TraceCollector

    env_fns = make_env_fns(cfg.env, split="train", count=cfg.env.num_envs)
    common = dict(episodes_per_batch=cfg.rl.episodes_per_iter, seed=cfg.seed + 1, pad_id=pad_id,
                  group_size=cfg.rl.group_size if cfg.rl.algo == "grpo" else 1, give_task_to_policy=False)
    if cfg.distributed.max_staleness:
        return thread_collector(cfg, env_fns, policy, learner, summarizer, **common)
    return TraceCollector(env_fns, policy, **common)


def thread_collector(cfg: TrainConfig, env_fns: list[Callable], policy: Any, learner: Any, summarizer: Any,
                     **common: Any) -> Any:
    """Asynchronous rollouts in the trainer's process (docs/distributed.md#asynchronous-rollouts): a
    :class:`~compactrl.distributed.ThreadCollector` whose thread generates while the learner trains. Its
    sampler is the vLLM engine itself (``policy``, synced between its requests) or, with
    ``rollout.engine=transformers``, a copy of ``learner`` built as a rollout worker builds its own
    (:func:`worker_policy`; behind the frozen summariser's router, if any), loading each published version
    before its next round."""
    from compactrl.distributed.collector import ThreadCollector

    k = cfg.distributed.max_staleness
    if cfg.rollout.engine == "vllm":
        return ThreadCollector(env_fns, policy, max_staleness=k, **common)
    copy_fn = functools.partial(sampler_copy, cfg.to_json(), summarizer)
    return ThreadCollector(env_fns, policy_fn=copy_fn, weights=learner, max_staleness=k, **common)


def sampler_copy(cfg_json: str, summarizer: Any, index: int) -> Any:
    """The rollout thread's own sampling policy (:func:`worker_policy`), its summaries written by the frozen
    ``summarizer`` when there is one."""
    policy = worker_policy(cfg_json, index)
    return policy if summarizer is None else SummaryRouter(policy, summarizer)


def report_lines(cfg: TrainConfig, rows: list[dict[str, Any]]) -> list[str]:
    """The run report's lines about its rollout source, from the metrics ``rows``: the vLLM engine's dtype,
    KV cache and the largest probe mismatch of its syncs; the learner's model sampling with an fp8 KV
    cache; none for the sources that generate with the learner's model as it is."""
    fp8 = cfg.rollout.kv_cache_dtype == "fp8"
    if cfg.rollout.engine != "vllm":
        return ["- rollouts: the learner's model sampling with an FP8 KV cache (compactrl's Fp8KVCache, "
                "vLLM's scheme)"] if fp8 else []
    worst = max(x.get("engine/probe_max_abs_dlogp", 0.0) for x in rows)
    return [f"- rollouts: a vLLM engine process ({cfg.rollout.engine_dtype}{', fp8 KV cache' if fp8 else ''}), "
            f"synced after every update and checked on a probe batch (largest max |delta log p|: {worst:.2g})"]


# -- the building blocks ------------------------------------------------------------------------------


def make_env_fns(cfg: EnvConfig, *, split: str, count: int, budget: int | None = None) -> list[Callable]:
    """``count`` constructors of the wrapped training env (``budget`` overrides the context budget)."""
    import gymnasium as gym

    import compactrl  # noqa: F401  (registers the env ids)

    wrapper = cfg.context_budget if not budget else dataclasses.replace(cfg.context_budget, budget=budget)
    kwargs = dict(backend=cfg.backend, difficulty=cfg.difficulty, split=split, max_turns=cfg.max_turns,
                  context_budget=wrapper, **json.loads(cfg.env_kwargs))
    if cfg.tools:
        kwargs["tools"] = tuple(t.strip() for t in cfg.tools.split(",") if t.strip())
    return [lambda: gym.make(cfg.env_id, **kwargs) for _ in range(count)]


def build_policy(cfg: TrainConfig, tokenizer):
    """The trained policy (tiny MoE from a seeded init, or a saved model; its sampler's KV cache is
    ``rollout.kv_cache_dtype``) and a greedy twin for evaluation."""
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy

    m = cfg.model
    if m.pretrained:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(m.pretrained, experts_implementation="grouped_mm")
    else:
        model = tiny_moe(m.arch, hidden_size=m.hidden_size, num_layers=m.num_layers, num_experts=m.num_experts,
                         experts_per_token=m.experts_per_token, seed=m.init_seed)
    common = dict(max_new_tokens=cfg.env.context_budget.reserve, max_batch_size=cfg.env.num_envs * 4)
    # the rollouts' sampler gets the run's KV cache; held-out evaluation samples with the model's own
    policy = TransformersPolicy(model, tokenizer, temperature=m.temperature, seed=cfg.seed, **common,
                                kv_cache_dtype=cfg.rollout.kv_cache_dtype,
                                logprob_chunk_tokens=cfg.learner.logprob_chunk_tokens,
                                activation_checkpointing=cfg.learner.activation_checkpointing)
    eval_policy = TransformersPolicy(model, tokenizer, temperature=cfg.eval.temperature, seed=cfg.eval.seed,
                                     **common)
    return policy, eval_policy


def evaluation_policy(cfg: TrainConfig, eval_policy: Any, summarizer: Any = None) -> Any:
    """What held-out evaluation acts with: ``eval_policy`` (the greedy twin), and with a frozen summariser
    (``rl.frozen_summarizer``) its summaries written by a greedy twin of that summariser, as in training:
    the arm is judged on the summaries it was trained with, not on ones its own weights never learnt."""
    if summarizer is None:
        return eval_policy
    from compactrl.policies.transformers_policy import TransformersPolicy

    twin = TransformersPolicy(summarizer.model, summarizer.tokenizer, temperature=cfg.eval.temperature,
                              seed=cfg.eval.seed, max_new_tokens=cfg.env.context_budget.reserve,
                              max_batch_size=cfg.env.num_envs * 4)
    return SummaryRouter(eval_policy, twin)


class SummaryRouter:
    """Acts with ``policy``, except that summaries are written by ``summarizer`` (a frozen summariser).

    Masking summary tokens out of the loss does not freeze the summariser when the weights are
    shared (the summaries still change as the policy trains); routing summary requests to a
    separate, never-updated copy does.
    """

    def __init__(self, policy, summarizer) -> None:
        self.policy, self.summarizer = policy, summarizer

    def update_weights(self, model, **kwargs) -> None:
        """A policy that generates elsewhere (the vLLM engine) gets the new weights; the summariser stays."""
        hook = getattr(self.policy, "update_weights", None)
        if callable(hook):
            hook(model, **kwargs)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """New weights for the policy (a rollout thread's copy); the summariser stays."""
        self.policy.load_state_dict(state)

    def act(self, requests):
        out: list[Any] = [None] * len(requests)
        for pol, want in ((self.summarizer, True), (self.policy, False)):
            idx = [i for i, r in enumerate(requests) if r.compaction_required == want]
            if idx:
                for i, resp in zip(idx, pol.act([requests[i] for i in idx])):
                    out[i] = resp
        return out


# -- the vLLM engine ----------------------------------------------------------------------------------


def engine_settings(cfg: TrainConfig, policy) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(engine config fields, VLLMPolicy keywords)`` of the run's vLLM engine (``rollout.engine_*``):
    it samples like ``policy``; pure, so the config's reach is testable without starting an engine. An MoE
    policy's engine records its routes (``capture_routes``): the batches carry the engine's
    ``routed_experts``, so ``rl.routing_replay`` and the ``mismatch/route_disagree_*`` metrics work."""
    ro = cfg.rollout
    s = policy.sampling
    engine = dict(dtype=ro.engine_dtype, kv_cache_dtype=ro.kv_cache_dtype, seed=cfg.seed, threads=cfg.threads,
                  max_model_len=policy.context_length if policy.context_length < (1 << 20) else 8192,
                  capture_routes=bool(moe_routers(getattr(policy, "model", None))))
    kwargs = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=policy.max_new_tokens,
                  seed=cfg.seed, stop_token_ids=policy.stop_token_ids, sync_tolerance=ro.engine_sync_tolerance or None)
    return engine, kwargs


def start_engine(cfg: TrainConfig, policy, run: RunDir):
    """``rollout.engine=vllm``: a vLLM engine process serving ``policy``'s current weights (written to
    the run's ``engine_model/``), sampling like the policy, checked against it on the probe batch."""
    from compactrl.serving.vllm.policy import VLLMPolicy

    engine_cfg, kwargs = engine_settings(cfg, policy)
    engine = VLLMPolicy.from_model(policy.model, policy.tokenizer, run.path / "engine_model", engine=engine_cfg,
                                   log_path=run.path / "engine.log", **kwargs)
    try:  # version 0: the weights it was started from
        engine.last_sync = {"engine/start_s": engine.engine.start_s, **engine.check_sync(policy.model)}
    except BaseException:
        engine.close()
        raise
    return engine


def engine_mismatch(policy, batch) -> dict[str, float]:
    """How far the engine's sampling log-probs are from the learner's on the batch's policy tokens,
    before the update (the train-inference mismatch): k3 estimate of KL(engine || learner) and the
    max and mean |delta log p|."""
    mask = batch["policy_mask"].bool()
    if not bool(mask.any()):
        return {}
    with torch.no_grad(), RouteRecorder(getattr(policy, "model", None)) as recorder:
        learner, _ = policy.log_prob(batch["tokens"], batch["attention_mask"], select=mask)
        routes = recorder.take(*batch["tokens"].shape)
    log_ratio = (learner - batch["sample_log_prob"].float())[mask]
    k3 = torch.expm1(log_ratio) - log_ratio
    return {"mismatch/k3": float(k3.mean()), "mismatch/max_abs_dlogp": float(log_ratio.abs().max()),
            "mismatch/mean_abs_dlogp": float(log_ratio.abs().mean()), "mismatch/tokens": float(mask.sum()),
            **route_mismatch_metrics(batch, _masked_routes(routes, batch))}


def route_mismatch(policy, batch) -> dict[str, float]:
    """The expert disagreement of the batch's recorded routes with ``policy``'s own forward over the batch
    (:func:`~compactrl.policies.routing.route_mismatch_metrics`); {} when the batch has no routes."""
    if "routed_experts" not in batch.keys() or not isinstance(getattr(policy, "model", None), torch.nn.Module):
        return {}
    routes = forward_routes(policy.model, batch["tokens"], batch["attention_mask"])
    return route_mismatch_metrics(batch, routes)


def _masked_routes(routes, batch):
    return None if routes is None else routes.masked_fill(~batch["attention_mask"].bool()[..., None, None], -1)


# -- the other sources --------------------------------------------------------------------------------


def ray_collector(cfg: TrainConfig, policy, *, pad_id: int, run: RunDir | None = None):
    """Rollout workers on Ray (``distributed.*``), each building the policy from ``cfg`` and starting
    from ``policy``'s weights; each sync publishes the update. With ``rollout.engine=vllm`` every
    engine actor owns a vLLM engine process serving the model written to the run's
    ``engine_model/`` (same node), and syncs and probe-checks each published version."""
    from compactrl.distributed import RayCollector, vllm_engine

    engine_fn = None
    if cfg.rollout.engine == "vllm":
        if run is None:
            raise ValueError("rollout.engine=vllm with rollout workers needs the run directory (engine_model/)")
        model_dir = run.path / "engine_model"
        policy.model.save_pretrained(model_dir)
        engine_cfg, kwargs = engine_settings(cfg, policy)
        kwargs.pop("seed")  # each engine actor seeds its own engine and sampling stream (vllm_engine)
        engine_cfg = {k: v for k, v in engine_cfg.items() if k != "seed"} | {"threads": 1}
        engine_fn = functools.partial(vllm_engine, str(model_dir), engine_kwargs=engine_cfg, **kwargs)

    # routing summaries to a frozen copy would need a second model in every worker
    if cfg.rl.frozen_summarizer:
        raise ValueError("rl.frozen_summarizer: expected False with distributed.num_rollout_workers > 0, got True")
    d = cfg.distributed
    return RayCollector(
        make_env_fns(cfg.env, split="train", count=d.envs_per_worker), functools.partial(worker_policy, cfg.to_json()),
        num_workers=d.num_rollout_workers, episodes_per_batch=cfg.rl.episodes_per_iter,
        group_size=cfg.rl.group_size if cfg.rl.algo == "grpo" else 1, seed=cfg.seed + 1, pad_id=pad_id,
        give_task_to_policy=False, weights=policy, threads=1, start_timeout_s=d.start_timeout_s,
        num_engines=d.num_engines, max_staleness=d.max_staleness,
        **({"engine_fn": engine_fn} if engine_fn is not None else {}))


def worker_policy(cfg_json: str, index: int):
    """A rollout worker's sampling policy: the trained architecture, its own random stream per worker."""
    from compactrl.tokenizer import shared_tokenizer

    cfg = TrainConfig.from_dict(json.loads(cfg_json))
    policy, _ = build_policy(cfg, shared_tokenizer())
    policy.generator.manual_seed(cfg.seed + 7919 * (index + 1))
    return policy


def agent_collector(cfg: TrainConfig, policy, *, pad_id: int, run: RunDir | None):
    """The black-box source (``rollout.source=mini_swe_agent``): mini-swe-agent on the env's tasks
    through a gateway in front of ``policy``; sessions are recorded under the run's ``sessions/``."""
    from compactrl.gateway.collector import AgentCollector, AgentEpisodeConfig

    ro, ctx = cfg.rollout, cfg.env.context_budget
    # as the ContextBudget wrapper: compact when the context leaves no room for a reserve-sized response
    episode = AgentEpisodeConfig(context_tokens=ctx.budget - ctx.reserve, step_limit=cfg.env.max_turns, max_tokens=ctx.reserve,
                                 temperature=cfg.model.temperature, config_name=ro.agent_config,
                                 action_regex=ro.action_regex or None, command_timeout_s=ro.command_timeout_s)
    return AgentCollector(
        policy, make_env_fns(cfg.env, split="train", count=1)[0], episode, episodes_per_batch=cfg.rl.episodes_per_iter,
        group_size=cfg.rl.group_size if cfg.rl.algo == "grpo" else 1, concurrency=cfg.env.num_envs,
        seed=cfg.seed + 1, pad_id=pad_id, record_dir=str(run.path / "sessions") if run is not None else None,
        threads=cfg.threads)
