"""Typed training configuration: one frozen dataclass per concern, named presets, validation.

One config tree: :class:`EnvConfig` nests the ContextBudget wrapper's own
:class:`~compactrl.wrappers.ContextBudgetConfig`, and :class:`RLConfig` nests the loss
configurations as the losses define them (:class:`~compactrl.algos.loss_config.CriticPPOConfig`,
:class:`~compactrl.algos.loss_config.GRPOConfig`), so every option has one name and one default from the trainer down
to what it configures. The CLI (``compactrl train --help``) is generated from these classes: every
leaf field becomes an option ``--<section>.<field>`` (``--env.context_budget.budget``) and its
docstring becomes the help text (see :func:`field_docs`). Presets are complete :class:`TrainConfig`
values; overrides go through :func:`override` so that validation always runs.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from compactrl.algos.loss_config import CriticPPOConfig, GRPOConfig
from compactrl.wrappers.context_budget import ContextBudgetConfig


def _check(cond: bool, name: str, expected: str, got: Any) -> None:
    if not cond:
        raise ValueError(f"{name}: expected {expected}, got {got!r}")


def _choices(tp: Any) -> tuple:
    """The values of a ``Literal`` type."""
    return typing.get_args(tp)


Backend = Literal["sim", "local", "docker"]
Difficulty = Literal["tiny", "easy", "default", "hard", "long_noisy", "variable_chain"]
Arch = Literal["glm4_moe", "qwen3_moe", "mixtral"]
Demonstrator = Literal["reading_order", "reproduce_first", "oracle"]
Truncation = Literal["terminal", "bootstrap_last"]
"""End of a truncated episode in GAE (``compactrl.algos.gae.trace_gae``'s ``truncation``)."""
DEFAULT_TRUNCATION: Truncation = "terminal"
"""The one default of ``truncation``, here and in :func:`compactrl.algos.gae.trace_gae`."""


@dataclass(frozen=True)
class EnvConfig:
    """The training environment: a registered Gymnasium id behind the ContextBudget wrapper."""

    env_id: str = "CompactCode-v0"
    """Gymnasium id (``import compactrl`` registers it)."""
    backend: Backend = "sim"
    """Sandbox backend: ``sim`` (in-process), ``local`` (bubblewrap) or ``docker``."""
    difficulty: Difficulty = "tiny"
    """Task-generator preset."""
    tools: str = "view,replace,test,submit"
    """Comma-separated tools the env accepts and its system prompt lists (empty: the env's full set)."""
    max_turns: int = 12
    """Env steps (responses, summaries excluded) before the episode is truncated."""
    num_envs: int = 16
    """Environments stepped in lock-step by the collector (one batched generation per round)."""
    env_kwargs: str = "{}"
    """Extra keyword arguments for ``gym.make`` as a JSON object (e.g. generator knobs)."""
    context_budget: ContextBudgetConfig = field(default_factory=ContextBudgetConfig)
    """The ContextBudget wrapper (``gym.make(env_id, context_budget=...)``); its ``reserve`` is also
    the longest response the policy generates."""

    def __post_init__(self) -> None:
        _check(self.backend in _choices(Backend), "env.backend", "|".join(_choices(Backend)), self.backend)
        _check(self.difficulty in _choices(Difficulty), "env.difficulty", "|".join(_choices(Difficulty)),
               self.difficulty)
        for name in ("max_turns", "num_envs"):
            _check(getattr(self, name) >= 1, f"env.{name}", ">= 1", getattr(self, name))
        try:
            extra = json.loads(self.env_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"env.env_kwargs: expected a JSON object, got {self.env_kwargs!r} ({exc})") from None
        _check(isinstance(extra, dict), "env.env_kwargs", "a JSON object", self.env_kwargs)
        _check(not (self.tools and "tools" in extra), "env.env_kwargs",
               "no 'tools' key when env.tools is set (set one of them)", self.env_kwargs)
        clash = sorted(set(extra) & ({f.name for f in dataclasses.fields(ContextBudgetConfig)} | {"context_budget"}))
        _check(not clash, "env.env_kwargs", "no ContextBudget options (set env.context_budget.*)", clash)


@dataclass(frozen=True)
class ModelConfig:
    """The policy: a tiny randomly initialised MoE model of a real architecture (or a saved one)."""

    arch: Arch = "glm4_moe"
    """Architecture of the tiny model."""
    hidden_size: int = 128
    """Residual width."""
    num_layers: int = 2
    """Decoder layers."""
    num_experts: int = 4
    """Routed experts per MoE layer."""
    experts_per_token: int = 2
    """Experts each token is routed to."""
    init_seed: int = 0
    """Seed of the random initialisation."""
    pretrained: str = ""
    """Directory of a saved model (``save_pretrained``) to start from instead of a random init."""
    temperature: float = 1.0
    """Sampling temperature while collecting training rollouts."""
    critic_head_init: float = 0.0
    """Initial value of the critic everywhere (the bias of its value head; the head's weights start
    at zero). An estimate of the success rate after SFT starts the critic near the mean return."""

    def __post_init__(self) -> None:
        _check(self.arch in _choices(Arch), "model.arch", "|".join(_choices(Arch)), self.arch)
        for name in ("hidden_size", "num_layers", "num_experts", "experts_per_token"):
            _check(getattr(self, name) >= 1, f"model.{name}", ">= 1", getattr(self, name))
        _check(self.temperature > 0, "model.temperature", "> 0", self.temperature)


DEMONSTRATORS = _choices(Demonstrator)
"""The scripted demonstrators SFT can imitate (``SFTConfig.demonstrator``)."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start on scripted (oracle) demonstrations with imperfect summaries."""

    enabled: bool = True
    """Run the warm start before RL."""
    demo_episodes: int = 512
    """Oracle episodes collected through the same ContextBudget wrapper as training."""
    summary_quality: float = 0.5
    """Oracle summary quality in [0, 1]: the probability that each fact survives into a summary."""
    demonstrator: Demonstrator = "reading_order"
    """``reading_order``: reads candidate files in an order a learner can imitate;
    ``reproduce_first``: the same, but runs the tests before fixing and, after a summary that
    lost the stale line, views the bug file again (``ReadingOrderOracle(reproduce_first=True)``);
    ``oracle``: reads the file
    holding each fact directly (it knows where, from the task metadata)."""
    keep_truncated: bool = False
    """Train on demonstrations that hit a limit too (they are mostly loops after a lost fact)."""
    copy_steps: int = 200
    """Steps of in-context copy warm-up on the demonstrations' text before SFT (0 disables); it
    stands in for the pretraining a real base model has (see ``compactrl.training.sft.copy_warmup``)."""
    steps: int = 300
    """Optimiser steps."""
    lr: float = 3e-3
    """Learning rate (AdamW, cosine decay to 10%)."""
    batch_traces: int = 16
    """Traces per optimiser step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    micro_batch_tokens: int = 8192
    """Positions per forward pass: a step's traces run in length-packed micro-batches under this
    budget (same loss, less padding; memory, not the result, is what it trades)."""
    budget: int = 896
    """Context budget of the demonstrations (0 = ``env.context_budget.budget``). The default, roomier
    than the training budget, lets most demonstrations write their fix before the first summary, so
    the value lookup is learned from every demonstration (see docs/training.md, the main job)."""
    second_demonstrator: Literal["none", "reading_order", "reproduce_first", "oracle"] = "reproduce_first"
    """A second SFT phase after the first, on this demonstrator's episodes at
    ``env.context_budget.budget`` (``none``: no second phase)."""
    second_steps: int = 100
    """Optimiser steps of the second phase."""
    second_lr: float = 1e-3
    """Learning rate of the second phase (AdamW, cosine decay to 10%)."""

    @property
    def total_steps(self) -> int:
        """Optimiser steps of every phase (copy warm-up, SFT, second phase); 0: nothing to run."""
        return self.copy_steps + self.steps + (self.second_steps if self.second_demonstrator != "none" else 0)

    def __post_init__(self) -> None:
        _check(0.0 <= self.summary_quality <= 1.0, "sft.summary_quality", "a value in [0, 1]", self.summary_quality)
        _check(self.demonstrator in DEMONSTRATORS, "sft.demonstrator", "|".join(DEMONSTRATORS), self.demonstrator)
        for name in ("demo_episodes", "batch_traces", "micro_batch_tokens"):
            _check(getattr(self, name) >= 1, f"sft.{name}", ">= 1", getattr(self, name))
        _check(self.steps >= 0, "sft.steps", ">= 0", self.steps)
        _check(self.copy_steps >= 0, "sft.copy_steps", ">= 0", self.copy_steps)
        _check(self.lr > 0, "sft.lr", "> 0", self.lr)
        _check(self.budget >= 0, "sft.budget", ">= 0", self.budget)
        _check(self.second_demonstrator in ("none", *DEMONSTRATORS), "sft.second_demonstrator",
               "|".join(("none", *DEMONSTRATORS)), self.second_demonstrator)
        _check(self.second_steps >= 0, "sft.second_steps", ">= 0", self.second_steps)
        _check(self.second_lr > 0, "sft.second_lr", "> 0", self.second_lr)


@dataclass(frozen=True)
class RLConfig:
    """The RL phase: critic PPO with GAE across trace boundaries, or the GRPO baseline.

    The defaults are the reference recipe (``--preset compactionrl``): gamma 1, a length-adaptive
    lambda ``1 - 1/(lmbda_alpha * l)`` for the advantages, value targets at ``value_lmbda`` 1, a
    critic initialised from the (SFT) policy and pre-trained for ``critic_pretrain_steps`` on fresh
    rollouts before any policy update, then ``critic_updates`` critic steps per policy step.
    """

    algo: Literal["ppo", "grpo"] = "ppo"
    """``ppo`` (critic, token-level GAE) or ``grpo`` (group-relative outcome advantage)."""
    iterations: int = 6
    """Collect-then-update iterations (each updates the policy)."""
    episodes_per_iter: int = 32
    """Episodes collected per iteration (and per critic pre-training batch)."""
    group_size: int = 4
    """GRPO: rollouts per task (PPO ignores it and uses one rollout per task)."""
    epochs: int = 2
    """Passes over each batch."""
    minibatches: int = 2
    """Optimiser steps per epoch (the batch is split into this many parts)."""
    micro_batch_tokens: int = 8192
    """Token budget of one forward/backward micro-batch (padding included); gradients accumulate."""
    lr: float = 1e-4
    """Policy learning rate (AdamW)."""
    critic_lr: float = 3e-4
    """Critic learning rate (AdamW). 3e-4: from the main job's SFT model, the critic's held-out
    trace-start AUC during pre-training averaged 0.72 over steps 24-64 at 3e-4 against 0.63 at 1e-3,
    which swung 0.45-0.86 between batches (``benchmarks/critic_pretrain_auc.py``; 2 seeds)."""
    critic_pretrain_steps: int = 50
    """PPO: critic optimiser steps on fresh rollouts of the starting policy before the first policy
    update (each batch of ``episodes_per_iter`` episodes gives ``epochs x minibatches x
    critic_updates`` of them); 0 disables the phase."""
    critic_pretrain_replay: bool = False
    """PPO: critic pre-training trains on every batch collected so far in the phase (each step on a
    minibatch drawn from all of them, of one batch's minibatch size; values and targets recomputed
    over the pool with the current critic at each new batch); False: on the latest batch only, as
    the PPO update does. Off by default: measured from the main job's SFT model it did not raise the
    critic's held-out trace-start AUC (mean over steps 24-64: 0.71 with it, 0.72 without at the
    default critic lr; 0.59 and 0.63 at 1e-3; docs/experiments.md)."""
    critic_updates: int = 2
    """Critic optimiser steps per policy optimiser step."""
    gamma: float = 1.0
    """Discount per policy token."""
    lmbda: float | Literal["adaptive"] = "adaptive"
    """GAE lambda of the advantages: a value in [0, 1], or ``adaptive``: ``1 - 1/(lmbda_alpha * l)``
    with ``l`` the policy tokens of the GAE stream (the episode under ``bootstrap``, the trace under
    ``cut``). Lambda = 1 makes ``bootstrap`` and ``cut`` identical."""
    lmbda_alpha: float = 1.5
    """``alpha`` of the adaptive lambda (used only when ``lmbda`` is ``adaptive``)."""
    value_lmbda: float | None = 1.0
    """GAE lambda of the critic's targets (1: Monte-Carlo returns, independent of the critic);
    None uses the advantages' lambda."""
    boundary: Literal["bootstrap", "cut"] = "bootstrap"
    """``bootstrap``: GAE runs across trace boundaries; ``cut``: each trace is its own episode."""
    truncation: Truncation = DEFAULT_TRUNCATION
    """End of a truncated episode in GAE. ``terminal``: its end is final (the env grades the work at
    the limit, so a loop that runs out of turns earns its 0); ``bootstrap_last``: value the end by the
    critic (right only when the limit is not part of the task)."""
    frozen_summarizer: bool = False
    """Write summaries with a frozen copy of the starting policy (separate weights, not trained)."""
    whiten_advantages: bool = True
    """Normalise advantages over the loss tokens of the batch."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    routing_replay: bool = False
    """MoE routing replay: the learner's forwards (policy loss, critic values and loss with a shared trunk)
    route each token to the experts the sampler chose (the batch's ``routed_experts``), with the gate
    weights recomputed from the learner's own router logits; False routes as the learner's router chooses."""
    ppo: CriticPPOConfig = field(default_factory=CriticPPOConfig)
    """The critic PPO loss (``algo=ppo``)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """The GRPO loss and its group-relative advantage (``algo=grpo``)."""

    @property
    def loss(self) -> CriticPPOConfig | GRPOConfig:
        """The loss configuration of ``algo``."""
        return self.ppo if self.algo == "ppo" else self.grpo

    def __post_init__(self) -> None:
        _check(self.algo in ("ppo", "grpo"), "rl.algo", "ppo|grpo", self.algo)
        _check(self.boundary in ("bootstrap", "cut"), "rl.boundary", "bootstrap|cut", self.boundary)
        _check(self.truncation in _choices(Truncation), "rl.truncation", "|".join(_choices(Truncation)),
               self.truncation)
        for name in ("episodes_per_iter", "group_size", "epochs", "minibatches", "micro_batch_tokens",
                     "critic_updates"):
            _check(getattr(self, name) >= 1, f"rl.{name}", ">= 1", getattr(self, name))
        for name in ("iterations", "critic_pretrain_steps"):
            _check(getattr(self, name) >= 0, f"rl.{name}", ">= 0", getattr(self, name))
        for name in ("lr", "critic_lr", "max_grad_norm", "lmbda_alpha"):
            _check(getattr(self, name) > 0, f"rl.{name}", "> 0", getattr(self, name))
        _check(0.0 <= self.gamma <= 1.0, "rl.gamma", "a value in [0, 1]", self.gamma)
        _check(isinstance(self.routing_replay, bool), "rl.routing_replay", "True|False", self.routing_replay)
        _check(self.lmbda == "adaptive" or (not isinstance(self.lmbda, str) and 0.0 <= self.lmbda <= 1.0),
               "rl.lmbda", "a value in [0, 1] or 'adaptive'", self.lmbda)
        _check(self.value_lmbda is None or 0.0 <= self.value_lmbda <= 1.0, "rl.value_lmbda",
               "None or a value in [0, 1]", self.value_lmbda)
        if self.algo == "grpo":
            _check(self.episodes_per_iter % self.group_size == 0, "rl.episodes_per_iter",
                   f"a multiple of group_size ({self.group_size})", self.episodes_per_iter)
            _check(self.group_size >= 2, "rl.group_size", ">= 2 for grpo", self.group_size)


@dataclass(frozen=True)
class DistributedConfig:
    """Rollouts on Ray (docs/distributed.md); 0 workers keeps the single-process collector."""

    num_rollout_workers: int = 0
    """Rollout worker actors (0: the trainer's process steps the envs itself). Needs a Ray: ``compactrl
    train --ray`` starts a local one, ``--ray-address`` joins a cluster."""
    envs_per_worker: int = 2
    """Envs (and sandboxes) each worker steps in lock-step, with one batched generation per round."""
    start_timeout_s: float = 120.0
    """Seconds a rollout worker may take to start (or restart after dying) before the run stops with an error."""
    num_engines: int = 0
    """Shared inference engine actors (1 CPU each) that generate for the rollout workers, worker ``w`` on
    engine ``w mod num_engines`` (0: every worker generates with its own copy of the policy)."""
    max_staleness: int = 0
    """Asynchronous rollouts: the workers keep generating while the learner trains, up to this many batches
    ahead of it, a busy worker takes new weights before its next round (an episode goes on with them), and a batch admits
    only traces at most this many policy versions older than the newest. Without rollout workers the
    rollouts run on a thread of the trainer's process (its own copy of the policy, or the trainer's vLLM
    engine). 0: synchronous collection, exactly as before (docs/distributed.md#asynchronous-rollouts)."""

    def __post_init__(self) -> None:
        _check(self.num_rollout_workers >= 0, "distributed.num_rollout_workers", ">= 0", self.num_rollout_workers)
        _check(self.envs_per_worker >= 1, "distributed.envs_per_worker", ">= 1", self.envs_per_worker)
        _check(self.start_timeout_s > 0, "distributed.start_timeout_s", "> 0", self.start_timeout_s)
        _check(self.num_engines >= 0, "distributed.num_engines", ">= 0", self.num_engines)
        _check(not self.num_engines or self.num_rollout_workers, "distributed.num_engines",
               "0 without rollout workers (distributed.num_rollout_workers > 0)", self.num_engines)
        _check(self.max_staleness >= 0, "distributed.max_staleness", ">= 0", self.max_staleness)


@dataclass(frozen=True)
class LearnerConfig:
    """The learner: one process, or FSDP2 ranks (docs/distributed.md#the-sharded-learner)."""

    ranks: int = 1
    """Learner ranks. 1: the policy and critic train in the trainer's process. N > 1: each is sharded
    with FSDP2 (``fully_shard``) over N ranks (gloo on CPU, NCCL on CUDA), data-parallel over the batch,
    the loss normalised by the whole batch's token count; the trainer's process keeps an unsharded
    sampling copy that every weight sync refreshes."""
    launcher: Literal["auto", "ray", "torchrun"] = "auto"
    """How the ranks start. ``ray``: Ray actors in a placement group (a local Ray if the run has none).
    ``torchrun``: the processes ``torchrun --nproc-per-node N`` started (rank 0 runs the loop, the others
    follow it). ``auto``: torchrun when launched under it, else Ray."""
    sync_bucket_mb: float = 64.0
    """Weight sync: parameters are gathered from the shards and sent to the engines in buckets of at
    most this size, so no rank holds more than one bucket of full tensors beyond its shard."""
    mixed_precision: Literal["auto", "none", "bf16"] = "auto"
    """FSDP2 mixed precision: ``bf16`` parameters and fp32 gradient reduction; ``auto`` is bf16 on CUDA
    and none on CPU (where the gloo reduction and CPU kernels gain nothing from it)."""
    logprob_chunk_tokens: int = 0
    """Compute the LM head, log-probs and entropy over at most this many positions at a time (memory
    O(chunk x vocab) instead of O(T x vocab)); 0: all at once."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them."""
    start_timeout_s: float = 120.0
    """Seconds the ranks may take to start and form their process group."""

    def __post_init__(self) -> None:
        _check(self.ranks >= 1, "learner.ranks", ">= 1", self.ranks)
        _check(self.launcher in ("auto", "ray", "torchrun"), "learner.launcher", "auto|ray|torchrun", self.launcher)
        _check(self.sync_bucket_mb > 0, "learner.sync_bucket_mb", "> 0", self.sync_bucket_mb)
        _check(self.mixed_precision in ("auto", "none", "bf16"), "learner.mixed_precision", "auto|none|bf16",
               self.mixed_precision)
        _check(self.logprob_chunk_tokens >= 0, "learner.logprob_chunk_tokens", ">= 0", self.logprob_chunk_tokens)
        _check(self.start_timeout_s > 0, "learner.start_timeout_s", "> 0", self.start_timeout_s)


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation with the same ContextBudget wrapper as training."""

    every: int = 2
    """Evaluate every this many iterations (and always at the end)."""
    initial: bool = True
    """Also evaluate at iteration 0 (after SFT, before RL)."""
    episodes: int = 64
    """Held-out episodes per evaluation (the same task seeds every time)."""
    split: str = "test"
    """Task split of the held-out tasks."""
    seed: int = 12345
    """Seed of the held-out task stream (fixed, so every evaluation sees the same tasks)."""
    temperature: float = 0.0
    """Sampling temperature at evaluation (0 = greedy; training rollouts use ``model.temperature``)."""
    context_budget: int = 0
    """Context budget at evaluation (0 = ``env.context_budget.budget``); set it to evaluate a run
    trained with a different budget under the serving budget (train-serve skew)."""

    def __post_init__(self) -> None:
        _check(self.every >= 1, "eval.every", ">= 1", self.every)
        _check(self.episodes >= 0, "eval.episodes", ">= 0", self.episodes)
        _check(self.temperature >= 0, "eval.temperature", ">= 0", self.temperature)
        _check(self.context_budget >= 0, "eval.context_budget", ">= 0", self.context_budget)


RolloutSource = Literal["env", "mini_swe_agent"]
AgentConfigName = Literal["default.yaml", "mini.yaml"]
RolloutEngine = Literal["transformers", "vllm"]
EngineDtype = Literal["float32", "bfloat16"]
KVCacheDtype = Literal["auto", "fp8"]


@dataclass(frozen=True)
class RolloutConfig:
    """Where training episodes come from: the env stepped by the trainer, or a black-box agent."""

    source: RolloutSource = "env"
    """``env``: the trace collector steps ``env.*`` with the policy. ``mini_swe_agent``: mini-swe-agent
    (PyPI, unmodified) runs the env's tasks in a real sandbox (``env.backend`` local or docker)
    through an in-process gateway in front of the policy, ``env.num_envs`` episodes at once, at
    most ``env.max_turns`` calls each, with responses of at most ``env.context_budget.reserve``
    tokens, compacting when its context leaves less room than that under
    ``env.context_budget.budget``; its recorded sessions, rewarded by the task's check, are the
    batch (docs/gateway.md)."""
    agent_config: AgentConfigName = "default.yaml"
    """mini-swe-agent's packaged config: ``default.yaml`` (text actions) or ``mini.yaml`` (``bash`` tool calls)."""
    action_regex: str = ""
    """``default.yaml``: the text model's ``action_regex`` ('' keeps mini-swe-agent's fenced-block
    regex; ``\\A\\s*([^\\n]+)`` makes a response's first line the command, which a tiny model can write)."""
    command_timeout_s: float = 30.0
    """Seconds each of the agent's commands may run in the sandbox."""
    engine: RolloutEngine = "transformers"
    """What generates the training rollouts: ``transformers`` (the learner's model, in process) or
    ``vllm`` (a vLLM engine in its own process and environment, built by ``bash scripts/setup.sh
    --vllm``; after every update the weights are synced to it and checked on a probe batch, see
    docs/policies.md). Held-out evaluation always uses the learner's model."""
    engine_dtype: EngineDtype = "float32"
    """``vllm`` only: the engine's weights and activations (float32 agrees with the learner to ~1e-6)."""
    engine_sync_tolerance: float = 0.0
    """``vllm`` only: largest max |delta log p| between engine and learner on the probe batch after a
    sync before the run stops (0: by dtype, 1e-3 for float32, 0.5 for bfloat16)."""
    kv_cache_dtype: KVCacheDtype = "auto"
    """The sampler's KV cache: ``auto`` (the model's dtype) or ``fp8`` (float8 e4m3 keys and values with
    per-tensor scales 1.0): vLLM's own ``kv_cache_dtype="fp8"`` with ``engine=vllm`` (a CPU needs AVX-512
    or AMX for it), compactrl's transformers ``Fp8KVCache`` (vLLM's scheme, any CPU) with
    ``engine=transformers``. The learner always scores in full precision (docs/mismatch.md)."""
    save_batches: bool = False
    """Keep every policy iteration's trace batch (tokens, masks, sampling log-probs, policy versions, the
    sampler's routes) in the run directory as ``batches/iter-<k>.pt`` (``RunDir.load_batch``), for offline
    study of the mismatch; about 50 bytes a token."""

    def __post_init__(self) -> None:
        _check(self.source in _choices(RolloutSource), "rollout.source", "|".join(_choices(RolloutSource)),
               self.source)
        _check(self.agent_config in _choices(AgentConfigName), "rollout.agent_config",
               "|".join(_choices(AgentConfigName)), self.agent_config)
        _check(self.command_timeout_s > 0, "rollout.command_timeout_s", "> 0", self.command_timeout_s)
        _check(self.engine in _choices(RolloutEngine), "rollout.engine", "|".join(_choices(RolloutEngine)),
               self.engine)
        _check(self.engine_dtype in _choices(EngineDtype), "rollout.engine_dtype", "|".join(_choices(EngineDtype)),
               self.engine_dtype)
        _check(self.engine_sync_tolerance >= 0, "rollout.engine_sync_tolerance", ">= 0 (0: by dtype)",
               self.engine_sync_tolerance)
        _check(self.kv_cache_dtype in _choices(KVCacheDtype), "rollout.kv_cache_dtype",
               "|".join(_choices(KVCacheDtype)), self.kv_cache_dtype)
        try:
            re.compile(self.action_regex)
        except re.error as exc:
            raise ValueError(f"rollout.action_regex: expected a regular expression, got {self.action_regex!r} "
                             f"({exc})") from None


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; the run directory stores it as ``config.json``."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """The training environment."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The supervised warm start."""
    rl: RLConfig = field(default_factory=RLConfig)
    """The RL phase."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Where the training episodes come from (the env, or a black-box agent through the gateway)."""
    seed: int = 0
    """Seed of everything else (torch, numpy, task streams)."""
    threads: int = 2
    """``torch.set_num_threads``."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many iterations (1 = a kill loses no completed iteration)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Rollout workers on Ray (none by default)."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The learner's ranks (one process by default), long-trace memory options."""

    def __post_init__(self) -> None:
        _check(self.threads >= 1, "threads", ">= 1", self.threads)
        _check(self.checkpoint_every >= 1, "checkpoint_every", ">= 1", self.checkpoint_every)
        if self.rollout.source == "mini_swe_agent":  # the agent's shell commands need a real sandbox
            _check(self.env.backend != "sim", "env.backend", "local|docker with rollout.source=mini_swe_agent",
                   self.env.backend)
            # a black box does not say which response was a summary: none can be routed
            _check(not self.rl.frozen_summarizer, "rl.frozen_summarizer",
                   "False with rollout.source=mini_swe_agent", self.rl.frozen_summarizer)
            # the agent's episodes run in the trainer's process, behind its in-process gateway
            _check(self.distributed.num_rollout_workers == 0, "distributed.num_rollout_workers",
                   "0 with rollout.source=mini_swe_agent", self.distributed.num_rollout_workers)
            # its sessions are collected batch by batch (asynchronous rollouts run trace collectors' shares)
            _check(self.distributed.max_staleness == 0, "distributed.max_staleness",
                   "0 with rollout.source=mini_swe_agent", self.distributed.max_staleness)

        if self.rollout.engine == "vllm" and self.distributed.num_rollout_workers:
            # rollout workers reach the vLLM engine through engine actors (each owns one engine process)
            _check(self.distributed.num_engines >= 1, "distributed.num_engines",
                   ">= 1 with rollout.engine=vllm and rollout workers", self.distributed.num_engines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        return _from_dict(cls, raw, "")


def _from_dict(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'}: expected a section (an object), got {raw!r}")
    unknown = set(raw) - names
    if unknown:
        raise ValueError(f"{prefix or 'config'}: unknown field(s) {sorted(unknown)}; expected some of {sorted(names)}")
    kwargs = {}
    for name, value in raw.items():
        if dataclasses.is_dataclass(hints[name]):
            kwargs[name] = _from_dict(hints[name], value, f"{prefix}{name}.")
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a nested section's own message names its field without the path
        if prefix and not str(exc).startswith(prefix):
            raise ValueError(f"{prefix}{exc}") from None
        raise


# -- presets ------------------------------------------------------------------------------------


def _preset_main() -> TrainConfig:
    """The README's default run: the main job's budget and the reference recipe over 4 policy iterations.

    The :class:`RLConfig` defaults (gamma 1, adaptive lambda, value lambda 1, 50 critic
    pre-training steps, 2 critic updates per policy update, GAE across trace boundaries) with ``rl.iterations`` 4: the boundary experiment (8 seeds, equal compute) put this
    recipe first on the main job's tasks and ``cut``'s lead of round 1 came from lambda 0.95
    (docs/experiments.md); ``--preset compactionrl`` is the same recipe at the default 6 iterations.
    """
    base = TrainConfig()
    return dataclasses.replace(
        base,
        env=dataclasses.replace(base.env, context_budget=ContextBudgetConfig(
            budget=860, reserve=64, tool_output_cap=192, max_compactions=4)),
        rl=dataclasses.replace(base.rl, iterations=4),
    )


def _preset_compactionrl() -> TrainConfig:
    """The reference recipe (CompactionRL): the main job's env, model, SFT and evaluation with the
    :class:`RLConfig` defaults (gamma 1, adaptive lambda with alpha 1.5, value lambda 1, 50 critic
    pre-training steps, 2 critic updates per policy update, ``bootstrap`` across trace boundaries)."""
    return dataclasses.replace(_preset_main(), rl=RLConfig())


def _preset_smoke() -> TrainConfig:
    """Seconds on a CPU: every stage runs once with a minimal budget and a minimal model (CI)."""
    return TrainConfig(
        env=EnvConfig(num_envs=2, max_turns=3, context_budget=ContextBudgetConfig(
            budget=640, reserve=16, tool_output_cap=64, max_compactions=4)),
        model=ModelConfig(hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1),
        sft=SFTConfig(demo_episodes=2, copy_steps=2, steps=2, batch_traces=2, budget=0, second_steps=2),
        rl=RLConfig(iterations=2, episodes_per_iter=2, group_size=2, epochs=1, minibatches=1,
                    critic_pretrain_steps=1, critic_updates=1, micro_batch_tokens=2048),
        eval=EvalConfig(every=1, episodes=2),
        threads=1,
    )


def _preset_ablation() -> TrainConfig:
    """One arm of ``benchmarks/compaction_ablation.py`` (round 1's six-arm ablation, kept reproducible):
    the main job's env with round 1's RL settings -- lambda 0.95 for advantages and value targets,
    8 critic pre-training steps on the latest batch, 1 critic update per policy update -- and 10
    policy iterations; the ablation's arms set the boundary."""
    main = _preset_main()
    return dataclasses.replace(main, rl=dataclasses.replace(
        main.rl, boundary="cut", lmbda=0.95, value_lmbda=None, critic_lr=1e-3, critic_pretrain_steps=8,
        critic_pretrain_replay=False, critic_updates=1, iterations=10))


PRESETS = {"main": _preset_main, "compactionrl": _preset_compactionrl, "smoke": _preset_smoke,
           "ablation": _preset_ablation}
"""Named presets: ``main`` (the README's default run), ``compactionrl`` (the reference recipe),
``smoke`` (CI), ``ablation`` (one arm)."""


def preset(name: str) -> TrainConfig:
    """The preset called ``name``."""
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]()


def override(cfg: TrainConfig, changes: dict[str, Any]) -> TrainConfig:
    """Return ``cfg`` with dotted-path ``changes`` (``{"rl.lr": 1e-4, "seed": 3}``) applied and validated."""
    raw = cfg.to_dict()
    for path, value in changes.items():
        node = raw
        *parents, leaf = path.split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                raise ValueError(f"{path}: no such config section {p!r}")
            node = node[p]
        if leaf not in node or isinstance(node[leaf], dict):
            raise ValueError(f"{path}: no such config field")
        node[leaf] = value
    return TrainConfig.from_dict(raw)


# -- field documentation (drives the CLI help) ------------------------------------------------------


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` and its dataclass bases (read from source)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def iter_fields(cls: type = TrainConfig, prefix: str = "", instance: Any = None):
    """Yield ``(dotted_name, type, default, doc)`` for every leaf field, depth first.

    Defaults are those of ``instance`` (default: ``cls()``), so a nested section's defaults are
    the ones its parent gives it.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    instance = cls() if instance is None else instance
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_fields(tp, f"{prefix}{f.name}.", getattr(instance, f.name))
        else:
            yield f"{prefix}{f.name}", tp, getattr(instance, f.name), docs.get(f.name, "")
