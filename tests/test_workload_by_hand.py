"""pdsim.workload by hand and by theory: arrival processes, lengths, rate curves, chat sessions.

Written to kill mutmut survivors in workload.py (tests/MUTANTS.md section 2). Expected values are
arithmetic on the inputs or the moments of the distributions (with sampling bounds of several
standard errors), never a second call into pdsim's own code path.
"""
from __future__ import annotations

import numpy as np
import pytest

from pdsim import workload as wl


def test_constant_arrivals_by_hand():
    # 4 requests at 2/s: one every 0.5 s, the first after one gap
    assert list(wl.constant_arrivals(2.0, 4)) == [0.5, 1.0, 1.5, 2.0]
