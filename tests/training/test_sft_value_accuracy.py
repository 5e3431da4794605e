"""benchmarks/sft_value_accuracy.py finds the three value tokens of every fix a demonstration writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sft_value_accuracy as va  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_every_fix_has_the_three_value_tokens_and_accuracy_is_a_share(tmp_path):
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.tokenizer import load_tokenizer

    tok = load_tokenizer()
    batch = va.held_out_demos(4, seed=5)
    positions = va.value_positions(batch, tok)
    solved = len({int(e) for e, r in zip(batch["episode_id"], batch["episode_reward"]) if r > 0})
    counts = {kind: int(sel.sum()) for kind, sel in positions.items()}
    assert len(set(counts.values())) == 1 and counts["next"] >= solved >= 1, counts  # each fix has all three
    for kind, sel in positions.items():
        targets = batch["tokens"][:, 1:][sel]
        assert all(tok.decode([int(t)]).strip().isdigit() for t in targets), kind
    model = tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1)
    model.save_pretrained(tmp_path / "m")
    res = va.accuracy(str(tmp_path / "m"), batch, positions)
    assert all(0.0 <= res[k] <= 1.0 for k in ("all_policy_tokens", *va.PATTERNS))
