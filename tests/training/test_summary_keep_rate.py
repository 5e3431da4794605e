"""benchmarks/summary_keep_rate.py reads the fact lines of a summary and reports shares."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import summary_keep_rate as skr  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_fact_lines_are_read_from_the_facts_section_only():
    kept = "<summary>\nread: config/defaults.toml lines 1-9\nfacts:\nMAX_RETRIES = 7\nnext: replace MAX_RETRIES = 2 in a/b.py\n</summary>"
    dropped = "<summary>\nread: config/defaults.toml lines 1-9\nfacts:\nnext: fix MAX_RETRIES in a/b.py\n</summary>"
    assert skr.first_summary_facts(kept) == {"MAX_RETRIES": "7"}
    assert skr.first_summary_facts(dropped) == {}
    assert skr.first_summary_facts("<summary>\nfacts:\nPAGE_SIZE = 50") == {"PAGE_SIZE": "50"}  # cut at the limit
    assert skr.first_summary_facts("no summary at all") == {}


def test_probe_reports_shares_for_a_saved_model(tmp_path):
    from compactrl.policies.tiny_moe import tiny_moe

    tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1).save_pretrained(tmp_path / "m")
    row = skr.probe(str(tmp_path / "m"), temperature=1.0, episodes=2, seed=0)
    assert row["episodes"] == 2
    for key in ("success_rate", "first_summary_keeps_fact", "first_summary_value_right", "no_summary"):
        assert 0.0 <= row[key] <= 1.0, key
    assert row["first_summary_value_right"] <= row["first_summary_keeps_fact"]
    for key in ("success_if_kept", "success_if_dropped"):
        assert math.isnan(row[key]) or 0.0 <= row[key] <= 1.0
