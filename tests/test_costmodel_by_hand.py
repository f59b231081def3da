"""pdsim/costmodel.py by hand: values worked out in the comments (DESIGN.md's formulas, tiny shapes, a
hand-written device), written against mutmut survivors (tests/MUTANTS.md section 2).  Never pdsim
compared with itself."""
from __future__ import annotations

import numpy as np
import pytest

from pdsim.costmodel import expected_distinct_experts, expert_hit_probs, sliding_aggregates, sliding_positions


def test_expected_distinct_experts_uniform_by_hand():
    # E = 4 experts, top-2: one token misses an expert with probability 1 - 2/4 = 1/2
    # 1 token: 4 (1 - 1/2) = 2 (its two experts); 2 tokens: 4 (1 - 1/4) = 3; 0 tokens: 0
    assert expected_distinct_experts(1, 2, 4) == pytest.approx(2.0, abs=1e-12)
    assert expected_distinct_experts(2, 2, 4) == pytest.approx(3.0, abs=1e-12)
    assert expected_distinct_experts(0, 2, 4) == 0.0
