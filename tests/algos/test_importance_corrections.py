"""Importance corrections of the policy loss for a sampler that is not the learner (another engine, an fp8
KV cache): truncated IS (``tis_cap``) and masked IS (``mis_high`` / ``mis_low``).

The ratio both read is ``exp(old_log_prob - sample_log_prob)``: the learner's log-probs at the rollout's
weights over the sampler's. MIS's normalisation, decided as verl (rollout rejection: the modified
response mask is the one the loss aggregates over) and slime (``mis.py``: its ``mask`` mode returns the
modified loss mask) do: a dropped token leaves the numerator *and* the denominator, so a batch with
MIS dropping some tokens gives exactly the loss of the same batch in which those tokens were never
policy tokens.
"""

from __future__ import annotations

import pytest
import torch
from algos_helpers import TinyActor, TinyCritic, batch_with_values, random_episodes
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.algos.gae import trace_gae
from compactrl.algos.loss_config import CriticPPOConfig, GRPOConfig, PolicyLossConfig
from compactrl.algos.losses import CriticPPOLoss, GRPOLoss, add_loss_normalizers, loss_mask, whiten_advantages
from compactrl.algos.packing import micro_batches

pytestmark = pytest.mark.timeout(60)


def _batch(seed: int, *, spread: float = 0.6, same: bool = False):
    """A PPO trace batch whose learner/sampler log-ratios spread over about +-``spread`` (0 when ``same``)."""
    actor, critic = TinyActor(seed=seed % 5), TinyCritic(seed=seed % 3)
    batch = batch_with_values(random_episodes(seed, n_episodes=5, max_traces=3), seed)
    g = torch.Generator().manual_seed(seed)
    pol = batch["policy_mask"]
    with torch.no_grad():
        logp, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
        batch.set("value", critic.value(batch["tokens"], batch["attention_mask"]))
    sample = torch.where(pol, logp + 0.1 * torch.randn(logp.shape, generator=g), 0.0)
    shift = torch.zeros_like(sample) if same else spread * (2 * torch.rand(logp.shape, generator=g) - 1)
    batch.set("sample_log_prob", sample)
    batch.set("old_log_prob", torch.where(pol, sample + shift, 0.0))
    trace_gae(batch, gamma=0.99, lmbda=0.95)
    whiten_advantages(batch)
    return batch, actor, critic


def _grads(loss, parts) -> list[torch.Tensor]:
    loss.zero_grad(set_to_none=True)
    for part in parts:
        out = loss.actor_loss(part)
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in loss.actor.parameters()]


def _same(a, b, **tol) -> None:
    assert any(float(x.abs().max()) > 0 for x in a)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **(tol or dict(rtol=1e-4, atol=1e-6)))


def _ratio(batch) -> torch.Tensor:
    return (batch["old_log_prob"] - batch["sample_log_prob"]).exp()


# -- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, field", [
    ({"tis_cap": 0.0}, "tis_cap"), ({"mis_high": 1.0}, "mis_high"), ({"mis_high": 0.5}, "mis_high"),
    ({"mis_high": 2.0, "mis_low": 1.0}, "mis_low"), ({"mis_high": 2.0, "mis_low": -0.1}, "mis_low"),
    ({"mis_low": 0.5}, "mis_low"),  # a lower bound without MIS on would silently do nothing
])
def test_bad_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"^{field}: expected"):
        PolicyLossConfig(**kw)
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**kw)


def test_both_are_off_by_default_and_the_trainer_config_nests_them():
    from compactrl.training.config import override, preset

    assert PolicyLossConfig().tis_cap is None and PolicyLossConfig().mis_high is None
    cfg = override(preset("smoke"), {"rl.ppo.mis_high": 2.0, "rl.ppo.mis_low": 0.5, "rl.grpo.tis_cap": 1.5})
    assert (cfg.rl.ppo.mis_high, cfg.rl.ppo.mis_low, cfg.rl.grpo.tis_cap) == (2.0, 0.5, 1.5)
    with pytest.raises(ValueError, match="mis_high"):
        override(preset("smoke"), {"rl.ppo.mis_high": 0.9})


# -- TIS ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [0.8, 1.2, 5.0])
def test_tis_weights_each_token_by_the_capped_ratio_as_a_constant(cap):
    batch, actor, critic = _batch(3)
    add_loss_normalizers(batch)
    weight = _ratio(batch).clamp(max=cap)
    mask = loss_mask(batch)
    # the same objective with the weight folded into the advantage by hand: a constant per token, so the
    # gradient is the same only if TIS's weight carries no gradient of its own (and it is min(ratio, cap))
    plain = CriticPPOLoss(actor, critic, CriticPPOConfig(clip_eps_low=0.999, clip_eps_high=1e6))
    manual = batch.clone()
    manual.set("advantage", batch["advantage"] * weight)
    tis = CriticPPOLoss(actor, critic, CriticPPOConfig(clip_eps_low=0.999, clip_eps_high=1e6, tis_cap=cap))
    out = tis.actor_loss(batch)
    torch.testing.assert_close(out["loss_objective"], plain.actor_loss(manual)["loss_objective"])
    _same(_grads(tis, [batch]), _grads(plain, [manual]))
    assert float(out["tis_clip_fraction"]) == pytest.approx(float((_ratio(batch)[mask] >= cap).float().mean()))
    assert float(out["tis_weight_mean"]) == pytest.approx(float(weight[mask].mean()), rel=1e-5)


# -- MIS ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalization", ["token", "trace"])
@pytest.mark.parametrize("low, high", [(0.0, 1.2), (0.8, 1.25), (0.9, 10.0)])
def test_mis_drops_exactly_the_tokens_outside_the_bounds_from_numerator_and_denominator(normalization, low, high):
    batch, actor, critic = _batch(5)
    mask, ratio = loss_mask(batch), _ratio(batch)
    outside = mask & ((ratio < low) | (ratio > high))
    assert 0 < int(outside.sum()) < int(mask.sum())  # the check is not vacuous
    cfg = dict(normalization=normalization, entropy_coef=0.01, kl_coef=0.1, kl_ref_key="old_log_prob")
    mis = CriticPPOLoss(actor, critic, CriticPPOConfig(mis_high=high, mis_low=low, **cfg))
    mis.add_normalizers(batch)
    assert int(batch["num_loss_tokens"][0]) == int((mask & ~outside).sum())
    # the same batch in which the dropped tokens were never policy tokens, no MIS
    never = batch.clone()
    never.set("policy_mask", batch["policy_mask"] & ~outside)
    plain = CriticPPOLoss(actor, critic, CriticPPOConfig(**cfg))
    plain.add_normalizers(never)
    out, ref = mis.actor_loss(batch), plain.actor_loss(never)
    for key in ("loss_objective", "loss_entropy", "loss_kl"):
        torch.testing.assert_close(out[key], ref[key])
    _same(_grads(mis, [batch]), _grads(plain, [never]))
    assert float(out["mis_drop_fraction"]) == pytest.approx(float(outside.sum() / mask.sum()))
    # the value loss still learns every policy token
    assert int(batch["num_value_tokens"][0]) == int(mask.sum())


def test_mis_keeps_ratios_on_the_bounds():
    batch, actor, critic = _batch(2, same=True)
    pol = batch["policy_mask"]
    rows, cols = pol.nonzero(as_tuple=True)
    old = batch["old_log_prob"].clone()
    old[rows[0], cols[0]] += torch.tensor(2.0).log()  # ratio exactly 2
    old[rows[1], cols[1]] += torch.tensor(0.5).log()  # ratio exactly 0.5
    old[rows[2], cols[2]] += 1.0  # ratio e: dropped
    batch.set("old_log_prob", old)
    loss = CriticPPOLoss(actor, critic, CriticPPOConfig(mis_high=2.0, mis_low=0.5))
    keep = loss.mis_keep(batch, loss_mask(batch))
    assert not bool(keep[rows[2], cols[2]]) and int((loss_mask(batch) & ~keep).sum()) == 1


# -- identity and micro-batching ----------------------------------------------------------------------


@pytest.mark.parametrize("correction", [dict(tis_cap=1.5), dict(mis_high=1.5, mis_low=0.5),
                                        dict(tis_cap=2.0, mis_high=1.1)])
def test_both_are_the_identity_when_learner_and_sampler_agree(correction):
    batch, actor, critic = _batch(7, same=True)
    without_old = batch.clone()
    del without_old["old_log_prob"]
    corrected = CriticPPOLoss(actor, critic, CriticPPOConfig(**correction))
    plain = CriticPPOLoss(actor, critic, CriticPPOConfig())
    for b in (batch, without_old):
        corrected.add_normalizers(b)
        out = corrected.actor_loss(b)
        ref = plain.actor_loss(add_loss_normalizers(b.clone()))
        assert torch.equal(out["loss_objective"], ref["loss_objective"])
        _same(_grads(corrected, [b]), _grads(plain, [b]), rtol=0, atol=0)
        if "mis_high" in correction:
            assert float(out["mis_drop_fraction"]) == 0.0
        if "tis_cap" in correction:
            assert float(out["tis_clip_fraction"]) == 0.0


@settings(max_examples=20)
@given(seed=st.integers(0, 2**31 - 1), algo=st.sampled_from(["ppo", "grpo"]),
       normalization=st.sampled_from(["token", "trace"]), tis=st.sampled_from([None, 1.3]),
       bounds=st.sampled_from([(0.0, 1.15), (0.85, 1.3)]), budget=st.integers(15, 150))
def test_micro_batching_leaves_the_gradient_unchanged_with_both_on(seed, algo, normalization, tis, bounds, budget):
    batch, actor, critic = _batch(seed)
    kw = dict(normalization=normalization, tis_cap=tis, mis_low=bounds[0], mis_high=bounds[1], entropy_coef=0.01)
    loss = CriticPPOLoss(actor, critic, CriticPPOConfig(**kw)) if algo == "ppo" else GRPOLoss(actor, GRPOConfig(**kw))
    loss.add_normalizers(batch)
    full = _grads(loss, [batch])
    _same(full, _grads(loss, micro_batches(batch, budget)))
    _same(full, _grads(loss, [batch[i:i + 1] for i in range(batch.shape[0])]))


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
@pytest.mark.parametrize("bounds", [{"mis_high": 1.2}, {"mis_high": 10.0, "mis_low": 0.9}])
def test_the_run_config_reaches_the_update_step_with_whole_minibatch_counts(algo, bounds):
    """``rl.<algo>.mis_high`` / ``mis_low`` reach the trainer's update, which normalises with the loss's own
    counts (``add_normalizers``): every micro-batch sees the kept tokens of the whole minibatch."""
    from compactrl.training.config import override, preset
    from compactrl.training.update import Updater

    batch, actor, critic = _batch(11)
    seen = []
    rl = override(preset("smoke"), {"rl.algo": algo, **{f"rl.{algo}.{k}": v for k, v in bounds.items()},
                                    "rl.micro_batch_tokens": 40, "rl.epochs": 1, "rl.minibatches": 1}).rl
    upd = Updater(rl, actor, critic if algo == "ppo" else None)
    forward = upd.loss.actor_loss
    upd.loss.actor_loss = lambda td: seen.append(int(td["num_loss_tokens"][0])) or forward(td)
    stats = upd.update(batch)
    ratio = _ratio(batch)
    kept = loss_mask(batch) & (ratio <= bounds["mis_high"]) & (ratio >= bounds.get("mis_low", 0.0))
    assert len(seen) > 1 and set(seen) == {int(kept.sum())}
    assert 0 < stats["policy/mis_drop_fraction"] < 1


@pytest.mark.parametrize("correction", [{}, {"rl.ppo.tis_cap": 2.0}, {"rl.ppo.mis_high": 1.5}])
def test_the_update_writes_the_learners_own_log_probs_when_a_correction_is_on(correction):
    """Without ``old_log_prob`` from the rollout source, the learner's log-probs before the update (packed
    micro-batches) become the ratio's numerator; with no correction on, the batch is left as it was."""
    from compactrl.training.config import override, preset
    from compactrl.training.update import Updater

    batch, actor, critic = _batch(13)
    given_old = batch["old_log_prob"].clone()
    del batch["old_log_prob"]
    upd = Updater(override(preset("smoke"), {**correction, "rl.micro_batch_tokens": 30}).rl, actor, critic)
    upd.advantages(batch)
    if not correction:
        assert "old_log_prob" not in batch.keys()
        return
    with torch.no_grad():
        full, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
    pol = batch["policy_mask"]
    torch.testing.assert_close(batch["old_log_prob"][pol], full[pol], rtol=0, atol=1e-5)
    assert float(batch["old_log_prob"][~pol].abs().max()) == 0.0
    batch.set("old_log_prob", given_old)  # a source's own old_log_prob is kept
    upd.advantages(batch)
    assert torch.equal(batch["old_log_prob"], given_old)
