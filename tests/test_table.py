"""pdsim.table.Table: `pdsim run` writes and summarises its tables without pandas, to the same bytes and
figures as the pandas DataFrames the other commands use (issue 19, cheap start and finish)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdsim import config, metrics
from pdsim.output import write_csv
from pdsim.simulation import simulate
from pdsim.table import Table

REPO = Path(__file__).resolve().parents[1]


def _results(name: str, sets: list[str]):
    sc = config.load(REPO / "scenarios" / f"{name}.yaml", sets)
    return sc, simulate(sc, progress=False)


@pytest.mark.parametrize("name,sets", [
    ("quickstart", ["workload.num_requests=120", "client.warmup_requests=7"]),     # colocated + PD, warm-up
    ("faults-overload", ["workload.num_requests=300"]),                              # rejections
    ("faults-decode-vs-replica", []),                                                # faults (a trace)
])
def test_summary_and_csvs_from_the_table_are_the_frames(tmp_path, name, sets):
    sc, res = _results(name, sets)
    table = metrics.requests_table(res, sc.client)
    frame = metrics.requests_frame(res, sc.client)
    assert table.columns == list(frame.columns) == metrics.REQUEST_COLUMNS and len(table) == len(frame)
    pd.testing.assert_frame_equal(table.to_pandas(metrics.REQUEST_COLUMNS), frame, check_exact=True)
    ts_table, ts_frame = metrics.timeseries_table(res), metrics.timeseries_frame(res)
    pd.testing.assert_frame_equal(ts_table.to_pandas(), ts_frame, check_exact=True)
    a = json.dumps(metrics.summarize(res, table, sc), default=str)
    b = json.dumps(metrics.summarize(res, frame, sc), default=str)
    assert a == b
    for t, f, fmt in ((table, frame, "%.9g"), (ts_table, ts_frame, "%.6g")):
        write_csv(t, tmp_path / "table.csv", fmt, chunk_rows=50)
        f.to_csv(tmp_path / "pandas.csv", index=False, float_format=fmt)
        assert (tmp_path / "table.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_awkward_text_and_no_parts_write_as_pandas_does(tmp_path):
    parts = [{"topology": "a,b", "x_s": np.array([0.1, np.nan]), "n": [1, 2],
              "why": np.array([None, 'q"x'], dtype=object)},
             {"topology": "c", "x_s": np.array([1e-300]), "n": [3], "why": np.array(["line\nbreak"], dtype=object)}]
    t = Table.concat(parts)
    assert len(t) == 3 and t.columns == ["topology", "x_s", "n", "why"]
    assert t["topology"].tolist() == ["a,b", "a,b", "c"] and t[t.n > 1].n.tolist() == [2, 3]
    for table in (t, t.head(0), Table.concat([], empty_columns=["p", "q"]), Table.concat([])):
        write_csv(table, tmp_path / "table.csv", "%.9g")
        table.to_pandas().to_csv(tmp_path / "pandas.csv", index=False, float_format="%.9g")
        assert (tmp_path / "table.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_run_without_report_does_not_import_pandas(tmp_path):
    scen = tmp_path / "s.yaml"
    scen.write_text("model: llama-3.1-8b\n"
                    "workload: {arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}\n"
                    "topologies:\n"
                    "  a: {kind: colocated, replicas: 1, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}\n")
    code = ("import sys\nfrom pdsim.__main__ import main\n"
            f"rc = main(['run', {str(scen)!r}, '--no-report', '--quiet', '--out', {str(tmp_path / 'out')!r}])\n"
            "assert rc == 0\nprint('pandas' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "False"
    assert (tmp_path / "out" / "requests.csv").read_text().count("\n") == 6
