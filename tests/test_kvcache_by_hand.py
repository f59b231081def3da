"""Hand-worked tests of pdsim/kvcache.py written against mutmut survivors (tests/MUTANTS.md section 2).

Every expected value is worked out by hand in the test's comments (block counts, free counts,
evictions, hits, host-tier loads), never by running pdsim a second way.
"""
from __future__ import annotations
