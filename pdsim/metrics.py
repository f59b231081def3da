"""Records -> tables: per-request rows, per-topology summary, per-instance time series.  Pure functions."""
from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter

from typing import TYPE_CHECKING

import numpy as np

from .config import Scenario
from .table import Table
from .workload import ABANDONED, FINISHED, REJECTED, UNFINISHED

if TYPE_CHECKING:
    import pandas as pd

REQUEST_COLUMNS = ["topology", "request_id", "arrival_s", "prompt_tokens", "output_tokens", "status",
                   "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s",
                   "kv_wait_s", "kv_transfer_s", "decode_queue_s", "preemptions", "recomputed_tokens",
                   "fault_recomputed_tokens", "instance", "decode_instance", "reject_reason", "fault_hits",
                   # client view (Scenario.client): server-side TTFT, inter-token latency, warm-up flag
                   "ttft_prefill_end_s", "itl_mean_s", "itl_p99_s", "itl_max_s", "warmup"]


def client_first_token(rs, first: np.ndarray, kind: str, client) -> tuple[np.ndarray, np.ndarray]:
    """(time of the first token the client sees, index of that token among the request's tokens).

    Colocated: the first token.  Disaggregated with ``ttft_at: first_decode_token`` (the default,
    what ``vllm bench serve`` measures behind a PD proxy): the first token the decode instance
    streams; a one-token reply (nothing decoded) keeps the prefill's token.  A longer reply the decode side
    never streamed a token of (abandoned, or unfinished at the horizon) has none: NaN, however far its
    prefill got.
    """
    k0 = np.zeros(len(rs), np.int64)
    if kind != "disaggregated" or client.ttft_at == "prefill_end":
        return first, k0
    dfirst = np.fromiter((r.decode_first_s for r in rs), np.float64, len(rs))
    one = np.fromiter((r.output_tokens == 1 for r in rs), bool, len(rs))
    use = ~np.isnan(dfirst)
    k0[use] = 1
    return np.where(use, dfirst, np.where(one, first, np.nan)), k0


def _token_runs(rs, k0: np.ndarray, keep=None) -> tuple[list, np.ndarray, np.ndarray]:
    """(rows, gaps per row, every gap of those rows concatenated): the requests (``keep``-ed) whose
    client saw at least two tokens after index ``k0``; one pass over the token lists, no per-request arrays."""
    k0l = k0.tolist()
    rows, lens, parts = [], [], []
    for i, r in enumerate(rs):
        t = r.token_s
        if t is None or (keep is not None and not keep[i]):
            continue
        k = k0l[i]
        if len(t) - k >= 2:
            rows.append(i)
            lens.append(len(t) - k)
            parts.append(t[k:] if k else t)
    if not rows:
        return rows, np.zeros(0, np.int64), np.zeros(0)
    lens = np.asarray(lens, np.int64)
    times = np.fromiter(chain.from_iterable(parts), np.float64, int(lens.sum()))
    gaps = np.delete(np.diff(times), np.cumsum(lens)[:-1] - 1)   # drop the gap from one request to the next
    return rows, lens - 1, gaps


def itl_columns(rs, k0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: mean, p99 and max gap between consecutive streamed tokens after the client's first
    (``vllm bench serve``'s ITL); NaN where token times were not recorded or there is no gap.

    Column-wise over all requests at once; the values are bit-for-bit what ``g.mean()``,
    ``np.percentile(g, 99)`` (linear) and ``g.max()`` give per request (tests/test_report.py)."""
    n = len(rs)
    mean, p99, mx = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    rows, m, g = _token_runs(rs, k0)
    if not rows:
        return mean, p99, mx
    o = np.zeros(len(m), np.int64)
    np.cumsum(m[:-1], out=o[1:])                       # each request's first gap in g
    # per-request sums with numpy's pairwise summation, as g.mean() sums (reduceat sums sequentially)
    red = np.add.reduce
    mean[rows] = np.fromiter((red(g[a:a + k]) for a, k in zip(o.tolist(), m.tolist())), np.float64, len(m)) / m
    mx[rows] = np.maximum.reduceat(g, o)
    # p99 as numpy's linear method: sorted within each request, index (m - 1) * 0.99, numpy's lerp
    # (each request's gaps sorted in place, stable as the lexsort by (request, gap) this replaces, which took
    # ~25x longer on the quickstart's 300k gaps)
    s = g.copy()
    for a0, k in zip(o.tolist(), m.tolist()):
        s[a0:a0 + k].sort(kind="stable")
    v = (m - 1) * 0.99
    prev = np.floor(v)
    gamma = v - prev
    lo = o + prev.astype(np.int64)
    a, b = s[lo], s[np.minimum(lo + 1, o + m - 1)]
    d = b - a
    p99[rows] = np.where(gamma >= 0.5, b - d * (1 - gamma), a + d * gamma)
    return mean, p99, mx


def itl_gaps(rs, k0: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Every inter-token gap of the kept requests, concatenated (the distribution a benchmark reports)."""
    return _token_runs(rs, k0, keep)[2]


def warmup_mask(finish: np.ndarray, status: np.ndarray, n_warm: int) -> np.ndarray:
    """The first ``n_warm`` requests to finish (ties by order) are warm-up, left out of the metrics."""
    out = np.zeros(len(finish), bool)
    if n_warm:
        fin = np.nonzero(status == FINISHED)[0]
        out[fin[np.argsort(finish[fin], kind="stable")[:n_warm]]] = True
    return out


FRAME_CHUNK = 16_384   # requests turned into columns at a time (release=True drops their objects after each)
_FLOAT_FIELDS = ("arrival_s", "first_token_s", "finish_s", "prefill_start_s", "prefill_end_s", "decode_start_s",
                 "kv_wait_s", "kv_transfer_s", "decode_step_s")
_INT_FIELDS = ("id", "prompt_tokens", "output_tokens", "preemptions", "recomputed_tokens", "fault_recomputed_tokens",
               "fault_hits")
_TEXT_FIELDS = ("status", "instance", "decode_instance", "reject_reason")


def releasable(results) -> bool:
    """Whether :func:`summarize` needs nothing from the request objects once the frame is built, so
    ``requests_frame(..., release=True)`` may drop them: no token times recorded (``itl_summary``
    reads them) and no prefix-cache pool (``prefix_summary`` reads each request's cached tokens)."""
    for res in results:
        if res.requests and res.requests[0].token_s is not None:
            return False
        if any(p.spec.prefix_on for p in res.topology.pools):
            return False
    return True


def requests_frame(results, client=None, release: bool = False) -> pd.DataFrame:
    """:func:`requests_table` as a pandas DataFrame (one frame per topology, concatenated)."""
    return requests_table(results, client, release).to_pandas(REQUEST_COLUMNS)


def requests_table(results, client=None, release: bool = False) -> Table:
    """One row per request per topology (REQUEST_COLUMNS), built column by column with numpy:
    no per-row Python tuples, so a million requests cost arrays, not objects; no pandas (a
    :class:`pdsim.table.Table`, whose ``to_pandas()`` is :func:`requests_frame`).

    ``client`` (Scenario.client; default ClientSpec()) sets the client view: ``ttft_s``,
    ``tpot_s`` and ``e2e_s`` are what the benchmark client measures (first token it sees,
    network RTT added); ``ttft_prefill_end_s`` keeps the server-side TTFT.

    The objects are read ``FRAME_CHUNK`` requests at a time.  ``release=True`` (only where
    :func:`releasable`; ``output.write_outputs`` for ``pdsim run``): each chunk's Request objects are
    dropped once read and every ``res.requests`` is left empty, so a million requests are never held
    as objects and as columns at once."""
    if client is None:
        from .config import ClientSpec
        client = ClientSpec()
    parts = []
    for res in results:
        rs = res.requests
        n = len(rs)
        fcols = {a: np.empty(n, np.float64) for a in _FLOAT_FIELDS}
        icols = {a: np.empty(n, np.int64) for a in _INT_FIELDS}
        # text columns as lists until the objects are gone: np.empty(n, object) fills every row with None
        # at once, 8 MB a column at 1 M requests before a single object has been dropped
        tcols = {a: [] for a in _TEXT_FIELDS}
        first, k0 = np.empty(n, np.float64), np.empty(n, np.int64)    # the client's first token, its index
        itl_mean, itl_p99, itl_max = np.empty(n), np.empty(n), np.empty(n)
        for lo in range(0, n, FRAME_CHUNK):
            part = rs[lo:lo + FRAME_CHUNK]
            m = len(part)
            hi = lo + m
            for a, c in fcols.items():
                c[lo:hi] = np.fromiter(map(attrgetter(a), part), np.float64, m)
            for a, c in icols.items():
                c[lo:hi] = np.fromiter(map(attrgetter(a), part), np.int64, m)
            for a, c in tcols.items():
                c.extend(map(attrgetter(a), part))
            # per request, so chunk by chunk gives the same values as all at once
            first[lo:hi], k0[lo:hi] = client_first_token(part, fcols["first_token_s"][lo:hi], res.topology.kind,
                                                         client)
            itl_mean[lo:hi], itl_p99[lo:hi], itl_max[lo:hi] = itl_columns(part, k0[lo:hi])
            del part
            if release:
                rs[lo:hi] = [None] * m
        if release:
            rs.clear()
        tcols = {a: np.array(c, dtype=object) for a, c in tcols.items()}
        arrival, server_first, finish = fcols["arrival_s"], fcols["first_token_s"], fcols["finish_s"]
        pstart, pend, dstart = fcols["prefill_start_s"], fcols["prefill_end_s"], fcols["decode_start_s"]
        kv_wait, kv_xfer = fcols["kv_wait_s"], fcols["kv_transfer_s"]
        output = icols["output_tokens"]
        status = tcols["status"]
        fin = status == FINISHED
        streamed = output - k0          # tokens the client receives
        rtt = client.network_rtt_s
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(fin & (streamed > 1), (finish - first) / np.maximum(streamed - 1, 1), np.nan)
            # from its KV's arrival on the decode instance to the start of its first decode step there (the step in
            # flight when it arrived, if any): decode room is reserved before the KV is sent, so there is no other
            # decode-side queue; a request dropped before that step has none
            dq = fcols["decode_step_s"] - dstart
        # one str object n times (np.full(n, name, dtype=object) makes a new str per row: ~60 MB at 1 M)
        topology = np.empty(n, object)
        topology.fill(res.name)
        parts.append({
            "topology": topology, "request_id": icols["id"],
            "arrival_s": arrival, "prompt_tokens": icols["prompt_tokens"], "output_tokens": output, "status": status,
            "first_token_s": first, "finish_s": finish, "ttft_s": first - arrival + rtt, "tpot_s": tpot,
            "e2e_s": np.where(fin, finish - arrival + rtt, np.nan), "queue_s": pstart - arrival,
            "prefill_s": pend - pstart, "kv_wait_s": kv_wait, "kv_transfer_s": kv_xfer, "decode_queue_s": dq,
            "preemptions": icols["preemptions"], "recomputed_tokens": icols["recomputed_tokens"],
            "fault_recomputed_tokens": icols["fault_recomputed_tokens"],
            "instance": tcols["instance"], "decode_instance": tcols["decode_instance"],
            "reject_reason": tcols["reject_reason"], "fault_hits": icols["fault_hits"],
            "ttft_prefill_end_s": server_first - arrival, "itl_mean_s": itl_mean, "itl_p99_s": itl_p99,
            "itl_max_s": itl_max, "warmup": warmup_mask(finish, status, client.warmup_requests)})
        del fcols, icols, tcols
    # to_pandas: copy=False, the arrays become the columns as they are (the default copies every numeric
    # column into one 2-D block per dtype, ~170 MB more at 1 M requests, for the time it takes)
    return Table.concat(parts, empty_columns=REQUEST_COLUMNS)


def _c(d, name: str) -> np.ndarray:
    """Column ``name`` of a table (a :class:`pdsim.table.Table` or a pandas DataFrame) as a numpy array."""
    c = d[name]
    return c if isinstance(c, np.ndarray) else c.to_numpy()


def _f(d, name: str) -> np.ndarray:
    """A numeric column as float64 (NaN where missing)."""
    return np.asarray(_c(d, name), np.float64)


def _stats(x: np.ndarray) -> dict:
    """mean and p50/p90/p99 of the non-NaN values (what pandas' Series.mean / dropna gave, bit for bit)."""
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    q = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def slo_attainment(df, slo) -> float:
    """Share of all arrived requests that finished meeting both the TTFT and the TPOT bound.

    Rejected and unfinished requests count as misses; a one-token reply has no TPOT and
    is judged on TTFT alone.
    """
    if len(df) == 0:
        return float("nan")
    tpot = _f(df, "tpot_s")
    ok = (_c(df, "status") == FINISHED) & (_f(df, "ttft_s") <= slo.ttft_s) & (np.isnan(tpot) | (tpot <= slo.tpot_s))
    return float(ok.mean())


def nearest_rank(x: np.ndarray, p: float) -> float | None:
    """The p-th percentile by nearest rank: the smallest sample with at least p% of samples <= it.

    Conservative for an SLO (never interpolates below an observed latency) and defined with
    infinite samples (requests that never got there).  None for an empty sample.
    """
    n = len(x)
    if n == 0:
        return None
    k = min(n, max(1, math.ceil(p / 100.0 * n - 1e-9)))     # 1-based rank; 1e-9: 99.9% of 1000 is 999
    return float(np.partition(np.asarray(x, float), k - 1)[k - 1])


def slo_passes(slo, attainment: float, ttft_p: float | None, tpot_p: float | None) -> bool:
    """The SLO rule, in one place (summary, report and ``pdsim plan`` all call it).

    ``attainment`` mode: attainment >= attainment_target.  ``percentile`` mode: the TTFT percentile
    <= ttft_s and the TPOT percentile <= tpot_s (None: no sample, e.g. only one-token replies).
    """
    if getattr(slo, "mode", "attainment") == "percentile":
        return (ttft_p is None or ttft_p <= slo.ttft_s) and (tpot_p is None or tpot_p <= slo.tpot_s)
    return attainment == attainment and attainment >= slo.attainment_target


def slo_samples(df) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TPOT) samples an SLO percentile is taken over, in seconds.

    TTFT: every arrived request; one with no first token (rejected, abandoned, still queued at the
    horizon) is +inf.  TPOT: every request asking for more than one output token; one that did not
    finish is +inf.  So refusing work never improves a percentile.  A finished request whose client saw
    a single token (behind a PD proxy, a 2-token reply: the prefill's token is not streamed) has no TPOT,
    as a one-token request has none: it is left out, not ranked as a NaN.
    """
    ttft = _f(df, "ttft_s")
    ttft = np.where(np.isnan(ttft), np.inf, ttft)
    fin = _c(df, "status") == FINISHED
    tpot_s = _f(df, "tpot_s")
    keep = (_c(df, "output_tokens") > 1) & ~(fin & np.isnan(tpot_s))
    tpot = np.where(fin, tpot_s, np.inf)[keep]
    return ttft, tpot


def slo_verdict(df, slo) -> dict:
    """How a run stands against its SLO: mode, each bound's measured value, which bound binds, the margin.

    Both modes report the same numbers; ``met`` follows ``slo.mode`` (see :func:`slo_passes`).
    ``binding`` is the bound closest to failing: in attainment mode the one fewer requests meet
    (margin = attainment - target, a fraction); in percentile mode the one with the smallest
    relative headroom (margin = bound - measured percentile, seconds).  An infinite percentile (too
    many requests never served) is shown as None with ``unserved`` set.
    """
    ttft, tpot = slo_samples(df)
    n = len(df)
    fin = _c(df, "status") == FINISHED
    ttft_within = fin & (_f(df, "ttft_s") <= slo.ttft_s)
    tpot_all = _f(df, "tpot_s")
    tpot_within = fin & (np.isnan(tpot_all) | (tpot_all <= slo.tpot_s))
    att = float((ttft_within & tpot_within).mean()) if n else float("nan")
    bounds = {}
    for name, sample, bound, pct, within in (("ttft", ttft, slo.ttft_s, slo.ttft_percentile, ttft_within),
                                             ("tpot", tpot, slo.tpot_s, slo.tpot_percentile, tpot_within)):
        v = nearest_rank(sample, pct)
        bounds[name] = {"bound_s": bound, "percentile": pct,
                        "measured_s": v if v is None or math.isfinite(v) else None,
                        "unserved": v is not None and not math.isfinite(v),
                        "margin_s": None if v is None or not math.isfinite(v) else bound - v,
                        "met": v is None or v <= bound,
                        "share_within": float(within.mean()) if n else None}
    mode = getattr(slo, "mode", "attainment")
    met = slo_passes(slo, att, bounds["ttft"]["measured_s"] if not bounds["ttft"]["unserved"] else math.inf,
                     bounds["tpot"]["measured_s"] if not bounds["tpot"]["unserved"] else math.inf)
    def headroom(k):
        b = bounds[k]
        if b["unserved"]:
            return -math.inf
        return math.inf if b["margin_s"] is None else b["margin_s"] / b["bound_s"]
    if mode == "percentile":
        binding = min(("ttft", "tpot"), key=headroom)
        margin, unit = bounds[binding]["margin_s"], "s"
    else:
        # fewer requests within binds; a tie (e.g. every request meets both) goes to the smaller headroom
        binding = min(("ttft", "tpot"), key=lambda k: (bounds[k]["share_within"] if n else 0.0, headroom(k)))
        margin, unit = (att - slo.attainment_target if n else None), "fraction"
    return {"mode": mode, "met": bool(met), "binding": binding, "margin": margin, "margin_unit": unit,
            "attainment": att if n else None, "attainment_target": slo.attainment_target, "bounds": bounds}


def timeseries_frame(results) -> pd.DataFrame:
    """:func:`timeseries_table` as a pandas DataFrame."""
    return timeseries_table(results).to_pandas()


def timeseries_table(results) -> Table:
    """One row per time bin per instance (a :class:`pdsim.table.Table`; no pandas)."""
    frames = []
    for res in results:
        for inst in res.topology.instances:
            s = inst.series
            n = len(s.busy_s)
            if n == 0:
                continue
            dev = getattr(inst.cost, "device", None)
            # the cost model prices a step per GPU (each GPU's shard): one GPU's peak and bandwidth
            peak = dev.peak_flops(inst.cost.compute_dtype) if dev else math.nan
            bw = dev.mem_bw_Bps if dev else math.nan
            steps = np.asarray(s.steps, float)
            frames.append({
                "topology": res.name, "instance": inst.name, "pool": inst.pool,
                "t_s": np.arange(n) * s.bin_s,
                "busy_fraction": np.minimum(1.0, np.asarray(s.busy_s) / s.bin_s),
                "mfu": np.asarray(s.flops) / (s.bin_s * peak),
                "mbu": np.asarray(s.bytes) / (s.bin_s * bw),
                "batch_size": np.divide(s.batch_sum, steps, out=np.zeros(n), where=steps > 0),
                "steps": s.steps,
                "queued_max": s.queue_max,
                "kv_blocks_used_max": s.kv_max,
                "kv_blocks_total": inst.kv.total_blocks,
            })
    return Table.concat(frames)


def kv_cache_totals(topo) -> dict:
    """KV bytes over every GPU of a topology.

    ``peak_bytes``: each instance's own peak, summed over instances: the KV in use at once was at most
    this (instances need not peak together; an instance that switched roles counts once per role).
    ``capacity_bytes``: the pools' KV capacity at their peak instance counts.  An instance's blocks are
    sized per GPU (``Pool.block_bytes``) and each of its tp x pp GPUs holds its share, so an instance's
    bytes are blocks x block_bytes x GPUs per instance (``Pool.instance_block_bytes``: under an uneven pipeline
    split each stage's GPUs hold their own layers' share, less than the busiest stage's block_bytes).  (Before: each pool's busiest instance times the
    pool's peak instance count, per GPU: it counted autoscaled instances that never ran and left out tp x pp.)
    """
    peak = cap = 0.0
    for p in topo.pools:
        per_block = p.instance_block_bytes
        peak += sum(i.kv.peak_used for i in p.instances) * per_block
        cap += p.peak_instances * p.instances[0].kv.total_blocks * per_block
    return {"peak_bytes": float(peak), "capacity_bytes": float(cap)}


def _reason_counts(reasons: np.ndarray) -> dict:
    """Rejections per reason (the text before its first ':'), most first, ties in order of first
    appearance; missing reasons not counted (pandas' ``str.split(":").str[0].value_counts()``)."""
    counts: dict = {}
    for r in reasons.tolist():
        if r is None or r != r:
            continue
        k = str(r).split(":")[0]
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def summarize(results, df, sc: Scenario) -> dict:
    """The per-topology summary of a run's requests table (a :class:`pdsim.table.Table` or a DataFrame)."""
    out = {}
    for res in results:
        # the frame itself when every row is this topology's (one topology, no warm-up): not a copy of it
        mine = _c(df, "topology") == res.name
        d_all = d = df if mine.all() else df[mine]
        if "warmup" in d:
            # client.warmup_requests: counted in `requests`, left out of latency, SLO and throughput figures
            warm = _c(d, "warmup").astype(bool)
            if warm.any():
                d = d[~warm]
        topo = res.topology
        # the finished rows of the columns read from them (not a copy of every column)
        status = _c(d, "status")
        fin_rows = status == FINISHED
        fin_out, fin_tpot = _c(d, "output_tokens")[fin_rows], _f(d, "tpot_s")[fin_rows]
        fin_e2e, fin_kv = _f(d, "e2e_s")[fin_rows], _f(d, "kv_transfer_s")[fin_rows]
        n_fin = int(fin_rows.sum())
        elapsed = res.sim_end_s           # 0 when every request was settled (rejected) at t = 0
        span = elapsed or 1.0             # a divisor only: with nothing elapsed the rates are 0 (nothing done)
        st_all = _c(d_all, "status")
        counts = {"total": len(d_all), "finished": int((st_all == FINISHED).sum()),
                  "rejected": int((st_all == REJECTED).sum()),
                  "abandoned": int((st_all == ABANDONED).sum()),
                  "unfinished": int((st_all == UNFINISHED).sum())}
        assert counts["total"] == counts["finished"] + counts["rejected"] + counts["abandoned"] + counts["unfinished"]
        rej = _reason_counts(_c(d_all, "reject_reason")[st_all == REJECTED])
        # an autoscaled topology: the most GPUs alive at once (not the sum of each pool's own peak)
        scaler = getattr(topo, "autoscaler", None)
        gpus = scaler.peak_gpus() if scaler is not None else sum(p.gpus for p in topo.pools)
        # paid time, provisioning and loading included (a static pool: every instance, the whole run)
        alive = {p.name: p.alive_s(elapsed) for p in topo.pools}     # nothing elapsed: nothing paid
        gpu_hours = sum(p.spec.gpus_per_instance * alive[p.name] for p in topo.pools) / 3600
        cost_usd = sum(p.spec.gpus_per_instance * alive[p.name] * p.price_per_gpu_hour_usd for p in topo.pools) / 3600
        scaled = getattr(topo, "autoscaler", None) is not None
        # a static cluster: its price per hour; an autoscaled one: the mean over the run
        cost_per_hour = cost_usd / (span / 3600) if scaled else \
            sum(p.gpus * p.price_per_gpu_hour_usd for p in topo.pools)
        out_tokens = float(fin_out.sum())
        verdict = slo_verdict(d, sc.slo)
        pools = {}
        for p in topo.pools:
            busy = sum(i.busy_s for i in p.instances)
            flops = sum(i.flops for i in p.instances)
            bytes_ = sum(i.bytes for i in p.instances)
            dev = getattr(p.cost, "device", None)
            inst_s = (alive[p.name] or span) if scaled else span * len(p.instances)
            pools[p.name] = {
                "instances": p.peak_instances, "tp": p.spec.tp, "pp": p.spec.pp, "ep": p.spec.ep,
                "dp_attention": p.spec.dp_attention,
                # TensorRT-LLM's attention-DP balance: its settings and the steps in which it held new prompts
                "attention_dp_balance": None if p.spec.attention_dp_balance is None else {
                    **p.spec.attention_dp_balance.model_dump(),
                    "steps_held": sum(getattr(i.policy, "held", 0) for i in p.instances)},
                # TensorRT-LLM's batch waiting: its settings and the steps in which it held new prompts
                "batch_wait": None if p.spec.batch_wait is None else {
                    **p.spec.batch_wait.model_dump(),
                    "steps_held": sum(getattr(i.policy, "held", 0) for i in p.instances)},
                "micro_batches": (p.spec.micro_batches or p.spec.pp) if p.spec.pp > 1 else None, "gpus": p.gpus,
                "pp_layers": p.pp_layers,
                "gpu_hours": p.spec.gpus_per_instance * alive[p.name] / 3600,
                "cost_usd": p.spec.gpus_per_instance * alive[p.name] * p.price_per_gpu_hour_usd / 3600,
                "device": p.spec.device, "device_source": dev.source if dev else "n/a (constant/linear cost model)",
                # over the instance-seconds paid (an autoscaled pool's instances are not all there all the time)
                "busy_fraction": busy / inst_s,
                # instance FLOPs and bytes are per GPU (the cost model prices one GPU's shard of a step)
                "mfu": flops / (inst_s * dev.peak_flops(p.cost.compute_dtype)) if dev else None,
                "mbu": bytes_ / (inst_s * dev.mem_bw_Bps) if dev else None,
                # per GPU (a block's bytes on one GPU): the busiest instance's peak, and one instance's pool;
                # a pool per attention rank (one GPU each): the busiest rank's, not the ranks' mean
                "kv_peak_bytes": max(i.kv.rank_peak * i.kv.ranks if i.kv.ranked else i.kv.peak_used
                                     for i in p.instances) * p.block_bytes,
                "kv_capacity_bytes": p.instances[0].kv.total_blocks * p.block_bytes,
                "weights_bytes_per_gpu": p.cost.weight_bytes_per_gpu() if dev else None,
                "price_per_gpu_hour_usd": p.price_per_gpu_hour_usd,
                **kv_capacity(p, d),
            }
        links = [{"name": l.name, "transfers": l.transfers, "bytes": l.bytes,
                  "busy_fraction": l.busy_s / span} for l in topo.links]
        out[res.name] = {
            "kind": topo.kind,
            "ttft_s": _stats(_f(d, "ttft_s")[status != REJECTED]), "tpot_s": _stats(fin_tpot),
            "e2e_s": _stats(fin_e2e), "queue_s": _stats(_f(d, "queue_s")),
            "kv_transfer_s": _stats(fin_kv) if topo.kind == "disaggregated" else None,
            "requests": counts,
            # requests that would have arrived at or after horizon_s (a closed loop: not sent by then): not in the run
            "cut_by_horizon": getattr(res, "cut_by_horizon", 0),
            "throughput": {"requests_per_s": n_fin / span, "output_tokens_per_s": out_tokens / span,
                           # an autoscaled topology: per GPU alive on average (its peak would flatter nothing)
                           "output_tokens_per_s_per_gpu": (out_tokens / span / (gpu_hours * 3600 / span if scaled
                                                                                else gpus)) if out_tokens else 0.0},
            "slo_attainment": slo_attainment(d, sc.slo),
            "slo_met": verdict["met"],
            "slo": verdict,
            "gpus": gpus,
            "cost_per_hour_usd": cost_per_hour,
            "cost_per_million_output_tokens_usd": (cost_per_hour / 3600 * span / out_tokens * 1e6
                                                   if out_tokens else None),
            "gpu_hours": gpu_hours,
            "cost_usd": cost_usd,
            "mean_gpus": gpu_hours * 3600 / elapsed if elapsed else (None if scaled else gpus),
            "utilization": {name: {k: v for k, v in p.items() if k in ("busy_fraction", "mfu", "mbu")}
                            for name, p in pools.items()},
            "kv_cache": kv_cache_totals(topo),
            "pools": pools,
            "links": links,
            "preemptions": int(_c(d, "preemptions").sum()),
            "rejected_by_reason": rej,
            "sim_end_s": res.sim_end_s,
            "faults": fault_summary(topo, d, sc.slo, res.sim_end_s) if getattr(topo, "fault_log", None) else None,
            "itl_s": itl_summary(res, d, sc.client),
            "warmup_excluded": len(d_all) - len(d),
            "expected_error": (bands := expected_error(topo)),
            "slo_at_error": slo_at_error(d, sc.slo, bands, topo.pools[0].name, topo.pools[-1].name),
        }
        a = getattr(topo, "autoscaler", None)
        if a is not None:
            auto = a.summary(res.sim_end_s)
            for name, ps in auto["pools"].items():
                ps["gpu_hours"] = pools[a.scalers[name].pool.name]["gpu_hours"]
                ps["cost_usd"] = pools[a.scalers[name].pool.name]["cost_usd"]
            out[res.name]["autoscaling"] = auto
        if any(p.spec.prefix_on for p in topo.pools):
            out[res.name]["prefix_cache"] = prefix_summary(res)
        from .energy import topology_energy       # None when a pool's device has no power model
        # the whole run's joules over the whole run's finished requests and their output tokens, warm-up
        # included: the warm-up requests' energy is in the numerator, so they belong in the denominator
        fin_all = _c(d_all, "output_tokens")[st_all == FINISHED]
        out[res.name]["energy"] = topology_energy(topo, res.sim_end_s, len(fin_all), float(fin_all.sum()))
        if any(getattr(p, "spec_dec", None) is not None for p in topo.pools):
            out[res.name]["speculative"] = {p.name: p.spec_dec.summary() for p in topo.pools
                                            if getattr(p, "spec_dec", None) is not None}
    return out


ITL_QUANTILE_LEVELS = np.linspace(0.0, 100.0, 201)


def itl_summary(res, d, client) -> dict | None:
    """Inter-token latency over every streamed gap of the measured finished requests (mean, p50/p90/p99),
    as ``vllm bench serve`` reports it; None when token times were not recorded (client.itl)."""
    rs = res.requests
    if not rs or rs[0].token_s is None:
        return None
    first = np.fromiter((r.first_token_s for r in rs), np.float64, len(rs))
    _, k0 = client_first_token(rs, first, res.topology.kind, client)
    ids = set(_c(d, "request_id")[_c(d, "status") == FINISHED].tolist())
    keep = np.fromiter((r.id in ids for r in rs), bool, len(rs))
    g = itl_gaps(rs, k0, keep)
    if len(g) == 0:
        return None
    # percentiles are order statistics (and their lerp): the same from sorted gaps, where numpy's selection
    # of 204 ranks is ~5x faster than on the gaps as they come; the mean is summed in the original order
    s = np.sort(g)
    q = np.percentile(s, [50, 90, 99])
    return {"mean": float(g.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "gaps": int(len(g)),
            # the whole distribution for the report's ITL CDF: the gap at every half percent, 0..100
            "quantiles": [float(v) for v in np.percentile(s, ITL_QUANTILE_LEVELS)]}


def kv_capacity(pool, d) -> dict:
    """KV capacity of one instance in tokens, and in requests of this run's mean size (prompt + output);
    with an engine, the memory terms it was sized from."""
    inst = pool.instances[0]
    kv = inst.kv
    tokens = (kv.total_blocks - kv.watermark_blocks) * kv.block_size
    size = float((_c(d, "prompt_tokens") + _c(d, "output_tokens")).mean()) if len(d) else float("nan")
    per_req = kv.blocks_for(int(math.ceil(size))) if size == size else 0
    out = {"engine": pool.spec.engine, "kv_blocks": kv.total_blocks, "kv_block_size": kv.block_size,
           "kv_capacity_tokens": tokens,
           "kv_capacity_requests": kv.requests_fit(per_req) if per_req else None,
           "kv_request_tokens_mean": size if size == size else None}
    if kv.ranked:          # attention_dp_balance: one pool per attention rank, a request fits within one
        out["kv_blocks_per_rank"] = kv.per_rank
    dev = getattr(pool.cost, "device", None)
    if pool.spec.engine is not None and dev is not None and pool.spec.kv_blocks is None:
        from .engines import kv_cache_bytes
        model = getattr(pool.cost, "model", None)
        if model is not None:
            wd = getattr(pool.cost, "weight_dtype", "bf16")
            out["kv_sizing_bytes"] = kv_cache_bytes(pool.spec, model, wd, dev.memory_bytes)
    return out


def expected_error(topo) -> dict:
    """The error band measured for this engine and GPU against real benchmark runs (pdsim validate; an MoE
    model's from the MoE rows), or ``unvalidated``."""
    from .validate import error_band
    out = {}
    for p in topo.pools:
        if p.spec.engine is not None and getattr(p.spec, "step_overhead", None) is not None:
            # the stored band was measured with the preset's overhead, not this one
            out[p.name] = (f"unvalidated: step_overhead set on the {p.spec.engine} preset, whose band was measured "
                           "with its own (a `pdsim calibrate --from-benchmark` file states its held-out error)")
        elif getattr(p.spec, "frontend_latency_ms", None):      # (as step_overhead: specs without it)
            # the bands were measured without a front-end latency (every preset has none)
            out[p.name] = (f"unvalidated: frontend_latency_ms {p.spec.frontend_latency_ms:g} set; "
                           + (f"the {p.spec.engine} preset's band" if p.spec.engine else "every stored band")
                           + " was measured without one")
        elif p.spec.cost_model.kind != "roofline":
            # the bands were measured with the roofline cost model (device profile x model); a constant or
            # linear step time is a what-if nobody measured
            out[p.name] = f"unvalidated: a {p.spec.cost_model.kind} cost model (a what-if, not the roofline)"
        elif getattr(p.spec, "pp", 1) > 1:
            # the validation rows with pipeline parallelism are skipped (validate.read_measured): none measured
            out[p.name] = "unvalidated: pipeline parallel (no measured run used PP)"
        elif getattr(p.spec, "speculative", None) is not None:
            # no validation row records speculative decoding: its TPOT rests on the acceptance assumed
            out[p.name] = (f"unvalidated: speculative decoding ({p.spec.speculative.method}; no measured run "
                           "used it, and its TPOT rests on the acceptance rate assumed)")
        elif getattr(p.spec, "power_cap_W", None) is not None:
            out[p.name] = (f"unvalidated: power cap {p.spec.power_cap_W:g} W (no measured run was capped; the clock "
                           "model under a cap is not measured)")
        else:
            out[p.name] = error_band(p.spec.engine, p.spec.device, p.spec.tp, moe=p.model.is_moe)
    return out


def slo_at_error(d, slo, bands: dict, ttft_pool: str, tpot_pool: str) -> dict:
    """The run's SLO verdict at pdsim's measured error: the bounds divided by the p90 (nearest rank, at least 1)
    over the validation runs of these pools' engines and GPUs of measured / simulated mean TTFT (``ttft_pool``'s
    band) and of TPOT (``tpot_pool``'s), :func:`pdsim.validate.margin_factors` (held out for dense models, in
    sample for MoE; each factor is its own metric's quantile: both held together on ``margin['both_within_share']``
    of the runs, where one band gives both).  ``{margin, met, attainment, ttft_s, tpot_s, mode, ttft_p_s,
    tpot_p_s, ttft_percentile, tpot_percentile}``, or ``{margin: None, why}`` where a pool has no measured band."""
    from .errors import ConfigError
    from .validate import margin_factors
    try:
        m = margin_factors(bands, ttft_pool, tpot_pool, "p90")
    except ConfigError:
        why = "; ".join(f"{p}: {b if isinstance(b, str) else 'no measured/simulated ratios in its band'}"
                        for p, b in bands.items() if not isinstance(b, dict) or "ttft_measured_over_sim_p90" not in b)
        return {"margin": None, "why": why or "no measured band"}
    tight = slo.tightened(m["ttft_factor"], m["tpot_factor"])
    v = slo_verdict(d, tight)
    b = v["bounds"]
    return {"margin": m, "met": v["met"], "attainment": v["attainment"], "ttft_s": tight.ttft_s,
            "tpot_s": tight.tpot_s, "mode": v["mode"],
            # percentile mode judges these (None: no sample, or unserved requests put it at infinity)
            "ttft_p_s": b["ttft"]["measured_s"], "tpot_p_s": b["tpot"]["measured_s"],
            "ttft_percentile": b["ttft"]["percentile"], "tpot_percentile": b["tpot"]["percentile"]}


def _rate(num: float, den: float):
    return num / den if den else None


def prefix_summary(res) -> dict:
    """Prefix-cache figures of one topology: hit rates per instance and tier (hit tokens / prompt
    tokens of the admissions looked up there), prompt tokens not computed, the prefill FLOPs they
    would have cost (every admission that found a prefix, as the hit-token counts have it, a
    re-admission after a preemption included: its tokens alone vs its uncached suffix over the cached
    context, under the cost model of the instance that looked it up, per GPU as every step's FLOPs are; None
    for cost models without FLOPs), and KV-transfer bytes not sent because the decode instance held the prefix already."""
    topo = res.topology
    per_instance = {}
    tot = {"lookup_tokens": 0, "gpu_hit_tokens": 0, "host_hit_tokens": 0}
    for inst in topo.instances:
        if not inst.kv.prefix_on:
            continue
        st = inst.kv.stats
        per_instance[inst.name] = {
            "admissions": st.admissions, "lookup_tokens": st.lookup_tokens,
            "gpu_hit_tokens": st.gpu_hit_tokens, "host_hit_tokens": st.host_hit_tokens,
            "hit_rate": _rate(st.gpu_hit_tokens + st.host_hit_tokens, st.lookup_tokens),
            "gpu_hit_rate": _rate(st.gpu_hit_tokens, st.lookup_tokens),
            "host_hit_rate": _rate(st.host_hit_tokens, st.lookup_tokens),
            "evicted_blocks": st.evicted_blocks, "host_evicted_blocks": st.host_evicted_blocks,
            "host_load_bytes": st.host_load_bytes, "transfer_hit_tokens": st.transfer_hit_tokens,
            "cached_blocks_at_end": inst.kv.cached_blocks}
        for k in tot:
            tot[k] += getattr(st, k)
    flops_saved, has_flops = 0.0, True
    for inst in topo.instances:           # every admission that found a prefix, under the cost model it ran on
        if not inst.kv.prefix_on or not has_flops:
            continue
        hits, cost = inst.kv.stats.hits, inst.cost
        for i in range(0, len(hits), 2):
            p, h = hits[i], hits[i + 1]
            n = p - h
            full = cost.step(p, p * p / 2.0, p, 1, 1).flops
            if full == 0.0:
                has_flops = False
                break
            flops_saved += full - cost.step(n, n * (h + n / 2.0), p, 1, 1).flops
    by_engine = getattr(topo, "prefix_by_engine", None) or {}
    return {
        # which pools cache, and why: the scenario's prefix_cache key, or the engine's default (engines.py)
        "enabled_by": {p.name: (f"engine default ({by_engine[p.name]})" if p.name in by_engine else "scenario")
                       for p in getattr(topo, "pools", ()) if p.spec.prefix_on},
        "hit_rate": _rate(tot["gpu_hit_tokens"] + tot["host_hit_tokens"], tot["lookup_tokens"]),
        "gpu_hit_rate": _rate(tot["gpu_hit_tokens"], tot["lookup_tokens"]),
        "host_hit_rate": _rate(tot["host_hit_tokens"], tot["lookup_tokens"]),
        "prompt_tokens_looked_up": tot["lookup_tokens"],
        "tokens_saved": tot["gpu_hit_tokens"] + tot["host_hit_tokens"],
        "prefill_flops_saved": flops_saved if has_flops else None,
        "transfer_bytes_saved": getattr(topo, "transfer_bytes_saved", 0.0),
        "instances": per_instance,
    }


def _median(x: np.ndarray) -> float:
    """The median of the non-NaN values, NaN when there is none (pandas' Series.median)."""
    x = x[~np.isnan(x)]
    if not len(x):
        return float("nan")
    return float(np.nanmedian(x))


def fault_summary(topo, d, slo, end_s: float, window_s: float = 30.0) -> dict:
    """What the faults cost: requests hit, extra latency, attainment inside vs outside the fault
    windows (by arrival time), recomputed tokens, and the time to get back to steady state
    (the first moment after a fault ends from which the median TTFT of the next ``window_s``
    of arrivals is within 25% of the median TTFT of arrivals outside every fault window)."""
    from .faults import fault_windows
    wins = fault_windows(topo)
    arr = _f(d, "arrival_s")
    inside = np.zeros(len(d), bool)
    for a, b in wins:
        inside |= (arr >= a) & (arr < b)
    hit = _c(d, "fault_hits") > 0
    fin = _c(d, "status") == FINISHED
    e2e = _f(d, "e2e_s")
    ttft = _f(d, "ttft_s")

    def mean(mask):
        m = mask & fin
        return float(np.nanmean(e2e[m])) if m.any() else None

    base_ttft = _median(ttft[~inside]) if (~inside).any() else None
    recover = []
    for a, b in wins:
        t, got = b, None
        if base_ttft is not None and base_ttft == base_ttft:
            last = float(np.nanmax(arr)) if len(arr) else b
            while t <= last:
                m = (arr >= t) & (arr < t + window_s)
                if m.any() and float(np.nanmedian(ttft[m])) <= 1.25 * base_ttft:
                    got = t - b
                    break
                t += window_s / 6
        recover.append({"fault_start_s": a, "fault_end_s": b, "time_to_recover_s": got})
    return {
        "events": topo.fault_log,
        "requests_affected": int(hit.sum()),
        # tokens computed again because a fault took their KV (a preemption's recompute is not a fault's)
        "recomputed_tokens": int(_c(d, "fault_recomputed_tokens").sum()),
        "extra_e2e_s_affected": (mean(hit) - mean(~hit)) if mean(hit) is not None and mean(~hit) is not None
        else None,
        "slo_attainment_inside_fault_windows": slo_attainment(d[inside], slo) if inside.any() else None,
        "slo_attainment_outside_fault_windows": slo_attainment(d[~inside], slo) if (~inside).any() else None,
        "requests_arriving_in_fault_windows": int(inside.sum()),
        "recovery": recover,
        # an outage still running at the end of the run counts up to the end
        "instance_down_s": {i.name: i.down_s + (max(0.0, end_s - i.down_since) if i.failed else 0.0)
                            for i in topo.instances if i.down_s or i.failed},
    }
