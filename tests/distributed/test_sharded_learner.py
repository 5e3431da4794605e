"""The sharded learner (FSDP2 over gloo ranks on Ray) against the one-process learner, on the same batch.

Invariants: the ranks' gradients sum to one process's gradient (the per-token normalisation is global,
whatever share of the tokens each rank holds), so parameters agree after k steps; a checkpoint saved at
2 ranks resumes at 1 and the reverse with the next step equal to an uninterrupted run's; a sync gathers
the ranks' weights into the sampling copy exactly, and a corrupted bucket is caught by the probe check.
"""

from __future__ import annotations

import copy

import pytest
import torch

from compactrl.training.config import override, preset

pytestmark = pytest.mark.timeout(300)


def _cfg(algo: str = "ppo", **changes):
    cfg = override(preset("smoke"), {"rl.algo": algo, "rl.epochs": 2, "rl.minibatches": 2, "rl.critic_updates": 1,
                                     "rl.micro_batch_tokens": 24, "rl.lr": 3e-3, "rl.critic_lr": 3e-3,
                                     "rl.max_grad_norm": 0.5, "rl.group_size": 2, "rl.episodes_per_iter": 4,
                                     "learner.ranks": 2, **changes})
    return cfg


def _batch(seed: int = 0):
    """Episodes with 1-3 traces of 2-17 policy tokens: ranks get unequal token counts and micro-batch counts."""
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    g = torch.Generator().manual_seed(seed)
    episodes = []
    for e in range(4):
        n_traces = int(torch.randint(1, 4, (1,), generator=g))
        reward = float(e % 2)
        traces = []
        for t in range(n_traces):
            n = int(torch.randint(2, 18, (1,), generator=g))
            ids = torch.randint(5, 300, (3 + n,), generator=g).tolist()
            pm = [False] * 3 + [True] * n
            rewards = {len(pm) - 1: reward} if t == n_traces - 1 else {}
            traces.append(Trace(ids, pm, [t < n_traces - 1 and i >= len(pm) - 2 for i in range(len(pm))],
                                [-2.0 if p else float("nan") for p in pm], rewards, trace_index=t))
        episodes.append((EpisodeMeta(e, e // 2, True, False), traces))
    return stack_traces(episodes)


def _local(cfg):
    from compactrl.tokenizer import shared_tokenizer
    from compactrl.training.learner import LocalLearner
    from compactrl.training.rollouts import build_policy
    from compactrl.training.trainer import build_critic

    policy, _ = build_policy(cfg, shared_tokenizer())
    return LocalLearner(override(cfg, {"learner.ranks": 1}), policy, build_critic(cfg, policy))


def _sharded(cfg, policy):
    from compactrl.training.ranks import make_learner

    return make_learner(cfg, copy.deepcopy(policy), None)


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Every gradient within 1e-4 of its tensor's largest entry, plus float32 summation noise: 1e-6 of the
    largest gradient entry of the module. A bias's gradient sums per-token terms that cancel, so the two
    ranks' summation order moves it by ~1e-8 when its net value is ~1e-4 (AMD EPYC, AVX-512)."""
    assert set(a) == set(b)
    floor = 1e-6 * max(float(g.abs().max()) for g in a.values())
    for k in a:
        diff, scale = float((a[k] - b[k]).abs().max()), float(a[k].abs().max())
        assert diff <= 1e-4 * scale + floor, (k, diff, scale, floor)


def _with_routes(batch, model, seed: int):
    """``batch`` with recorded routes that are not the model's own: for every real token and MoE layer,
    ``k`` distinct experts drawn at random (``routed_experts`` ``[N, L, moe_layers, k]`` uint8, 255 on padding)."""
    from compactrl.policies.routing import moe_layer_indices, num_experts

    n, length = batch["tokens"].shape
    layers, experts, k = len(moe_layer_indices(model)), num_experts(model), model.config.num_experts_per_tok
    g = torch.Generator().manual_seed(seed)
    routes = torch.rand(n, length, layers, experts, generator=g).argsort(-1)[..., :k].to(torch.uint8)
    batch["routed_experts"] = routes.masked_fill(~batch["attention_mask"].bool()[..., None, None], 255)
    return batch


@pytest.mark.parametrize("algo,long_traces,replay", [("ppo", False, False), ("grpo", False, False),
                                                      ("ppo", True, False), ("ppo", False, True)],
                         ids=["ppo", "grpo", "ppo-chunked-checkpointed", "ppo-routing-replay"])
def test_two_ranks_give_one_process_gradients_and_parameters(ray_cluster, algo, long_traces, replay):
    """``long_traces``: log-probs in chunks of 8 positions and activation checkpointing, on both sides (the
    chunks' recomputation in the backward runs inside the sharded root's hooks). ``replay``: the batch
    carries recorded routes (not the model's own) and ``rl.routing_replay`` is on, so every forward of
    every rank routes by them (the update differs from one without replay)."""
    cfg = _cfg(algo, **({"learner.logprob_chunk_tokens": 8, "learner.activation_checkpointing": True}
                        if long_traces else {}), **({"rl.routing_replay": True} if replay else {}))
    local = _local(cfg)
    sharded = _sharded(cfg, local.policy)
    if replay:  # the same first update without replay: another gradient
        plain = _local(override(cfg, {"rl.routing_replay": False}))
        plain.policy.model.load_state_dict(local.policy.model.state_dict())
        plain.critic.load_state_dict(local.critic.state_dict())
        batch = _with_routes(_batch(seed=0), local.policy.model, seed=0)
        stats = plain.update(plain.advantages(batch.clone()))
        first_without_replay = stats["policy/grad_norm"]
    try:
        for it in range(2):  # k = 2 updates x (2 epochs x 2 minibatches) policy steps
            batch = _batch(seed=it)
            if replay:
                batch = _with_routes(batch, local.policy.model, seed=it)
            a = local.advantages(batch.clone())
            b = sharded.advantages(batch.clone())
            if algo == "ppo":
                assert torch.allclose(a["value"], b["value"], atol=1e-5)
            assert torch.allclose(a["advantage"], b["advantage"], atol=1e-5)
            stats_a, stats_b = local.update(a), sharded.update(b)
            assert stats_a["policy/grad_norm"] == pytest.approx(stats_b["policy/grad_norm"], rel=1e-4)
            if replay and it == 0:
                # one deterministic process: any difference is the routes' (here 7e-4 relative)
                assert abs(stats_a["policy/grad_norm"] - first_without_replay) > 1e-4 * first_without_replay
            assert stats_a["loss/objective"] == pytest.approx(stats_b["loss/objective"], rel=1e-4, abs=1e-6)
            got = sharded.ranks.call("grads")
            _assert_close(_grads(local.policy.model), got["policy"])
            if algo == "ppo":
                _assert_close(_grads(local.critic), got["critic"])
        sharded.pull()
        want = dict(local.policy.model.named_parameters())
        for name, p in sharded.policy.model.named_parameters():
            assert torch.allclose(p, want[name], atol=1e-5), name
    finally:
        sharded.close()


def test_the_row_deal_is_uneven_and_covers_every_row_once():
    from compactrl.training.update import Shard, rank_rows

    weights = torch.tensor([17, 2, 9, 9, 3, 1, 12])
    parts = [rank_rows(weights, Shard(r, 3)) for r in range(3)]
    assert sorted(torch.cat(parts).tolist()) == list(range(7))
    loads = [int(weights[p].sum()) for p in parts]
    assert len(set(loads)) > 1 and max(loads) - min(loads) <= int(weights.max())
    assert rank_rows(weights, Shard(0, 1)).tolist() == list(range(7))


@pytest.mark.parametrize("saved_at,resumed_at", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_at_another_rank_count(ray_cluster, tmp_path, saved_at, resumed_at):
    cfg = _cfg("ppo")

    def learner(ranks, policy):
        return _local(cfg) if ranks == 1 else _sharded(cfg, policy)

    ref = _local(cfg)  # the uninterrupted run: step 1, then step 2
    first = learner(saved_at, ref.policy)
    try:
        first.update(first.advantages(_batch(0)))
        extra = first.save(tmp_path / "ck")
    finally:
        first.close()
    ref.update(ref.advantages(_batch(0)))
    ref.update(ref.advantages(_batch(1)))

    second = learner(resumed_at, copy.deepcopy(ref.policy))  # weights to be overwritten by the checkpoint
    try:
        second.load(tmp_path / "ck", extra)
        second.update(second.advantages(_batch(1)))
        if resumed_at > 1:
            second.pull()
        want = dict(ref.policy.model.named_parameters())
        for name, p in second.policy.model.named_parameters():
            assert torch.allclose(p, want[name], atol=2e-5), name
    finally:
        second.close()


def test_a_sync_fills_the_sampling_copy_and_a_corrupted_bucket_is_caught(ray_cluster):
    from compactrl.training.learner import LearnerSyncError

    cfg = _cfg("grpo", **{"learner.sync_bucket_mb": 0.01})  # several buckets
    local = _local(cfg)
    sharded = _sharded(cfg, local.policy)

    class Sink:  # an in-process rollout source: the sampling copy is its policy
        version = None

        def update_weights(self, policy, version, reference=None):
            self.version = version
            assert reference is not None

    try:
        sharded.update(sharded.advantages(_batch(0)))
        sink = Sink()
        row = sharded.sync(sink, version=1)
        assert sink.version == 1 and row["learner/sync_buckets"] > 1
        assert row["learner/probe_max_abs_dlogp"] < 1e-5
        sharded.ranks.call("corrupt_next_sync")
        with pytest.raises(LearnerSyncError, match="probe"):
            sharded.sync(sink, version=2)
        assert sink.version == 1  # the corrupted weights reached no engine
    finally:
        sharded.close()


def test_mixed_precision_is_bf16_where_asked_or_on_cuda():
    from compactrl.training.learner import probe_tolerance
    from compactrl.training.ranks import mixed_precision_policy

    for setting, cuda, dtype in [("auto", False, None), ("auto", True, torch.bfloat16), ("none", True, None),
                                 ("bf16", False, torch.bfloat16)]:
        cfg = _cfg(**{"learner.mixed_precision": setting})
        mp = mixed_precision_policy(cfg, cuda)
        assert mp.param_dtype == dtype and mp.reduce_dtype in (None, torch.float32)
    assert probe_tolerance(_cfg(**{"learner.mixed_precision": "bf16"})) > probe_tolerance(
        _cfg(**{"learner.mixed_precision": "none"}))
    with pytest.raises(ValueError, match="learner.mixed_precision"):
        _cfg(**{"learner.mixed_precision": "fp8"})


def test_ranks_that_cannot_be_placed_fail_within_the_start_timeout(ray_cluster):
    import time

    from compactrl.tokenizer import shared_tokenizer
    from compactrl.training.ranks import make_learner
    from compactrl.training.rollouts import build_policy

    cfg = _cfg(**{"learner.ranks": 3, "learner.start_timeout_s": 2.0})  # the tests' Ray has 2 CPUs
    policy, _ = build_policy(cfg, shared_tokenizer())
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"learner.ranks=3.*learner.start_timeout_s=2"):
        make_learner(cfg, policy, None)
    assert time.monotonic() - t0 < 30
    import ray

    deadline = time.monotonic() + 20  # the placement group was removed
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_a_dead_rank_stops_the_learner_with_a_clear_error_not_a_hang(ray_cluster):
    import time

    import ray

    from compactrl.training.ranks import LearnerRankError

    cfg = _cfg("grpo")
    local = _local(cfg)
    sharded = _sharded(cfg, local.policy)
    try:
        ray.kill(sharded.ranks.actors[1])
        t0 = time.monotonic()
        with pytest.raises(LearnerRankError, match="learner rank 1"):
            sharded.update(sharded.advantages(_batch(0)))
        assert time.monotonic() - t0 < 30  # not the process group's timeout
        assert sharded.ranks.actors == []  # every rank stopped, their CPUs back
        deadline = time.monotonic() + 20
        while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU", 0) == 2
    finally:
        sharded.close()
