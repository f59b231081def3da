"""A column table without pandas: named numpy columns of equal length, in order.

``pdsim run`` builds its per-request and time-series tables as ``Table`` s (metrics.requests_table,
metrics.timeseries_table), writes them (output.write_csv) and summarises them (metrics.summarize) without
importing pandas, about 0.45 s of a small run's start.  The few calls pdsim makes of a table are the ones a
pandas DataFrame answers the same way (``columns``, ``len``, ``t["col"]``, ``"col" in t``, ``t[mask]``,
``head(n)``), so the metrics functions take either; ``to_pandas()`` gives the DataFrame that
``metrics.requests_frame`` / ``timeseries_frame`` return (the report and other callers).
"""
from __future__ import annotations

import numpy as np


class Table:
    """Columns (numpy arrays, text as object arrays with None for missing), kept as the parts they came in
    (one per topology / instance) until a column is read: ``to_pandas`` builds one frame per part and
    concatenates them, as pandas always has, without the whole columns ever being concatenated."""

    __slots__ = ("_parts", "_cols", "_names")

    def __init__(self, cols: dict | None = None, parts: list | None = None, names: list | None = None):
        self._parts = parts if parts is not None else ([cols] if cols else [])
        self._cols = cols
        self._names = list(cols) if cols else (list(parts[0]) if parts else list(names or []))

    @classmethod
    def concat(cls, parts: list[dict], empty_columns: list | None = None) -> "Table":
        """One table of ``parts`` (dicts column -> array, list or scalar, the same columns in the same order);
        a scalar is repeated over its part's rows (what ``pd.DataFrame({...})`` does with one)."""
        full = []
        for p in parts:
            n = next((len(v) for v in p.values() if isinstance(v, (np.ndarray, list))), 1)
            full.append({c: _column(v, n) for c, v in p.items()})
        return cls(None, full, empty_columns)

    def _columns(self) -> dict:
        if self._cols is None:
            if not self._parts:
                self._cols = {c: np.empty(0, object) for c in self._names}
            elif len(self._parts) == 1:
                self._cols = self._parts[0]
            else:
                self._cols = {c: np.concatenate([p[c] for p in self._parts]) for c in self._names}
        return self._cols

    @property
    def columns(self) -> list[str]:
        return list(self._names)

    def __len__(self) -> int:
        return sum(len(next(iter(p.values()))) for p in self._parts if p)

    def __contains__(self, name) -> bool:
        return name in self._names

    def __getitem__(self, key):
        """``t["col"]``: the column's array; ``t[mask]`` (a boolean array): the rows where it is true."""
        if isinstance(key, str):
            return self._columns()[key]
        return Table({c: a[key] for c, a in self._columns().items()}, names=self._names)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._columns()[name]
        except KeyError:
            raise AttributeError(name) from None

    def head(self, n: int) -> "Table":
        return Table({c: a[:n] for c, a in self._columns().items()}, names=self._names)

    def to_pandas(self, columns: list | None = None):
        """The DataFrame: one per part (its arrays as they are, ``copy=False``), concatenated; a table of no
        part: an empty frame with the table's columns."""
        import pandas as pd
        if not self._parts:
            return pd.DataFrame(columns=self._names) if self._names else pd.DataFrame()
        frames = [pd.DataFrame(p, columns=columns, copy=False) for p in self._parts]
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _column(v, n: int) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, list):
        return np.asarray(v)
    if isinstance(v, str):
        a = np.empty(n, object)
        a.fill(v)
        return a
    return np.full(n, v)
