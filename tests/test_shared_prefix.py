"""workload.shared_prefix_tokens: every synthetic prompt starts with the same tokens (vllm bench serve's
--random-prefix-len, a shared system prompt), which a pool with prefix caching reuses.  Hash chains and
timings worked out by hand under a linear cost model."""
from __future__ import annotations

import pytest

from pdsim.errors import ConfigError
from pdsim.simulation import simulate
from pdsim.validate import row_scenario
from pdsim.workload import shared_prefix_ids

from conftest import scenario

LIN = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6}


def test_shared_prefix_ids_by_hand():
    # 24 shared tokens at 16 per id: one whole shared unit (id 0); fresh ids start at 24 // 16 = 1.
    # 40 tokens: id 0, then 24 tokens of its own -> 2 fresh (1, 2); 20 tokens: id 0 + 4 own -> 1 fresh (3);
    # 8 tokens (all inside the shared part, but no whole unit): 1 fresh (4) -- its content is the shared
    # part's first 8 tokens, a partial unit, which the engines' whole-block caches cannot reuse anyway.
    assert shared_prefix_ids([40, 20, 8], 24) == [[0, 1, 2], [0, 3], [4]]
    # everything shared (prompt == shared): the same chain for every request
    assert shared_prefix_ids([32, 32], 32) == [[0, 1], [0, 1]]
    assert shared_prefix_ids([33, 32], 32) == [[0, 1, 2], [0, 1]]
    # a shared part longer than a prompt: the prompt is all shared
    assert shared_prefix_ids([16, 48], 1000) == [[0], [0, 1, 2]]


def _closed(shared: int, cache: bool = True):
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 100, "block_size": 16, "cost_model": LIN}
    if cache:
        topo["prefix_cache"] = {"enabled": True}
    sc = scenario({"t": topo}, arrival="closed", clients=1, num_requests=2, prompt_tokens=160, output_tokens=2,
                  **({"shared_prefix_tokens": shared} if shared else {}))
    return simulate(sc)[0].requests


@pytest.mark.parametrize("shared,cached", [(160, 144), (64, 64), (70, 64), (0, 0)])
def test_a_closed_loop_client_reuses_the_shared_prefix_by_hand(shared, cached):
    """One client, two 160-token prompts in a row.  The first computes all 160 tokens: 0.01 + 160 x 1e-4
    + 160 x 1e-6 s to its first token.  The second finds the shared part's whole blocks cached (all 160
    shared: 9 blocks = 144, the last block holding the token to compute is computed again; 64 or 70 shared:
    4 blocks = 64) and computes the rest, attention still over all 160 tokens."""
    a, b = _closed(shared)
    assert a.first_token_s - a.arrival_s == pytest.approx(0.01 + 160e-4 + 160e-6, abs=1e-12)
    assert (a.cached_tokens, b.cached_tokens) == (0, cached)
    assert b.first_token_s - b.arrival_s == pytest.approx(0.01 + (160 - cached) * 1e-4 + 160e-6, abs=1e-12)


def test_without_prefix_caching_the_shared_prefix_changes_nothing():
    a, b = _closed(160, cache=False)
    assert b.cached_tokens == 0
    assert b.first_token_s - b.arrival_s == pytest.approx(0.01 + 160e-4 + 160e-6, abs=1e-12)


@pytest.mark.parametrize("extra,says", [
    ({"arrival": "trace", "trace": {"path": "t.csv"}}, "not with arrival: trace"),
    ({"conversation": {"turns": 2}}, "not with conversation"),
    ({"shared_prefix_tokens": -1}, "shared_prefix_tokens"),
])
def test_shared_prefix_tokens_refused_where_it_has_no_meaning(extra, says):
    w = {"shared_prefix_tokens": 64, **extra}
    with pytest.raises(ConfigError, match=says):
        scenario(**w)


def test_validate_rows_can_state_a_shared_prefix():
    r = {"id": "x", "model": "llama-3.1-8b", "device": "h200", "engine": "vllm-v1", "tp": 1, "weight_dtype": "fp8",
         "kv_dtype": "fp8", "isl": 1000, "osl": 100, "concurrency": 4}
    plain = row_scenario(r)
    assert plain.workload.shared_prefix_tokens == 0 and not plain.topologies["t"].prefix_on
    sc = row_scenario(r, shared_prefix=512)
    assert sc.workload.shared_prefix_tokens == 512 and sc.topologies["t"].prefix_on
