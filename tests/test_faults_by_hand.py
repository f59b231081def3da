"""pdsim.faults by hand: outage spans, overlapping faults, link degradation, random faults' seeding.

Written to kill mutmut survivors in faults.py (tests/MUTANTS.md section 2). Runs use ConstantCost
(every step 0.1 s), so each expected time is arithmetic on the fault schedule.
"""
from __future__ import annotations

from types import SimpleNamespace as NS

from pdsim import faults


def test_fault_windows_are_the_logged_spans():
    # an extension entry of an instance already down has a span too; a log entry without one does not
    log = [{"instance": "r-0", "at_s": 1.0, "until_s": 3.0}, {"note": "x", "at_s": 2.0},
           {"link": "all", "at_s": 4.0, "until_s": 4.5, "bandwidth_fraction": 0.5}]
    assert faults.fault_windows(NS(fault_log=log)) == [(1.0, 3.0), (4.0, 4.5)]
