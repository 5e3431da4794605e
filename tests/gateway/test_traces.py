"""Trace reconstruction, as properties over random sessions of agents that extend, compact and spawn."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.gateway.recording import CallRecord, SampledChoice, Session
from compactrl.gateway.traces import build_tree, sessions_to_batch


class _Agent:
    def __init__(self, name: str, root: list[int], rng: random.Random) -> None:
        self.name, self.root, self.rng = name, root, rng
        self.context = list(root)
        self.traces = 1

    def call(self, calls: list, parent: str | None = None) -> None:
        ids = [self.rng.randrange(3, 4000) for _ in range(self.rng.randint(1, 5))]
        lps = [-self.rng.random() for _ in ids]
        calls.append(CallRecord(session="s", index=len(calls), agent=self.name, parent_agent=parent,
                                prompt_ids=list(self.context), choices=[SampledChoice(ids, lps, True)],
                                policy_version=0, model="m", route="chat", t_received=0.0))
        self.context += ids + [self.rng.randrange(3, 4000) for _ in range(self.rng.randint(1, 4))]  # tool output

    def compact(self) -> None:
        self.context = self.root + [self.rng.randrange(3, 4000) for _ in range(self.rng.randint(1, 6))]
        self.traces += 1


def _session(seed: int, steps: int):
    """A main agent acting; at random it compacts, or a sub-agent (its own root) runs and compacts."""
    rng = random.Random(seed)
    calls: list = []
    main = _Agent("main", [1, 2, 3], rng)
    expected = {"main": 1}
    spawns = []
    main.call(calls)
    for k in range(steps):
        event = rng.random()
        if event < 0.25:
            main.compact()
            expected["main"] += 1
        elif event < 0.45:
            sub = _Agent(f"sub{k}", [1, 9, k + 10], rng)
            spawns.append((sub.name, len(calls) - 1))
            for _ in range(rng.randint(1, 3)):
                sub.call(calls, parent="main")
                if rng.random() < 0.3:
                    sub.compact()
            sub.call(calls, parent="main")
            expected[sub.name] = sub.traces
        main.call(calls)
    return Session("s", calls, reward=1.0), expected, spawns


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(0, 8))
def test_reconstruction_properties(seed, steps):
    session, expected, spawns = _session(seed, steps)
    nodes = build_tree(session)
    by_agent: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        by_agent.setdefault(n.agent, []).append(i)
    # one trace per context an agent started, no more
    assert {a: len(ix) for a, ix in by_agent.items()} == expected
    calls = {c.index: c for c in session.calls}
    for i, n in enumerate(nodes):
        first = calls[n.calls[0]]
        assert n.token_ids[:len(first.prompt_ids)] == first.prompt_ids
        sampled = [t for k in n.calls for t in calls[k].choices[0].token_ids]
        assert [t for t, m in zip(n.token_ids, n.policy_mask) if m] == sampled
        assert [lp for lp, m in zip(n.log_probs, n.policy_mask) if m] == \
            [lp for k in n.calls for lp in calls[k].choices[0].log_probs]
        chain = by_agent[n.agent]
        assert n.prev == (chain[chain.index(i) - 1] if chain.index(i) else -1)
    for name, spawn_call in spawns:  # a sub-agent hangs off the main trace at the spawning response's end
        child = nodes[by_agent[name][0]]
        parent = nodes[child.parent]
        assert parent.agent == "main" and spawn_call in parent.calls
        assert parent.token_ids[child.spawn_position] == calls[spawn_call].choices[0].token_ids[-1]
    batch = sessions_to_batch([session])
    assert batch.shape[0] == len(nodes) and float(batch["reward"].sum()) == 1.0
    assert int(batch["policy_mask"].sum()) == sum(len(c.choices[0].token_ids) for c in session.calls)
