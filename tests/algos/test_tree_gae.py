"""GAE over trace trees: a chain is trace_gae exactly; a child's outcome flows back to its spawn point."""

from __future__ import annotations

import pytest
import torch
from algos_helpers import batch_with_values, random_episodes
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.algos.gae import gae_loop, trace_gae
from compactrl.algos.tree_gae import tree_gae, tree_order
from compactrl.collectors.batch import EpisodeMeta, stack_traces
from compactrl.types import Trace


def _chain_links(batch):
    """Tree keys for plain compaction chains: trace i continues trace i - 1."""
    prev = batch["trace_index"] - 1
    batch.set("prev_trace", prev)
    batch.set("parent_trace", torch.full_like(prev, -1))
    batch.set("spawn_position", torch.full_like(prev, -1))
    return batch


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.9, 1.0), lmbda=st.floats(0.8, 1.0),
       truncation=st.sampled_from(["bootstrap_last", "terminal"]))
def test_a_chain_is_trace_gae_bootstrap(seed, gamma, lmbda, truncation):
    episodes = random_episodes(seed, n_episodes=4, step_rewards=True)
    ref = trace_gae(batch_with_values(episodes, seed), gamma=gamma, lmbda=lmbda, truncation=truncation)
    got = tree_gae(_chain_links(batch_with_values(episodes, seed)), gamma=gamma, lmbda=lmbda, truncation=truncation)
    torch.testing.assert_close(got["advantage"], ref["advantage"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["value_target"], ref["value_target"], atol=1e-5, rtol=1e-5)


def _trace(n_prompt: int, turns: list[int], index: int, rewards: dict | None = None) -> Trace:
    ids, pol = [7] * n_prompt, [False] * n_prompt
    for k in turns:
        ids += [9] * k + [5, 5]
        pol += [True] * k + [False, False]
    return Trace(ids, pol, [False] * len(ids), [-1.0 if p else float("nan") for p in pol], rewards or {},
                 trace_index=index)


def _tree_batch(child_reward: float = 0.0, outcome: float = 1.0):
    """Root (two turns, a compaction, one turn) spawning a child after its first turn; the child
    compacts once and spawns a grandchild."""
    root0 = _trace(3, [2, 2], 0)             # policy at 3,4 and 7,8; spawn after 4
    child0 = _trace(2, [3], 1)               # policy 2,3,4
    grand = _trace(2, [1], 2, {2: 0.0})      # policy 2; spawned after child0's token 4
    child1 = _trace(2, [2], 3, {3: child_reward})  # policy 2,3
    root1 = _trace(2, [2], 4, {3: outcome})  # policy 2,3
    traces = [root0, child0, grand, child1, root1]
    batch = stack_traces([(EpisodeMeta(0, 0, True, False), traces)])
    batch.set("parent_trace", torch.tensor([-1, 0, 1, -1, -1]))
    batch.set("spawn_position", torch.tensor([-1, 4, 4, -1, -1]))
    batch.set("prev_trace", torch.tensor([-1, -1, -1, 1, 0]))
    return batch


def test_tree_order_runs_each_subtree_after_its_spawn_token():
    order = tree_order(_tree_batch())
    assert order == [(0, 3), (0, 4),              # root up to the spawn token
                     (1, 2), (1, 3), (1, 4),      # child up to its own spawn token
                     (2, 2),                      # grandchild
                     (3, 2), (3, 3),              # child after compaction
                     (0, 7), (0, 8),              # root resumes
                     (4, 2), (4, 3)]              # root after compaction


def test_child_outcome_flows_back_to_the_spawn_point_and_not_to_later_parent_tokens():
    batch = _tree_batch(child_reward=0.5, outcome=0.0)
    batch.set("value", torch.zeros(batch["tokens"].shape))
    adv = tree_gae(batch, gamma=1.0, lmbda=1.0)["advantage"]
    order = tree_order(batch)
    got = [float(adv[r, p]) for r, p in order]
    # reward-to-go: 0.5 for every token up to the child's last one, 0 after it
    assert got == [0.5] * 8 + [0.0] * 4
    # with the episode outcome instead, every token (child's included) sees it
    batch = _tree_batch(child_reward=0.0, outcome=1.0)
    batch.set("value", torch.zeros(batch["tokens"].shape))
    adv = tree_gae(batch, gamma=1.0, lmbda=1.0)["advantage"]
    assert [float(adv[r, p]) for r, p in order] == [1.0] * 12


@pytest.mark.parametrize("gamma,lmbda", [(1.0, 0.9), (0.97, 0.95)])
def test_tree_gae_equals_the_definition_on_the_tree_stream(gamma, lmbda):
    batch = _tree_batch(child_reward=0.3, outcome=1.0)
    batch.set("value", torch.randn(batch["tokens"].shape, generator=torch.Generator().manual_seed(3)))
    order = tree_order(batch)
    r = torch.tensor([float(batch["reward"][a, b]) for a, b in order])
    v = torch.tensor([float(batch["value"][a, b]) for a, b in order])
    done = torch.zeros(len(order), dtype=torch.bool)
    done[-1] = True
    ref_adv, ref_vt = gae_loop(r, v, done, gamma=gamma, lmbda=lmbda)
    out = tree_gae(batch, gamma=gamma, lmbda=lmbda)
    got = torch.tensor([float(out["advantage"][a, b]) for a, b in order])
    torch.testing.assert_close(got, ref_adv.float(), atol=1e-5, rtol=1e-5)
    # the spawn token's next value is the child's first token, the child's end bootstraps from the parent
    k_spawn = order.index((0, 4))
    assert order[k_spawn + 1] == (1, 2) and order[order.index((3, 3)) + 1] == (0, 7)
    assert float(out["advantage"][~batch["policy_mask"]].abs().sum()) == 0.0


def test_cut_and_batches_without_tree_keys_are_trace_gae():
    episodes = random_episodes(5, n_episodes=3)
    for kw in (dict(boundary="cut"), dict(boundary="bootstrap")):
        ref = trace_gae(batch_with_values(episodes, 1), gamma=1.0, lmbda=0.9, **kw)
        plain = tree_gae(batch_with_values(episodes, 1), gamma=1.0, lmbda=0.9, **kw)
        torch.testing.assert_close(plain["advantage"], ref["advantage"])


def test_bad_trees_are_value_errors():
    batch = _tree_batch()
    batch.set("value", torch.zeros(batch["tokens"].shape))
    batch.set("prev_trace", torch.tensor([-1, -1, -1, 1, -1]))  # two roots
    with pytest.raises(ValueError, match="exactly one root"):
        tree_gae(batch, gamma=1.0, lmbda=1.0)
    with pytest.raises(ValueError, match="exactly one of lmbda"):
        tree_gae(_tree_batch(), gamma=1.0)
