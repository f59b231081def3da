"""Factories with small defaults, in the manner of vLLM's tests/v1/core/utils.py."""
from __future__ import annotations

from pathlib import Path

import os

import pytest
from hypothesis import settings

from pdsim import config

# Hypothesis profiles: `ci` (default: few examples, the suite stays fast on 2 cores) and `deep`
# (`make test-deep`, or HYPOTHESIS_PROFILE=deep): many more examples for the invariant tests.
# Tests that leave max_examples unset take it from the profile; @example cases always run.
# `ci` is derandomized (a fixed seed per test): a red CI is reproducible and says the change broke something,
# not that the search happened on a rare case; `deep` keeps searching at random for new counterexamples,
# and each one found is pinned as an explicit case (e.g. tests/test_prefix.py's known fast-path mismatch).
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("deep", max_examples=400, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


def run_trace(tmp_path, model: str, pool: dict, rows: list[str]):
    """One colocated topology ``t`` (``pool``) fed a trace of ``rows`` ("arrived_at,prompt,output"): (its
    requests by id, the TopologyResult with ``scenario`` set), for timelines worked by hand."""
    from pdsim.simulation import simulate
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    sc = config.parse({"model": model, "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"t": {"kind": "colocated", **pool}}}, "t.yaml")
    (res,) = simulate(sc)
    res.scenario = sc
    return sorted(res.requests, key=lambda r: r.id), res


def scenario(topologies: dict | None = None, model: str | dict = "llama-3.1-8b", **workload) -> config.Scenario:
    """A validated scenario: constant-cost colocated replica by default, tiny workload."""
    w = {"arrival": "poisson", "rate": 1.0, "num_requests": 20, "prompt_tokens": 100, "output_tokens": 10}
    # a default the chosen arrival does not read would be refused (a closed loop has no rate; a trace's rows
    # carry their own lengths): left out unless the test gives it
    arrival = workload.get("arrival", "poisson")
    if arrival in ("closed", "trace"):
        del w["rate"]
    if arrival == "trace":
        del w["prompt_tokens"], w["output_tokens"]
    w.update(workload)
    topologies = topologies or {"c": {"kind": "colocated", "replicas": 1,
                                      "cost_model": {"kind": "constant", "step_s": 0.01}, "kv_blocks": 10000}}
    return config.parse({"seed": 0, "model": model, "workload": w, "topologies": topologies},
                        "test.yaml")


@pytest.fixture
def make_scenario():
    return scenario


def chromium_render(html_path, tmp_path):
    """Load a page in headless Chromium with networking blocked: (DOM text, stderr log, screenshot array).

    Skips when Chromium is missing, except under CI (``.ci/run`` installs it), where that fails.
    """
    import os
    import shutil
    import subprocess

    import matplotlib.image as mpimg
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed under CI (apt-get install -y chromium)")
        pytest.skip("chromium not installed")
    url = Path(html_path).as_uri()
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'prof'}",
            "--proxy-server=127.0.0.1:9",        # an unreachable proxy: any external fetch would fail
            "--window-size=1200,2000"]
    dom = subprocess.run(base + ["--enable-logging=stderr", "--v=0", "--dump-dom", url], capture_output=True,
                         text=True, timeout=120)
    shot = tmp_path / "shot.png"
    subprocess.run(base + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    img = mpimg.imread(shot) if shot.exists() else None
    return dom.stdout, dom.stderr, img


def drive_search(s, passes, limit: int = 40) -> list[float]:
    """The rates a ``pdsim.plan.Search`` asks for until it is done, each answered pass or fail by
    ``passes(rate)`` (attainment 1 or 0 against a 0.9 target); a search that has not ended after ``limit``
    rates fails here."""
    seen = []
    for _ in range(limit):
        r = s.next_rate()
        if r is None:
            return seen
        seen.append(r)
        s.update(r, {"pass_att": 1.0 if passes(r) else 0.0}, 0.9)
    raise AssertionError(f"the search did not end: {seen}")


class ScriptedExecutor:
    """A ``pdsim plan`` executor that answers each task from ``answer(config, rate, seed, requests)`` instead of
    simulating it, and records what it was asked: (config, rate, seed, requests, early) per task; with a
    ``clock`` (a one-element list) it moves that fake clock 10 s per task."""
    name = "script"

    def __init__(self, answer, clock=None):
        self.answer, self.calls, self.maps, self.closed, self.clock = answer, [], 0, 0, clock

    def map(self, fn, tasks, on_done=None):
        from pdsim.plan import evaluate
        assert fn is evaluate
        self.maps += 1
        out = []
        for t in tasks:
            sc = t["scenario"]
            (name,) = sc["topologies"]
            n, rate = sc["workload"]["num_requests"], sc["workload"]["rate"]
            self.calls.append((name, rate, sc["seed"], n, t["early"]))
            out.append(self.answer(name, rate, sc["seed"], n))
            if self.clock is not None:
                self.clock[0] += 10.0
            if on_done:
                on_done()
        return out

    def close(self):
        self.closed += 1
