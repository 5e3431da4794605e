"""Typed training configuration: one frozen dataclass per concern, named presets, validation.

The CLI (``compactrl train --help``) is generated from these classes: every field becomes an
option ``--<section>.<field>`` and its docstring becomes the help text (see
:func:`field_docs`). Presets are complete :class:`TrainConfig` values; overrides go through
:func:`override` so that validation always runs.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Any, Literal


def _check(cond: bool, name: str, expected: str, got: Any) -> None:
    if not cond:
        raise ValueError(f"{name}: expected {expected}, got {got!r}")


@dataclass(frozen=True)
class EnvConfig:
    """The training environment: a registered Gymnasium id behind the ContextBudget wrapper."""

    env_id: str = "CompactCode-v0"
    """Gymnasium id (``import compactrl`` registers it)."""
    backend: str = "sim"
    """Sandbox backend: ``sim`` (in-process), ``local`` (bubblewrap) or ``docker``."""
    difficulty: str = "tiny"
    """Task-generator preset (``tiny``, ``easy``, ``default``, ``hard``)."""
    tools: str = "view,replace,test,submit"
    """Comma-separated tools the env accepts and its system prompt lists (empty: the env's full set)."""
    context_budget: int = 860
    """Context budget in tokens; the wrapper asks for a summary before a response would exceed it."""
    max_new_tokens: int = 64
    """Longest response (tokens) the policy may generate per step."""
    max_compactions: int = 4
    """Summaries allowed per episode; exceeding the budget after that truncates the episode."""
    tool_output_cap: int = 192
    """Longest tool output (tokens) kept in the context; longer ones are clipped head + tail."""
    max_turns: int = 12
    """Env steps (responses, summaries excluded) before the episode is truncated."""
    num_envs: int = 16
    """Environments stepped in lock-step by the collector (one batched generation per round)."""
    env_kwargs: str = "{}"
    """Extra keyword arguments for ``gym.make`` as a JSON object (e.g. generator knobs)."""

    def __post_init__(self) -> None:
        _check(self.backend in ("sim", "local", "docker"), "env.backend", "sim|local|docker", self.backend)
        for name in ("context_budget", "max_new_tokens", "max_turns", "num_envs", "tool_output_cap"):
            _check(getattr(self, name) >= 1, f"env.{name}", ">= 1", getattr(self, name))
        _check(self.max_compactions >= 0, "env.max_compactions", ">= 0", self.max_compactions)
        _check(self.max_new_tokens < self.context_budget, "env.max_new_tokens",
               f"< context_budget ({self.context_budget})", self.max_new_tokens)
        try:
            extra = json.loads(self.env_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"env.env_kwargs: expected a JSON object, got {self.env_kwargs!r} ({exc})") from None
        _check(isinstance(extra, dict), "env.env_kwargs", "a JSON object", self.env_kwargs)
        _check(not (self.tools and "tools" in extra), "env.env_kwargs",
               "no 'tools' key when env.tools is set (set one of them)", self.env_kwargs)


@dataclass(frozen=True)
class ModelConfig:
    """The policy: a tiny randomly initialised MoE model of a real architecture (or a saved one)."""

    arch: str = "glm4_moe"
    """Architecture of the tiny model (``glm4_moe``, ``qwen3_moe``, ``mixtral``)."""
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
    """Initial value of the critic's output (bias); weights of the head start at zero."""

    def __post_init__(self) -> None:
        _check(self.arch in ("glm4_moe", "qwen3_moe", "mixtral"), "model.arch",
               "glm4_moe|qwen3_moe|mixtral", self.arch)
        for name in ("hidden_size", "num_layers", "num_experts", "experts_per_token"):
            _check(getattr(self, name) >= 1, f"model.{name}", ">= 1", getattr(self, name))
        _check(self.temperature > 0, "model.temperature", "> 0", self.temperature)


DEMONSTRATORS = ("reading_order", "reproduce_first", "oracle")
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
    demonstrator: Literal["reading_order", "reproduce_first", "oracle"] = "reading_order"
    """``reading_order``: reads candidate files in an order a learner can imitate;
    ``reproduce_first``: the same, but runs the tests before fixing and, after a summary that
    lost the stale line, views the bug file again (``ReadingOrderOracle(reproduce_first=True)``);
    ``oracle``: reads the file
    holding each fact directly (it knows where, from the task metadata)."""
    keep_truncated: bool = False
    """Train on demonstrations that hit a limit too (they are mostly loops after a lost fact)."""
    copy_steps: int = 200
    """Steps of in-context copy warm-up on the demonstrations' text before SFT (0 disables); it
    stands in for the pretraining a real base model has (see ``compactrl.algos.sft.copy_warmup``)."""
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
    """Context budget of the demonstrations (0 = ``env.context_budget``). The default, roomier than
    the training budget, lets most demonstrations write their fix before the first summary, so the
    value lookup is learned from every demonstration (see docs/training.md, the main job)."""
    second_demonstrator: Literal["none", "reading_order", "reproduce_first", "oracle"] = "reproduce_first"
    """A second SFT phase after the first, on this demonstrator's episodes at ``env.context_budget``
    (``none``: no second phase)."""
    second_steps: int = 100
    """Optimiser steps of the second phase."""
    second_lr: float = 1e-3
    """Learning rate of the second phase (AdamW, cosine decay to 10%)."""

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
    """The RL phase: critic PPO with GAE across trace boundaries, or the GRPO baseline."""

    algo: Literal["ppo", "grpo"] = "ppo"
    """``ppo`` (critic, token-level GAE) or ``grpo`` (group-relative outcome advantage)."""
    iterations: int = 6
    """Collect-then-update iterations."""
    episodes_per_iter: int = 32
    """Episodes collected per iteration."""
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
    critic_lr: float = 1e-3
    """Critic learning rate (AdamW)."""
    critic_warmup_iters: int = 2
    """First iterations train only the critic (the policy is not updated)."""
    critic_updates: int = 1
    """Critic optimiser steps per policy optimiser step."""
    clip_epsilon: float = 0.2
    """PPO ratio clip."""
    value_clip: float = 0.2
    """Clip of the value update around the old value (0 disables)."""
    gamma: float = 1.0
    """Discount per policy token."""
    lmbda: float = 0.95
    """GAE lambda (lambda = 1 makes ``bootstrap`` and ``cut`` identical)."""
    boundary: Literal["bootstrap", "cut"] = "bootstrap"
    """``bootstrap``: GAE runs across trace boundaries; ``cut``: each trace is its own episode."""
    truncation: Literal["terminal", "bootstrap_last"] = "terminal"
    """End of a truncated episode in GAE. ``terminal``: its end is final (the env grades the work at
    the limit, so a loop that runs out of turns earns its 0); ``bootstrap_last``: value the end by the
    critic (right only when the limit is not part of the task)."""
    train_summaries: bool = True
    """Include summary tokens in the policy loss (False masks them out; weights are still shared)."""
    frozen_summarizer: bool = False
    """Write summaries with a frozen copy of the starting policy (separate weights, not trained)."""
    whiten_advantages: bool = True
    """Normalise advantages over the policy tokens of the batch."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the sampling policy (k3 estimator)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""

    def __post_init__(self) -> None:
        _check(self.algo in ("ppo", "grpo"), "rl.algo", "ppo|grpo", self.algo)
        _check(self.boundary in ("bootstrap", "cut"), "rl.boundary", "bootstrap|cut", self.boundary)
        _check(self.truncation in ("terminal", "bootstrap_last"), "rl.truncation", "terminal|bootstrap_last",
               self.truncation)
        for name in ("episodes_per_iter", "group_size", "epochs", "minibatches", "micro_batch_tokens",
                     "critic_updates"):
            _check(getattr(self, name) >= 1, f"rl.{name}", ">= 1", getattr(self, name))
        for name in ("iterations", "critic_warmup_iters"):
            _check(getattr(self, name) >= 0, f"rl.{name}", ">= 0", getattr(self, name))
        for name in ("lr", "critic_lr", "clip_epsilon", "max_grad_norm"):
            _check(getattr(self, name) > 0, f"rl.{name}", "> 0", getattr(self, name))
        for name in ("gamma", "lmbda"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"rl.{name}", "a value in [0, 1]", getattr(self, name))
        for name in ("value_clip", "entropy_coef", "kl_coef"):
            _check(getattr(self, name) >= 0, f"rl.{name}", ">= 0", getattr(self, name))
        if self.algo == "grpo":
            _check(self.episodes_per_iter % self.group_size == 0, "rl.episodes_per_iter",
                   f"a multiple of group_size ({self.group_size})", self.episodes_per_iter)
            _check(self.group_size >= 2, "rl.group_size", ">= 2 for grpo", self.group_size)


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation with the same ContextBudget wrapper as training."""

    every: int = 6
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
    """Sampling temperature at evaluation (0 = greedy)."""
    context_budget: int = 0
    """Context budget at evaluation (0 = the training budget); set it to evaluate a run trained
    with a different budget under the serving budget (train-serve skew)."""

    def __post_init__(self) -> None:
        _check(self.every >= 1, "eval.every", ">= 1", self.every)
        _check(self.episodes >= 0, "eval.episodes", ">= 0", self.episodes)
        _check(self.temperature >= 0, "eval.temperature", ">= 0", self.temperature)
        _check(self.context_budget >= 0, "eval.context_budget", ">= 0", self.context_budget)


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
    seed: int = 0
    """Seed of everything else (torch, numpy, task streams)."""
    threads: int = 2
    """``torch.set_num_threads``."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many iterations (1 = a kill loses no completed iteration)."""

    def __post_init__(self) -> None:
        _check(self.threads >= 1, "threads", ">= 1", self.threads)
        _check(self.checkpoint_every >= 1, "checkpoint_every", ">= 1", self.checkpoint_every)

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
    unknown = set(raw) - names
    if unknown:
        raise ValueError(f"{prefix or 'config'}: unknown field(s) {sorted(unknown)}; expected some of {sorted(names)}")
    kwargs = {}
    for name, value in raw.items():
        if dataclasses.is_dataclass(hints[name]):
            kwargs[name] = _from_dict(hints[name], value, f"{prefix}{name}.")
        else:
            kwargs[name] = value
    return cls(**kwargs)


# -- presets ------------------------------------------------------------------------------------


def _preset_main() -> TrainConfig:
    """The README's default run: the field defaults, with ``rl.boundary="cut"``.

    In the job's 6 iterations the critic never explains the returns (explained variance < 0), and
    ``bootstrap`` credits the summary tokens through it; ``cut`` ends every trace with the
    rollout's reward. Measured from the same SFT model, 3 seeds each, held-out success after 6
    iterations: ``cut`` 0.47-0.56, ``bootstrap`` 0.17-0.28 (docs/training.md, the ablation).
    """
    cfg = TrainConfig()
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, boundary="cut"))


def _preset_smoke() -> TrainConfig:
    """Seconds on a CPU: every stage runs once with a minimal budget and a minimal model (CI)."""
    return TrainConfig(
        env=EnvConfig(num_envs=2, max_turns=3, context_budget=640, max_new_tokens=16, tool_output_cap=64),
        model=ModelConfig(hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1),
        sft=SFTConfig(demo_episodes=2, copy_steps=2, steps=2, batch_traces=2, budget=0, second_steps=2),
        rl=RLConfig(iterations=2, episodes_per_iter=2, group_size=2, epochs=1, minibatches=1,
                    critic_warmup_iters=1, micro_batch_tokens=2048),
        eval=EvalConfig(every=1, episodes=2),
        threads=1,
    )


def _preset_ablation() -> TrainConfig:
    """One arm of ``benchmarks/compaction_ablation.py``: a short RL phase from a shared SFT start."""
    main = _preset_main()
    return dataclasses.replace(main, rl=dataclasses.replace(main.rl, iterations=12))


PRESETS = {"main": _preset_main, "smoke": _preset_smoke, "ablation": _preset_ablation}
"""Named presets: ``main`` (the README's default run), ``smoke`` (CI), ``ablation`` (one arm)."""


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
        if leaf not in node:
            raise ValueError(f"{path}: no such config field")
        node[leaf] = value
    return TrainConfig.from_dict(raw)


# -- field documentation (drives the CLI help) ------------------------------------------------------


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (attribute docstrings, read from source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def iter_fields(cls: type = TrainConfig, prefix: str = ""):
    """Yield ``(dotted_name, type, default, doc)`` for every leaf field, depth first."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_fields(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp, getattr(defaults, f.name), docs.get(f.name, "")
