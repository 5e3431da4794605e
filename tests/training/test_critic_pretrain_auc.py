"""benchmarks/critic_pretrain_auc.py: the table of the critic's held-out AUC by pre-training steps."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import critic_pretrain_auc as cpa  # noqa: E402


def _score(steps, auc, ev=0.0, batch=None):
    return {"steps": steps, "batch_success": batch, "critic/trace_start_auc": auc, "critic/trace_start_ev": ev,
            "critic/trace_starts": 10.0}


def test_table_has_a_row_per_step_count_with_each_seeds_auc_in_seed_order():
    cells = [{"seed": 1, "held_out_success": 0.25, "scores": [_score(0, 0.5), _score(8, 0.9, batch=0.5)]},
             {"seed": 0, "held_out_success": 0.5, "scores": [_score(0, 0.5), _score(8, math.nan, batch=0.0)]}]
    rows = cpa.table(cells).splitlines()
    assert rows[2] == "| 0 | 0.50 | 0.50, 0.50 | 0.00 | -, - |"
    # a NaN AUC (no trace start with both outcomes) is shown as '-' and left out of the mean
    assert rows[3] == "| 8 | 0.90 | -, 0.90 | 0.00 | 0.00, 0.50 |"
    assert rows[-1].endswith("per seed: 0.50, 0.25.")
