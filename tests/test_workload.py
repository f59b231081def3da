"""Request generation (pdsim.workload.generate): trace-sampled lengths keep real (prompt, output) pairs."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from pdsim import config
from pdsim.models import get_model
from pdsim.workload import generate

REPO = Path(__file__).resolve().parents[1]


def _spearman(a, b) -> float:
    """Rank correlation with average ranks for ties (written out: no scipy)."""
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        sums = np.bincount(inv, weights=r)
        return (sums / counts)[inv]
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def _sampled(path: Path, n: int = 20000, seed: int = 0, output_path: Path | None = None):
    sc = config.parse({"seed": seed, "model": "llama-3.1-8b",
                       "workload": {"arrival": "poisson", "rate": 10, "num_requests": n,
                                    "prompt_tokens": {"dist": "trace", "path": str(path)},
                                    "output_tokens": {"dist": "trace", "path": str(output_path or path)}},
                       "topologies": {"c": {"kind": "colocated"}}}, "w.yaml")
    reqs = generate(sc, get_model("llama-3.1-8b"))
    return np.array([r.prompt_tokens for r in reqs]), np.array([r.output_tokens for r in reqs])


def _read_pairs(path: Path, prompt_col: str, output_col: str):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [int(r[prompt_col]) for r in rows], [int(r[output_col]) for r in rows]


def test_trace_lengths_sampled_jointly_keep_the_azure_correlation():
    """Azure conversation trace: prompt/output Spearman 0.15; independent sampling would give ~0."""
    path = REPO / "scenarios/traces/azure_conv_10min.csv"
    tp, to = _read_pairs(path, "ContextTokens", "GeneratedTokens")
    want = _spearman(tp, to)
    assert abs(want) > 0.1                         # the check below can tell joint from independent
    p, o = _sampled(path)
    assert _spearman(p, o) == pytest.approx(want, abs=0.05)
    pairs = set(zip(tp, to))                       # every sampled request is a real row of the trace
    assert all((a, b) in pairs for a, b in zip(p[:2000].tolist(), o[:2000].tolist()))


def test_trace_lengths_sampled_jointly_strong_correlation(tmp_path):
    """A lengths trace written here with output ~ prompt / 4: Spearman about 0.9 must survive sampling."""
    rng = np.random.default_rng(7)
    prompt = rng.integers(10, 4000, 3000)
    output = np.maximum(1, prompt // 4 + rng.integers(-150, 150, 3000))
    path = tmp_path / "pairs.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" +
                    "".join(f"{a},{b}\n" for a, b in zip(prompt, output)))
    want = _spearman(prompt, output)
    assert want > 0.8
    p, o = _sampled(path, n=10000)
    assert _spearman(p, o) == pytest.approx(want, abs=0.05)


def test_lengths_from_two_different_traces_are_independent(tmp_path):
    """Prompt from one file, output from another: no pairing exists, so no correlation is invented."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    vals = np.arange(1, 2001)
    for path in (a, b):
        path.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{v},{v}\n" for v in vals))
    p, o = _sampled(a, n=10000, output_path=b)
    assert abs(_spearman(p, o)) < 0.05


def test_one_module_makes_the_stream():
    """simulate, plan and sweep all use workload.generate (simulation re-exports it, it does not copy it)."""
    from pdsim import simulation
    assert simulation.generate is generate
