"""Readers for public LLM-serving request traces.

A trace gives the simulator, per request, an arrival time and the prompt and
output token counts.  Four on-disk formats are understood (see
``../shared/traces/README.md`` and ``scenarios/traces/README.md``):

* ``azure``    -- Azure LLM inference trace 2023 (Splitwise): CSV
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` with absolute wall-clock times
  ``YYYY-MM-DD HH:MM:SS.fffffff`` and CRLF line endings;
* ``vidur``    -- Vidur's processed traces: CSV
  ``arrived_at,num_prefill_tokens,num_decode_tokens`` (relative seconds);
* ``lengths``  -- length-only CSVs (``num_prefill_tokens,num_decode_tokens``,
  extra columns ignored) with no arrival times;
* ``mooncake`` -- Mooncake FAST'25 JSON Lines with ``timestamp`` in ms.

CSV fields are plain comma-separated values (no quoting).  Mooncake's
``hash_ids`` (prefix-block hash chains, 512 tokens per id) are read when present
(``Trace.hash_ids``, a list per row; each id must be a non-negative integer) and
replayed exactly by the prefix cache; the other formats carry no prefix.

Every problem with a file is a :class:`~pdsim.errors.TraceError` naming the
file, the 1-based line (a CSV header is line 1), the column and the value.
Rows are never dropped silently; rows out of arrival order are stable-sorted
with a :class:`TraceWarning`.
"""
from __future__ import annotations

import csv
import io
import json
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd

from pdsim.errors import TraceError

FORMATS = ("auto", "azure", "vidur", "lengths", "mooncake")
# Which columns (CSV) or keys (JSONL) each format needs: (arrival, prompt, output).
_COLUMNS: dict[str, tuple[str | None, str, str]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "lengths": (None, "num_prefill_tokens", "num_decode_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
}
MAX_TOKENS = 10_000_000           # no real request is this long; larger is a corrupt file
MAX_ARRIVAL_S = 1e9               # ~31.7 years of relative time: beyond that it is junk
MAX_FILE_BYTES = 2 * 1024**3      # refuse before reading rather than die of MemoryError
MAX_LINE_BYTES = 1024**2          # the longest real row is 2.7 KB (Mooncake hash_ids)
_AZURE_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


class TraceWarning(UserWarning):
    """A trace was readable but needed fixing up (e.g. rows out of order)."""


@dataclass(frozen=True, eq=False)   # eq=False: element-wise == on arrays is not a bool
class Trace:
    """Requests of one trace file, in arrival order; arrays are read-only.

    ``load_trace`` puts the first arrival at 0.0 s; ``window`` may leave an
    idle gap before the first kept arrival (its ``start_s`` maps to 0.0).
    """

    path: str
    format: str
    arrival_s: np.ndarray | None   # float64 seconds, non-decreasing; None: lengths only
    prompt_tokens: np.ndarray      # int64, >= 1
    output_tokens: np.ndarray      # int64, >= 1
    hash_ids: list | None = None   # Mooncake: per row, the prefix-block hash chain (list of ints)

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if len(self.output_tokens) != n or (self.arrival_s is not None and len(self.arrival_s) != n) \
                or (self.hash_ids is not None and len(self.hash_ids) != n):
            raise ValueError("Trace arrays must have equal lengths")
        for field in ("arrival_s", "prompt_tokens", "output_tokens"):
            arr = getattr(self, field)
            if arr is not None and arr.flags.writeable:   # frozen should mean the data too,
                view = arr.view()                        # without freezing the caller's array
                view.setflags(write=False)
                object.__setattr__(self, field, view)

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def load_trace(path: str | Path, format: str = "auto") -> Trace:
    """Read a trace file; ``format`` is one of :data:`FORMATS`."""
    name = str(path)
    if format not in FORMATS:
        raise TraceError(f"unknown trace format; valid formats: {', '.join(FORMATS)}",
                         file=name, key="format", value=format)
    p = Path(path)
    try:
        if p.is_dir():
            raise TraceError("is a directory, not a trace file", file=name)
        size_bytes = p.stat().st_size
        if size_bytes == 0:
            raise TraceError("empty file", file=name)
        if size_bytes > MAX_FILE_BYTES:
            raise TraceError(f"file is {size_bytes:,} bytes, larger than the "
                             f"{MAX_FILE_BYTES:,}-byte limit for traces", file=name)
        lines = list(_iter_lines(p, name))
    except FileNotFoundError:
        raise TraceError("no such file", file=name) from None
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror}", file=name) from None
    except ValueError as e:   # "embedded null byte" in the path
        raise TraceError(f"not a usable path: {e}", file=name) from None
    if format == "auto":
        format = _detect(p, lines)
    if format == "mooncake":
        return _load_mooncake(name, lines)
    return _load_csv(name, lines, format)


def window(trace: Trace, start_s: float = 0.0, duration_s: float | None = None) -> Trace:
    """Keep arrivals in ``[start_s, start_s + duration_s)``, with ``start_s`` mapped to 0.0.

    Re-basing on ``start_s`` rather than on the first kept arrival keeps an idle
    gap at the start of the window as it was in the trace.
    """
    t = _arrivals(trace, "window")
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"window start_s must be finite and >= 0, got {start_s!r}")
    keep = t >= start_s
    if duration_s is not None:
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"window duration_s must be finite and > 0, got {duration_s!r}")
        keep &= t < start_s + duration_s
    return replace(trace, arrival_s=t[keep] - start_s,
                   prompt_tokens=trace.prompt_tokens[keep].copy(),
                   output_tokens=trace.output_tokens[keep].copy(),
                   hash_ids=None if trace.hash_ids is None else
                   [h for h, k in zip(trace.hash_ids, keep.tolist()) if k])


def scale_rate(trace: Trace, factor: float) -> Trace:
    """Multiply the request rate by ``factor`` (2 => arrivals twice as dense)."""
    t = _arrivals(trace, "scale_rate")
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ValueError(f"scale_rate factor must be finite and > 0, got {factor!r}")
    return replace(trace, arrival_s=t / float(factor))


# ---------------------------------------------------------------- internals

def _arrivals(trace: Trace, what: str) -> np.ndarray:
    if trace.arrival_s is None:
        raise TraceError(f"has no arrival times ({trace.format} format), so {what} "
                         f"cannot apply; give it an arrival process", file=trace.path)
    return trace.arrival_s


def _iter_lines(p: Path, name: str) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, text without line ending), one line at a time.

    Bounded ``readline`` means a pathological multi-GB line is refused instead
    of exhausting memory; decoding per line lets binary junk name its line.
    """
    with p.open("rb") as f:
        for lineno in range(1, 1 << 62):
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(f"line longer than {MAX_LINE_BYTES:,} bytes; "
                                 f"not a trace file?", file=name, line=lineno)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceError("not UTF-8 text (binary data?)", file=name, line=lineno,
                                 key=f"byte {e.start + 1}", value=raw[e.start:e.start + 8]) from None
            if lineno == 1:
                text = text.removeprefix("\ufeff")  # a BOM some editors add
            text = text.removesuffix("\n").removesuffix("\r")
            # NUL and a stray CR would make the CSV parser see other rows than we count.
            for bad, what in (("\x00", "a NUL byte (binary data?)"), ("\r", "a carriage return inside the line")):
                if bad in text:
                    raise TraceError(f"contains {what}", file=name, line=lineno,
                                     key=f"column {text.index(bad) + 1}", value=text[:60])
            yield lineno, text


def _detect(p: Path, lines: list[tuple[int, str]]) -> str:
    first_line, first = next(((n, t) for n, t in lines if t.strip()), (1, ""))
    if p.suffix.lower() in (".jsonl", ".ndjson") or first.lstrip().startswith("{"):
        return "mooncake"
    if not first:
        raise TraceError("empty file (only blank lines)", file=str(p))
    found = set(_split_header(first))
    for fmt in ("azure", "vidur", "lengths"):   # most specific header first
        if {c for c in _COLUMNS[fmt] if c} <= found:
            return fmt
    wanted = "; ".join(f"{fmt}: {','.join(c for c in cols if c)}" for fmt, cols in _COLUMNS.items()
                       if fmt != "mooncake")
    raise TraceError(f"header does not match any trace format; columns found: "
                     f"{','.join(_split_header(first))}; required ({wanted})",
                     file=str(p), line=first_line)


def _split_header(text: str) -> list[str]:
    return [c.strip().strip('"').strip() for c in text.split(",")]


def _load_csv(name: str, lines: list[tuple[int, str]], fmt: str) -> Trace:
    rows = [(n, t) for n, t in lines if t.strip()]   # blank lines skipped, still counted
    if not rows:
        raise TraceError("empty file (no header)", file=name)
    header_line, header_text = rows[0]
    header = _split_header(header_text)
    time_col, prompt_col, output_col = _COLUMNS[fmt]
    required = [c for c in (time_col, prompt_col, output_col) if c]
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(f"header lacks column(s) {','.join(missing)} for {fmt} format; "
                         f"columns found: {','.join(header)}; required: {','.join(required)}",
                         file=name, line=header_line)
    dups = sorted({c for c in header if header.count(c) > 1})
    if dups:
        raise TraceError(f"duplicate column(s) {','.join(dups)}", file=name, line=header_line)
    data = rows[1:]
    if not data:
        raise TraceError("no rows (header only)", file=name)
    # Check the field count ourselves: pandas would turn one extra field into an index.
    want = len(header) - 1
    for n, t in data:
        if t.count(",") != want:
            raise TraceError(f"expected {want + 1} comma-separated fields, found "
                             f"{t.count(',') + 1}", file=name, line=n, value=t[:80])
    line_no = np.fromiter((n for n, _ in data), dtype=np.int64, count=len(data))
    try:   # strings only: our own checks then name the exact line and value
        df = pd.read_csv(io.StringIO("\n".join(t for _, t in data)), names=header, header=None,
                         dtype=str, na_filter=False, quoting=csv.QUOTE_NONE, engine="c",
                         index_col=False, skip_blank_lines=False)
    except (ValueError, pd.errors.ParserError) as e:   # should not happen after the checks above
        raise TraceError(f"cannot parse CSV: {e}", file=name) from None
    if len(df) != len(data):
        raise TraceError(f"CSV parser saw {len(df)} rows, expected {len(data)}", file=name)
    prompt, output = (_tokens(_num(df[c]), df[c].tolist(), line_no, c, name)
                      for c in (prompt_col, output_col))
    if fmt == "lengths":
        return Trace(name, fmt, None, prompt, output)
    if fmt == "azure":
        ns = _azure_ns(df[time_col], line_no, time_col, name)
        t_s = (ns - ns.min()) / 1e9   # subtract in integer ns: float64 epoch-ns would lose µs
    else:
        t_s = _seconds(_num(df[time_col]), df[time_col].tolist(), line_no, time_col, name, 1.0)
    return _sorted_trace(name, fmt, t_s, prompt, output)


def _load_mooncake(name: str, lines: list[tuple[int, str]]) -> Trace:
    keys = _COLUMNS["mooncake"]
    line_no: list[int] = []
    hashes: list[list[int]] = []
    raw: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    for n, text in lines:
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise TraceError(f"invalid JSON ({getattr(e, 'msg', type(e).__name__)})",
                             file=name, line=n, value=text[:80]) from None
        if not isinstance(obj, dict):
            raise TraceError("expected a JSON object {...}", file=name, line=n, value=text[:80])
        missing = [k for k in keys if k not in obj]
        if missing:
            raise TraceError(f"missing key(s) {','.join(missing)}; keys found: "
                             f"{','.join(map(str, obj))}; required: {','.join(keys)}",
                             file=name, line=n)
        line_no.append(n)
        for col, k in zip(raw, keys):
            col.append(obj[k])
        if hashes is not None:
            h = obj.get("hash_ids")
            if h is None:           # a file without hash ids carries no prefix
                hashes = None if len(line_no) == 1 else _no_hashes(name, n)
            else:
                hashes.append(_hash_ids(h, name, n))
    if not line_no:
        raise TraceError("no rows", file=name)
    lines_arr = np.asarray(line_no, dtype=np.int64)
    num = [np.fromiter(map(_json_number, col), dtype=np.float64, count=len(col)) for col in raw]
    prompt = _tokens(num[1], raw[1], lines_arr, keys[1], name)
    output = _tokens(num[2], raw[2], lines_arr, keys[2], name)
    t_s = _seconds(num[0], raw[0], lines_arr, keys[0], name, 1e-3)   # ms -> s
    return _sorted_trace(name, "mooncake", t_s, prompt, output, hashes)


def _no_hashes(name: str, line: int):
    raise TraceError("missing key hash_ids (earlier rows have it)", file=name, line=line, key="hash_ids")


def _hash_ids(h: Any, name: str, line: int) -> list[int]:
    """A row's hash chain: a list of non-negative integers (bool, float or str ids are errors)."""
    if not isinstance(h, list):
        raise TraceError("hash_ids must be a list of integers", file=name, line=line, key="hash_ids",
                         value=h, has_value=True)
    for v in h:
        if type(v) is not int or v < 0 or v >= 1 << 62:
            raise TraceError("hash_ids must be non-negative integers", file=name, line=line,
                             key="hash_ids", value=v, has_value=True)
    return h


def _num(col: pd.Series) -> np.ndarray:
    """CSV strings as float64; NaN where not a number (our checks name the row)."""
    return pd.to_numeric(col, errors="coerce").to_numpy(np.float64)


def _json_number(v: Any) -> float:
    """A JSON number as float; NaN for anything else (bool, str, null, list...)."""
    if type(v) is float:
        return v
    if type(v) is int:   # `type is`, not isinstance: True must not count as 1
        try:
            return float(v)
        except OverflowError:   # a 400-digit integer
            return math.inf
    return math.nan


def _tokens(vals: np.ndarray, raw: Sequence[Any], line_no: np.ndarray,
            key: str, name: str) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(vals) & (vals >= 1) & (vals <= MAX_TOKENS) & (vals == np.floor(vals))
    if not ok.all():
        i = int(np.argmin(ok))
        v, r = float(vals[i]), raw[i]
        if not math.isfinite(v):
            why = _why_not_number(r)
        elif v < 1:
            why = "token count must be >= 1"
        elif v > MAX_TOKENS:
            why = f"token count above {MAX_TOKENS:,} (corrupt row?)"
        else:
            why = "token count must be a whole number"
        raise TraceError(why, file=name, line=int(line_no[i]), key=key, value=r, has_value=True)
    return vals.astype(np.int64)


def _seconds(vals: np.ndarray, raw: Sequence[Any], line_no: np.ndarray, key: str,
             name: str, scale: float) -> np.ndarray:
    t_s = vals * scale
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(t_s) & (t_s >= 0) & (t_s <= MAX_ARRIVAL_S)
    if not ok.all():
        i = int(np.argmin(ok))
        why = (_why_not_number(raw[i]) if not math.isfinite(t_s[i]) else
               "arrival time must be >= 0" if t_s[i] < 0 else
               f"arrival time above {MAX_ARRIVAL_S:g} s (wrong unit?)")
        raise TraceError(why, file=name, line=int(line_no[i]), key=key, value=raw[i], has_value=True)
    return t_s


def _why_not_number(r: Any) -> str:
    if r is None or (isinstance(r, str) and not r.strip()):
        return "missing value"
    if isinstance(r, bool) or not isinstance(r, (str, int, float)):
        return "not a number"
    try:
        f = float(r)
    except OverflowError:   # a 400-digit JSON integer
        return "number too large"
    except ValueError:
        return "not a number"
    if math.isinf(f) and "inf" not in str(r).lower():   # "1e999" parses as inf
        return "number too large"
    return f"not a finite number ({f})" if not math.isfinite(f) else "not a number"


def _azure_ns(col: pd.Series, line_no: np.ndarray, key: str, name: str) -> np.ndarray:
    """Absolute timestamps as int64 ns; 7 fractional digits, or whole seconds."""
    ts = pd.to_datetime(col, format=_AZURE_TIME_FORMATS[0], errors="coerce")
    bad = ts.isna().to_numpy()
    if bad.any():   # rare: a row written without a fraction
        ts = ts.where(~bad, pd.to_datetime(col, format=_AZURE_TIME_FORMATS[1], errors="coerce"))
        bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError("unparsable timestamp; expected YYYY-MM-DD HH:MM:SS.fffffff",
                         file=name, line=int(line_no[i]), key=key, value=col.iloc[i], has_value=True)
    return ts.to_numpy().astype("datetime64[ns]").astype(np.int64)


def _sorted_trace(name: str, fmt: str, t_s: np.ndarray, prompt: np.ndarray,
                  output: np.ndarray, hash_ids: list | None = None) -> Trace:
    """Stable-sort by arrival if it ever decreases (with a warning); first arrival -> 0.0."""
    n_back = int(np.count_nonzero(np.diff(t_s) < 0))
    if n_back:
        warnings.warn(f"{name}: {n_back} row(s) arrive earlier than the row before them; "
                      f"stable-sorted {len(t_s)} rows by arrival time (none dropped)",
                      TraceWarning, stacklevel=4)   # -> the caller of load_trace
        order = np.argsort(t_s, kind="stable")
        t_s, prompt, output = t_s[order], prompt[order], output[order]
        if hash_ids is not None:
            hash_ids = [hash_ids[i] for i in order.tolist()]
    return Trace(name, fmt, (t_s - t_s[0]).astype(np.float64), prompt, output, hash_ids)
