"""``pdsim validate MEASURED``: simulate real benchmark runs and say how far pdsim is from them.

Input formats (detected from the content):

- ``silicon``: the silicon sample CSV shipped in NVIDIA's aiconfigurator-core
  (``aiconfigurator_core/systems/silicon_sample.csv``; columns backend, model_path, system,
  precision, mode, isl, osl, tp_size, ..., silicon_ttft_ms, silicon_tpot_ms; the closed-loop
  concurrency is ``silicon_concurrency=`` in silicon_data_source, else batch_size).  Read from
  the installed package (``--silicon``) or a path; never shipped with pdsim.
- ``vllm``: a ``vllm bench serve --save-result`` JSON (mean_ttft_ms, mean_tpot_ms,
  max_concurrency, total_input_tokens / completed, ...).  GPU, TP and engine are not in that
  file: give them with ``--metadata gpu=h100-sxm tp=1`` at benchmark time, or --device/--tp here.
- ``genai-perf``: a GenAI-Perf ``profile_export_genai_perf.json`` (time_to_first_token,
  inter_token_latency in ms, input_config with the model and concurrency).

Each usable row becomes a closed-loop scenario at the measured concurrency with the measured
ISL/OSL, model, GPU, TP, precision and engine; rows pdsim cannot express (MoE models, fp4/int4,
attention data parallelism, an unknown GPU or model, instances over 8 GPUs, an open-loop run at a finite
``request_rate``, ...) and rows with a bad value (``bad_value: KEY = VALUE: ...``) are counted and listed by
reason; the rest still run.
Outputs: ``validate.csv`` (measured vs simulated per row, with APE), ``skipped.csv``,
``validate.json`` (MAPE per model/GPU/backend/mode, counts by reason, worst rows) and
``validate.html``.
"""
from __future__ import annotations

import csv
import html
import json
import math
import re
from pathlib import Path

import numpy as np

from .errors import ConfigError

#: GPU names used by benchmark tools -> pdsim device presets
GPUS = {"h100_sxm": "h100-sxm", "h100": "h100-sxm", "h100-sxm": "h100-sxm", "h200_sxm": "h200", "h200": "h200",
        "a100_sxm": "a100-80gb-sxm", "a100": "a100-80gb-sxm", "a100-80gb-sxm": "a100-80gb-sxm", "l40s": "l40s",
        "b200_sxm": "b200", "b200": "b200"}
#: model names of benchmark files -> pdsim presets (dense decoders only)
MODELS = {"llama-3.1-8b": "llama-3.1-8b", "llama-3.1-8b-instruct": "llama-3.1-8b",
          "llama-3.1-8b-instruct-fp8": "llama-3.1-8b", "llama-3.1-70b": "llama-3.1-70b",
          "llama-3.1-70b-instruct": "llama-3.1-70b", "qwen3-32b": "qwen3-32b", "qwen3-8b": "qwen3-8b",
          "llama-2-7b-hf": "llama-2-7b", "llama-2-70b-hf": "llama-2-70b", "mistral-7b-instruct-v0.3": "mistral-7b"}
#: mixture-of-experts families (pdsim's cost model is dense)
MOE = re.compile(r"deepseek|mixtral|minimax|kimi|glm-5|gpt-oss|qwen3-235b|qwen3-30b|qwen3\.5|a\d+b", re.I)
#: mixture-of-experts models of benchmark files that pdsim has presets for (the rest are skipped)
MOE_MODELS = {"deepseek-v3": "deepseek-v3", "deepseek-r1": "deepseek-r1", "deepseek-r1-0528": "deepseek-r1",
              "qwen3-235b-a22b": "qwen3-235b-a22b", "qwen3-235b-a22b-fp8": "qwen3-235b-a22b",
              "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-30b-a3b-fp8": "qwen3-30b-a3b",
              "gpt-oss-120b": "gpt-oss-120b", "mixtral-8x7b-v0.1": "mixtral-8x7b",
              "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b"}
#: multi-node instances are not modelled (one NVLink domain per instance)
MAX_ROW_TP = 8
ENGINES = ("vllm-v1", "vllm-v0", "sglang", "trtllm")


def check_defaults(device: str | None = None, tp: int | None = None, engine: str | None = None,
                   flags: tuple[str, str, str] = ("--device", "--tp", "--engine")) -> None:
    """The GPU, TP and engine given for files that do not name them (``flags``: their CLI names), checked
    before any row is read: a bad one is one error naming the flag, not every row skipped."""
    if device is not None and str(device).lower() not in GPUS:
        raise ConfigError(f"unknown GPU (one of {', '.join(sorted(GPUS))})", key=flags[0], value=device)
    if tp is not None and not (isinstance(tp, int) and 1 <= tp <= MAX_ROW_TP):
        raise ConfigError(f"must be a TP degree in 1..{MAX_ROW_TP} (an instance over {MAX_ROW_TP} GPUs is "
                          "multi-node: not modelled)", key=flags[1], value=tp)
    if engine is not None and _engine(str(engine), "") is None:
        raise ConfigError(f"unknown engine (one of {', '.join(ENGINES)}, or vllm: v0 or v1 by the file's "
                          "vllm_version)", key=flags[2], value=engine)


def _model(name: str) -> tuple[str | None, str | None]:
    base = name.strip().split("/")[-1].lower()
    if MOE.search(base):
        m = MOE_MODELS.get(base)
        return (m, None) if m else (None, f"moe_model: {name}")
    m = MODELS.get(base)
    return (m, None) if m else (None, f"unknown_model: {name}")


# how benchmark files and tools spell the engines pdsim has presets for
ENGINE_ALIASES = {"tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "tensorrtllm": "trtllm", "trt-llm": "trtllm",
                  "trt_llm": "trtllm"}


def _engine(backend: str, version: str) -> str | None:
    b = backend.strip().lower()
    b = ENGINE_ALIASES.get(b, b)
    if b in ENGINES:
        return b
    if b == "vllm":
        try:
            major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
        except ValueError:
            return "vllm-v1"
        return "vllm-v0" if (major, minor) < (0, 8) else "vllm-v1"   # v1 is the default engine from 0.8
    return b if b in ("sglang", "trtllm") else None


def _int(x) -> int | None:
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return None


class BadValue(Exception):
    """A value of a measured file that is not what its format holds: the row is skipped as ``bad_value``,
    with the key and the value in its reason (``bad_value: KEY = VALUE: what is wrong``)."""

    def __init__(self, key: str, value, why: str):
        from .errors import _short
        self.reason = f"bad_value: {key} = {_short(value, 60)}: {why}"
        super().__init__(self.reason)


def _as_float(key: str, x, why: str) -> float:
    """``x`` (a number, or a string of one) as a float, else BadValue(key, x, why)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        raise BadValue(key, x, why)
    try:
        return float(x)
    except ValueError:
        raise BadValue(key, x, why) from None


def _number(key: str, x, whole: bool = False) -> float | int | None:
    """A number of a measured file: None when absent (None, an empty cell, or NaN / inf for a measurement), an
    int or float (a numeric string reads as its number, as every field always did), else BadValue; ``whole``:
    a count (ISL, TP, concurrency), which a fraction is not (512.7 is not silently cut to 512)."""
    if x is None or (isinstance(x, str) and not x.strip()):
        return None
    v = _as_float(key, x, "not a number")
    if not math.isfinite(v):        # a NaN latency or throughput reads as absent, as it always did (a count: bad)
        if whole:
            raise BadValue(key, x, "not a finite number")
        return None
    if whole:
        if not v.is_integer():
            raise BadValue(key, x, "not a whole number")
        return int(v)
    return v


def _text(key: str, x) -> str | None:
    """A name of a measured file (GPU, engine, precision): None when absent, else a string or BadValue."""
    if x is None or x == "":
        return None
    if not isinstance(x, str):
        raise BadValue(key, x, "not a string")
    return x


def _lengths(key: str, x) -> list[float] | None:
    """Per-request token counts (``input_lens``): None when absent or empty, else non-negative numbers."""
    if x is None or x == []:
        return None
    if not isinstance(x, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                                      for v in x):
        raise BadValue(key, x, "not a list of token counts")
    return [float(v) for v in x]


def _open_loop(key: str, rate) -> str | None:
    """``open_loop_rate: KEY = RATE`` for a run sent at a finite request rate (Poisson or gamma arrivals, up to
    max_concurrency in flight): not the closed loop pdsim simulates a row as.  None for no rate or an unlimited
    one (vllm writes ``"inf"``): the closed loop at max_concurrency."""
    if rate is None or (isinstance(rate, str) and rate.strip().lower() in ("inf", "infinity")):
        return None
    v = _as_float(key, rate, "not a request rate (a number or \"inf\")")
    if v == math.inf:
        return None
    if not v > 0:
        raise BadValue(key, rate, "not a request rate (a number > 0 or \"inf\")")
    return f"open_loop_rate: {key.split('.')[-1]} = {rate}"


# --- readers: each yields (row dict | None, skip reason | None) ------------------------------------
def _row(source, rid, model, gpu, backend, version, mode, tp, isl, osl, conc, precision, ttft_ms, tpot_ms,
         throughput=None, extra=None):
    r = {"source": source, "id": rid, "model_name": model, "gpu_name": gpu, "backend": backend, "mode": mode,
         "tp": tp, "isl": isl, "osl": osl, "concurrency": conc, "precision": precision or "bf16",
         "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "throughput_tok_s": throughput, **(extra or {})}
    m, why = _model(model)
    if why:
        return r, why
    r["model"] = m
    r["device"] = GPUS.get(str(gpu).lower())
    if r["device"] is None:
        return r, "unknown_gpu"
    r["engine"] = _engine(backend, version or "")
    if r["engine"] is None:
        return r, "unknown_backend"
    p = (precision or "bf16").lower()
    if p not in ("bf16", "fp16", "fp8", "fp8_block", "fp4", "nvfp4", ""):
        return r, "unsupported_precision"
    r["weight_dtype"] = "fp8" if p.startswith("fp8") else "fp4" if p in ("fp4", "nvfp4") else "bf16"
    # an fp8 (or fp4) checkpoint served with an fp8 KV cache (the engines' usual pairing); an assumption
    r["kv_dtype"] = "bf16" if r["weight_dtype"] == "bf16" else "fp8"
    if mode not in ("agg", "colocated"):
        return r, "disaggregated_row"
    bad = [k for k in ("tp", "isl", "osl", "concurrency") if not (isinstance(r[k], int) and r[k] > 0)]
    if bad:
        return r, f"missing_{bad[0]}"
    if osl == 1:                # 1-token replies: no inter-token gap (vllm writes mean_tpot_ms 0), TTFT only
        r["tpot_ms"] = tpot_ms = None
    if not (ttft_ms and ttft_ms > 0 and (osl == 1 or (tpot_ms and tpot_ms > 0))):
        return r, "missing_measurement"
    return r, None


#: Benchmark harnesses recognised in the silicon sample, and how their clients draw request lengths.
#: ``inferencemax``: SemiAnalysis InferenceMAX (its README and benchmarks/*_slurm.sh): ISL/OSL grid
#: (1024, 1024), (1024, 8192), (8192, 1024), concurrency 4..64, ``bench_serving/benchmark_serving.py
#: --random-range-ratio 0.8 --num-prompts CONC*10 --max-concurrency CONC --ignore-eos``, whose
#: random dataset draws each prompt and output length uniformly from [int(L x 0.8), L].  The silicon
#: sample's dated dump (not NVIDIA's aic-auto-gap-analysis sweeps) holds rows on exactly that grid.
INFERENCEMAX_GRID = {(1024, 1024), (1024, 8192), (8192, 1024)}
INFERENCEMAX_RANGE_RATIO = 0.8


def silicon_harness(source: str, isl: int | None, osl: int | None) -> tuple[str, float]:
    """(harness, length range ratio) of a silicon row: ``inferencemax`` (0.8) when the row is on the
    InferenceMAX grid and not from NVIDIA's aic-auto-gap-analysis sweeps, else ``unknown`` with fixed
    lengths (1.0: every request exactly ISL/OSL, as ``vllm bench serve``'s default)."""
    if (isl, osl) in INFERENCEMAX_GRID and "aic-auto-gap-analysis" not in source:
        return "inferencemax", INFERENCEMAX_RANGE_RATIO
    return "unknown", 1.0


def _moe_split(r: dict, moe_tp: int, moe_ep: int, attention_dp: int) -> str | None:
    """Set a MoE row's ``ep`` / ``dp_attention`` / ``tp`` as a pdsim pool expresses them, or say why not:
    TP attention with experts over moe_tp x moe_ep = tp GPUs, or DP attention within one instance
    (attention TP 1 on attention_dp GPUs, experts over all of them: ep = attention_dp)."""
    tp = r["tp"]
    if attention_dp > 1:
        if not (tp == 1 and moe_tp == 1 and moe_ep == attention_dp):
            return "attention_data_parallel"
        from .models import get_model
        if get_model(r["model"]).has_sliding:      # DP attention with sliding-window layers: not modelled
            return "dp_attention_sliding_window"
        r["tp"], r["dp_attention"] = attention_dp, True
    elif tp != moe_tp * moe_ep:
        return "moe_split"
    r["ep"] = moe_ep
    return "multi_node_tp" if r["tp"] > MAX_ROW_TP else None


def _bad_row(source: str, rid, model, gpu, backend, mode: str) -> dict:
    """What skipped.csv lists of a row with a bad value (the reason says which key and value)."""
    return {"source": source, "id": rid, "model_name": str(model or ""), "gpu_name": str(gpu or ""),
            "backend": str(backend or ""), "mode": mode}


def _dense_tp(r: dict, why: str | None) -> str | None:
    """A row of one instance over more than MAX_ROW_TP GPUs is multi-node: not modelled, as for MoE rows."""
    return "multi_node_tp" if why is None and r["tp"] > MAX_ROW_TP else why


def read_silicon(path: Path) -> list[tuple[dict, str | None]]:
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for line in csv.DictReader(f):
            try:
                out.append(_silicon_row(line))
            except BadValue as exc:
                out.append((_bad_row("silicon", line.get("id", ""), line.get("model_path"), line.get("system"),
                                     line.get("backend"), line.get("mode") or ""), exc.reason))
    return out


def _silicon_row(line: dict) -> tuple[dict, str | None]:
    def whole(key):
        return _number(key, line.get(key), whole=True)
    src = line.get("silicon_data_source") or ""
    m = re.search(r"silicon_concurrency=(\d+)", src)
    conc = int(m.group(1)) if m else whole("batch_size")
    isl, osl = whole("isl"), whole("osl")
    harness, ratio = silicon_harness(src, isl, osl)
    r, why = _row("silicon", line.get("id", ""), line.get("model_path", ""), line.get("system", ""),
                  line.get("backend", ""), line.get("backend_version", ""), line.get("mode", ""),
                  whole("tp_size"), isl, osl, conc,
                  line.get("moe_quant_mode") or line.get("gemm_quant_mode") or line.get("precision"),
                  _number("silicon_ttft_ms", line.get("silicon_ttft_ms")),
                  _number("silicon_tpot_ms", line.get("silicon_tpot_ms")),
                  extra={"harness": harness, "length_ratio": ratio})
    if why is None:
        if (whole("pp_size") or 1) > 1:
            why = "pipeline_parallel"
        elif r["model"] in MOE_MODELS.values():
            why = _moe_split(r, whole("moe_tp_size") or 1, whole("moe_ep_size") or 1,
                             whole("attention_dp_size") or 1)
        elif (whole("attention_dp_size") or 1) > 1:
            why = "attention_data_parallel"
        else:
            why = _dense_tp(r, why)
    return r, why


def _float(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_vllm(path: Path, data: dict, defaults: dict) -> list[tuple[dict, str | None]]:
    try:
        return [_vllm_row(path, data, defaults)]
    except BadValue as exc:
        return [(_bad_row("vllm", path.name, data.get("model_id") or data.get("model"), data.get("gpu"),
                          data.get("engine"), "agg"), exc.reason)]


def _vllm_row(path: Path, data: dict, defaults: dict) -> tuple[dict, str | None]:
    open_loop = _open_loop("request_rate", data.get("request_rate"))
    done = _number("completed", data.get("completed"), whole=True) or 0
    def mean_len(side: str) -> int | None:     # per-request lengths, else the total over the completed
        lens = _lengths(f"{side}_lens", data.get(f"{side}_lens"))
        total = _number(f"total_{side}_tokens", data.get(f"total_{side}_tokens"))
        if lens:
            return int(round(float(np.mean(lens))))
        return int(round(total / done)) if done and total is not None else None
    isl, osl = mean_len("input"), mean_len("output")
    gpu_key = "gpu" if data.get("gpu") else "device"
    gpu = _text(gpu_key, data.get(gpu_key)) or defaults.get("device") or ""
    tp_key = "tp" if data.get("tp") is not None else "tensor_parallel_size"
    tp = _number(tp_key, data.get(tp_key), whole=True)
    tp = tp if tp is not None else _int(defaults.get("tp"))
    backend = _text("engine", data.get("engine")) or defaults.get("engine") or "vllm"
    precision = _text("precision", data.get("precision")) or defaults.get("precision")
    r, why = _row("vllm", path.name, str(data.get("model_id") or data.get("model") or ""), gpu, backend,
                  str(data.get("vllm_version") or defaults.get("version") or ""), "agg", tp, isl, osl,
                  _number("max_concurrency", data.get("max_concurrency"), whole=True), precision,
                  _number("mean_ttft_ms", data.get("mean_ttft_ms")), _number("mean_tpot_ms", data.get("mean_tpot_ms")),
                  _number("output_throughput", data.get("output_throughput")))
    # a run at a finite rate is open loop whatever else it lacks: no closed loop (and no --tp) expresses it
    return r, open_loop or _dense_tp(r, why)


def read_genai_perf(path: Path, data: dict, defaults: dict) -> list[tuple[dict, str | None]]:
    try:
        return [_genai_perf_row(path, data, defaults)]
    except BadValue as exc:
        return [(_bad_row("genai-perf", path.name, "", data.get("gpu"), data.get("engine"), "agg"), exc.reason)]


def _genai_perf_row(path: Path, data: dict, defaults: dict) -> tuple[dict, str | None]:
    cfg = data.get("input_config")
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise BadValue("input_config", cfg, "not an object")
    models = cfg.get("model") or cfg.get("model_names") or [""]
    model = models[0] if isinstance(models, list) and models else models
    if not isinstance(model, str):
        raise BadValue("input_config.model", models, "not a model name or a list of them")
    pa = cfg.get("perf_analyzer") or {}
    if not isinstance(pa, dict):
        raise BadValue("input_config.perf_analyzer", pa, "not an object")
    stim = pa.get("stimulus") or {}
    if not isinstance(stim, dict):
        raise BadValue("input_config.perf_analyzer.stimulus", stim, "not an object")
    open_loop = _open_loop("input_config.perf_analyzer.stimulus.request_rate", stim.get("request_rate"))
    conc = (_number("input_config.perf_analyzer.stimulus.concurrency", stim.get("concurrency"), whole=True)
            or _number("input_config.concurrency", cfg.get("concurrency"), whole=True))
    conc = conc or _int(defaults.get("concurrency"))

    def avg(key):
        v = data.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise BadValue(key, v, "not an object with an avg")
        return _number(f"{key}.avg", v.get("avg"))

    isl, osl = avg("input_sequence_length"), avg("output_sequence_length")
    tp = _number("tp", data.get("tp"), whole=True)
    r, why = _row("genai-perf", path.name, model, _text("gpu", data.get("gpu")) or defaults.get("device") or "",
                  _text("engine", data.get("engine")) or defaults.get("engine") or "vllm",
                  str(defaults.get("version") or ""), "agg",
                  tp if tp is not None else _int(defaults.get("tp")), _int(round(isl)) if isl else None,
                  _int(round(osl)) if osl else None, conc, defaults.get("precision"),
                  avg("time_to_first_token"), avg("inter_token_latency"), avg("output_token_throughput"))
    return r, open_loop or _dense_tp(r, why)


def read_measured(path: str | Path, defaults: dict | None = None) -> list[tuple[dict, str | None]]:
    """Rows of one measured file, each with the reason it cannot be simulated (None: usable)."""
    path, defaults = Path(path), defaults or {}
    if not path.is_file():
        raise ConfigError("measured file not found", file=str(path))
    with open(path, "rb") as f:
        head = f.read(4096)
    text_head = head.decode("utf-8", "replace").lstrip()
    if text_head.startswith(("{", "[")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"not valid JSON: {exc}", file=str(path)) from None
        if isinstance(data, dict) and "mean_ttft_ms" in data:
            return _from(path, read_vllm(path, data, defaults))
        if isinstance(data, dict) and "time_to_first_token" in data:
            return _from(path, read_genai_perf(path, data, defaults))
        raise ConfigError("JSON is neither a `vllm bench serve` result (mean_ttft_ms) nor a GenAI-Perf "
                          "export (time_to_first_token)", file=str(path))
    first_line = text_head.splitlines()[0] if text_head else ""
    if "silicon_ttft_ms" in first_line:
        return _from(path, read_silicon(path))
    raise ConfigError("unknown format: expected the aiconfigurator silicon CSV (silicon_ttft_ms column), a "
                      "`vllm bench serve` JSON or a GenAI-Perf JSON export", file=str(path))


def _from(path: Path, rows: list[tuple[dict, str | None]]) -> list[tuple[dict, str | None]]:
    for r, _ in rows:
        r["file"] = str(path)       # where a skipped row came from, for the line that names it
    return rows


def bad_value_lines(skipped: list[tuple[dict, str]], limit: int = 5) -> list[str]:
    """One line per row skipped for a bad value, naming its file (and row), key and value; ``limit`` lines,
    then how many more skipped.csv lists."""
    bad = [(r, why) for r, why in skipped if why.startswith("bad_value:")]
    out = []
    for r, why in bad[:limit]:
        f = r.get("file") or r.get("source") or ""
        row = "" if str(r.get("id")) == Path(f).name else f" row {r.get('id')}"
        out.append(f"{f}{row}: {why.split(': ', 1)[1]} (row skipped)")
    if len(bad) > limit:
        out.append(f"... and {len(bad) - limit} more rows with a bad value (skipped.csv)")
    return out


def silicon_sample_path() -> Path:
    """The silicon sample CSV inside an installed aiconfigurator-core (an optional extra)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("aiconfigurator-core is not installed (pip install it, or give the CSV's path)",
                          key="--silicon")
    p = Path(list(spec.submodule_search_locations)[0]) / "systems" / "silicon_sample.csv"
    if not p.is_file():
        raise ConfigError("no systems/silicon_sample.csv in the installed aiconfigurator-core", key="--silicon",
                          value=str(p))
    return p


def parse_profiles(pairs: list[str] | None = None, pattern: str | None = None,
                   devices: set[str] | None = None) -> dict[str, str]:
    """{device preset: profile path} from ``--profile DEVICE=PATH`` pairs and/or ``--profiles PATTERN``.

    PATTERN is a folder (every .yaml in it) or a glob (``calibration/profiles/*-aic.yaml``); a profile
    belongs to the GPU its file name starts with (``h100_sxm-trtllm-aic.yaml`` -> h100-sxm, by the
    GPU names of the measured files).  A GPU with two candidate files among ``devices`` (the GPUs the
    rows use) is an error naming both: narrow the pattern or use ``--profile``.  Pairs win."""
    import glob as _glob
    out: dict[str, str] = {}
    if pattern is not None:
        files = (sorted(Path(pattern).glob("*.y*ml")) if Path(pattern).is_dir()
                 else sorted(Path(f) for f in _glob.glob(pattern)))
        found: dict[str, list[Path]] = {}
        for f in files:
            dev = GPUS.get(f.stem.split("-")[0].lower())
            if dev is not None:
                found.setdefault(dev, []).append(f)
        if not found:
            raise ConfigError("no profile file whose name starts with a known GPU (h100_sxm-..., h200_sxm-...)",
                              key="--profiles", value=pattern)
        for dev, fs in found.items():
            if len(fs) > 1 and (devices is None or dev in devices):
                raise ConfigError(f"{len(fs)} profiles for {dev} ({', '.join(f.name for f in fs)}); narrow the "
                                  f"pattern or use --profile {dev}=PATH", key="--profiles", value=pattern)
            out[dev] = str(fs[0])
    for pair in pairs or []:
        dev, sep, path = pair.partition("=")
        if not sep or not path:
            raise ConfigError("expected DEVICE=PATH", key="--profile", value=pair)
        dev = GPUS.get(dev.strip().lower(), dev.strip())
        if not Path(path).is_file():
            raise ConfigError("profile file not found", key="--profile", value=path)
        out[dev] = path
    return out


# --- simulate a row ------------------------------------------------------------------------------
#: what InferenceMAX's TensorRT-LLM launch scripts set for a DP-attention server (benchmarks/*trt*.sh:
#: ``attention_dp_config: {enable_balance: true, timeout_iters: 60, batching_wait_iters: 0}``, chunked prefill
#: left at its default, off, and ``max_num_tokens`` = max(8192, conc + ISL + 64 rounded up to 64), per rank)
INFERENCEMAX_TRTLLM_DP = {"timeout_iters": 60, "batching_wait_iters": 0}


#: InferenceMAX's DeepSeek-R1 fp8 TensorRT-LLM scripts (H200, B200) without DP attention at 1024 in / 1024 out
#: and 64 or more clients: ``batch_wait_timeout_iters: 40``, ``batch_wait_max_tokens_ratio: 0.8``
INFERENCEMAX_TRTLLM_BATCH_WAIT = {"timeout_iters": 40, "max_tokens_ratio": 0.8}


def harness_engine_config(r: dict) -> dict:
    """Pool keys a row's harness is known to have set beyond the engine's defaults (empty when none is
    known): an InferenceMAX TensorRT-LLM DP-attention row gets :data:`INFERENCEMAX_TRTLLM_DP`, a DeepSeek-R1
    fp8 chat row (1024 / 1024, 64+ clients) without DP :data:`INFERENCEMAX_TRTLLM_BATCH_WAIT`."""
    if not (r.get("engine") == "trtllm" and r.get("harness") == "inferencemax"):
        return {}
    if not r.get("dp_attention"):
        if str(r.get("model", "")).startswith("deepseek-r1") and r.get("weight_dtype") == "fp8" and \
                r.get("isl") == 1024 and r.get("osl") == 1024 and r.get("concurrency", 0) >= 64:
            return {"batch_wait": dict(INFERENCEMAX_TRTLLM_BATCH_WAIT)}
        return {}
    per_rank = max(8192, -(-(r["concurrency"] + r["isl"] + 64) // 64) * 64)
    return {"attention_dp_balance": dict(INFERENCEMAX_TRTLLM_DP), "scheduler": "inflight",
            "max_batched_tokens": per_rank * r["tp"]}


def row_scenario(r: dict, engine_presets: bool = True, requests_per_client: int = 10, min_requests: int = 16,
                 client: dict | None = None, step_overhead: dict | None = None, profiles: dict | None = None,
                 cost_model: dict | None = None, frontend_ms: float | None = None, shared_prefix: int = 0):
    """The closed-loop scenario of one measured row (``engine_presets=False``: the idealised engine);
    ``client``: Scenario.client keys (ramp-up, jitter, warm-up); ``profiles``: {device preset: profile
    path} to price the row's GPU with a measured profile instead of its datasheet preset;
    ``cost_model``: a pool ``cost_model`` (constant / linear what-if models, for tests); ``frontend_ms``: the
    pool's ``frontend_latency_ms`` (a per-request TTFT floor, benchmarks/fit_prefill_dispatch.py);
    ``shared_prefix``: the first that many tokens of every prompt are the same and the pool caches prefixes
    (a benchmark run with prefix caching on and a shared prefix, e.g. ``--random-prefix-len``)."""
    from . import config
    c = r["concurrency"]
    ratio = r.get("length_ratio", 1.0)

    def lengths(n: int):
        # the benchmark's random dataset: uniform integers in [int(n x ratio), n] (ratio 1: exactly n)
        return n if ratio >= 1.0 or int(n * ratio) >= n else {"dist": "uniform", "low": max(1, int(n * ratio)),
                                                                  "high": n}
    pool = {"kind": "colocated", "replicas": 1, "tp": r["tp"], "device": (profiles or {}).get(r["device"], r["device"])}
    if cost_model:
        pool["cost_model"] = cost_model
    if shared_prefix:
        pool["prefix_cache"] = {"enabled": True}
    if r.get("ep", 1) > 1:
        pool["ep"] = r["ep"]
    if r.get("dp_attention"):
        pool["dp_attention"] = True
    if engine_presets:
        pool["engine"] = r["engine"]
        pool.update(harness_engine_config(r))
        if step_overhead and r["engine"] in step_overhead:     # fitted overhead (calibration) over the preset's
            pool["step_overhead"] = step_overhead[r["engine"]]
        if frontend_ms is not None:
            pool["frontend_latency_ms"] = frontend_ms
    raw = {"name": str(r["id"])[:80], "model": r["model"], "weight_dtype": r["weight_dtype"],
           "kv_dtype": r["kv_dtype"],
           "workload": {"arrival": "closed", "clients": c, "num_requests": max(min_requests, requests_per_client * c),
                        "prompt_tokens": lengths(r["isl"]), "output_tokens": lengths(r["osl"]),
                        **({"shared_prefix_tokens": shared_prefix} if shared_prefix else {})},
           "topologies": {"t": pool}}
    if client:
        raw["client"] = client
    return config.parse(raw, f"row {r['id']}")


#: how the clients of a measured run are assumed to send (the silicon sample does not say):
#: ``sync``: all start at t=0 and every request is measured (vllm bench serve --max-concurrency);
#: ``steady``: all start at t=0, but the first ``concurrency`` requests to finish (the cold first
#: wave, every client's first request arriving at once) are left out of the means: what a long
#: run measures, where that one burst is a small share of many requests (or a tool's warm-up);
#: ``stagger``: first sends spread uniformly over one lone request's E2E time (as clients that
#: have drifted apart in a long run), the first ``concurrency`` requests left out as warm-up;
#: ``auto`` (default): ``sync`` for rows whose harness is known to count every request
#: (InferenceMAX: 10 x concurrency requests, all measured, as simulated), ``steady`` for silicon
#: rows of an unknown harness (NVIDIA's aic-auto-gap-analysis sweeps), ``sync`` otherwise.
CLIENT_MODES = ("auto", "sync", "steady", "stagger")


def client_mode_for(r: dict, client_mode: str = "auto") -> str:
    """The client mode a row is simulated with: ``client_mode`` itself unless it is ``auto``."""
    if client_mode not in CLIENT_MODES:
        raise ConfigError(f"unknown client mode (one of {', '.join(CLIENT_MODES)})", key="client_mode",
                          value=client_mode)
    if client_mode != "auto":
        return client_mode
    return "steady" if r.get("source") == "silicon" and r.get("harness") == "unknown" else "sync"


def simulate_row(r: dict, engine_presets: bool = True, requests_per_client: int = 10,
                 client_mode: str = "auto", step_overhead: dict | None = None, profiles: dict | None = None,
                 cost_model: dict | None = None, frontend_ms: float | None = None, shared_prefix: int = 0) -> dict:
    """Mean TTFT/TPOT (ms) and output tokens/s of the row's scenario, as the benchmark client measures them
    (``client_mode``: see :data:`CLIENT_MODES`; the mode used is returned as ``client_mode``)."""
    from .metrics import requests_frame
    from .simulation import simulate
    mode = client_mode_for(r, client_mode)
    client = None
    if mode == "stagger":
        lone = simulate(row_scenario({**r, "concurrency": 1}, engine_presets, 1, 1, profiles=profiles,
                                     shared_prefix=shared_prefix))[0].requests[0]
        client = {"start_jitter_s": float(lone.finish_s - lone.arrival_s), "warmup_requests": r["concurrency"]}
    elif mode == "steady":
        client = {"warmup_requests": r["concurrency"]}
    sc = row_scenario(r, engine_presets, requests_per_client, client=client, step_overhead=step_overhead,
                      profiles=profiles, cost_model=cost_model, frontend_ms=frontend_ms, shared_prefix=shared_prefix)
    res = simulate(sc)
    df = requests_frame(res, sc.client)
    done = df[df.status == "finished"]
    fin = done[~done.warmup.astype(bool)]
    span = res[0].sim_end_s or float("nan")
    # throughput: a long run's output over its span (steady: the cold first wave's tokens count too)
    thr = done if mode == "steady" else fin
    kv_tokens, kv_held = kv_pool_tokens(res[0].topology), kv_holds_requests(res[0].topology, r["isl"] + r["osl"])
    return {"client_mode": mode, "sim_kv_tokens": kv_tokens, "kv_holds_requests": kv_held,
            "sim_ttft_ms": float(fin.ttft_s.mean() * 1e3) if len(fin) else float("nan"),
            "sim_tpot_ms": float(fin.tpot_s.mean() * 1e3) if len(fin) else float("nan"),
            "sim_throughput_tok_s": float(thr.output_tokens.sum() / span) if len(thr) else float("nan"),
            "sim_finished": int(len(fin)), "sim_requests": int(len(df))}


def kv_pool_tokens(topology) -> int:
    """Tokens of KV the smallest instance of a simulated topology holds (blocks x block size; under DP
    attention the sum over the ranks, as pdsim sizes it)."""
    return int(min(i.kv.total_blocks * i.kv.block_size for i in topology.instances))


def kv_holds_requests(topology, tokens: int) -> int:
    """How many requests of ``tokens`` tokens (ISL + OSL) the smallest instance admits at once, counted as
    ``metrics.kv_capacity`` counts its pool: blocks above the watermark over the blocks one request takes
    (whole blocks, plus a sliding-window pool's window blocks)."""
    return int(min(i.kv.requests_fit(i.kv.blocks_for(int(tokens))) for i in topology.instances))


def kv_bound(row: dict) -> bool:
    """Whether the row's simulated KV pool holds fewer full-length requests (ISL + OSL tokens each) than
    the run had clients: then the engine's memory setting, which a measured file rarely records, decides
    how many requests run at once and so the TTFT (queueing), more than any kernel does."""
    held = row.get("kv_holds_requests")
    return held is not None and held < row["concurrency"]


def _mean_length(n: int, ratio: float) -> float:
    """Mean of the benchmark's length draw: uniform integers in [int(n x ratio), n] (ratio 1: n itself)."""
    lo = int(n * ratio) if ratio < 1.0 else n
    return (max(1, min(lo, n)) + n) / 2.0


def implied_linear_flops_s(r: dict, shared_prefix: int = 0) -> float | None:
    """Linear-layer FLOPs per second a measured row implies: requests per second x FLOPs per request.

    Requests per second: the measured output throughput over the mean output length when the file gives it
    (vllm bench serve's ``output_throughput``, GenAI-Perf's ``output_token_throughput``), else Little's law
    for a closed loop whose clients always have a request in flight: concurrency / (TTFT + (OSL - 1) x TPOT),
    with the mean lengths of the row's length draw.  Little's law is an estimate: a short run (ramp-up, the
    tail where clients have finished, one request per client) serves fewer requests per second than it says
    (pdsim's own one-wave run of 256 clients: 1.8x), and the silicon sample does not say whether its latencies
    are means.  Per request, every token that runs through the model (prompt and reply, the last reply
    token excepted) costs 2 x the active decoder parameters (top-k experts for MoE), every reply token the
    LM head; with ``shared_prefix`` the whole 16-token units of the shared part are taken as cached (not
    computed).  Attention, all-reduces, norms and the engine's own time are left out: a lower bound on the
    work, given the rate.  None: the row lacks what it needs (unknown model, no concurrency or latencies and
    no throughput)."""
    from .models import get_model
    from .workload import SHARED_PREFIX_UNIT
    try:
        m = get_model(r["model"])
        isl, osl = r["isl"], r["osl"]
    except (KeyError, ConfigError):
        return None
    if not (isl and osl):
        return None
    ratio = r.get("length_ratio", 1.0) or 1.0
    isl_m, osl_m = _mean_length(isl, ratio), _mean_length(osl, ratio)
    thr = r.get("throughput_tok_s")
    if thr and thr > 0:
        req_s = thr / osl_m
    else:
        c, ttft, tpot = r.get("concurrency"), r.get("ttft_ms"), r.get("tpot_ms")
        if not (c and ttft and tpot and ttft > 0 and tpot > 0):
            return None
        req_s = c / ((ttft + (osl_m - 1) * tpot) * 1e-3)
    cached = (min(shared_prefix, isl_m - 1) // SHARED_PREFIX_UNIT) * SHARED_PREFIX_UNIT if shared_prefix else 0
    computed = isl_m - cached + osl_m - 1
    return req_s * (2.0 * m.active_decoder_params * computed + 2.0 * m.vocab * m.hidden * osl_m)


def _row_gpus(r: dict, device=None):
    """(device profile, GPUs) of the one instance pdsim simulates for the row (``tp`` GPUs; a data-parallel
    or multi-replica run is not what validate simulates either), or None."""
    from .devices import get_device
    try:
        dev = device if device is not None and not isinstance(device, str) else get_device(device or r["device"])
        gpus = r["tp"]
    except (KeyError, ConfigError):
        return None
    return (dev, gpus) if gpus else None


def implied_gemm_util(r: dict, shared_prefix: int = 0, device=None) -> float | None:
    """:func:`implied_linear_flops_s` over the most pdsim's cost model lets the row's GPUs do: ``tp`` GPUs at
    the device profile's GEMM ceiling (datasheet peak of pdsim's compute dtype x ``gemm_max`` x the larger fp8
    fraction; ``device``: the profile the row is priced with, default its datasheet preset; a measured profile's
    GEMM tables can beat its roofline ceiling, so with one this is an estimate).  Above 1,
    pdsim's kernels cannot serve the row's throughput whatever the scheduler does, so its error there is not
    the engine model's: the run had cache hits (``--shared-prefix-tokens``), its GPUs' GEMMs ran faster than
    the profile (NVIDIA's fastest measured H200 fp8 GEMMs reach 0.85 of the datasheet peak where the preset's
    ceiling is 0.59), or Little's law overstated its rate.  Impossible outright only when
    :func:`implied_peak_share` is above 1 too."""
    w, g = implied_linear_flops_s(r, shared_prefix), _row_gpus(r, device)
    if w is None or g is None:
        return None
    dev, gpus = g
    wd = r.get("weight_dtype", "bf16")
    dtype = "fp8" if wd == "fp8" else "fp4" if wd == "fp4" and "fp4" in dev.spec.peak_tflops else "bf16"
    e = dev.spec.efficiency
    frac = max(e.fp8_gemm_compute, e.grouped_fp8_compute) if dtype == "fp8" else 1.0
    return w / (gpus * dev.peak_flops(dtype) * min(1.0, e.gemm_max * frac))


def implied_peak_share(r: dict, shared_prefix: int = 0) -> float | None:
    """:func:`implied_linear_flops_s` over the row's ``tp`` GPUs at their datasheet dense peak (for quantised
    weights the fastest low-precision peak the GPU has, fp8 or fp4: an engine may run them there).  Above 1,
    no GPU of that kind does the stated work in the measured time, given the rate: the run served part of its
    prompts from a cache, or its clients did not keep the stated load."""
    w, g = implied_linear_flops_s(r, shared_prefix), _row_gpus(r)
    if w is None or g is None:
        return None
    dev, gpus = g
    peaks = dev.spec.peak_tflops
    if r.get("weight_dtype", "bf16") in ("bf16", "fp16", "fp32"):
        peak = dev.peak_flops("bf16")
    else:
        peak = 1e12 * max(peaks.get(k, 0.0) for k in ("fp8", "fp4", "int8", "bf16"))
    return w / (gpus * peak)


def over_gemm_rate(row: dict) -> bool:
    """Whether the measured row needs more GEMM work per second than pdsim's cost model lets its GPUs do
    (:func:`implied_gemm_util` above 1): pdsim will be too slow on it whatever the scheduler does."""
    u = row.get("implied_gemm_util")
    return u is not None and u == u and u > 1.0


def error_stats(rows: list[dict]) -> dict:
    """MAPE, median and p90 APE, and mean bias (simulated/measured - 1) of TTFT and TPOT over simulated rows,
    in percent, rounded to 0.1 (the error-band table's entries)."""
    out = {}
    for m in ("ttft", "tpot"):
        ok = [x for x in rows if x[f"{m}_ape"] is not None and x[f"{m}_ape"] == x[f"{m}_ape"]
              and x[f"sim_{m}_ms"] > 0]                                 # a row that finished nothing has none
        ape = [x[f"{m}_ape"] for x in ok]
        ratio = [x[f"sim_{m}_ms"] / x[f"{m}_ms"] for x in ok]
        out[f"{m}_mape_pct"] = round(float(np.mean(ape)), 1) if ape else float("nan")
        out[f"{m}_median_ape_pct"] = round(float(np.median(ape)), 1) if ape else float("nan")
        out[f"{m}_p90_ape_pct"] = round(float(np.percentile(ape, 90)), 1) if ape else float("nan")
        out[f"{m}_bias_pct"] = round((float(np.mean(ratio)) - 1) * 100, 1) if ratio else float("nan")
        # measured / simulated: an APE can never pass 100% however fast pdsim is, so when pdsim is fast the
        # factor says how far (a median 5x reads as 80% APE)
        meas_over_sim = [1.0 / q for q in ratio]
        # the error margins divide SLO bounds by these: the p90 by nearest rank (a run's own ratio, at or above
        # which at least 90% of the runs lie; numpy's linear interpolation covers fewer), rounded up to 0.01
        out[f"{m}_measured_over_sim_median"] = _ceil2(float(np.median(meas_over_sim))) if ratio else float("nan")
        out[f"{m}_measured_over_sim_p90"] = (_ceil2(float(np.percentile(meas_over_sim, 90, method="inverted_cdf")))
                                             if ratio else float("nan"))
    # each p90 factor is its own metric's: the share of runs whose TTFT *and* TPOT both stayed within the two
    # (what a verdict at the p90 error needs) is lower, and stated
    both = [x for x in rows if all(x.get(f"{m}_ape") is not None and x[f"{m}_ape"] == x[f"{m}_ape"]
                                   and x.get(f"sim_{m}_ms", 0) > 0 for m in ("ttft", "tpot"))]
    f_t, f_p = out.get("ttft_measured_over_sim_p90"), out.get("tpot_measured_over_sim_p90")
    if both and f_t == f_t and f_p == f_p:
        within = [x["ttft_ms"] / x["sim_ttft_ms"] <= max(1.0, f_t) and x["tpot_ms"] / x["sim_tpot_ms"] <= max(1.0, f_p)
                  for x in both]
        out["both_within_p90_share"] = round(float(np.mean(within)), 3)
    return out


def _ceil2(x: float) -> float:
    """``x`` rounded up to 2 decimals (a float's last bits never push an exact 1.19 to 1.20); NaN and inf as
    they are."""
    if not math.isfinite(x):
        return x
    return math.ceil(round(x * 100, 9)) / 100


def _ape(sim, meas):
    if sim is None or meas is None or not (meas > 0) or sim != sim:
        return None
    return abs(sim - meas) / meas * 100.0


GROUP = ("model", "device", "engine", "mode")


def validate(rows: list[tuple[dict, str | None]], engine_presets: bool = True, requests_per_client: int = 10,
             progress=None, client_mode: str = "auto", step_overhead: dict | None = None,
             profiles: dict | None = None, length_ratio: float | None = None, frontend: dict | None = None,
             shared_prefix: int = 0) -> dict:
    """Simulate every usable row; returns {"rows", "skipped", "groups", "counts"}.

    ``shared_prefix``: every row's prompts share their first that many tokens and its pool caches prefixes
    (:func:`row_scenario`); 0: every prompt fresh, no cache (the silicon sample does not say).

    ``frontend``: {engine: (us per layer, us per MoE layer)}: each row of that engine gets that per-request
    front-end latency (``frontend_latency_ms``) for its model (benchmarks/fit_prefill_dispatch.py).

    ``length_ratio``: the benchmark's random range ratio for every row (lengths uniform in
    [int(L x ratio), L]); None: each row's own (:func:`silicon_harness`; 1.0 = fixed lengths).
    ``profiles``: {device preset: profile path}; rows on those GPUs are priced with that profile
    (e.g. an imported measured kernel profile), the others with their datasheet preset."""
    client_mode_for({}, client_mode)        # an unknown mode is the caller's error, not a row's (raises once)
    usable, skipped = [], []
    for r, why in rows:
        (skipped if why else usable).append((r, why))
    out_rows = []
    for i, (r, _) in enumerate(usable):
        if length_ratio is not None:
            r = {**r, "length_ratio": length_ratio}
        try:
            fe = None
            if frontend and r.get("engine") in frontend and engine_presets:
                from .engines import frontend_by_layers_s
                from .models import get_model
                fe = frontend_by_layers_s(get_model(r["model"]), *frontend[r["engine"]]) * 1e3
            sim = simulate_row(r, engine_presets, requests_per_client, client_mode, step_overhead, profiles,
                               frontend_ms=fe, shared_prefix=shared_prefix)
        except ConfigError as exc:          # e.g. weights do not fit the GPU at this TP
            skipped.append((r, "does_not_fit: " + str(exc)[:160]))
            continue
        row = {**{k: r.get(k) for k in ("source", "id", "model", "device", "engine", "mode", "tp", "isl", "osl",
                                      "concurrency", "weight_dtype", "harness")},
               "length_ratio": r.get("length_ratio", 1.0), "ttft_ms": r["ttft_ms"],
               "tpot_ms": r["tpot_ms"], "throughput_tok_s": r.get("throughput_tok_s"), **sim,
               "cost": Path((profiles or {}).get(r["device"], "datasheet")).stem}
        row["implied_gemm_util"] = implied_gemm_util(r, shared_prefix,
                                                     (profiles or {}).get(r["device"]) if profiles else None)
        row["implied_peak_share"] = implied_peak_share(r, shared_prefix)
        row["ttft_ape"] = _ape(sim["sim_ttft_ms"], r["ttft_ms"])
        row["tpot_ape"] = _ape(sim["sim_tpot_ms"], r["tpot_ms"])
        row["throughput_ape"] = _ape(sim["sim_throughput_tok_s"], r.get("throughput_tok_s"))
        row["mode"] = "agg"
        out_rows.append(row)
        if progress:
            progress(i + 1, len(usable), row)
    groups = {}
    for row in out_rows:
        groups.setdefault(tuple(str(row[k]) for k in GROUP), []).append(row)
    table = []
    for key, rs in sorted(groups.items()):
        g = dict(zip(GROUP, key))
        for m in ("ttft", "tpot", "throughput"):
            v = [x[f"{m}_ape"] for x in rs if x[f"{m}_ape"] is not None]
            g[f"{m}_mape"] = float(np.mean(v)) if v else None
            g[f"{m}_bias"] = (float(np.mean([(x[f"sim_{m}_ms" if m != "throughput" else "sim_throughput_tok_s"]
                                             / x[f"{m}_ms" if m != "throughput" else "throughput_tok_s"] - 1) * 100
                                            for x in rs if x[f"{m}_ape"] is not None])) if v else None)
        g["rows"] = len(rs)
        # how much slower the real runs were than pdsim (median and p90 of measured / simulated mean TTFT, TPOT):
        # what `pdsim plan`'s goodput.error_margin and a run's slo_at_error divide the SLO bounds by
        g.update({k: v for k, v in error_stats(rs).items() if "measured_over_sim" in k or k.startswith("both_")})
        # rows that need more GEMM work per second than their GPUs have (over_gemm_rate): counted, and the
        # group's MAPE without them beside the MAPE over all rows (which stays the headline)
        over = [x for x in rs if over_gemm_rate(x)]
        g["over_gemm_rate_rows"] = len(over)
        if over:
            rest = [x for x in rs if not over_gemm_rate(x)]
            for m in ("ttft", "tpot"):
                v = [x[f"{m}_ape"] for x in rest if x[f"{m}_ape"] is not None]
                g[f"{m}_mape_within_gemm_rate"] = float(np.mean(v)) if v else None
        table.append(g)
    reasons: dict[str, int] = {}
    for _, why in skipped:
        k = why.split(":")[0]
        reasons[k] = reasons.get(k, 0) + 1
    return {"rows": out_rows, "skipped": [(r, why) for r, why in skipped], "groups": table,
            "counts": {"rows_in": len(rows), "simulated": len(out_rows), "skipped": len(skipped),
                       "skipped_by_reason": reasons},
            "settings": {"engine_presets": engine_presets, "client_mode": client_mode,
                         "requests_per_client": requests_per_client, "shared_prefix_tokens": shared_prefix}}


def fit_step_overhead(rows: list[dict], start: dict | None = None) -> dict:
    """Per engine, the step overhead that best explains the TPOT residuals of simulated rows.

    A decode step's overhead adds to every inter-token gap, so (measured - simulated) TPOT is
    fitted by least squares as d_base + d_per_seq x concurrency and added to the values the rows
    were simulated with (``start[engine]``'s base_us / per_seq_us, else the preset's), each clamped
    at 0 (an overhead cannot be negative).  Returns ``{engine: {base_us, per_seq_us}}`` for Scenario
    ``step_overhead`` keys.
    """
    from .engines import PRESETS
    out = {}
    for eng in sorted({r["engine"] for r in rows}):
        rs = [r for r in rows if r["engine"] == eng and r["sim_tpot_ms"] == r["sim_tpot_ms"]]
        if len(rs) < 3:
            continue
        c = np.array([r["concurrency"] for r in rs], float)
        resid_us = np.array([(r["tpot_ms"] - r["sim_tpot_ms"]) * 1e3 for r in rs])
        w = 1.0 / np.array([r["tpot_ms"] for r in rs])            # relative errors count equally
        A = np.c_[np.ones_like(c), c] * w[:, None]
        (d_base, d_seq), *_ = np.linalg.lstsq(A, resid_us * w, rcond=None)
        p = PRESETS[eng]
        base0, seq0 = ((start[eng]["base_us"], start[eng]["per_seq_us"]) if start and eng in start
                       else (p.overhead_base_us, p.overhead_per_seq_us))
        out[eng] = {"base_us": round(max(0.0, base0 + float(d_base)), 1),
                    "per_seq_us": round(max(0.0, seq0 + float(d_seq)), 2)}
    return out


def write_outputs(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    cols = ["source", "id", "model", "device", "cost", "engine", "mode", "tp", "isl", "osl", "concurrency",
            "weight_dtype", "harness", "length_ratio", "client_mode",
            "ttft_ms", "sim_ttft_ms", "ttft_ape", "tpot_ms", "sim_tpot_ms", "tpot_ape", "throughput_tok_s",
            "sim_throughput_tok_s", "throughput_ape", "sim_finished", "sim_requests", "sim_kv_tokens",
            "kv_holds_requests", "implied_gemm_util", "implied_peak_share"]
    with open(out / "validate.csv", "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(out / "skipped.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "id", "model", "gpu", "backend", "mode", "reason"])
        for r, why in result["skipped"]:
            w.writerow([r.get("source"), r.get("id"), r.get("model_name"), r.get("gpu_name"), r.get("backend"),
                        r.get("mode"), why])
    worst = sorted((r for r in rows if r["ttft_ape"] is not None), key=lambda r: -r["ttft_ape"])[:10]
    summary = {"counts": result["counts"], "settings": result.get("settings", {}), "groups": result["groups"],
               "kv_bound_rows": sum(1 for r in rows if kv_bound(r)),
               "kv_bound_ids": [r["id"] for r in rows if kv_bound(r)],
               "over_gemm_rate_rows": sum(1 for r in rows if over_gemm_rate(r)),
               "over_gemm_rate": [{"id": r["id"], "implied_gemm_util": round(r["implied_gemm_util"], 3),
                                   "implied_peak_share": (None if r.get("implied_peak_share") is None
                                                          else round(r["implied_peak_share"], 3))}
                                  for r in sorted(rows, key=lambda r: -(r.get("implied_gemm_util") or 0))
                                  if over_gemm_rate(r)],
               "worst_ttft_rows": [{**{k: r[k] for k in ("id", "concurrency", "ttft_ms", "sim_ttft_ms", "ttft_ape",
                                                        "tpot_ms", "sim_tpot_ms", "tpot_ape")},
                                    "kv_holds_requests": r.get("kv_holds_requests")} for r in worst]}
    (out / "validate.json").write_text(json.dumps(summary, indent=2, default=float))
    (out / "validate.html").write_text(_html(summary))


def _html(summary: dict) -> str:
    def f(x, d=1):
        return "-" if x is None else f"{x:.{d}f}"
    g = "".join(f"<tr><td>{html.escape(r['model'])}</td><td>{html.escape(r['device'])}</td>"
                f"<td>{html.escape(r['engine'])}</td><td>{r['mode']}</td><td>{r['rows']}</td>"
                f"<td>{f(r['ttft_mape'])}</td><td>{f(r['ttft_bias'])}</td><td>{f(r['tpot_mape'])}</td>"
                f"<td>{f(r['tpot_bias'])}</td><td>{f(r['throughput_mape'])}</td></tr>" for r in summary["groups"])
    def held(r):
        k = r.get("kv_holds_requests")
        return "-" if k is None else f"{k}{' &lt; ' + str(r['concurrency']) if k < r['concurrency'] else ''}"
    w = "".join(f"<tr><td>{html.escape(str(r['id']))}</td><td>{f(r['ttft_ms'])}</td><td>{f(r['sim_ttft_ms'])}</td>"
                f"<td>{f(r['ttft_ape'])}</td><td>{f(r['tpot_ms'], 2)}</td><td>{f(r['sim_tpot_ms'], 2)}</td>"
                f"<td>{f(r['tpot_ape'])}</td><td>{held(r)}</td></tr>" for r in summary["worst_ttft_rows"])
    c = summary["counts"]
    kvb = summary.get("kv_bound_rows", 0)
    kv_note = (f"<p>{kvb} simulated row(s) are <b>KV-bound</b>: pdsim's KV pool for the row (the engine preset's "
               "memory setting) holds fewer full-length requests (ISL + OSL) than the run had clients, so the "
               "engine's memory setting, which the measured file does not record, decides their TTFT (column "
               "<i>KV holds</i>, and <code>kv_holds_requests</code> in validate.csv). Check these rows' memory "
               "settings before reading their error as the cost model's (the group figures include them): "
               + ", ".join(html.escape(str(i)) for i in summary.get("kv_bound_ids", [])) + ".</p>") if kvb else ""
    over = summary.get("over_gemm_rate", [])
    within = "; ".join(f"{html.escape(r['model'])} {html.escape(r['device'])} {html.escape(r['engine'])}: TTFT "
                       f"{f(r.get('ttft_mape_within_gemm_rate'))}%, TPOT {f(r.get('tpot_mape_within_gemm_rate'))}%"
                       for r in summary["groups"] if r.get("over_gemm_rate_rows"))
    def share(r):
        return "-" if r.get("implied_peak_share") is None else f"{r['implied_peak_share']:.2f}"
    gemm_note = (f"<h2>Rows beyond pdsim's GEMM ceiling</h2><p>{len(over)} row(s) imply more linear-layer work "
                 "per second than pdsim's cost model lets their GPUs do: requests per second (the measured "
                 "throughput, else Little's law at the measured concurrency, which overstates the rate of a short "
                 "run) x the linear layers' FLOPs per request (attention and all-reduces left out), over the GPUs "
                 "at the profile's GEMM ceiling. pdsim is too slow on them whatever the scheduler does: the run "
                 "had cache hits (<code>--shared-prefix-tokens</code>), its GEMMs ran faster than the profile, or "
                 "its rate is overstated; only a share of the datasheet peak above 1 makes a row impossible "
                 "outright. The group figures above include them; without them: "
                 f"{within}.</p><table><tr><th>id</th><th>x pdsim's GEMM ceiling</th><th>x datasheet peak</th></tr>"
                 + "".join(f"<tr><td>{html.escape(str(r['id']))}</td><td>{r['implied_gemm_util']:.2f}</td>"
                           f"<td>{share(r)}</td></tr>" for r in over) + "</table>") if over else ""
    st = summary.get("settings") or {}
    prefix_note = (f" Every row's prompts share their first {st['shared_prefix_tokens']} tokens, cached "
                   "(<code>--shared-prefix-tokens</code>)." if st.get("shared_prefix_tokens") else
                   " Every prompt is fresh (no shared prefix, no cache).")
    sk = "".join(f"<li>{html.escape(k)}: {v}</li>" for k, v in sorted(c["skipped_by_reason"].items()))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>pdsim validate</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 8px;text-align:right}}</style></head><body>
<h1>pdsim vs measured benchmark runs</h1>
<p>{c['rows_in']} rows read, {c['simulated']} simulated, {c['skipped']} skipped. MAPE and bias (mean signed
error, simulated/measured - 1) in percent; closed loop at the measured concurrency.{prefix_note}</p>
<h2>Per model, GPU, engine, mode</h2><table><tr><th>model</th><th>GPU</th><th>engine</th><th>mode</th><th>rows</th>
<th>TTFT MAPE %</th><th>TTFT bias %</th><th>TPOT MAPE %</th><th>TPOT bias %</th><th>throughput MAPE %</th></tr>{g}</table>
<h2>Worst rows by TTFT error</h2>{kv_note}<table><tr><th>id</th><th>TTFT ms</th><th>sim</th><th>APE %</th>
<th>TPOT ms</th><th>sim</th><th>APE %</th><th>KV holds (requests)</th></tr>{w}</table>
{gemm_note}
<h2>Skipped rows by reason</h2><ul>{sk}</ul></body></html>"""


# --- the error band shown next to TTFT/TPOT ---------------------------------------------------------
def bands_text(expected: dict) -> str:
    """One line for a topology's ``expected_error`` ({pool: band or text}): 'prefill: TTFT ±x%, TPOT ±y% over
    n measured runs (bias ...); decode: unvalidated' (pools with the same band named together)."""
    groups: dict[str, list[str]] = {}
    for pool, band in expected.items():
        groups.setdefault(band_text(band), []).append(pool)
    return "; ".join(f"{'/'.join(pools)}: {text}" for text, pools in groups.items())


def band_text(band: dict | str) -> str:
    """'TTFT ±x%, TPOT ±y% (MAPE over n measured runs; pdsim's mean bias TTFT +a%, TPOT -b%; ...)', or the
    band's own text when it is one ('unvalidated ...')."""
    if isinstance(band, str):
        return band
    bias = (f"; pdsim's mean bias TTFT {band['ttft_bias_pct']:+.0f}%, TPOT {band['tpot_bias_pct']:+.0f}%"
            if band.get("ttft_bias_pct") is not None and band.get("tpot_bias_pct") is not None else "")
    # dense bands are held out (nothing in pdsim fitted on those runs); an MoE band says it is in sample (notes)
    held = "" if band.get("in_sample") else "held-out "
    return (f"TTFT ±{band['ttft_mape_pct']}%, TPOT ±{band['tpot_mape_pct']}% (MAPE over {band['rows']} {held}measured "
            f"{'MoE-model ' if band.get('moe') else ''}runs{bias}{band_notes(band)})")


def band_notes(band: dict) -> str:
    """What a band's MAPE alone hides, as '; ...' clauses: an in-sample MoE band and the models it was measured
    on; and where pdsim is fast by 1.5x or more at the median (an APE never passes 100%, however fast), the
    measured/simulated factor (for an MoE band's TTFT, with where much of it comes from)."""
    out = ""
    if band.get("in_sample"):
        models = band.get("models")
        out += f"; in sample, not held out{' (rows of ' + ', '.join(models) + ')' if models else ''}"
    for m, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        med, p90 = band.get(f"{m}_measured_over_sim_median"), band.get(f"{m}_measured_over_sim_p90")
        if med is not None and med == med and med >= 1.5:
            out += f"; measured {name} is a median {med:.1f}x pdsim's (p90 {p90:.1f}x)"
            if m == "ttft" and band.get("in_sample"):
                # the MoE rows (README "A TTFT floor in the InferenceMAX runs"): mostly a per-request floor
                out += (", much of it a per-request floor of the InferenceMAX runs (README 'A TTFT floor'): "
                        "set frontend_latency_ms if your stack shows one")
    return out


ERROR_TABLE = Path(__file__).parent / "data" / "validation_error.json"


#: a named error margin's key in an error band: measured / simulated mean latency over the band's runs
MARGIN_KEYS = {"median": "measured_over_sim_median", "p90": "measured_over_sim_p90"}


def margin_factors(bands: dict, ttft_pool: str, tpot_pool: str, mode: str = "p90", key: str = "error_margin") -> dict:
    """``{ttft_factor, tpot_factor, source}``: how much longer than pdsim's the real latencies were on the
    validation runs of these pools' engine and GPU (``bands``: :func:`pdsim.metrics.expected_error`, pool ->
    band): TTFT from ``ttft_pool`` (the pool a request enters), TPOT from ``tpot_pool`` (where it decodes), the
    ``mode`` (median or p90) over the runs of measured / simulated mean latency, never below 1 (a margin never
    loosens a bound).  Raises ConfigError naming ``key`` for a pool without such a band (unvalidated)."""
    out, where = {}, []
    for metric, pool in (("ttft", ttft_pool), ("tpot", tpot_pool)):
        band = bands.get(pool)
        ratio = band.get(f"{metric}_{MARGIN_KEYS[mode]}") if isinstance(band, dict) else None
        if ratio is None or not math.isfinite(ratio):
            why = band if isinstance(band, str) else "its stored band has no measured/simulated ratios"
            raise ConfigError(f"no measured {metric.upper()} error for pool {pool} ({why}); give fixed margins "
                              "instead, e.g. error_margin: {ttft: 0.3, tpot: 0.1}", key=key, value=mode)
        out[f"{metric}_factor"] = max(1.0, float(ratio))
        where.append(f"{metric.upper()} {band['engine']}|{band['device']}" + (" (MoE, in sample)" if band.get("moe")
                                                                                else ""))
    out["source"] = f"{mode} of measured/simulated over the validation runs: " + ", ".join(where)
    # dense bands are held out; an MoE band is in sample (error_band)
    out["in_sample"] = any(bool(bands[p].get("in_sample")) for p in (ttft_pool, tpot_pool))
    # each factor is its own metric's quantile: how often both held at once on the same runs (one band only)
    b_t, b_p = bands[ttft_pool], bands[tpot_pool]
    same = b_t.get("engine") == b_p.get("engine") and b_t.get("device") == b_p.get("device")
    out["both_within_share"] = b_t.get("both_within_p90_share") if same and mode == "p90" else None
    return out


def error_band(engine: str | None, device: str, tp: int | None = None, moe: bool = False) -> dict | str:
    """The held-out error measured by ``benchmarks/validate_silicon.py`` for this engine and GPU
    (pooled over dense models and TP): TTFT/TPOT MAPE, median APE, p90 APE and bias, or ``"unvalidated"``.
    ``moe``: an MoE model's band instead, measured by ``benchmarks/validate_moe_silicon.py`` on the MoE rows
    (in sample, not held out: marked ``"moe": True`` and ``"in_sample": True``; its ``models`` say which rows).

    ``device`` is a preset name or a profile path; a profile is looked up by its file stem (the
    imported ``h100_sxm-trtllm-aic.yaml`` has its own band), ``engine`` None by ``none`` (the
    idealised engine).  A pair nobody measured (vllm-v0, A100, L40S, a profile of your own) is
    ``unvalidated``."""
    key_dev = Path(device).stem if ("/" in device or device.endswith((".yaml", ".yml", ".json"))) else device
    if key_dev != device:
        from .devices import DATA_DIR, preset_names
        shipped = Path(device).resolve() == (DATA_DIR / f"{key_dev}.yaml").resolve()
        if key_dev in preset_names() and not shipped:   # a profile file of one's own named like a preset is not it
            return f"unvalidated: the profile {device} (the {key_dev} band was measured with the preset of that name)"
    try:
        table = json.loads(ERROR_TABLE.read_text())
    except (OSError, ValueError):
        return "unvalidated"
    if moe:
        # an MoE model's band comes from the MoE silicon rows (benchmarks/validate_moe_silicon.py), never the
        # dense one: their error differs in size and often in sign (SGLang H200 TTFT: dense +167%, MoE -43%)
        hit = table.get("moe_bands", {}).get(f"{engine or 'none'}|{key_dev}")
        if not hit:
            return ("unvalidated for MoE models on this engine and GPU (the dense models' band does not carry "
                    "over: benchmarks/validate_moe_silicon.py)")
        return {**hit, "source": table.get("moe_source", ""), "engine": engine or "none", "device": key_dev,
                "moe": True, "in_sample": True}
    hit = table.get("bands", {}).get(f"{engine or 'none'}|{key_dev}")
    if not hit:
        return "unvalidated"
    return {**hit, "source": table.get("source", ""), "engine": engine or "none", "device": key_dev}
