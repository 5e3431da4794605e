"""Every field of the training config reaches what it configures: changing it changes something observable.

One parametrised test over ``iter_fields``: for each leaf field, a probe builds what the trainer
builds from the config (the env, the policy, the critic, the update step on a fixed trace batch,
the SFT phase, the rollout collector, the evaluation call, the loop's schedule) and returns what it
observes; the field's new value must change that observation. ``EXEMPT`` would list fields that
no cheap probe can observe, each with the test that does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest
import torch

from compactrl.training import trainer as T
from compactrl.training.config import TrainConfig, iter_fields, override, preset
from compactrl.training.rollouts import build_policy, make_env_fns

pytestmark = pytest.mark.timeout(120)

EXEMPT: dict[str, str] = {  # field -> the test that observes it instead
    # a probe would start a vLLM engine process (~20-100 s): observed where one is started, and without one
    "rollout.engine": "tests/vllm/test_train.py::test_smoke_run_on_the_engine_survives_a_killed_engine",
    "rollout.engine_dtype": "tests/policies/test_vllm_policy.py::test_the_train_config_reaches_the_engine",
    "rollout.engine_sync_tolerance": "tests/policies/test_vllm_policy.py::test_the_train_config_reaches_the_engine",
    # the sampler's KV cache: observed in the generation it runs and in the engine's settings
    "rollout.kv_cache_dtype": "tests/policies/test_fp8_cache.py::test_the_run_config_reaches_both_samplers",
    # the probe batch has one learner/sampler ratio (e^0.5) for every token: no lower bound below 1 drops any
    "rl.ppo.mis_low": "tests/algos/test_importance_corrections.py::test_the_run_config_reaches_the_update_step_with_whole_minibatch_counts",
    "rl.grpo.mis_low": "tests/algos/test_importance_corrections.py::test_the_run_config_reaches_the_update_step_with_whole_minibatch_counts",
    # a probe would start learner ranks (a Ray, or torchrun): observed where they are started
    "learner.ranks": "tests/distributed/test_sharded_learner.py::test_two_ranks_give_one_process_gradients_and_parameters",
    "learner.launcher": "tests/vllm/test_sharded_sync.py::test_a_smoke_run_with_two_learner_ranks_and_the_engine_finishes_clean",
    "learner.sync_bucket_mb": "tests/distributed/test_sharded_learner.py::test_a_sync_fills_the_sampling_copy_and_a_corrupted_bucket_is_caught",
    "learner.mixed_precision": "tests/distributed/test_sharded_learner.py::test_mixed_precision_is_bf16_where_asked_or_on_cuda",
    "learner.start_timeout_s": "tests/distributed/test_sharded_learner.py::test_ranks_that_cannot_be_placed_fail_within_the_start_timeout",
    "learner.logprob_chunk_tokens": "tests/policies/test_long_traces.py::test_the_learner_config_reaches_the_policy_and_the_critic",
    "learner.activation_checkpointing": "tests/policies/test_long_traces.py::test_the_learner_config_reaches_the_policy_and_the_critic",
    # what the run directory keeps: observed on a run's directory
    "rollout.save_batches": "tests/training/test_trainer.py::test_saved_batches_hold_each_iteration_with_its_routes",
    # the probes' trace batch has no routes (its policy records none): observed on a batch with routes
    "rl.routing_replay": "tests/policies/test_routing_replay.py::test_the_routing_replay_setting_changes_the_update",
}

# the smoke env rarely compacts: demonstrations whose summaries matter need the main job's env
MAIN_DEMOS = {"env.max_turns": 12, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
              "env.context_budget.tool_output_cap": 192, "sft.demo_episodes": 6, "env.num_envs": 3}

# the black-box source (mini-swe-agent through the gateway) needs a real sandbox backend
AGENT = {"rollout.source": "mini_swe_agent", "env.backend": "local"}

# field -> (companion changes that make the field matter, new value); others get _changed(default)
CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "env.env_id": ({"env.difficulty": "easy", "env.tools": ""}, "CompactTerminal-v0"),
    "env.backend": ({}, "local"),
    "env.difficulty": ({}, "easy"),
    "env.tools": ({}, "view,submit"),
    "env.env_kwargs": ({}, '{"max_view_lines": 7}'),
    "env.context_budget.summary_instruction": ({}, "Summarise."),
    "env.context_budget.summary_header": ({}, "Earlier:\n"),
    "env.context_budget.max_summary_tokens": ({}, 8),
    "env.context_budget.clip_marker": ({}, "[{n} cut]"),
    "env.context_budget.tool_role": ({}, "user"),
    "model.arch": ({}, "qwen3_moe"),
    "model.hidden_size": ({}, 48),  # the MoE layer's grouped matmul needs rows of a multiple of 16 bytes
    # two layers: glm4_moe's first is dense, its second has the experts
    "model.num_experts": ({"model.num_layers": 2}, 3),
    "model.experts_per_token": ({"model.num_layers": 2}, 2),
    "model.pretrained": ({}, "SAVED"),
    "sft.enabled": ({}, False),
    "sft.demonstrator": (MAIN_DEMOS, "reproduce_first"),
    "sft.summary_quality": (MAIN_DEMOS, 0.1),
    "sft.micro_batch_tokens": ({}, 64),
    "sft.second_demonstrator": ({}, "none"),
    "sft.keep_truncated": ({**MAIN_DEMOS, "sft.summary_quality": 0.0}, True),
    "sft.budget": (MAIN_DEMOS, 2048),
    "rl.algo": ({}, "grpo"),
    "rl.group_size": ({"rl.algo": "grpo", "rl.episodes_per_iter": 4}, 4),
    "rl.lmbda": ({}, 0.5),
    "rl.lmbda_alpha": ({"rl.lmbda": "adaptive"}, 0.2),
    "rl.value_lmbda": ({}, 0.3),
    "rl.boundary": ({}, "cut"),
    "rl.truncation": ({"model.critic_head_init": 0.5}, "bootstrap_last"),  # a zero critic hides it
    "rl.gamma": ({}, 0.5),
    "rl.critic_pretrain_steps": ({}, 3),
    "rl.critic_pretrain_replay": ({"rl.critic_pretrain_steps": 3}, True),
    "rl.minibatches": ({}, 2),
    "rl.micro_batch_tokens": ({}, 40),
    "rl.max_grad_norm": ({"rl.epochs": 3}, 1e-3),
    "rl.ppo.kl_estimator": ({"rl.ppo.kl_coef": 0.5}, "k1"),
    "rl.ppo.kl_ref_key": ({"rl.ppo.kl_coef": 0.5}, "ref_log_prob"),
    "rl.ppo.tis_cap": ({}, 1.01),
    "rl.ppo.mis_high": ({}, 1.5),  # the probe batch's ratio e^0.5 = 1.65: every token dropped
    "rl.ppo.normalization": ({}, "trace"),
    "rl.ppo.value_clip_eps": ({}, None),
    "rl.ppo.clip_eps_low": ({}, 0.01),
    "rl.ppo.clip_eps_high": ({}, 0.01),
    "rl.grpo.kl_estimator": ({"rl.algo": "grpo", "rl.grpo.kl_coef": 0.5}, "k1"),
    "rl.grpo.trace_advantage": ({"rl.algo": "grpo"}, "split"),
    "rl.grpo.kl_ref_key": ({"rl.algo": "grpo", "rl.grpo.kl_coef": 0.5}, "ref_log_prob"),
    "rl.grpo.tis_cap": ({"rl.algo": "grpo"}, 1.01),
    "rl.grpo.mis_high": ({"rl.algo": "grpo"}, 1.5),
    "rl.grpo.normalization": ({"rl.algo": "grpo"}, "trace"),
    "rl.grpo.clip_eps_low": ({"rl.algo": "grpo"}, 0.01),
    "rl.grpo.clip_eps_high": ({"rl.algo": "grpo"}, 0.01),
    "rl.grpo.eps": ({"rl.algo": "grpo", "rl.whiten_advantages": False}, 5.0),
    "rl.grpo.scale_by_std": ({"rl.algo": "grpo", "rl.whiten_advantages": False}, False),
    "rl.whiten_advantages": ({}, False),
    "eval.split": ({}, "val"),
    "eval.context_budget": ({}, 700),
    "eval.temperature": ({}, 0.7),
    "eval.initial": ({}, False),
    "eval.every": ({"rl.iterations": 4}, 2),
    "checkpoint_every": ({"rl.iterations": 4}, 3),
    "rollout.source": ({"env.backend": "local"}, "mini_swe_agent"),
    "rollout.agent_config": (AGENT, "mini.yaml"),
    "rollout.action_regex": (AGENT, r"\A\s*([^\n]+)"),
    "rollout.command_timeout_s": (AGENT, 3.0),
    "distributed.envs_per_worker": ({"distributed.num_rollout_workers": 1}, 3),
    "distributed.start_timeout_s": ({"distributed.num_rollout_workers": 1}, 5.0),
    "distributed.num_engines": ({"distributed.num_rollout_workers": 1}, 1),
    # also without rollout workers since asynchronous rollouts run in process too (ThreadCollector)
    "distributed.max_staleness": ({}, 2),
}


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.25
    raise AssertionError(f"no generic change for {value!r}: add the field to CHANGES")


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _base() -> TrainConfig:
    cfg = preset("smoke")
    return override(cfg, {"rl.ppo.entropy_coef": 0.0, "rl.iterations": 1})


# -- probes ------------------------------------------------------------------------------------------


def probe_env(cfg: TrainConfig) -> Any:
    fns = make_env_fns(cfg.env, split="train", count=cfg.env.num_envs)
    env = fns[0]()
    obs, info = env.reset(seed=0)
    inner = {k: repr(v) for k, v in vars(env.unwrapped).items() if isinstance(v, (str, int, float, bool, tuple))}
    wrapper = getattr(env, "config", None) or env.get_wrapper_attr("config")
    env.close()
    return len(fns), type(env.unwrapped).__name__, inner, wrapper, json.dumps(obs, default=str)[:2000]


def _policy(cfg: TrainConfig):
    from compactrl.tokenizer import shared_tokenizer

    return build_policy(cfg, shared_tokenizer())


def probe_model(cfg: TrainConfig) -> Any:
    policy, _ = _policy(cfg)
    critic = T.build_critic(cfg, policy)
    tokens = torch.arange(3, 15)[None]
    with torch.no_grad():
        value = critic.value(tokens, torch.ones_like(tokens))
        logp, _ = policy.log_prob(tokens, torch.ones_like(tokens))
    return (policy.model.config.model_type, _digest(*policy.parameters()), policy.sampling, policy.max_new_tokens,
            _digest(value), _digest(logp))


def _count_calls(policy) -> list:
    calls: list = []
    forward = policy.log_prob
    policy.log_prob = lambda *a, **k: calls.append(1) or forward(*a, **k)
    return calls


def probe_sft(cfg: TrainConfig) -> Any:
    policy, _ = _policy(cfg)
    calls = _count_calls(policy)
    r = T.Run(cfg, None, policy, None, pad_id=0)
    row = T.sft_phase(r) if cfg.sft.enabled else {}
    row = {k: round(v, 6) for k, v in row.items() if not k.startswith("time/")}
    return row, _digest(*policy.parameters()), len(calls)


def probe_demos(cfg: TrainConfig) -> Any:
    demos, stats = T.collect_demonstrations(cfg, pad_id=0)
    return _digest(demos["tokens"]), demos.batch_size[0], stats


def _trace_batch():
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    g = torch.Generator().manual_seed(1)
    episodes = []
    for e in range(4):
        traces = []
        for t in range(1 + e % 2):
            n = 24
            pm = (torch.rand(n, generator=g) < 0.5).tolist()
            pm[0], pm[-1] = False, True
            sm = [p and t == 0 and e % 2 == 1 for p in pm]
            ids = torch.randint(3, 4000, (n,), generator=g).tolist()
            rewards = {n - 1: float(e % 2 == 1 or e == 0)} if t == e % 2 else {}
            # sampling log-probs far above and far below the model's: ratios clip on both sides
            lps = [(-1.0 if i % 2 else -20.0) if p else float("nan") for i, p in enumerate(pm)]
            traces.append(Trace(ids, pm, sm, lps, rewards, trace_index=t))
        episodes.append((EpisodeMeta(e, e // 2, e != 2, e == 2), traces))
    batch = stack_traces(episodes)
    batch["ref_log_prob"] = torch.where(batch["policy_mask"], batch["sample_log_prob"] - 0.3, 0.0)
    batch["old_log_prob"] = torch.where(batch["policy_mask"], batch["sample_log_prob"] + 0.5, 0.0)
    return batch


def probe_update(cfg: TrainConfig) -> Any:
    from compactrl.training.update import Updater

    torch.manual_seed(0)
    policy, _ = _policy(cfg)
    critic = T.build_critic(cfg, policy)
    calls = _count_calls(policy)
    upd = Updater(cfg.rl, policy, critic, seed=cfg.seed)
    batch = upd.advantages(_trace_batch())
    stats = upd.update(batch)
    params = list(policy.parameters()) + (list(critic.parameters()) if critic is not None else [])
    return (_digest(batch["advantage"]), _digest(batch.get("value_target", torch.zeros(1))), _digest(*params),
            len(calls), {k: round(v, 6) for k, v in stats.items()})


class _FakeCollector:
    def __init__(self):
        self.batches = 0

    def next(self):
        self.batches += 1
        return _trace_batch()


def probe_pretrain(cfg: TrainConfig) -> Any:
    from compactrl.training.learner import LocalLearner
    from compactrl.training.rollouts import CollectorRollouts

    policy, _ = _policy(cfg)
    critic = T.build_critic(cfg, policy)
    r = T.Run(cfg, None, policy, None, pad_id=0, critic=critic, learner=LocalLearner(cfg, policy, critic),
              rollouts=CollectorRollouts(_FakeCollector(), policy))
    row = T.critic_pretrain_phase(r)
    return r.rollouts.collector.batches, row.get("pretrain/batches"), _digest(*critic.parameters()) if critic else None


def probe_rollouts(cfg: TrainConfig) -> Any:
    policy, _ = _policy(cfg)
    r = T.Run(cfg, None, policy, None, pad_id=0)
    T.start_rollouts(r)
    c = r.rollouts.collector
    out = (c.episodes_per_batch, c.group_size, type(r.rollouts.policy).__name__, c.state_dict().get("seed"),
           type(c).__name__, getattr(c, "episode", None))  # the black-box source: how its episodes run
    r.rollouts.close()
    return out, policy.generator.initial_seed()


def probe_distributed(cfg: TrainConfig) -> Any:
    policy, _ = _policy(cfg)
    r = T.Run(cfg, None, policy, None, pad_id=0)
    T.start_rollouts(r)  # the Ray collector starts its workers at the first batch: no Ray needed here
    c = r.rollouts.collector
    out = (type(c).__name__, getattr(c, "num_workers", None), len(getattr(c, "env_fns", ())),
           getattr(c, "start_timeout_s", None), getattr(c, "num_engines", None), getattr(c, "max_staleness", None))
    r.rollouts.close()
    return out


def probe_eval(cfg: TrainConfig, monkeypatch) -> Any:
    seen = {}

    def fake_evaluate_policy(env_fns, policy, *, episodes, seed, pad_id, on_batch=None):
        env = env_fns[0]()
        seen.update(n=len(env_fns), episodes=episodes, seed=seed, temperature=policy.sampling.temperature,
                    budget=env.get_wrapper_attr("config").budget, split=env.unwrapped.split)
        env.close()
        return {"success_rate": 0.0}, []

    monkeypatch.setattr(T, "evaluate_policy", fake_evaluate_policy)
    _, eval_policy = _policy(cfg)
    T.Run(cfg, None, None, eval_policy, pad_id=0).evaluate()
    return seen


def probe_threads(cfg: TrainConfig) -> Any:
    before = torch.get_num_threads()
    try:
        T.setup(cfg, None, None, 0.0)
        return torch.get_num_threads()
    finally:  # the thread count is process-wide: later tests keep theirs
        torch.set_num_threads(before)


def probe_schedule(cfg: TrainConfig) -> Any:
    return T.schedule(cfg)


PROBES = [  # first matching prefix wins
    ("env.num_envs", probe_env), ("env.", probe_env),
    ("model.", probe_model),
    ("sft.summary_quality", probe_demos), ("sft.demonstrator", probe_demos), ("sft.keep_truncated", probe_demos),
    ("sft.budget", probe_demos), ("sft.", probe_sft),
    ("rl.critic_pretrain_steps", probe_pretrain), ("rl.critic_pretrain_replay", probe_pretrain),
    ("rl.episodes_per_iter", probe_rollouts), ("rl.group_size", probe_rollouts),
    ("rl.frozen_summarizer", probe_rollouts), ("rollout.", probe_rollouts),
    ("rl.iterations", probe_schedule),
    ("rl.", probe_update),
    ("eval.every", probe_schedule), ("eval.initial", probe_schedule), ("eval.", probe_eval),
    ("checkpoint_every", probe_schedule),
    ("seed", probe_rollouts),
    ("threads", probe_threads),
    ("distributed.", probe_distributed),
]


def _probe_for(name: str):
    return next(fn for prefix, fn in PROBES if name == prefix or (prefix.endswith(".") and name.startswith(prefix)))


FIELDS = [name for name, *_ in iter_fields()]


def test_every_field_is_probed_or_exempt():
    assert set(EXEMPT) <= set(FIELDS) and set(CHANGES) <= set(FIELDS)
    for name in FIELDS:
        assert name in EXEMPT or _probe_for(name) is not None


@pytest.mark.parametrize("name", [f for f in FIELDS if f not in EXEMPT])
def test_changing_a_field_changes_what_it_configures(name, tmp_path, monkeypatch):
    companions, value = CHANGES.get(name, ({}, None))
    if name.startswith("rl.grpo."):
        companions = {"rl.algo": "grpo", **companions}
    base = override(_base(), companions) if companions else _base()
    if name not in CHANGES:
        current = base.to_dict()
        for part in name.split("."):
            current = current[part]
        value = _changed(current)
    if value == "SAVED":  # a saved model of another size
        policy, _ = _policy(override(base, {"model.hidden_size": 48}))
        policy.save_pretrained(tmp_path / "saved")
        value = str(tmp_path / "saved")
    changed = override(base, {name: value})
    probe = _probe_for(name)
    args = (monkeypatch,) if probe is probe_eval else ()
    key = (probe.__name__, base.to_json())
    if key not in _SEEN:  # the unchanged config's observation, shared by the fields of one probe
        _SEEN[key] = probe(base, *args)
    assert probe(changed, *args) != _SEEN[key], f"{name}: {value!r} changed nothing the probe sees"


_SEEN: dict[tuple[str, str], Any] = {}


def test_the_config_is_one_tree_with_the_wrapper_and_loss_configs_nested():
    from compactrl.algos.gae import trace_gae
    from compactrl.algos.loss_config import CriticPPOConfig, GRPOConfig
    from compactrl.wrappers import ContextBudgetConfig

    cfg = TrainConfig()
    assert type(cfg.env.context_budget) is ContextBudgetConfig and cfg.env.context_budget == ContextBudgetConfig()
    assert type(cfg.rl.ppo) is CriticPPOConfig and type(cfg.rl.grpo) is GRPOConfig
    import inspect

    assert inspect.signature(trace_gae).parameters["truncation"].default == cfg.rl.truncation
    assert not {f.name for f in dataclasses.fields(cfg.env)} & {"budget", "reserve", "max_new_tokens"}
