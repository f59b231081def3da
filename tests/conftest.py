"""Factories with small defaults, in the manner of vLLM's tests/v1/core/utils.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from pdsim import config

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


def scenario(topologies: dict | None = None, **workload) -> config.Scenario:
    """A validated scenario: constant-cost colocated replica by default, tiny workload."""
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 20, "prompt_tokens": 100, "output_tokens": 10}
    w.update(workload)
    topologies = topologies or {"c": {"kind": "colocated", "replicas": 1,
                                      "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 10000}}
    return config.parse({"seed": 0, "model": "llama-3.1-8b", "workload": w, "topologies": topologies},
                        "test.yaml")


@pytest.fixture
def make_scenario():
    return scenario
