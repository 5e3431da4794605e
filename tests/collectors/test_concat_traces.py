"""``concat_traces``: several trace batches as one (critic pre-training's pool)."""

from __future__ import annotations

import torch

from compactrl.collectors.batch import EpisodeMeta, concat_traces, stack_traces
from compactrl.types import Trace


def _batch(lengths: list[list[int]], pad_id: int = 0):
    episodes = []
    for e, lens in enumerate(lengths):
        traces = []
        for t, n in enumerate(lens):
            pm = [False] + [True] * n
            traces.append(Trace(list(range(5, 6 + n)), pm, [False] * len(pm), [-0.5 if p else float("nan") for p in pm],
                                {n: 1.0} if t == len(lens) - 1 else {}, trace_index=t))
        episodes.append((EpisodeMeta(e, e, True, False), traces))
    return stack_traces(episodes, pad_id=pad_id)


def test_rows_keep_their_content_padding_and_unique_episode_ids():
    a, b = _batch([[2, 3], [1]], pad_id=7), _batch([[6], [2, 2]], pad_id=7)
    out = concat_traces([a, b], pad_id=7)
    assert out.batch_size[0] == a.batch_size[0] + b.batch_size[0]
    width = out["tokens"].shape[-1]
    assert width == max(a["tokens"].shape[-1], b["tokens"].shape[-1])
    for i, src in enumerate([*[(a, j) for j in range(3)], *[(b, j) for j in range(3)]]):
        batch, j = src
        n = batch["tokens"].shape[-1]
        for key in ("tokens", "attention_mask", "policy_mask", "summary_mask", "sample_log_prob", "reward"):
            assert torch.equal(out[key][i, :n], batch[key][j])
        assert (out["tokens"][i, n:] == 7).all() and not out["attention_mask"][i, n:].any()
        assert not out["policy_mask"][i, n:].any() and (out["reward"][i, n:] == 0).all()
    # the two batches both number their episodes 0, 1: after concatenation four distinct episodes,
    # and the traces of one episode still share theirs
    ids = out["episode_id"].tolist()
    assert len(set(ids)) == 4 and ids[0] == ids[1] and ids[4] == ids[5]
    assert len(set(out["group_id"].tolist())) == 4
    assert concat_traces([a])["tokens"].shape == a["tokens"].shape
