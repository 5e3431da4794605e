"""The update step (compactrl.training.update) on its own: step counts, critic pre-training, advantages."""

from __future__ import annotations

import pytest
import torch

from compactrl.training.config import override, preset
from compactrl.training.learner import LocalLearner
from compactrl.training.update import Updater

pytestmark = pytest.mark.timeout(120)


def _policy(seed: int = 3):
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import shared_tokenizer

    return TransformersPolicy(tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1,
                                       seed=seed), shared_tokenizer())


def _stream_batch(lengths: list[int], reward: float, *more: tuple[list[int], float]):
    """Episodes whose traces hold ``lengths`` policy tokens each (after a 2-token prompt), the reward
    at the end; ``more``: further ``(lengths, reward)`` episodes."""
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    episodes = []
    for e, (lens, r) in enumerate([(lengths, reward), *more]):
        traces = []
        for t, n in enumerate(lens):
            pm = [False, False] + [True] * n
            rewards = {n + 1: r} if t == len(lens) - 1 else {}
            traces.append(Trace(list(range(3, 5 + n)), pm, [False] * len(pm),
                                [-1.0 if p else float("nan") for p in pm], rewards, trace_index=t))
        episodes.append((EpisodeMeta(e, e, True, False), traces))
    return stack_traces(episodes)


def _hand_gae(values: list[float], rewards: list[float], lam: float) -> list[float]:
    """GAE at gamma = 1 written out: A_t = sum_k lam^k delta_{t+k}, delta_t = r_t + V_{t+1} - V_t, V_end = 0."""
    deltas = [r + (values[t + 1] if t + 1 < len(values) else 0.0) - v for t, (v, r) in enumerate(zip(values, rewards))]
    return [sum(lam ** k * d for k, d in enumerate(deltas[t:])) for t in range(len(deltas))]


@pytest.mark.parametrize("boundary", ["bootstrap", "cut"])
def test_adaptive_lambda_equals_a_hand_computation(boundary):
    """``rl.lmbda="adaptive"``: lambda = 1 - 1/(alpha * l), l the policy tokens of the GAE stream: the
    whole episode under ``bootstrap`` (l = 6 here: lambda 8/9), each trace under ``cut`` (l = 3: 7/9)."""
    cfg = override(preset("smoke"), {"rl.lmbda": "adaptive", "rl.lmbda_alpha": 1.5, "rl.gamma": 1.0,
                                     "rl.boundary": boundary, "rl.whiten_advantages": False, "rl.value_lmbda": 1.0})
    batch = _stream_batch([3, 3], reward=1.0)
    v = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    batch["value"] = torch.zeros(batch["tokens"].shape)
    batch["value"][0, 2:5], batch["value"][1, 2:5] = torch.tensor(v[:3]), torch.tensor(v[3:])
    policy = _policy()
    from compactrl.policies.critic import ValueModel

    Updater(cfg.rl, policy, ValueModel.from_policy(policy)).estimate(batch)
    got = torch.cat([batch["advantage"][0, 2:5], batch["advantage"][1, 2:5]]).tolist()
    if boundary == "bootstrap":
        want = _hand_gae(v, [0, 0, 0, 0, 0, 1.0], 1 - 1 / (1.5 * 6))
    else:  # each trace ends with the episode's reward
        want = _hand_gae(v[:3], [0, 0, 1.0], 1 - 1 / (1.5 * 3)) + _hand_gae(v[3:], [0, 0, 1.0], 1 - 1 / (1.5 * 3))
    assert got == pytest.approx(want, abs=1e-6)
    # value lambda 1: the targets are the Monte-Carlo return (1 at every token), whatever the critic says
    targets = torch.cat([batch["value_target"][0, 2:5], batch["value_target"][1, 2:5]])
    assert targets.tolist() == pytest.approx([1.0] * 6)


def _steps(opt) -> int:
    return max((int(s["step"]) for s in opt.state.values()), default=0)


def test_update_takes_critic_updates_critic_steps_per_policy_step():
    from compactrl.policies.critic import ValueModel

    cfg = override(preset("smoke"), {"rl.epochs": 2, "rl.minibatches": 2, "rl.critic_updates": 3})
    batch = _stream_batch([4, 3], 1.0, ([5], 0.0))
    policy = _policy()
    upd = Updater(cfg.rl, policy, ValueModel.from_policy(policy))
    stats = upd.update(upd.advantages(batch))
    assert (_steps(upd.opt), _steps(upd.critic_opt)) == (4, 12)
    assert {"loss/objective", "loss/critic", "policy/grad_norm", "critic/grad_norm", "critic/explained_variance"} <= set(stats)
    assert upd.steps_per_batch() == 12
    # pre-training: critic steps only, stopped at the limit
    upd2 = Updater(cfg.rl, policy, ValueModel.from_policy(policy))
    upd2.update(upd2.advantages(batch), train_policy=False, max_critic_steps=5)
    assert (_steps(upd2.opt), _steps(upd2.critic_opt)) == (0, 5)


def test_updater_needs_a_critic_exactly_for_ppo():
    policy = _policy()
    with pytest.raises(ValueError, match="critic"):
        Updater(preset("smoke").rl, policy, None)
    with pytest.raises(ValueError, match="critic"):
        Updater(override(preset("smoke"), {"rl.algo": "grpo"}).rl, policy, torch.nn.Linear(1, 1))


@pytest.mark.parametrize("replay", [True, False])
def test_critic_pretraining_runs_its_steps_on_fresh_batches_before_any_policy_step(replay):
    """``rl.critic_pretrain_steps``: batches of fresh rollouts until that many critic steps; no policy
    step. ``rl.critic_pretrain_replay``: each batch joins the pool the steps draw from (one episode
    per batch here: the pool holds 1, 2, 3 episodes), at the same number of steps."""
    from compactrl.training import trainer as T
    from compactrl.training.rollouts import CollectorRollouts

    cfg = override(preset("smoke"), {"rl.critic_pretrain_steps": 5, "rl.epochs": 1, "rl.minibatches": 1,
                                     "rl.critic_updates": 2, "rl.critic_pretrain_replay": replay})

    class Fresh:
        def __init__(self):
            self.batches = 0

        def next(self):
            self.batches += 1
            return _stream_batch([3, 2], reward=float(self.batches % 2))

    policy = _policy()
    critic = T.build_critic(cfg, policy)
    r = T.Run(cfg, None, policy, None, pad_id=0, critic=critic, learner=LocalLearner(cfg, policy, critic),
              rollouts=CollectorRollouts(Fresh(), policy))
    pools = [row["pool_episodes"] for _, row in T.critic_pretrain_batches(r, 5)]
    assert pools == ([1.0, 2.0, 3.0] if replay else [1.0, 1.0, 1.0])
    assert (_steps(r.learner.updater.opt), _steps(r.learner.updater.critic_opt)) == (0, 5)
    r.rollouts, r.learner = CollectorRollouts(Fresh(), policy), LocalLearner(cfg, policy, critic)
    row = T.critic_pretrain_phase(r)
    assert r.rollouts.collector.batches == 3 and row["pretrain/batches"] == 3.0  # 2 + 2 + 1 steps
    assert row["pretrain/pool_episodes"] == (3.0 if replay else 1.0)
    assert (_steps(r.learner.updater.opt), _steps(r.learner.updater.critic_opt)) == (0, 5)
    assert T.critic_pretrain_phase(T.Run(override(cfg, {"rl.critic_pretrain_steps": 0}), None, policy, None,
                                         pad_id=0, critic=critic)) == {}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_update_step_gradient_does_not_depend_on_the_micro_batch_budget(algo):
    import copy

    from compactrl.algos.losses import add_loss_normalizers
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.policies.critic import ValueModel
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.update import optimizer_step
    from compactrl.types import Trace

    g = torch.Generator().manual_seed(1)
    episodes = []
    for e in range(4):
        traces = []
        for t in range(1 + e % 2):
            n = int(torch.randint(8, 30, (1,), generator=g))
            pm = (torch.rand(n, generator=g) < 0.5).tolist()
            pm[0] = False
            ids = torch.randint(3, 4000, (n,), generator=g).tolist()
            last = max(i for i, p in enumerate(pm) if p) if any(pm) else None
            rewards = {last: float(e % 2)} if last is not None and t == e % 2 else {}
            traces.append(Trace(ids, pm, [False] * n, [-1.0 if p else float("nan") for p in pm], rewards,
                                trace_index=t))
        episodes.append((EpisodeMeta(e, e // 2, True, False), traces))
    batch = stack_traces(episodes)
    batch["advantage"] = torch.randn(batch["tokens"].shape, generator=g) * batch["policy_mask"]
    batch["value"] = torch.zeros(batch["tokens"].shape)
    batch["value_target"] = torch.randn(batch["tokens"].shape, generator=g)
    cfg = override(preset("smoke"), {"rl.algo": algo})
    grads, critic_grads = [], []
    for budget in (10_000, 40):
        policy = TransformersPolicy(tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2,
                                             experts_per_token=1, seed=3), load_tokenizer())
        critic = ValueModel.from_policy(policy) if algo == "ppo" else None
        upd = Updater(override(cfg, {"rl.micro_batch_tokens": budget}).rl, policy, critic)
        opt = torch.optim.SGD(policy.parameters(), lr=0.0)
        mb = add_loss_normalizers(copy.deepcopy(batch))
        optimizer_step(mb, upd.loss.actor_loss, opt, policy, name="policy", micro_batch_tokens=budget,
                       max_grad_norm=1e9)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]))
        if critic is not None:
            optimizer_step(mb, upd.loss.critic_loss, torch.optim.SGD(critic.parameters(), lr=0.0), critic,
                           name="critic", micro_batch_tokens=budget, max_grad_norm=1e9)
            critic_grads.append(torch.cat([p.grad.flatten() for p in critic.parameters() if p.grad is not None]))
    assert len({g.numel() for g in grads}) == 1 and grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    if critic_grads:
        assert critic_grads[0].abs().sum() > 0
        torch.testing.assert_close(critic_grads[0], critic_grads[1], rtol=1e-4, atol=1e-6)


def test_critic_pretraining_replay_steps_cost_one_batchs_minibatch():
    """With the pool split into ``minibatches x batches`` parts, a step trains on about one batch's
    minibatch of traces, however many batches the pool holds (a step costs the same)."""
    from compactrl.collectors.batch import concat_traces

    cfg = override(preset("smoke"), {"rl.epochs": 1, "rl.minibatches": 2, "rl.critic_updates": 1})
    pool = concat_traces([_stream_batch([3], 1.0, ([2], 0.0), ([4], 1.0), ([3], 0.0)) for _ in range(3)])
    policy = _policy()
    from compactrl.policies.critic import ValueModel

    critic = ValueModel.from_policy(policy)
    upd = Updater(cfg.rl, policy, critic)
    upd.advantages(pool)
    seen = []
    original = upd.loss.critic_loss
    upd.loss.critic_loss = lambda td: (seen.append(int(td["episode_id"].numel())), original(td))[1]
    upd.update(pool, train_policy=False, max_critic_steps=2, minibatches=2 * 3)
    assert seen == [2, 2]  # 12 one-trace episodes in 6 parts; 2 steps of 2 traces each


def test_a_learner_saved_before_its_first_policy_step_resumes_exactly(tmp_path):
    """A checkpoint at iteration 0 (critic pre-trained, no policy step yet): the restored learner's next
    update equals the uninterrupted one's, bit for bit (no optimiser step is invented at load)."""
    import copy

    from compactrl.policies.critic import ValueModel

    cfg = override(preset("smoke"), {"rl.epochs": 1, "rl.minibatches": 1})
    batch = _stream_batch([4, 3], 1.0, ([5], 0.0))
    policy = _policy()
    ref = LocalLearner(cfg, policy, ValueModel.from_policy(policy))
    ref.update(ref.advantages(batch.clone()), train_policy=False, max_critic_steps=1)  # critic only
    extra = ref.save(tmp_path / "ck")
    again = LocalLearner(cfg, copy.deepcopy(_policy(seed=9)), ValueModel.from_policy(_policy(seed=9)))
    again.load(tmp_path / "ck", extra)
    assert not again.updater.opt.state and again.updater.critic_opt.state
    ref.update(ref.advantages(batch.clone()))
    again.update(again.advantages(batch.clone()))
    for (n, a), b in zip(ref.policy.named_parameters(), again.policy.parameters()):
        assert torch.equal(a, b), n
