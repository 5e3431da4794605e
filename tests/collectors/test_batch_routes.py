"""``routed_experts`` in the trace batch: stacked per position, the sentinel where a token has no route,
kept through concatenation and padding trims."""

from __future__ import annotations

import numpy as np
import torch

from compactrl.collectors.batch import EpisodeMeta, concat_traces, stack_traces
from compactrl.training.sft import trim_padding
from compactrl.types import Trace


def trace(n: int, routes, index: int = 0) -> Trace:
    return Trace(list(range(3, 3 + n)), [False] + [True] * (n - 1), [False] * n, [-0.1] * n, trace_index=index,
                 routed_experts=routes)


def routes(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed).integers(0, 8, (n, 2, 2)).astype(np.uint8)
    r[-1] = 255
    return r


def test_routes_are_stacked_with_the_sentinel_where_none():
    a, b = routes(5, 0), routes(3, 1)
    batch = stack_traces([(EpisodeMeta(0, 0, True, False), [trace(5, a), trace(3, b, 1)]),
                          (EpisodeMeta(1, 1, True, False), [trace(4, None)])])
    got = batch["routed_experts"]
    assert got.dtype == torch.uint8 and got.shape == (3, 5, 2, 2)
    assert np.array_equal(got[0].numpy(), a) and np.array_equal(got[1, :3].numpy(), b)
    assert (got[1, 3:] == 255).all() and (got[2] == 255).all()


def test_routes_survive_concatenation_and_trimming():
    wide = stack_traces([(EpisodeMeta(0, 0, True, False), [trace(6, routes(6, 2))])])
    narrow = stack_traces([(EpisodeMeta(0, 0, True, False), [trace(3, None)])])
    assert "routed_experts" not in narrow.keys()
    both = concat_traces([narrow, wide])
    assert both["routed_experts"].shape == (2, 6, 2, 2) and (both["routed_experts"][0] == 255).all()
    assert torch.equal(both["routed_experts"][1], wide["routed_experts"][0])
    big = stack_traces([(EpisodeMeta(0, 0, True, False), [trace(2, np.array([[[300, 1]], [[-1, -1]]]))])])
    assert big["routed_experts"].dtype == torch.int16 and big["routed_experts"][0, 1].tolist() == [[-1, -1]]
    padded = concat_traces([wide, narrow])
    trimmed = trim_padding(padded[1:])
    assert trimmed["tokens"].shape[1] == 3 and trimmed["routed_experts"].shape == (1, 3, 2, 2)
