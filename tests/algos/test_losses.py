"""Critic PPO and GRPO losses: micro-batching (any split, packing) leaves the gradient unchanged."""

from __future__ import annotations

import statistics

import pytest
import torch
from algos_helpers import TinyActor, TinyCritic, batch_with_values, random_episodes, sample
from hypothesis import given
from hypothesis import strategies as st
from torchrl.objectives import LossModule

from compactrl.algos.gae import trace_gae
from compactrl.algos.losses import (
    CriticPPOConfig,
    CriticPPOLoss,
    GRPOConfig,
    GRPOLoss,
    add_loss_normalizers,
    grpo_advantage,
    loss_mask,
    whiten_advantages,
)
from compactrl.algos.packing import micro_batches, row_lengths


def _rollout_batch(seed: int, actor: TinyActor, critic: TinyCritic | None, *, off_engine: bool):
    """A trace batch as a rollout would leave it: sampling log-probs near the actor's, critic values."""
    batch = batch_with_values(random_episodes(seed, n_episodes=4, max_traces=3), seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        logp, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
        noise = lambda: 0.2 * torch.randn(logp.shape, generator=g)  # noqa: E731
        pol = batch["policy_mask"]
        batch.set("sample_log_prob", torch.where(pol, logp + noise(), 0.0))
        batch.set("ref_log_prob", torch.where(pol, logp + noise(), 0.0))
        if off_engine:
            batch.set("old_log_prob", torch.where(pol, batch["sample_log_prob"] + noise(), 0.0))
        if critic is not None:
            batch.set("value", critic.value(batch["tokens"], batch["attention_mask"]))
    return batch


def _split(n: int, data) -> list[torch.Tensor]:
    """Any partition of the rows into non-empty micro-batches, in any order."""
    perm = data.draw(st.permutations(list(range(n))))
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=n - 1)) if n > 1 else [])
    bounds = [0, *cuts, n]
    return [torch.tensor(perm[a:b]) for a, b in zip(bounds, bounds[1:])]


def _grads(loss_module: LossModule, parts) -> list[torch.Tensor]:
    loss_module.zero_grad(set_to_none=True)
    for part in parts:
        out = loss_module(part)
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in loss_module.parameters()]


def _trim(part):
    width = max(int(row_lengths(part["attention_mask"]).max()), 1)
    full = part["tokens"].shape[1]
    return part.apply(lambda t: t[:, :width] if t.dim() >= 2 and t.shape[1] == full else t)


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert any(float(x.abs().max()) > 0 for x in a)  # the check is not vacuous
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


ppo_configs = st.builds(
    CriticPPOConfig,
    clip_eps_low=st.sampled_from([0.1, 0.2]),
    clip_eps_high=st.sampled_from([0.2, 0.28]),
    entropy_coef=st.sampled_from([0.0, 0.01]),
    kl_coef=st.sampled_from([0.0, 0.1]),
    kl_estimator=st.sampled_from(["k1", "k3"]),
    tis_cap=st.sampled_from([None, 2.0]),
    train_summaries=st.booleans(),
    normalization=st.sampled_from(["token", "trace"]),
    value_clip_eps=st.sampled_from([None, 0.2]),
)


@pytest.mark.timeout(240)
@given(seed=st.integers(0, 2**31 - 1), config=ppo_configs, data=st.data())
def test_ppo_any_split_gives_the_full_batch_gradient(seed, config, data):
    actor, critic = TinyActor(seed=seed % 7), TinyCritic(seed=seed % 5)
    batch = _rollout_batch(seed, actor, critic, off_engine=config.tis_cap is not None)
    trace_gae(batch, gamma=0.99, lmbda=0.95)
    whiten_advantages(batch)
    add_loss_normalizers(batch, train_summaries=config.train_summaries)
    loss = CriticPPOLoss(actor, critic, config)
    full = _grads(loss, [batch])
    parts = [_trim(batch[idx]) for idx in _split(batch.shape[0], data)]
    _assert_same(full, _grads(loss, parts))


@pytest.mark.timeout(240)
@given(
    seed=st.integers(0, 2**31 - 1),
    normalization=st.sampled_from(["token", "trace"]),
    scale=st.booleans(),
    budget=st.integers(20, 200),
    data=st.data(),
)
def test_grpo_any_split_and_packing_give_the_full_batch_gradient(seed, normalization, scale, budget, data):
    actor = TinyActor(seed=seed % 7)
    batch = _rollout_batch(seed, actor, None, off_engine=False)
    loss = GRPOLoss(actor, GRPOConfig(normalization=normalization, scale_by_std=scale, kl_coef=0.05,
                                           kl_ref_key="ref_log_prob"))
    loss.compute_advantage(batch)
    add_loss_normalizers(batch)
    full = _grads(loss, [batch])
    parts = [_trim(batch[idx]) for idx in _split(batch.shape[0], data)]
    _assert_same(full, _grads(loss, parts))
    _assert_same(full, _grads(loss, micro_batches(batch, budget)))


@pytest.mark.timeout(120)
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(10, 300))
def test_ppo_packed_micro_batches_give_the_full_batch_gradient(seed, budget):
    actor, critic = TinyActor(seed=1), TinyCritic(seed=2)
    batch = _rollout_batch(seed, actor, critic, off_engine=True)
    trace_gae(batch, gamma=1.0, lmbda=0.9)
    add_loss_normalizers(batch)
    loss = CriticPPOLoss(actor, critic, CriticPPOConfig(entropy_coef=0.01, kl_coef=0.1, tis_cap=3.0,
                                                         kl_ref_key="ref_log_prob"))
    _assert_same(_grads(loss, [batch]), _grads(loss, micro_batches(batch, budget)))


@pytest.mark.timeout(60)
def test_ppo_outputs_and_diagnostics():
    actor, critic = TinyActor(), TinyCritic()
    batch = _rollout_batch(0, actor, critic, off_engine=True)
    trace_gae(batch, gamma=0.99, lmbda=0.95)
    loss = CriticPPOLoss(actor, critic, CriticPPOConfig(entropy_coef=0.01, kl_coef=0.1, tis_cap=2.0,
                                                         kl_ref_key="ref_log_prob"))
    assert isinstance(loss, LossModule)
    assert "CriticPPOLoss" in repr(loss)
    assert {"advantage", "value_target", "ref_log_prob", "old_log_prob"} <= set(loss.in_keys)
    out = loss(batch)
    assert set(loss.out_keys) <= set(out.keys())
    for key in (
        "loss_objective",
        "loss_critic",
        "loss_entropy",
        "loss_kl",
        "clip_fraction",
        "approx_kl",
        "entropy",
        "ratio_mean",
        "value_clip_fraction",
        "explained_variance",
        "tis_weight_mean",
    ):
        assert key in out.keys(), key
        assert out[key].shape == () and bool(torch.isfinite(out[key]))
    assert out["loss_objective"].requires_grad and out["loss_critic"].requires_grad
    assert not out["clip_fraction"].requires_grad
    assert 0 <= float(out["clip_fraction"]) <= 1 and float(out["approx_kl"]) >= 0
    assert float(out["loss_entropy"].detach()) < 0  # a bonus
    critic_only = loss.critic_loss(batch)
    assert set(critic_only.keys()) >= {"loss_critic", "explained_variance"}
    assert "loss_objective" not in critic_only.keys()


@pytest.mark.timeout(60)
def test_on_policy_ratio_is_one_and_objective_is_minus_mean_advantage():
    actor, critic = TinyActor(), TinyCritic()
    batch = _rollout_batch(3, actor, critic, off_engine=False)
    with torch.no_grad():
        logp, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
    batch.set("sample_log_prob", logp)
    trace_gae(batch, gamma=1.0, lmbda=0.95)
    out = CriticPPOLoss(actor, critic)(batch)
    mask = loss_mask(batch)
    assert float(out["ratio_mean"]) == pytest.approx(1.0, abs=1e-6)
    assert float(out["clip_fraction"]) == 0.0
    assert float(out["loss_objective"].detach()) == pytest.approx(
        -float(batch["advantage"][mask].mean()), rel=1e-5
    )


@pytest.mark.timeout(60)
def test_frozen_summaries_get_no_policy_gradient_but_keep_the_critic():
    actor, critic = TinyActor(), TinyCritic()
    batch = _rollout_batch(5, actor, critic, off_engine=False)
    trace_gae(batch, gamma=1.0, lmbda=0.95)
    summary = batch["summary_mask"]
    assert bool(summary.any())
    masked = CriticPPOLoss(actor, critic, CriticPPOConfig(train_summaries=False))
    base = masked(batch)
    changed = batch.clone()
    changed["advantage"] = torch.where(summary, changed["advantage"] + 100.0, changed["advantage"])
    changed["value_target"] = torch.where(summary, changed["value_target"] + 100.0, changed["value_target"])
    out = masked(changed)
    assert float(out["loss_objective"].detach()) == pytest.approx(
        float(base["loss_objective"].detach()), rel=1e-6
    )
    assert float(out["loss_critic"].detach()) > float(base["loss_critic"].detach())


@pytest.mark.timeout(60)
def test_grpo_advantage_is_group_normalised_per_episode():
    episodes = random_episodes(11, n_episodes=6, max_traces=3, groups=2, truncated_share=0.0)
    batch = batch_with_values(episodes, 0)
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 3.0]  # groups: episodes 0, 2, 4 and 1, 3, 5
    batch["episode_reward"] = torch.tensor(rewards)[batch["episode_id"]]
    assert int(batch["num_traces"].max()) > 1  # several traces per episode, each episode counts once
    for scale in (True, False):
        grpo_advantage(batch, scale_by_std=scale, eps=0.0)
        for e in range(6):
            group = rewards[e % 2 :: 2]
            expected = rewards[e] - statistics.mean(group)
            expected /= statistics.stdev(group) if scale else 1.0
            rows = batch["episode_id"] == e
            pol, adv = batch["policy_mask"][rows], batch["advantage"][rows]
            torch.testing.assert_close(adv[pol], torch.full_like(adv[pol], expected))
            assert bool((adv[~pol] == 0).all())


@pytest.mark.timeout(30)
def test_grpo_single_rollout_group_gets_zero_advantage():
    batch = batch_with_values(random_episodes(2, n_episodes=3, groups=3), 0)
    grpo_advantage(batch)
    assert bool((batch["advantage"] == 0).all())


@pytest.mark.timeout(30)
def test_bad_configs_name_the_field():
    with pytest.raises(ValueError, match="clip_eps_low"):
        CriticPPOConfig(clip_eps_low=1.5)
    with pytest.raises(ValueError, match="kl_estimator"):
        GRPOConfig(kl_estimator="k2")
    with pytest.raises(ValueError, match="value_clip_eps"):
        CriticPPOConfig(value_clip_eps=-1.0)
    with pytest.raises(ValueError, match="normalization"):
        GRPOConfig(normalization="sequence")


def _toy_batch(actor, episodes: int, generator: torch.Generator, *, group: int = 1):
    """Episodes of two traces of 4 sampled tokens each (the first ends with a 2-token 'summary');
    the outcome reward, at the very end, is the share of sampled tokens equal to 7."""
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    out = []
    for e in range(episodes):
        traces, hits = [], 0
        for i in range(2):
            toks, logp = sample(actor, torch.tensor([[1 + i]]), 4, generator)
            ids = toks[0].tolist()
            hits += sum(t == 7 for t in ids[1:])
            summary = [False, False, False, True, True] if i == 0 else [False] * 5
            rewards = {4: hits / 8} if i == 1 else {}
            traces.append(
                Trace(
                    ids,
                    [False] + [True] * 4,
                    summary,
                    [float("nan")] + logp[0].tolist(),
                    rewards,
                    trace_index=i,
                    episode_id=e,
                    ends_with_summary=i == 0,
                )
            )
        out.append((EpisodeMeta(episode_id=e, group_id=e // group, terminated=True, truncated=False), traces))
    return stack_traces(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_few_updates_raise_the_reward_of_a_toy_task(algo):
    """Catches sign and masking errors that gradient-invariance cannot: learning must happen."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    actor, critic = TinyActor(seed=0), TinyCritic(seed=1)
    params = list(actor.parameters()) + (list(critic.parameters()) if algo == "ppo" else [])
    opt = torch.optim.Adam(params, lr=3e-2)
    if algo == "ppo":
        loss = CriticPPOLoss(actor, critic, CriticPPOConfig(entropy_coef=0.0))
    else:
        loss = GRPOLoss(actor, GRPOConfig())
    rewards = []
    for _ in range(25):
        batch = _toy_batch(actor, 16, gen, group=8)
        rewards.append(float(batch["episode_reward"].mean()))
        if algo == "ppo":
            with torch.no_grad():
                batch.set("value", critic.value(batch["tokens"], batch["attention_mask"]))
            trace_gae(batch, gamma=1.0, lmbda=0.95)
            whiten_advantages(batch)
        else:
            loss.compute_advantage(batch)
        add_loss_normalizers(batch)
        for _ in range(2):
            opt.zero_grad()
            out = loss(batch)
            sum(v for k, v in out.items() if k.startswith("loss_")).backward()
            opt.step()
    assert sum(rewards[:3]) / 3 < 0.1 and sum(rewards[-3:]) / 3 > 0.5, rewards


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_build_losses_from_the_trainer_config(algo):
    """The trainer's config reaches the loss as it is (no renaming), and its estimator writes advantages."""
    import dataclasses

    from compactrl.algos.losses import advantage_estimator, build_losses
    from compactrl.training.config import RLConfig

    rl = RLConfig(algo=algo)
    rl = dataclasses.replace(rl, **{algo: dataclasses.replace(rl.loss, kl_coef=0.05, train_summaries=False)})
    actor, critic = TinyActor(), TinyCritic()
    batch = _rollout_batch(9, actor, critic, off_engine=False)
    module = build_losses(rl, actor, critic if algo == "ppo" else None)
    assert module.config is rl.loss and "loss_kl" in module.out_keys
    advantage_estimator(rl)(batch)
    assert "advantage" in batch.keys() and float(batch["advantage"].abs().sum()) > 0
    with pytest.raises(ValueError, match="critic"):
        build_losses(RLConfig(algo="ppo"), actor, None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_options_of_the_config_reach_the_advantage(scale_by_std):
    """``rl.grpo.scale_by_std`` and ``rl.grpo.eps`` decide the advantage the trainer trains on."""
    import dataclasses

    from compactrl.algos.loss_config import GRPOConfig
    from compactrl.algos.losses import advantage_estimator
    from compactrl.training.config import RLConfig

    rl = RLConfig(algo="grpo", whiten_advantages=False, grpo=GRPOConfig(scale_by_std=scale_by_std, eps=0.5))
    batch = _rollout_batch(3, TinyActor(), None, off_engine=False)
    expected = grpo_advantage(batch.clone(), scale_by_std=scale_by_std, eps=0.5)["advantage"]
    torch.testing.assert_close(advantage_estimator(rl)(batch)["advantage"], expected)
    other = dataclasses.replace(rl, grpo=GRPOConfig(scale_by_std=not scale_by_std, eps=0.5))
    assert not torch.equal(advantage_estimator(other)(batch.clone())["advantage"], expected)
