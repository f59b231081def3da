"""Hostile input (issue #8): fuzz the scenario loader and the trace readers.

The only acceptable outcomes are a valid result, or a :class:`~pdsim.errors.PdsimError`
whose message names the file and the key or line (and the value, where there is
one).  Any other exception -- KeyError, TypeError, ValueError, a yaml or pydantic
error, RecursionError, UnicodeDecodeError, MemoryError -- or a hang is a bug.

Paths in a scenario resolve relative to the scenario file, and a run writes only
under its ``--out`` folder.

Deterministic: every hypothesis test is derandomized, with no example database.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import REPO
from pdsim import config
from pdsim.__main__ import main
from pdsim.errors import ConfigError, InputError, PdsimError, TraceError
from pdsim.traces import MAX_LINE_BYTES, TraceWarning, load_trace

SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Errors about a whole file (no key or line to name): the file is still named.
FILE_LEVEL = re.compile(r"a scenario must be a YAML mapping|not UTF-8 text|YAML nested too deeply|"
                        r"empty file|no rows|scenario file not found|is a directory|no such file|larger than|"
                        r"not a usable path|cannot read|is a device profile, not a scenario|is a plan, not a scenario")


def check_error(exc: BaseException, file: str) -> str:
    """``exc`` is a clear, one-line pdsim error about ``file``; return its message."""
    msg = str(exc)
    assert isinstance(exc, PdsimError), f"{type(exc).__name__} leaked: {exc!r}"
    assert isinstance(exc, InputError), msg
    assert exc.file == file and msg.startswith(file), msg
    assert exc.key or exc.line is not None or FILE_LEVEL.search(msg), f"names no key or line: {msg}"
    assert "\n" not in msg and len(msg) < 1000, msg
    return msg


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return path


# ============================================================ scenario loader

def load_or_error(path: Path, overrides: list[str] | None = None) -> config.Scenario | None:
    """``config.load``: a Scenario that can be written to summary.json, or a clean error naming ``path``."""
    try:
        sc = config.load(path, overrides)
    except Exception as exc:   # noqa: BLE001 -- the point: anything but a PdsimError fails
        check_error(exc, str(path))
        return None
    json.dumps(sc.model_dump(mode="json"), allow_nan=False)   # the run's summary.json needs this
    return sc


def parse_or_error(raw: object) -> None:
    try:
        sc = config.parse(raw, "fuzz.yaml")
    except Exception as exc:   # noqa: BLE001
        check_error(exc, "fuzz.yaml")
        return
    json.dumps(sc.model_dump(mode="json"), allow_nan=False)


HOSTILE = [None, True, False, 0, -1, -1e-300, 5e-324, 1e-200, 1e308, -1e308, math.nan, math.inf, -math.inf,
           10**30, -(10**30), 2**63, 10**4000, "", "x", "-1", "1e999", "nan", "h100-sxm", "../" * 40 + "etc/passwd",
           "\x00", "\u202e", "x" * 100_000, [], [1, 2], {}, {"kind": "colocated"}, {"a": {"b": {"c": None}}}]
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(10**40), 10**40)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
           | st.sampled_from([v for v in HOSTILE if not isinstance(v, (list, dict))]))
keys = st.text(max_size=12) | st.sampled_from(sorted(config._vocabulary()))
trees = st.recursive(scalars, lambda kids: st.lists(kids, max_size=5)
                     | st.dictionaries(keys | st.integers() | st.booleans() | st.none(), kids, max_size=6),
                     max_leaves=40)


@FUZZ
@given(tree=trees)
def test_random_trees_parse_or_fail_cleanly(tree) -> None:
    parse_or_error(tree)
    if isinstance(tree, dict):   # and the same as a scenario with the right top-level keys
        parse_or_error({**tree, "workload": tree, "topologies": tree})


@FUZZ
@given(tree=trees)
def test_random_yaml_files_load_or_fail_cleanly(tmp_path: Path, tree) -> None:
    load_or_error(write(tmp_path / "s.yaml", yaml.safe_dump(tree, allow_unicode=True)))


def _paths(node, prefix=()):
    """Every (path, parent container) in a raw scenario tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


RAW = {p.stem: config.read_yaml(p) for p in SCENARIOS}
MUTATIONS = ["delete", "replace", "unknown_key", "wrong_container"]


@settings(FUZZ, max_examples=150)
@given(data=st.data(), name=st.sampled_from(sorted(RAW)), how=st.sampled_from(MUTATIONS),
       value=st.sampled_from(HOSTILE) | scalars)
def test_mutated_scenarios_load_or_fail_cleanly(tmp_path: Path, data, name: str, how: str, value) -> None:
    raw = copy.deepcopy(RAW[name])
    paths = list(_paths(raw))
    path = data.draw(st.sampled_from(paths))
    parent = raw
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "replace":
        parent[last] = value
    elif how == "unknown_key":
        target = parent[last] if isinstance(parent[last], dict) else parent
        if isinstance(target, dict):
            target[data.draw(st.sampled_from(["replcas", "rates", "bogus", "kind2", "devce"]))] = value
    else:
        parent[last] = [parent[last]] if not isinstance(parent[last], list) else {"x": parent[last]}
    scen_dir = tmp_path / "scen"
    if scen_dir.exists():
        shutil.rmtree(scen_dir)
    shutil.copytree(REPO / "scenarios" / "traces", scen_dir / "traces")   # trace paths resolve here
    sc = load_or_error(write(scen_dir / f"{name}.yaml", yaml.safe_dump(raw, allow_unicode=True)))
    if sc is not None and how == "replace" and isinstance(value, float) and not math.isfinite(value):
        pytest.fail(f"non-finite value accepted at {path}: {value}")


@pytest.mark.parametrize("key,value,shown", [
    ("workload.rate", ".nan", "nan"), ("workload.rate", "-.inf", "-inf"), ("workload.rate", "-2", "-2"),
    ("workload.duration_s", "-10", "-10"), ("horizon_s", "0", "0"), ("horizon_s", ".inf", "inf"),
    ("workload.num_requests", "1e12", "1e12"), ("workload.num_requests", "1.5", "1.5"),
    ("topologies.colocated-4.replicas", "1000000000", "1000000000"),
    ("topologies.colocated-4.replicas", "[4]", "[4]"), ("seed", "-1", "-1"), ("seed", str(10**30), "1000"),
    ("workload.cv", "1e-300", "1e-300"), ("workload.arrival", "tachyon", "tachyon"),
    ("slo.ttft_s", "-0.5", "-0.5"), ("workload.prompt_tokens.mean", "-1", "-1"),
    ("topologies.disagg-3p1d.kv_link.bandwidth_GBps", "5e-324", "5e-324"),
    ("topologies.disagg-3p1d.kv_link.latency_us", "-1", "-1"),
    ("topologies.colocated-4.gpu_memory_utilization", "1.5", "1.5"),
])
def test_bad_values_name_file_key_and_value(key: str, value: str, shown: str) -> None:
    path = str(REPO / "scenarios" / "quickstart.yaml")
    with pytest.raises(ConfigError) as ei:
        config.load(path, [f"{key}={value}"])
    msg = check_error(ei.value, path)
    assert key in msg and shown in msg, msg


def test_rate_times_duration_too_many_requests(tmp_path: Path) -> None:
    p = write(tmp_path / "s.yaml", "workload: {arrival: poisson, rate: 1000000, duration_s: 1e9}\n"
                                   "topologies: {a: {kind: colocated}}\n")
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert "workload" in msg and "1e+15" in msg and "num_requests" in msg


def test_deleted_required_keys_are_named(tmp_path: Path) -> None:
    for drop, named in [("workload", "workload"), ("topologies", "topologies")]:
        raw = copy.deepcopy(RAW["quickstart"])
        del raw[drop]
        p = write(tmp_path / f"no-{drop}.yaml", yaml.safe_dump(raw))
        msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
        assert named in msg and "required" in msg.lower()


@pytest.mark.parametrize("data,what", [
    (b"", "mapping"), (b"\n\n# only a comment\n", "mapping"), (b"[1, 2]\n", "mapping"), (b"42\n", "mapping"),
    (b"\xff\xfe\x00\x01binary\x80junk", "UTF-8"), (b"name: caf\xe9\n", "UTF-8"), (b"\x00\x00\x00", "YAML"),
    (b"a: [1, 2\nb: }", "YAML"), (b"a: !!python/object/apply:os.system ['true']\n", "YAML"),
    (b"seed: " + b"9" * 5000 + b"\n", "YAML"), (b"a: 2023-13-45\n", "YAML"), (b"a: !!bool maybe\n", "YAML"),
    (b"a: !!timestamp x\n", "YAML"), (b"? [1, 2]\n: 3\n", "YAML"), (b"a: &x [*x]\n", "alias"),
    (b"a: &a {b: 1, c: *a}\n", "alias"),
    (b"a: *undefined\n", "YAML"), (b"a: 1\na: 2\nworkload: {}\n", "duplicate key (first on line 1)"),
    (b"workload: {rate: 1, rate: 2}\n", "rate: duplicate key"),
    (b"1: 2\nworkload: {}\n", "string"), (b"topologies: {true: {}}\n", "string"),
])
def test_broken_scenario_files(tmp_path: Path, data: bytes, what: str) -> None:
    p = write(tmp_path / "bad.yaml", data)
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert what in msg, msg


def test_missing_directory_and_nul_scenario_paths(tmp_path: Path) -> None:
    for p in (tmp_path / "nope.yaml", tmp_path):
        check_error(pytest.raises(ConfigError, config.load, p).value, str(p))


def _laughs(levels: int, width: int = 10) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["top", "name", "topologies", "workload"])
def test_billion_laughs_rejected_quickly(tmp_path: Path, where: str) -> None:
    bomb = _laughs(9)   # 10^9 leaves when expanded
    text = {"top": bomb,
            "name": bomb + "name: *l8\n",
            "topologies": bomb + "workload: {rate: 1, num_requests: 1}\ntopologies: {a: *l8}\n",
            "workload": bomb + "workload: {rate: *l8, num_requests: 1}\ntopologies: {a: {kind: colocated}}\n"}[where]
    p = write(tmp_path / "bomb.yaml", text)
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert "expands to more than" in msg      # how fast: benchmarks/bench_input_guards.py


def test_small_aliases_still_work(tmp_path: Path) -> None:
    """Anchors and merge keys are legitimate YAML for sharing a pool definition."""
    p = write(tmp_path / "s.yaml", """
workload: {arrival: poisson, rate: 1, num_requests: 3, prompt_tokens: 10, output_tokens: 2}
topologies:
  a: &pool {kind: colocated, replicas: 1, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}
  b: {<<: *pool, replicas: 2}
""")
    sc = config.load(p)
    assert sc.topologies["b"].replicas == 2 and sc.topologies["b"].kv_blocks == 1000
    shared = write(tmp_path / "shared.yaml", "x: &s [1, 2]\ny: [*s, *s, *s]\nz: {p: *s, q: *s}\n")
    assert config.read_yaml(shared) == {"x": [1, 2], "y": [[1, 2]] * 3, "z": {"p": [1, 2], "q": [1, 2]}}


@pytest.mark.parametrize("depth", [70, 2_000, 100_000])
@pytest.mark.parametrize("kind", ["flow-seq", "flow-map", "block-map"])
def test_deep_nesting_rejected_quickly(tmp_path: Path, depth: int, kind: str) -> None:
    if kind == "flow-seq":
        text = "name: " + "[" * depth + "]" * depth + "\n"
    elif kind == "flow-map":
        text = "name: " + "{a: " * depth + "1" + "}" * depth + "\n"
    else:
        depth = min(depth, 2_000)   # indentation grows quadratically
        text = "".join(" " * i + f"k{i}:\n" for i in range(depth))
    p = write(tmp_path / "deep.yaml", text)
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert "nest" in msg, msg   # "nested" (PyYAML) or "nesting" (libyaml)


@pytest.mark.parametrize("loader", ["default", "pure-python"])
def test_pure_python_yaml_fallback_is_as_safe(tmp_path: Path, monkeypatch, loader: str) -> None:
    """Without libyaml, PyYAML's own parser recurses: deep nesting is a RecursionError, caught."""
    if loader == "pure-python":
        monkeypatch.setattr(config, "_Loader", config._PyLoader)
    for name, text, what in [("deep", "name: " + "[" * 20_000 + "]" * 20_000, "nest"),
                             ("bomb", _laughs(9), "expands"), ("nul", "a: 1\nb: \x00\n", "YAML"),
                             ("int", "seed: " + "9" * 5000, "cannot read value"), ("dup", "a: 1\na: 2\n", "duplicate")]:
        p = write(tmp_path / f"{name}.yaml", text)
        msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
        assert what in msg, msg
        if name == "nul":
            assert f"{p}:2:" in msg, msg
    assert config.load(REPO / "scenarios" / "quickstart.yaml").topologies


def test_huge_scalars_shown_short(tmp_path: Path) -> None:
    p = write(tmp_path / "s.yaml", "name: [" + ", ".join(["1"] * 50_000) + "]\nworkload: {}\n")
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert "name = [1, 1" in msg and "characters" in msg and len(msg) < 300
    p = write(tmp_path / "big.yaml", "name: 0x" + "f" * 5000 + "\n")   # repr() of this int would raise
    check_error(pytest.raises(ConfigError, config.load, p).value, str(p))


def test_scenario_file_size_cap(tmp_path: Path) -> None:
    p = tmp_path / "huge.yaml"
    with p.open("wb") as f:
        f.truncate(config.MAX_YAML_BYTES + 1)   # sparse: nothing is written to disk
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert "larger than" in msg


def test_base_dir_is_not_a_scenario_key(tmp_path: Path) -> None:
    p = write(tmp_path / "s.yaml", "base_dir: /etc\nworkload: {rate: 1, num_requests: 1}\n"
                                   "topologies: {a: {kind: colocated}}\n")
    msg = check_error(pytest.raises(ConfigError, config.load, p).value, str(p))
    assert "base_dir" in msg and "unknown key" in msg


# ================================================================ trace readers

FORMATS = ["azure", "vidur", "lengths", "mooncake"]
HEADS = {"azure": ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
         "vidur": ["arrived_at", "num_prefill_tokens", "num_decode_tokens"],
         "lengths": ["num_prefill_tokens", "num_decode_tokens"],
         "mooncake": ["timestamp", "input_length", "output_length"]}


def trace_or_error(path: Path, fmt: str, rows: int | None = None):
    """A valid Trace with every row (when ``rows`` is known), or a clean TraceError naming the file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        try:
            tr = load_trace(path, fmt)
        except Exception as exc:   # noqa: BLE001
            msg = check_error(exc, str(path))
            assert isinstance(exc, TraceError), msg
            if exc.line is not None:
                assert f"{path}:{exc.line}:" in msg
            return None
    assert tr.prompt_tokens.dtype == np.int64 and (tr.prompt_tokens >= 1).all() and (tr.output_tokens >= 1).all()
    if tr.arrival_s is not None:
        assert np.isfinite(tr.arrival_s).all() and (np.diff(tr.arrival_s) >= 0).all() and tr.arrival_s[0] == 0
    assert rows is None or len(tr) == rows, (len(tr), rows)
    return tr


@FUZZ
@given(data=st.binary(max_size=400), fmt=st.sampled_from(FORMATS + ["auto"]))
def test_trace_binary_junk(tmp_path: Path, data: bytes, fmt: str) -> None:
    trace_or_error(write(tmp_path / "junk.csv", data), fmt)


field = (st.integers(-5, 20_000).map(str) | st.floats(allow_nan=True, allow_infinity=True).map(repr)
         | st.text(st.sampled_from("0123456789.-+eE:xn \"'\t"), max_size=10)
         | st.sampled_from(["", "nan", "inf", "-inf", "1e999", "1" * 400, "0x10", "1_000", " 5 ", "5.0", "True",
                            "2023-11-16 18:15:46.6805900", "2023-11-16 18:15:46", "2023-02-30 00:00:00.0",
                            "9999-12-31 23:59:59.9999999", "0001-01-01 00:00:00.0"]))


@settings(FUZZ, max_examples=120)
@given(data=st.data(), fmt=st.sampled_from(["azure", "vidur", "lengths"]), eol=st.sampled_from(["\n", "\r\n"]),
       n=st.integers(0, 6), header_edit=st.sampled_from(["ok", "extra", "drop", "dup", "shuffle", "bom"]))
def test_trace_csv_rows_missing_extra_and_bad_fields(tmp_path: Path, data, fmt: str, eol: str, n: int,
                                                     header_edit: str) -> None:
    head = list(HEADS[fmt])
    if header_edit == "extra":
        head.append("pd_ratio")
    elif header_edit == "drop":
        head.pop(data.draw(st.integers(0, len(head) - 1)))
    elif header_edit == "dup":
        head.append(head[0])
    elif header_edit == "shuffle":
        head = data.draw(st.permutations(head))
    lines = [("\ufeff" if header_edit == "bom" else "") + ",".join(head)]
    for _ in range(n):
        width = len(head) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
        lines.append(",".join(data.draw(field) for _ in range(max(width, 0))))
    trace_or_error(write(tmp_path / "t.csv", eol.join(lines) + data.draw(st.sampled_from(["", eol]))), fmt,
                   rows=sum(1 for x in lines[1:] if x.strip()))


json_value = (st.none() | st.booleans() | st.integers() | st.integers(-(10**30), 10**400)
              | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
              | st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(FUZZ, max_examples=100)
@given(rows=st.lists(st.dictionaries(st.sampled_from(HEADS["mooncake"] + ["hash_ids", "x"]), json_value)
                     | st.fixed_dictionaries({"timestamp": st.integers(0, 10**7), "input_length": st.integers(1, 10**5),
                                              "output_length": st.integers(1, 10**4)}), max_size=6),
       junk=st.sampled_from(["", "[]", "null", "{", "{\"timestamp\": 1,}", "\"x\"", "[" * 100_000, "{}" * 3]),
       junk_at=st.integers(0, 7))
def test_trace_jsonl_missing_extra_and_bad_values(tmp_path: Path, rows, junk: str, junk_at: int) -> None:
    lines = [json.dumps(r) for r in rows]
    if junk and junk_at <= len(lines):
        lines.insert(junk_at, junk)
    text = "\n".join(lines) + "\n"
    expect = len(rows) if not junk or junk_at > len(rows) else None
    trace_or_error(write(tmp_path / "t.jsonl", text), "mooncake", rows=expect)


@FUZZ
@given(times=st.lists(st.integers(0, 50) | st.sampled_from([0, 0, 7]), min_size=1, max_size=30),
       fmt=st.sampled_from(["vidur", "mooncake"]))
def test_trace_unsorted_and_duplicate_timestamps_keep_every_row(tmp_path: Path, times, fmt: str) -> None:
    if fmt == "vidur":
        text = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + \
            "".join(f"{t / 10},{i + 1},1\n" for i, t in enumerate(times))
        p = write(tmp_path / "t.csv", text)
    else:
        p = write(tmp_path / "t.jsonl", "".join(json.dumps({"timestamp": t * 100, "input_length": i + 1,
                                                           "output_length": 1}) + "\n" for i, t in enumerate(times)))
    tr = trace_or_error(p, fmt, rows=len(times))
    order = np.argsort(np.asarray(times), kind="stable")   # stable: equal times keep file order
    np.testing.assert_array_equal(tr.prompt_tokens, order + 1)
    np.testing.assert_allclose(tr.arrival_s, (np.sort(times) - min(times)) / 10, atol=1e-9)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("text", ["", "\n\n\n", "\r\n", " \t \n"])
def test_trace_empty_files(tmp_path: Path, fmt: str, text: str) -> None:
    p = write(tmp_path / "e.csv", text)
    check_error(pytest.raises(TraceError, load_trace, p, fmt).value, str(p))


@pytest.mark.parametrize("fmt", FORMATS)
def test_trace_oversized_line_rejected_fast_in_bounded_memory(tmp_path: Path, fmt: str) -> None:
    """A multi-MB line (standing in for the 1 GB one) is refused by the per-line cap, naming its line."""
    head = ",".join(HEADS[fmt]) + "\n" if fmt != "mooncake" else '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
    p = tmp_path / "long.csv"
    with p.open("wb") as f:
        f.write(head.encode())
        f.write(b"1" * (4 * MAX_LINE_BYTES))   # no newline at all: a reader that reads to EOL would hold it all
        f.write(b"\n")
    tracemalloc.start()
    try:
        exc = pytest.raises(TraceError, load_trace, p, fmt).value
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = check_error(exc, str(p))
    assert exc.line == 2 and "longer than" in msg
    assert peak < 3 * MAX_LINE_BYTES, f"peak {peak:,} bytes"   # one capped line, not the file


def test_trace_bad_paths(tmp_path: Path) -> None:
    for p in (tmp_path / "none.csv", tmp_path, tmp_path / "a\x00b.csv"):
        check_error(pytest.raises(TraceError, load_trace, p, "vidur").value, str(p))


@pytest.mark.parametrize("junk", [b"\xff\xfe", b"caf\xe9", b"\x00", b"a\rb"])
def test_trace_non_utf8_and_control_bytes_name_line(tmp_path: Path, junk: bytes) -> None:
    p = write(tmp_path / "t.csv", b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,1,1\n0.6," + junk + b",1\n")
    exc = pytest.raises(TraceError, load_trace, p, "vidur").value
    assert exc.line == 3 and f"{p}:3:" in check_error(exc, str(p))


# ============================================================ CLI: exit 2, one line

TINY = ("model: llama-3.1-8b\n"
        "workload: {arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}\n"
        "topologies:\n  a: {kind: colocated, replicas: 1, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.01}}\n")
TRACE_TINY = TINY.replace("{arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}",
                          "{arrival: trace, trace: {path: t.csv, format: vidur}}")


@pytest.mark.parametrize("case", ["binary", "bomb", "deep", "nan-rate", "negative-duration", "unknown-key",
                                  "list", "negative-seed", "tiny-gamma-cv", "trace-binary", "trace-unsorted-bad",
                                  "trace-long-line"])
def test_cli_broken_files_exit_2_one_line(tmp_path: Path, capsys, case: str) -> None:
    text = {"binary": b"\x89PNG\r\n\x1a\n\x00\x00\xff",
            "bomb": _laughs(9),
            "deep": "workload: " + "[" * 5000 + "]" * 5000,
            "nan-rate": TINY.replace("rate: 2", "rate: .nan"),
            "negative-duration": TINY.replace("num_requests: 5", "duration_s: -60"),
            "unknown-key": TINY.replace("replicas: 1", "replicaz: 1"),
            "list": "- " + TINY.replace("\n", "\n  "),
            "negative-seed": "seed: -1\n" + TINY,
            "tiny-gamma-cv": TINY.replace("arrival: poisson", "arrival: gamma, cv: 1.0e-200"),
            }.get(case, TRACE_TINY)
    trace = {"trace-binary": b"\x7fELF\x02\x01\x01\x00" * 4,
             "trace-unsorted-bad": b"arrived_at,num_prefill_tokens,num_decode_tokens\n2,1,1\n1,1,1\n0.5,-3,1\n",
             "trace-long-line": b"arrived_at,num_prefill_tokens,num_decode_tokens\n" + b"9" * (2 * MAX_LINE_BYTES)}
    if case in trace:
        write(tmp_path / "t.csv", trace[case])
    p = write(tmp_path / "s.yaml", text)
    out = tmp_path / "out"
    rc = main(["run", str(p), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("pdsim: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert (str(tmp_path / "t.csv") if case in trace else str(p)) in err, err
    assert not out.exists(), "a failed run must not leave a half-written output folder"


# ============================================= paths: relative to the scenario; output only under --out

def _device_profile() -> str:
    return (REPO / "pdsim" / "data" / "devices" / "h100-sxm.yaml").read_text()


def test_relative_paths_resolve_against_scenario_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """A trace path and a device-profile path are read next to the scenario, whatever the working directory;
    a same-named decoy in the working directory is not used."""
    scen = tmp_path / "proj" / "scen"
    write(scen / "data" / "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,5\n0.5,120,6\n1.0,90,4\n")
    write(scen / "profiles" / "mine.yaml", _device_profile())
    cwd = tmp_path / "elsewhere"
    write(cwd / "data" / "t.csv", "this is not a trace\n")
    write(cwd / "profiles" / "mine.yaml", "not: [a, device, profile]\n")
    monkeypatch.chdir(cwd)
    p = write(scen / "s.yaml", "model: llama-3.1-8b\n"
              "workload: {arrival: trace, trace: {path: data/t.csv}}\n"
              "topologies:\n"
              "  c: {kind: colocated, device: profiles/mine.yaml}\n"
              "  d: {kind: disaggregated, prefill: {device: profiles/mine.yaml}, decode: {device: ./profiles/mine.yaml}}\n")
    sc = config.load(os.path.relpath(p, cwd))
    assert Path(sc.topologies["c"].device).resolve() == (scen / "profiles" / "mine.yaml").resolve()
    assert Path(sc.topologies["d"].decode.device).resolve() == (scen / "profiles" / "mine.yaml").resolve()
    assert sc.resolve(sc.workload.trace.path).resolve() == (scen / "data" / "t.csv").resolve()
    out = tmp_path / "out"
    rc = main(["run", os.path.relpath(p, cwd), "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    assert {t["requests"]["total"] for t in s["topologies"].values()} == {3}
    # a length distribution's trace path too (arrival: trace reads lengths from its own rows, not prompt_tokens)
    q = write(scen / "s2.yaml", p.read_text().replace(
        "{arrival: trace, trace: {path: data/t.csv}}",
        "{arrival: poisson, rate: 10, num_requests: 3, prompt_tokens: {dist: trace, path: data/t.csv}}"))
    assert main(["run", os.path.relpath(q, cwd), "--out", str(tmp_path / "out3"), "--quiet"]) == 0, \
        capsys.readouterr().err
    # a missing relative profile is reported with the path that was tried
    write(p, p.read_text().replace("profiles/mine.yaml", "profiles/gone.yaml"))
    assert main(["run", str(p), "--out", str(tmp_path / "out2"), "--quiet"]) == 2
    assert str(scen / "profiles" / "gone.yaml") in capsys.readouterr().err


def test_no_scenario_key_names_an_output_path() -> None:
    """No key can point the run's writes elsewhere: output goes to --out only."""
    suspicious = {k for k in config._vocabulary()
                  if re.search(r"(^|_)(out|output|dir|folder|file|save|write|report|dest)(_|$)", k, re.I)}
    # base_dir is internal, not a YAML key; scale_out_above is an autoscaler bound (a number)
    assert suspicious <= {"output_tokens", "base_dir", "scale_out_above"}, suspicious


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_run_writes_only_under_out(tmp_path: Path, monkeypatch, capsys) -> None:
    work = tmp_path / "work"
    scen = work / "scen"
    write(scen / "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,5\n0.5,120,6\n")
    hostile = TRACE_TINY.replace("model: llama-3.1-8b",
                                 "model: llama-3.1-8b\nname: ../../../escaped\ndescription: /tmp/x")
    p = write(scen / "s.yaml", hostile)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work / "home"))
    root = tmp_path.parent   # this session's pytest base folder: siblings too, not just tmp_path
    before = _tree(root)
    out = work / "out"
    assert main(["run", str(p), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    new = _tree(root) - before
    assert new, "the run wrote nothing"
    outside = sorted(str(q) for q in new if out not in q.parents and q != out)
    assert not outside, outside
    assert {q.name for q in out.iterdir()} >= {"summary.json", "requests.csv", "timeseries.csv"}
