"""Write a run's outputs: requests.csv, summary.json, timeseries.csv, and report.html when available.

Outputs are never half-written:

* ``OutputFolder`` checks ``--out`` before anything is simulated (a file in the way, a place that cannot be
  written), creates it, and holds ``OUT/.pdsim.lock`` (the ``filelock`` package) for the whole run, so a second
  run on the same folder fails at once with one line instead of interleaving rows into the same files.
* ``write_outputs`` writes every file into a staging folder inside ``OUT`` and only then moves them into place.
  A folder that did not exist is renamed into place whole (atomic). In an existing folder the run's own files
  (``RUN_FILES``) are replaced one by one with ``os.replace``; the old ``summary.json`` is removed first and the
  new one moved in last, so ``summary.json`` marks a complete set: a crash or Ctrl-C leaves either the old set
  untouched or a folder without ``summary.json``, which ``pdsim report`` refuses. Other files in ``OUT`` (notes,
  a plan's cache) are left alone.
* ``summary.json`` records the row counts of the CSVs (``outputs``), which ``pdsim report`` checks.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import __version__, metrics
from .errors import ConfigError
from .table import Table

LOCK_NAME = ".pdsim.lock"
STAGING_PREFIX = ".pdsim-staging-"
# The files one run owns, in the order they are moved into place: summary.json last (the commit marker).
RUN_FILES = ("requests.csv", "requests.parquet", "timeseries.csv", "report.html", "summary.json")
# --requests-format: the per-request table as CSV (the default, readable anywhere) or Parquet (typed columns,
# a fraction of the size and write time; needs pyarrow, the `parquet` extra)
REQUESTS_FILES = {"csv": "requests.csv", "parquet": "requests.parquet"}


def check_requests_format(fmt: str, key: str = "--requests-format") -> None:
    """Refuse an unknown format, or Parquet without pyarrow, before anything is simulated."""
    if fmt not in REQUESTS_FILES:
        raise ConfigError(f"unknown format; choose one of {', '.join(REQUESTS_FILES)}", key=key, value=fmt)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigError("writing Parquet needs pyarrow: pip install 'pdsim[parquet]' (or use csv)",
                              key=key, value=fmt) from None


def requests_path(out_dir: Path, summary: dict | None = None) -> Path:
    """The requests table of a run folder. When summary.json's ``outputs`` names one (requests.csv or
    requests.parquet), that file and no other: a stale table of the other format left in the folder by an
    earlier run is never read in its place (the caller reports the named one missing). Without a named
    one (an older summary): whichever of requests.csv / requests.parquet exists (csv first), else
    requests.csv."""
    out_dir = Path(out_dir)
    outputs = (summary or {}).get("outputs")
    named = [n for n in outputs if n in REQUESTS_FILES.values()] if isinstance(outputs, dict) else []
    if named:
        return out_dir / named[0]
    for name in REQUESTS_FILES.values():
        if (out_dir / name).is_file():
            return out_dir / name
    return out_dir / "requests.csv"


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


class OutputFolder:
    """``--out`` checked, created and locked before a run simulates anything; unlocked afterwards.

    ``with OutputFolder(path):`` raises ConfigError (one line, key ``--out``) when ``path`` is a file, lies
    below a file, cannot be created or written, or is locked by another pdsim process. A folder this object
    created is removed again if the run leaves nothing in it (a run that failed), so a failed run leaves no
    empty output folder behind.
    """

    def __init__(self, out: Path, key: str = "--out"):
        self.out, self.key = Path(out), key
        self._created: list[Path] = []
        self._lock = None

    def _error(self, reason: str) -> ConfigError:
        return ConfigError(reason, key=self.key, value=str(self.out))

    def __enter__(self) -> "OutputFolder":
        from filelock import FileLock, Timeout
        out = self.out
        if out.exists() and not out.is_dir():
            raise self._error("exists and is not a folder; give a folder path")
        missing, p = [], out
        while not p.exists():
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        if p.exists() and not p.is_dir():
            raise self._error(f"{p} is a file, so no folder can be made below it")
        try:
            for d in reversed(missing):
                d.mkdir()
                self._created.append(d)
            fd, probe = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=out)   # a read-only folder fails here
            os.close(fd)
            os.unlink(probe)
            self._lock = FileLock(str(out / LOCK_NAME))
            self._lock.acquire(timeout=0)
        except Timeout:
            self._lock = None
            self._cleanup()
            raise self._error(f"another pdsim run is writing to this folder (it holds {out / LOCK_NAME}); "
                              "wait for it to finish or choose another --out") from None
        except OSError as exc:
            self._lock = None
            self._cleanup()
            raise self._error(f"cannot write here: {exc.strerror or exc}") from None
        return self

    def _cleanup(self) -> None:
        """Remove the folders this object created, deepest first, while they are empty but for the lock file."""
        for d in reversed(self._created):
            try:
                if d == self.out:
                    (d / LOCK_NAME).unlink(missing_ok=True)
                d.rmdir()
            except OSError:
                break                           # not empty: keep it and everything above it
        self._created = []

    def __exit__(self, *exc) -> None:
        # Nothing committed to a folder this run made (it failed or was interrupted): remove the folder, unlinking
        # the lock file while still holding the lock, so no empty output folder is left behind.
        out = self.out
        if out in self._created and not (out / "summary.json").exists():
            try:
                empty = all(p.name == LOCK_NAME for p in out.iterdir())
            except OSError:
                empty = False
            if empty:
                (out / LOCK_NAME).unlink(missing_ok=True)
                self._release()
                self._cleanup()
                return
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _commit(staged: Path, out: Path) -> None:
    """Move the staged run files into ``out``: summary.json out first, back in last."""
    produced = {name for name in RUN_FILES if (staged / name).exists()}
    (out / "summary.json").unlink(missing_ok=True)
    for name in RUN_FILES:
        if name in produced:
            os.replace(staged / name, out / name)
        elif name != "summary.json":
            (out / name).unlink(missing_ok=True)    # a stale file of an older run (e.g. report.html)


def write_outputs(results, sc, out: Path, wall_s: float = 0.0, progress: bool = False,
                  report: bool = True, release: bool = False, requests_format: str = "csv") -> dict:
    """Write requests.csv (or requests.parquet: ``requests_format``), timeseries.csv, summary.json (and
    report.html) into ``out``; returns the summary.

    ``release=True`` (``pdsim run``, which needs the results no further): where nothing after the requests
    frame reads the Request objects (``metrics.releasable``), they are dropped as their rows are built and
    every ``results[i].requests`` is left empty; a million requests then never sit in memory as objects
    and as a frame at once.  The files are the same either way."""
    out = Path(out)
    fresh = not out.exists()
    # Stage inside OUT when it exists (same file system, os.replace per file), else beside it and rename the
    # whole folder. The staged folder is named like OUT so the report's default title is OUT's name.
    parent = out.parent if fresh else out
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
    try:
        staged = staging / out.name
        staged.mkdir()
        summary = _write_files(results, sc, staged, wall_s, progress, report, release, requests_format)
        if fresh and not out.exists():
            os.rename(staged, out)
        else:
            out.mkdir(parents=True, exist_ok=True)
            _commit(staged, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


def _write_files(results, sc, out: Path, wall_s: float, progress: bool, report: bool,
                 release: bool = False, requests_format: str = "csv") -> dict:
    check_requests_format(requests_format)
    # numpy tables (pdsim.table.Table): no pandas unless the report or Parquet needs a DataFrame
    df = metrics.requests_table(results, sc.client, release=release and metrics.releasable(results))
    req_name = REQUESTS_FILES[requests_format]
    if requests_format == "parquet":
        write_parquet(df.to_pandas(metrics.REQUEST_COLUMNS), out / req_name)
    else:
        write_csv(df, out / req_name, "%.9g")
    ts = metrics.timeseries_table(results)
    write_csv(ts, out / "timeseries.csv", "%.6g")
    topologies = metrics.summarize(results, df, sc)
    for t in topologies.values():
        t.update(vllm_aliases(t))
    summary = {"pdsim_version": __version__, "wall_s": wall_s,
               "topologies": topologies,
               "scenario": sc.model_dump(mode="json"),
               # what pdsim report checks the CSVs against: a folder whose files disagree is not rendered
               "outputs": {req_name: {"rows": int(len(df))}, "timeseries.csv": {"rows": int(len(ts))}}}
    summary = _clean(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if not report:
        return summary
    try:
        from .report import build_report
    except ImportError:
        return summary
    if progress:
        print("pdsim: building report.html...", file=sys.stderr, flush=True)
    build_report(out, progress=False, df=df.to_pandas(metrics.REQUEST_COLUMNS), summary=summary,
                 ts=ts.to_pandas())   # in memory: no re-reading the CSVs
    return summary


def _column_text(a, float_format: str, plain: bool = False) -> list[str]:
    """One column as the strings ``DataFrame.to_csv(float_format=...)`` writes: floats through the format,
    NaN / None as empty fields, everything else ``str``.  ``plain``: a text column of a pdsim Table (str or
    None, no pandas missing values), read without importing pandas."""
    kind = a.dtype.kind
    if kind == "f":
        return [float_format % v if v == v else "" for v in a.tolist()]
    if kind in "iub":
        return list(map(str, a.tolist()))
    if plain:
        return ["" if v is None or v != v else str(v) for v in a.tolist()]
    from pandas import isna       # None, NaN, pd.NA, NaT: empty fields, as pandas writes them
    return ["" if m else str(v) for v, m in zip(a.tolist(), isna(a).tolist())]


CSV_CHUNK_ROWS = 8_192       # rows formatted at a time (~13 MB of text): a big requests.csv never holds all its text


def write_parquet(df, path: Path) -> None:
    """The frame as Parquet (pyarrow): typed columns, full float64 precision, no index."""
    df.to_parquet(path, engine="pyarrow", index=False)


def write_csv(df, path: Path, float_format: str, chunk_rows: int = CSV_CHUNK_ROWS) -> None:
    """``df.to_csv(path, index=False, float_format=float_format)``, byte for byte, column-wise; ``df`` a
    pandas DataFrame or a :class:`pdsim.table.Table` (its pandas frame's bytes, without pandas).

    pandas formats cell by cell through several layers; here each column becomes a list of strings
    in one comprehension and the csv module (what pandas itself writes with, same dialect: minimal
    quoting, "\\n" line ends) joins them, about 4x faster (benchmarks/README.md).  ``chunk_rows`` rows at
    a time, so the text in memory is bounded (27 columns x 1 M rows would be ~27 M strings)."""
    header = [str(c) for c in df.columns]
    # each chunk's slice is turned into numpy there: a text column (pandas' str dtype) made into Python
    # strings all at once would be a million new str objects per column
    series = [df[c] for c in df.columns]
    plain = isinstance(df, Table)      # numpy columns already (text: str or None)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for lo in range(0, len(df), chunk_rows):
            arrays = [s[lo:lo + chunk_rows] if plain else s.iloc[lo:lo + chunk_rows].to_numpy() for s in series]
            text_cols = [a.dtype.kind == "O" for a in arrays]
            cols = [_column_text(a, float_format, plain) for a in arrays]
            del arrays
            # no field that needs quoting (only text columns can hold , " or a line break): plain joins, the
            # bytes the csv module would write; else the csv module (minimal quoting, field by field)
            texts = set().union(*(col for col, t in zip(cols, text_cols) if t))
            if len(cols) > 1 and not any(ch in v for v in texts for ch in ',"\r\n'):
                f.writelines(",".join(row) + "\n" for row in zip(*cols))
            else:
                w.writerows(zip(*cols))


def vllm_aliases(t: dict) -> dict:
    """The names ``vllm bench serve`` gives the same quantities (milliseconds, as it reports them), so a
    result can be compared key for key with a measured run: mean/median/p90/p99 of ttft, tpot, e2el (and itl
    when the run records it), request_throughput (req/s), output_throughput (tok/s), completed.  The
    pdsim keys stay as they are; these are extra keys beside them."""
    out = {}
    thr = t.get("throughput") or {}
    if thr.get("requests_per_s") is not None:
        out["request_throughput"] = thr["requests_per_s"]
    if thr.get("output_tokens_per_s") is not None:
        out["output_throughput"] = thr["output_tokens_per_s"]
    if isinstance(t.get("requests"), dict) and "finished" in t["requests"]:
        # the measured requests, as request_throughput counts them: vllm bench serve's warm-up is not in
        # its `completed` (every client.warmup_requests row is a finished one)
        out["completed"] = t["requests"]["finished"] - (t.get("warmup_excluded") or 0)
    for ours, theirs in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("itl_s", "itl"), ("e2e_s", "e2el")):
        st = t.get(ours)
        if not isinstance(st, dict):
            continue
        for k, name in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            v = st.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"{name}_{theirs}_ms"] = v * 1e3
    return out
