"""Tests for pdsim.traces: the shipped slices, the full public traces (when
present), window/scale_rate, and clean errors on malformed input."""
from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim.errors import TraceError
from pdsim.traces import Trace, TraceWarning, load_trace, scale_rate, window

REPO = Path(__file__).resolve().parents[1]
SLICES = REPO / "scenarios" / "traces"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
AZURE_CONV = "azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = "azure-llm-2023/AzureLLMInferenceTrace_code.csv"
MOONCAKE_CONV = "mooncake-fast25/conversation_trace.jsonl"


def shared(rel: str) -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/traces not present (fresh clone)")
    return SHARED / rel


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def assert_valid(tr: Trace) -> None:
    assert tr.prompt_tokens.dtype == np.int64 and tr.output_tokens.dtype == np.int64
    assert (tr.prompt_tokens >= 1).all() and (tr.output_tokens >= 1).all()
    if tr.arrival_s is not None:
        assert tr.arrival_s.dtype == np.float64
        assert np.isfinite(tr.arrival_s).all() and (np.diff(tr.arrival_s) >= 0).all()


# ----------------------------------------------------------- shipped slices

def plain_count(p: Path) -> int:
    if p.suffix == ".jsonl":
        return sum(1 for line in p.open() if json.loads(line))
    with p.open(newline="") as f:
        return sum(1 for _ in csv.reader(f)) - 1


@pytest.mark.parametrize("name,fmt,rows", [("azure_conv_10min.csv", "azure", 2867),
                                           ("azure_code_10min.csv", "azure", 1482),
                                           ("mooncake_conv_10min.jsonl", "mooncake", 1750)])
def test_shipped_slice_loads(name: str, fmt: str, rows: int) -> None:
    p = SLICES / name
    tr = load_trace(p)
    assert tr.format == fmt
    assert len(tr) == plain_count(p) == rows
    assert tr.arrival_s[0] == 0.0 and tr.arrival_s.max() < 600.0
    assert_valid(tr)
    if fmt == "azure":   # the slices keep the source's CRLF bytes
        assert p.read_bytes().count(b"\r\n") == rows + 1


def test_slice_readme_sha256_and_counts_match() -> None:
    readme = (SLICES / "README.md").read_text()
    table = re.findall(r"^\| `([\w.]+)` \| ([\d,]+) \| ([\d,]+) \|.*`([0-9a-f]{64})` \|$", readme, re.M)
    assert len(table) == 3
    for name, rows, size, digest in table:
        p = SLICES / name
        assert sha256(p) == digest, name
        assert p.stat().st_size == int(size.replace(",", ""))
        assert plain_count(p) == int(rows.replace(",", ""))


@pytest.mark.parametrize("name,src", [("azure_conv_10min.csv", AZURE_CONV),
                                      ("azure_code_10min.csv", AZURE_CODE),
                                      ("mooncake_conv_10min.jsonl", MOONCAKE_CONV)])
def test_slice_is_exact_prefix_of_source_first_10min(name: str, src: str) -> None:
    full_p = shared(src)
    piece = (SLICES / name).read_bytes()
    assert full_p.read_bytes().startswith(piece)
    full, part = load_trace(full_p), load_trace(SLICES / name)
    assert len(part) == int(np.count_nonzero(full.arrival_s < 600.0))


# ------------------------------------------------------- full public traces

def test_full_azure_conv_stats() -> None:
    tr = load_trace(shared(AZURE_CONV))
    assert tr.format == "azure" and len(tr) == 19_366
    assert tr.arrival_s[-1] == pytest.approx(3501.7, abs=0.05)
    assert tr.prompt_tokens.mean() == pytest.approx(1154.7, abs=0.05)
    assert tr.output_tokens.mean() == pytest.approx(211.1, abs=0.05)
    assert tr.prompt_tokens.min() == 2 and tr.prompt_tokens.max() == 14_050
    assert_valid(tr)


def test_full_azure_code_and_mooncake_stats() -> None:
    code = load_trace(shared(AZURE_CODE))   # this file has no final newline
    assert len(code) == 8_819 and code.arrival_s[-1] == pytest.approx(3435.9, abs=0.05)
    moon = load_trace(shared(MOONCAKE_CONV))
    assert moon.format == "mooncake" and len(moon) == 12_031
    assert moon.prompt_tokens.mean() == pytest.approx(12_035.1, abs=0.05)
    assert moon.arrival_s[-1] == pytest.approx(3537.0, abs=0.05)
    assert len(np.unique(moon.arrival_s)) == 1_180   # ~3 s ticks, per the README


@pytest.mark.parametrize("kind", ["conv", "code"])
def test_vidur_splitwise_equals_azure_row_by_row(kind: str) -> None:
    azure = load_trace(shared(f"azure-llm-2023/AzureLLMInferenceTrace_{kind}.csv"))
    vidur = load_trace(shared(f"vidur/splitwise_{kind}.csv"))
    assert vidur.format == "vidur" and len(vidur) == len(azure)
    np.testing.assert_array_equal(vidur.prompt_tokens, azure.prompt_tokens)
    np.testing.assert_array_equal(vidur.output_tokens, azure.output_tokens)
    np.testing.assert_allclose(vidur.arrival_s, azure.arrival_s, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rel,rows", [
    ("vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28_257),
    ("etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30_731),
    ("etalon/bwb_stats_llama2_tokenizer_filtered_v2.csv", 33_768)])
def test_lengths_files_have_no_arrivals(rel: str, rows: int) -> None:
    tr = load_trace(shared(rel))
    assert tr.format == "lengths" and tr.arrival_s is None and len(tr) == rows
    assert_valid(tr)
    with pytest.raises(TraceError, match="no arrival times"):
        window(tr, 0.0, 10.0)


def test_shared_readme_sha256() -> None:
    want = {AZURE_CODE: "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
            AZURE_CONV: "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
            MOONCAKE_CONV: "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
            "vidur/splitwise_conv.csv": "439e4138b7e384f316de614c071f7162be05b8af0cef866f82faacd1b0472249"}
    for rel, digest in want.items():
        assert sha256(shared(rel)) == digest, rel


# ------------------------------------------------------ window / scale_rate

def small() -> Trace:
    return Trace("t.csv", "vidur", np.array([0.0, 1.0, 2.5, 4.0, 4.0, 7.0]),
                 np.arange(1, 7, dtype=np.int64), np.arange(11, 17, dtype=np.int64))


def test_window_by_hand() -> None:
    w = window(small(), 1.0, 3.0)        # [1, 4): rows at 1.0 and 2.5; 4.0 excluded
    np.testing.assert_array_equal(w.arrival_s, [0.0, 1.5])
    np.testing.assert_array_equal(w.prompt_tokens, [2, 3])
    np.testing.assert_array_equal(w.output_tokens, [12, 13])
    w = window(small(), 3.0)             # open-ended; start maps to 0 so the 1 s gap stays
    np.testing.assert_array_equal(w.arrival_s, [1.0, 1.0, 4.0])
    np.testing.assert_array_equal(w.prompt_tokens, [4, 5, 6])
    assert len(window(small(), 7.5, 1.0)) == 0
    for bad in [(-1.0, 1.0), (0.0, 0.0), (math.nan, 1.0), (0.0, math.inf)]:
        with pytest.raises(ValueError):
            window(small(), *bad)


def test_scale_rate_by_hand() -> None:
    s = scale_rate(small(), 2.0)
    np.testing.assert_array_equal(s.arrival_s, [0.0, 0.5, 1.25, 2.0, 2.0, 3.5])
    np.testing.assert_array_equal(s.prompt_tokens, small().prompt_tokens)
    np.testing.assert_array_equal(scale_rate(small(), 0.5).arrival_s, [0, 2, 5, 8, 8, 14])
    for bad in [0, -1.0, math.inf, math.nan]:
        with pytest.raises(ValueError):
            scale_rate(small(), bad)


def test_trace_arrays_are_read_only() -> None:
    mine = np.array([3, 4], dtype=np.int64)
    tr = Trace("t", "lengths", None, mine, mine.copy())
    with pytest.raises(ValueError):
        tr.prompt_tokens[0] = 5
    mine[0] = 7   # the caller's own array stays writable
    with pytest.raises(ValueError):
        Trace("t", "lengths", None, mine, mine[:1])


arrivals = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=0, max_size=50).map(
    lambda xs: np.array(sorted(xs), dtype=np.float64))


def make(t: np.ndarray) -> Trace:
    n = len(t)
    return Trace("h.csv", "vidur", t, np.arange(1, n + 1, dtype=np.int64), np.ones(n, np.int64))


@given(arrivals, st.floats(1e-3, 1e3))
def test_scale_rate_round_trip(t: np.ndarray, f: float) -> None:
    back = scale_rate(scale_rate(make(t), f), 1 / f).arrival_s
    np.testing.assert_allclose(back, t, rtol=1e-12, atol=1e-9)


@given(arrivals, st.floats(0, 1e4), st.none() | st.floats(1e-6, 1e4))
def test_window_keeps_exactly_rows_in_range(t: np.ndarray, start: float, dur: float | None) -> None:
    w = window(make(t), start, dur)
    end = math.inf if dur is None else start + dur
    kept = [i for i, x in enumerate(t) if start <= x < end]
    np.testing.assert_array_equal(w.prompt_tokens, np.array(kept, dtype=np.int64) + 1)
    np.testing.assert_array_equal(w.arrival_s, t[kept] - start)
    assert (w.arrival_s >= 0).all()


# --------------------------------------------------------- malformed input

AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"


def az_row(sec: int, p: object = 10, o: object = 5) -> str:
    return f"2023-11-16 18:15:{sec:02d}.1234567,{p},{o}\r\n"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def err(p: Path, fmt: str = "auto") -> str:
    with pytest.raises(TraceError) as e:
        load_trace(p, fmt)
    return str(e.value)


def test_azure_small_file_exact(tmp_path: Path) -> None:
    p = write(tmp_path, "a.csv", AZ_HEAD + az_row(1, 7, 3) + az_row(3, 8, 4))
    tr = load_trace(p)
    assert tr.format == "azure"
    np.testing.assert_allclose(tr.arrival_s, [0.0, 2.0], atol=1e-9)
    np.testing.assert_array_equal(tr.prompt_tokens, [7, 8])


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "no such file" in err(tmp_path / "nope.csv")
    assert "directory" in err(tmp_path)


def test_empty_and_header_only(tmp_path: Path) -> None:
    assert "empty" in err(write(tmp_path, "e.csv", ""))
    assert "no rows" in err(write(tmp_path, "h.csv", AZ_HEAD))
    assert "no rows" in err(write(tmp_path, "h.jsonl", "\n\n"))


def test_missing_column_lists_found_and_required(tmp_path: Path) -> None:
    m = err(write(tmp_path, "m.csv", "arrived_at,num_prefill_tokens\n0.0,5\n"), "vidur")
    assert "num_decode_tokens" in m and "found: arrived_at,num_prefill_tokens" in m
    m = err(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    assert "found: a,b" in m and "ContextTokens" in m


def test_non_numeric_token_on_line_4(tmp_path: Path) -> None:
    p = write(tmp_path, "n.csv", AZ_HEAD + az_row(1) + az_row(2) + az_row(3, "12abc") + az_row(4))
    m = err(p)
    assert m.startswith(f"{p}:4: ContextTokens = '12abc'") and "not a number" in m


def test_csv_blank_lines_skipped_but_counted(tmp_path: Path) -> None:
    head = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
    tr = load_trace(write(tmp_path, "ok.csv", head + "0.0,5,5\n\n1.5,6,6\n\n\n"))
    np.testing.assert_array_equal(tr.prompt_tokens, [5, 6])
    p = write(tmp_path, "b.csv", head + "0.0,5,5\n   \n1.5,x7,6\n")
    assert f"{p}:4: num_prefill_tokens = 'x7'" in err(p)


@pytest.mark.parametrize("value,why", [("-3", ">= 1"), ("0", ">= 1"), ("nan", "NaN"),
                                       ("inf", "finite"), ("2.5", "whole"),
                                       ("99999999999", "above"), ("", "missing")])
def test_bad_token_values(tmp_path: Path, value: str, why: str) -> None:
    p = write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
              f"0.0,5,5\n1.0,5,{value}\n")
    m = err(p)
    assert f"{p}:3: num_decode_tokens = '{value}'" in m and why in m


def test_bad_timestamp_and_field_count(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", AZ_HEAD + az_row(1) + "2023-13-45 99:00:00.1,5,5\r\n")
    m = err(p)
    assert f"{p}:3: TIMESTAMP = '2023-13-45 99:00:00.1'" in m and "timestamp" in m
    m = err(write(tmp_path, "f.csv", AZ_HEAD + az_row(1) + az_row(2) + "2023-11-16 18:15:09.1,5,5,9\r\n"))
    assert ":4:" in m and "fields" in m
    m = err(write(tmp_path, "g.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n-1.0,5,5\n"))
    assert ":2: arrived_at = '-1.0'" in m


def test_invalid_json_on_line_3_counts_blank_lines(tmp_path: Path) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
    p = write(tmp_path, "j.jsonl", good + "\n" + '{"timestamp": 1, "input_length": 5,\n')
    assert f"{p}:3:" in err(p) and "invalid JSON" in err(p)
    m = err(write(tmp_path, "k.jsonl", good + '{"timestamp": 1, "input_length": true, "output_length": 2}\n'))
    assert ":2: input_length = True" in m
    m = err(write(tmp_path, "l.jsonl", good + '{"timestamp": 1, "input_length": 5}\n'))
    assert ":2:" in m and "output_length" in m and "hash_ids" not in m
    m = err(write(tmp_path, "n.jsonl", good + '{"timestamp": 1, "input_length": NaN, "output_length": 2}\n'))
    assert ":2: input_length = nan" in m
    m = err(write(tmp_path, "o.jsonl", good + '{"timestamp": 1, "input_length": 1%s, "output_length": 2}\n' % ("0" * 400)))
    assert ":2: input_length = 1000" in m and "too large" in m
    m = err(write(tmp_path, "p.jsonl", good + '{"timestamp": -5, "input_length": 1, "output_length": 2}\n'))
    assert ":2: timestamp = -5" in m and ">= 0" in m


def test_binary_junk_names_line(tmp_path: Path) -> None:
    p = write(tmp_path, "b.csv", AZ_HEAD.encode() + az_row(1).encode() + b"\xff\xfe\x00junk\r\n")
    m = err(p)
    assert f"{p}:3:" in m and "UTF-8" in m
    assert "NUL" in err(write(tmp_path, "z.jsonl", b'{"timestamp": 0}\x00\n'))


def test_huge_line_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "huge.jsonl", b'{"x": "' + b"a" * (2 * 1024**2) + b'"}\n')
    assert "longer than" in err(p)


def test_unknown_format(tmp_path: Path) -> None:
    m = err(write(tmp_path, "a.csv", AZ_HEAD + az_row(1)), "parquet")
    assert "'parquet'" in m and "azure" in m and "mooncake" in m


def test_unsorted_timestamps_warn_and_sort(tmp_path: Path) -> None:
    p = write(tmp_path, "u.csv", AZ_HEAD + az_row(5, 1) + az_row(2, 2) + az_row(2, 3) + az_row(9, 4))
    with pytest.warns(TraceWarning, match="1 row"):
        tr = load_trace(p)
    np.testing.assert_array_equal(tr.prompt_tokens, [2, 3, 1, 4])   # stable: 2 before 3
    np.testing.assert_allclose(tr.arrival_s, [0.0, 0.0, 3.0, 7.0], atol=1e-9)
    rows = [{"timestamp": t, "input_length": i + 1, "output_length": 1} for i, t in enumerate([3000, 0, 6000])]
    j = write(tmp_path, "u.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(TraceWarning):
        tr = load_trace(j)
    np.testing.assert_array_equal(tr.arrival_s, [0.0, 3.0, 6.0])
    np.testing.assert_array_equal(tr.prompt_tokens, [2, 1, 3])


def test_sorted_file_does_not_warn(tmp_path: Path) -> None:
    p = write(tmp_path, "s.csv", AZ_HEAD + az_row(1) + az_row(1) + az_row(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_trace(p)) == 3


# ------------------------------------------------------------------- fuzz

def load_or_error(p: Path, rows: int | None = None) -> None:
    """A valid Trace (with every row, if ``rows`` is known) or a TraceError; nothing else."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        try:
            tr = load_trace(p)
        except TraceError:
            return
    assert_valid(tr)
    assert rows is None or len(tr) == rows


FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
junk = st.text(st.sampled_from("0123456789.,-e:nN \r\n{}\"[]x"), max_size=12)
number = st.integers(-3, 20_000) | st.floats(-1e3, 1e12) | st.sampled_from([math.nan, math.inf, 1e99])
stamp = st.datetimes().map(lambda d: d.strftime("%Y-%m-%d %H:%M:%S.%f") + "7")   # years 1..9999
near_stamp = st.datetimes(dt.datetime(2023, 11, 16), dt.datetime(2023, 11, 17)).map(
    lambda d: d.strftime("%Y-%m-%d %H:%M:%S.%f") + "7")
# Mostly-valid fields reach the checks past the header and field count.
VALID = {"stamp": near_stamp, "secs": st.floats(0, 4e3).map(str), "tok": st.integers(1, 9_000).map(str)}
CSV_HEADS = {"TIMESTAMP,ContextTokens,GeneratedTokens": ("stamp", "tok", "tok"),
             "arrived_at,num_prefill_tokens,num_decode_tokens": ("secs", "tok", "tok"),
             "num_prefill_tokens,num_decode_tokens,pd_ratio": ("tok", "tok", "secs")}


@FUZZ
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
       ext=st.sampled_from([".csv", ".jsonl"]))
def test_fuzz_random_bytes(tmp_path: Path, data: bytes, ext: str) -> None:
    load_or_error(write(tmp_path, "fuzz" + ext, data))


@FUZZ
@given(data=st.data(), head=st.sampled_from(sorted(CSV_HEADS)), eol=st.sampled_from(["\n", "\r\n"]),
       n_rows=st.integers(0, 8))
def test_fuzz_near_valid_csv(tmp_path: Path, data: st.DataObject, head: str, eol: str, n_rows: int) -> None:
    def field(kind: str) -> str:
        ok = data.draw(st.integers(0, 9)) > 0
        return data.draw(VALID[kind] if ok else (number.map(str) | junk | stamp))
    text = eol.join([head] + [",".join(field(k) for k in CSV_HEADS[head]) for _ in range(n_rows)])
    load_or_error(write(tmp_path, "near.csv", text), sum(1 for x in text.split("\n")[1:] if x.strip()))


@FUZZ
@given(rows=st.lists(st.fixed_dictionaries(
    {"timestamp": st.integers(0, 10**7), "input_length": st.integers(1, 10**5),
     "output_length": st.integers(1, 10**4)}, optional={"hash_ids": st.lists(st.integers())}), max_size=8),
    bad_row=st.integers(0, 8), bad_key=st.sampled_from(["timestamp", "input_length", "output_length"]),
    bad_value=number | st.none() | st.booleans() | junk | st.lists(st.integers(), max_size=2) | st.just(10**400))
def test_fuzz_near_valid_jsonl(tmp_path: Path, rows: list[dict], bad_row: int, bad_key: str,
                               bad_value: object) -> None:
    if bad_row < len(rows):
        rows[bad_row][bad_key] = bad_value
    load_or_error(write(tmp_path, "near.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), len(rows))
