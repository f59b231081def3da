"""Calibration: the fit recovers known parameters, tables interpolate exactly, a tiny CPU run works end to end."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import yaml

from conftest import REPO, scenario
from pdsim import fitting
from pdsim.__main__ import main
from pdsim.costmodel import RooflineCost
from pdsim.devices import DeviceProfile, ProfileSpec, get_device, load_profile_file
from pdsim.errors import ConfigError
from pdsim.models import get_model
from pdsim.profile_tables import MeasuredTables

LLAMA8 = get_model("llama-3.1-8b")


# --- (1) the fit ---------------------------------------------------------------------------
def test_fit_recovers_known_roofline_parameters():
    C, B, m_half, ov = 0.55e12, 17e9, 24.0, 35e-6
    shapes = [(768, 4096), (4096, 512), (3584, 4096), (4096, 1792), (16032, 4096), (256, 256)]
    ms = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    m, n, k = (np.array(v) for v in zip(*[(mm, nn, kk) for nn, kk in shapes for mm in ms]))
    t = fitting.gemm_model(m, n, k, C, B, m_half, ov)
    fit = fitting.fit_gemm(m, n, k, t)
    for key, want in (("compute_Fps", C), ("bandwidth_Bps", B), ("m_half", m_half), ("overhead_s", ov)):
        assert fit[key] == pytest.approx(want, rel=0.01), key
    # attention: one free rate at a time, overhead and the other rate fixed
    tok = np.array([128, 256, 512, 1024, 2048, 4096])
    fl, by = fitting.attention_flops_bytes(tok, tok * tok / 2.0, tok, 32, 8, 128)
    tp = fitting.attention_model(fl, by, 0.21e12, B, ov)
    assert fitting.fit_rate(fl, by, tp, ov, B=B)["compute_Fps"] == pytest.approx(0.21e12, rel=0.01)
    bs, ctx = np.meshgrid([1, 4, 16, 64], [256, 1024, 4096])
    fl, by = fitting.attention_flops_bytes(bs, bs * ctx, bs * ctx, 32, 8, 128)
    td = fitting.attention_model(fl, by, 0.1e12, 9e9, ov)
    assert fitting.fit_rate(fl.ravel(), by.ravel(), td.ravel(), ov, C=0.1e12)["bandwidth_Bps"] == \
        pytest.approx(9e9, rel=0.01)


def test_efficiency_raises_a_peak_the_measurement_exceeds():
    eff, peak, bw, notes = fitting.to_efficiency({"gemm_C": 0.6e12, "gemm_B": 18e9, "attn_prefill_C": 0.1e12,
                                                  "attn_decode_B": 4e9}, 0.19e12, 20e9)
    assert peak == 0.6e12 and eff["gemm_max"] == 1.0 and bw == 20e9
    assert eff["memory"] == pytest.approx(0.9) and len(notes) == 1 and "raised" in notes[0]


# --- (2) interpolation ----------------------------------------------------------------------
def _measured_spec(**measured) -> ProfileSpec:
    base = get_device("cpu-epyc-2c").spec.model_dump()
    return ProfileSpec.model_validate({**base, "name": "t", "source": "test tables",
                                       "measured": {"device": "cpu", **measured}})


GEMM = {"n": 512, "k": 256, "m": [1, 4, 16, 64, 256], "time_s": [1e-4, 1.1e-4, 2e-4, 6e-4, 2.2e-3]}


def test_gemm_table_exact_at_points_monotone_between_none_outside():
    prof = DeviceProfile(_measured_spec(gemm=[GEMM]))
    for m, t in zip(GEMM["m"], GEMM["time_s"]):
        assert prof.tables.gemm_time(m, 512, 256, "bf16") == t
        assert prof.gemm_time(m, 512, 256, 2.0) == t      # the table wins over the roofline
    xs = np.geomspace(1, 256, 400)
    ys = [prof.tables.gemm_time(x, 512, 256, "bf16") for x in xs]
    assert all(b >= a for a, b in zip(ys, ys[1:]))
    # log-space: the geometric midpoint of M gets the geometric mean of the times
    assert prof.tables.gemm_time(32, 512, 256, "bf16") == pytest.approx(math.sqrt(2e-4 * 6e-4))
    assert prof.tables.gemm_time(512, 512, 256, "bf16") is None          # outside: roofline
    assert prof.tables.gemm_time(4, 512, 128, "bf16") is None            # never measured (n, k)
    roof = DeviceProfile(get_device("cpu-epyc-2c").spec)
    assert prof.gemm_time(512, 512, 256, 2.0) == pytest.approx(roof.gemm_time(512, 512, 256, 2.0))
    # the cost model, outside the measured M range: the roofline's shape anchored to the table's last point
    from pdsim import kernels
    t, code = kernels.gemm_time(prof, 512, 512, 256, 2.0)
    assert t == pytest.approx(2.2e-3 * roof.gemm_time(512, 512, 256, 2.0) / roof.gemm_time(256, 512, 256, 2.0))
    assert kernels.SOURCE_NAMES[code] == "extrapolated"
    t, code = kernels.gemm_time(prof, 4, 512, 128, 2.0)
    assert t == pytest.approx(roof.gemm_time(4, 512, 128, 2.0)) and kernels.SOURCE_NAMES[code] == "roofline"


def test_attention_tables_prefill_batches_and_decode_grid():
    pre = {"q_heads": 4, "kv_heads": 1, "head_dim": 128, "seq_len": [64, 256, 1024], "time_s": [1e-4, 8e-4, 9e-3]}
    dec = {"q_heads": 4, "kv_heads": 1, "head_dim": 128, "batch": [1, 4], "context": [128, 512],
           "time_s": [[1e-4, 2e-4], [3e-4, 9e-4]]}
    tab = MeasuredTables.from_profile(_measured_spec(attention_prefill=[pre], attention_decode=[dec]))
    for s, t in zip(pre["seq_len"], pre["time_s"]):
        assert tab.attention_time(True, (s, s * s / 2.0, s, 1, 4, 1, 128)) == t
    # three prompts of 256 as aggregates: three times one prompt
    assert tab.attention_time(True, (768, 3 * 256 * 128.0, 768, 3, 4, 1, 128)) == pytest.approx(3 * 8e-4)
    assert tab.attention_time(True, (4096, 4096 * 2048.0, 4096, 1, 4, 1, 128)) is None
    assert tab.attention_time(True, (256, 256 * 128.0, 256, 1, 8, 1, 128)) is None   # other heads
    for i, b in enumerate(dec["batch"]):
        for j, c in enumerate(dec["context"]):
            assert tab.attention_time(False, (b, float(b * c), b * c, b, 4, 1, 128)) == dec["time_s"][i][j]
    mid = tab.attention_time(False, (2, 2 * 256.0, 2 * 256, 2, 4, 1, 128))
    assert mid == pytest.approx(math.exp(np.mean(np.log([1e-4, 2e-4, 3e-4, 9e-4]))))
    assert tab.attention_time(False, (8, 8 * 256.0, 8 * 256, 8, 4, 1, 128)) is None


# --- (3) a tiny CPU calibration end to end ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    pytest.importorskip("torch")
    from pdsim import calibrate
    out = tmp_path_factory.mktemp("cal") / "tiny-measured.yaml"
    plan = calibrate.Plan([1, 2, 3, 4, 6, 8], [16, 24, 32, 48, 64], [1, 2, 4], [64, 128, 256], [2 ** 20],
                          repeats=2, warmup=1, point_budget_s=0.2, unseen_m=2)
    # force: on a shared machine some points may stay noisy; what is measured is still written and marked
    prof = calibrate.run("cpu", "llama-3.1-8b", [8], plan=plan, out=out, progress=False, stream=open("/dev/null", "w"),
                         force=True)
    return out, prof


def test_tiny_calibration_writes_a_valid_profile(tiny_profile):
    out, prof = tiny_profile
    dev = load_profile_file(out)
    assert dev.is_measured and dev.source.startswith("measured by pdsim calibrate on ")
    meta = dev.spec.meta
    assert {"torch", "cuda", "date", "host", "wall_s"} <= set(meta)
    ms = dev.spec.measured
    assert {g.op for g in ms.gemm} == {"qkv", "attn_out", "gate_up", "down", "lm_head"}
    # raw samples kept: at least `repeats` of them (more while the median is unsettled), the table holds
    # their median
    assert all(2 <= len(s) <= 40 for g in ms.gemm for s in g.samples_s)
    assert all(t == pytest.approx(float(np.median(s)), rel=1e-4) for g in ms.gemm
               for t, s in zip(g.time_s, g.samples_s))
    noise = dev.spec.fitted["noise"]
    assert noise["points"] == sum(len(g.m) for g in ms.gemm + ms.holdout.gemm) + sum(
        len(t.seq_len) for t in ms.attention_prefill + ms.holdout.attention_prefill) + sum(
        len(t.batch) * len(t.context) for t in ms.attention_decode + ms.holdout.attention_decode) + sum(
        len(t.bytes) for t in ms.transfers)
    assert 0 <= noise["stable"] <= noise["points"]
    assert ms.holdout.gemm and ms.holdout.attention_prefill and ms.holdout.attention_decode
    assert {"gemm", "attention_prefill", "attention_decode", "holdout_error"} <= set(dev.spec.fitted)
    assert dev.spec.efficiency.kernel_overhead_us == dev.spec.fitted["gemm"]["kernel_overhead_us"]
    # the sharded shapes at tp=8 are in the tables, keyed by (n, k): the table point comes back exactly
    g = ms.gemm[0]
    assert dev.gemm_time(g.m[0], g.n, g.k, 2.0) == g.time_s[0]
    # held-out M values are not in the table
    assert not set(ms.holdout.gemm[0].m) & set(g.m)


def test_simulation_runs_on_the_measured_profile(tiny_profile):
    from pdsim.simulation import simulate
    out, _ = tiny_profile
    topo = {"kind": "colocated", "replicas": 1, "tp": 8, "device": str(out), "cost_model": {"kind": "roofline"}}
    sc = scenario({"m": topo}, rate=2.0, num_requests=4, prompt_tokens=40, output_tokens=4)
    res = simulate(sc)
    reqs = res[0].requests
    # finish_s is a float (NaN until set): check the run really finished each request, after it arrived
    assert len(reqs) == 4 and all(r.status == "finished" and r.finish_s > r.first_token_s > r.arrival_s
                                  and r.generated == 4 for r in reqs)
    cm = RooflineCost(LLAMA8, load_profile_file(out), 8)
    first = min(reqs, key=lambda r: r.arrival_s)
    assert first.first_token_s - first.arrival_s >= cm.prefill_time(40) * (1 - 1e-9)


def test_check_remeasures_the_holdout(tiny_profile, capsys):
    from pdsim import calibrate
    out, _ = tiny_profile
    errs = calibrate.check(out, progress=False)
    assert {"qkv", "attn_prefill", "attn_decode", "all", "noise", "verdict"} <= set(errs)
    noise, text = errs["noise"], capsys.readouterr().out
    assert noise["points"] == errs["all"]["n"]
    # real timings on a shared machine: either verdict can be right, but it must follow the noise measured
    if noise["stable"] >= 0.8 * noise["points"]:
        assert errs["verdict"] == "judged" and "median APE" in text
    else:
        assert errs["verdict"] == "machine too noisy to judge" and "too noisy" in text


# --- (3b) noise: a point is sampled until its median is settled; a noisy machine is named as such ---------
class FakeClock:
    """A clock that advances by each sample's own time (no wall-clock dependence)."""
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _sampler(times, clock):
    it = iter(times)

    def measure():
        t = next(it)
        clock.now += t
        return t
    return measure


def test_median_ci_is_the_binomial_order_statistics():
    xs = list(range(1, 101))   # n = 100: ranks floor(50 - 9.8) and ceil(51 + 9.8): the textbook 40th and 61st
    assert calibrate_mod().median_ci(xs) == (40, 61)
    assert calibrate_mod().median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)   # small n: the whole range


def test_sampling_stops_when_settled_and_reports_noise():
    cal = calibrate_mod()
    clock = FakeClock()
    quiet = [1e-3 * (1 + 0.001 * (-1) ** i) for i in range(100)]
    samples, ci = cal.sample_until_stable(_sampler(quiet, clock), 5, 40, 10.0, 0.03, clock)
    assert len(samples) == 5 and ci <= 0.03                  # settled at the minimum
    rng = np.random.default_rng(0)
    noisy = list(1e-3 * rng.lognormal(0.0, 0.6, 100))        # a loaded machine: +-60% swings
    clock = FakeClock()
    samples, ci = cal.sample_until_stable(_sampler(noisy, clock), 5, 40, 10.0, 0.03, clock)
    assert len(samples) == 40 and ci > 0.03                  # never settles: reported, not hidden
    clock = FakeClock()
    samples, _ = cal.sample_until_stable(_sampler(noisy, clock), 5, 40, 0.01, 0.03, clock)
    assert 5 <= len(samples) < 40                            # the time budget stops it, after the minimum
    clock = FakeClock()
    slow = [2.0] * 10                                        # one call outlasts the whole budget
    samples, _ = cal.sample_until_stable(_sampler(slow, clock), 5, 40, 1.0, 0.03, clock)
    assert len(samples) == 3


def calibrate_mod():
    from pdsim import calibrate
    return calibrate


def _noisy_timer(seed=0, sigma=0.6):
    rng = np.random.default_rng(seed)
    return lambda bench, fn: float(1e-4 * rng.lognormal(0.0, sigma))


TINY_PLAN = dict(gemm_m=[1, 2, 4], prefill_seq=[16, 32, 64], decode_batch=[1, 2], decode_context=[64, 128],
                 copy_bytes=[2 ** 20], repeats=3, warmup=1, point_budget_s=0.05, max_repeats=12, unseen_m=1)


def test_noisy_machine_refuses_to_write_unless_forced(tmp_path):
    pytest.importorskip("torch")
    from pdsim import calibrate
    out = tmp_path / "noisy.yaml"
    plan = calibrate.Plan(**TINY_PLAN)
    with pytest.raises(ConfigError) as ei:
        calibrate.run("cpu", "llama-3.1-8b", [8], plan=plan, out=out, progress=False,
                      stream=open("/dev/null", "w"), timer=_noisy_timer())
    msg = str(ei.value)
    assert "too noisy" in msg and "--force" in msg and "\n" not in msg and not out.exists()
    calibrate.run("cpu", "llama-3.1-8b", [8], plan=plan, out=out, progress=False, stream=open("/dev/null", "w"),
                  timer=_noisy_timer(), force=True)
    noise = load_profile_file(out).spec.fitted["noise"]
    assert noise["stable"] < noise["points"] and noise["worst_rel_ci"] > 0.03
    # a quiet machine (every call the same time) writes without --force
    quiet = tmp_path / "quiet.yaml"
    calibrate.run("cpu", "llama-3.1-8b", [8], plan=plan, out=quiet, progress=False, stream=open("/dev/null", "w"),
                  timer=lambda bench, fn: 1e-4)
    assert load_profile_file(quiet).spec.fitted["noise"]["stable"] == load_profile_file(quiet).spec.fitted[
        "noise"]["points"]


def test_check_on_a_noisy_machine_says_so_instead_of_a_false_error(tmp_path, capsys):
    pytest.importorskip("torch")
    from pdsim import calibrate
    out = tmp_path / "p.yaml"
    plan = calibrate.Plan(**TINY_PLAN)
    calibrate.run("cpu", "llama-3.1-8b", [8], plan=plan, out=out, progress=False, stream=open("/dev/null", "w"),
                  timer=lambda bench, fn: 1e-4)
    capsys.readouterr()
    errs = calibrate.check(out, progress=False, timer=_noisy_timer(1))
    text = capsys.readouterr().out
    assert errs["verdict"] == "machine too noisy to judge" and "machine too noisy to judge" in text
    assert "median APE" not in text                         # no error table passed off as a judgement
    errs = calibrate.check(out, progress=False, timer=lambda bench, fn: 1e-4)
    assert errs["verdict"] == "judged" and "median APE" in capsys.readouterr().out
    # the profile's tables hold 1e-4 s everywhere, so re-measuring 1e-4 s at held-out points is no error
    assert errs["qkv"]["median_ape"] == pytest.approx(0.0, abs=1e-6)


# --- (4) bad input ---------------------------------------------------------------------------------
def _bad(tmp_path, mutate) -> str:
    raw = get_device("cpu-epyc-2c").spec.model_dump()
    mutate(raw)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as ei:
        load_profile_file(p)
    return str(ei.value)


def test_bad_profiles_name_the_file_and_key(tmp_path):
    msg = _bad(tmp_path, lambda r: r.pop("memory_bandwidth_GBps"))
    assert "bad.yaml" in msg and "memory_bandwidth_GBps" in msg and "missing" in msg.lower()
    msg = _bad(tmp_path, lambda r: r.__setitem__("memory_bandwidth_GBps", -5))
    assert "bad.yaml" in msg and "memory_bandwidth_GBps = -5" in msg
    msg = _bad(tmp_path, lambda r: r["interconnect"].__setitem__("bandwidth_GBps", -1))
    assert "interconnect.bandwidth_GBps" in msg
    bad_table = {"device": "cpu", "gemm": [{**GEMM, "time_s": GEMM["time_s"][:-1]}]}
    msg = _bad(tmp_path, lambda r: r.__setitem__("measured", bad_table))
    assert "measured.gemm.0" in msg and "time_s has 4 values for 5 m values" in msg


def test_cuda_without_gpu_is_a_clear_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    rc = main(["calibrate", "--device", "cuda", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("pdsim: error: --device = 'cuda': no CUDA GPU") and err.count("\n") == 1


def test_missing_torch_gives_the_install_hint(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)      # import torch -> ImportError
    rc = main(["calibrate", "--device", "cpu", "--quick", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install torch==2.13.0" in err


def test_check_of_a_datasheet_profile_is_a_clear_error(capsys):
    rc = main(["calibrate", "--check", str(REPO / "pdsim/data/devices/cpu-epyc-2c.yaml")])
    assert rc == 2 and "measured.holdout" in capsys.readouterr().err


def test_committed_cpu_profile_validates_and_serves_its_tables():
    path = REPO / "calibration/profiles/cpu-epyc-2c-measured.yaml"
    if not path.is_file():
        pytest.skip("no committed measured profile yet")
    dev = get_device(str(path))
    assert dev.is_measured and dev.spec.measured.device == "cpu"
    g = dev.spec.measured.gemm[0]
    assert dev.gemm_time(g.m[-1], g.n, g.k, 2.0) == g.time_s[-1]
    assert RooflineCost(LLAMA8, dev).decode_time(4, 1000) > 0


def test_profile_tables_and_fitting_import_without_torch():
    import subprocess
    code = ("import sys; sys.modules['torch'] = None; import pdsim.profile_tables, pdsim.fitting, pdsim.calibrate, "
            "pdsim.devices; assert 'torch' not in [k for k, v in sys.modules.items() if v is not None]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_grid_descent_stops_at_a_coordinatewise_grid_minimum():
    # f = (x - y)^2 + (y - 3)^2 + 0.1 (x - 1)^2 couples x and y: one pass from (0, 0) stops short (x follows
    # y's old value); repeated passes go on until no single coordinate can improve on its grid
    grid = [i * 0.5 for i in range(13)]                    # 0 .. 6
    f = lambda x, y: (x - y) ** 2 + (y - 3) ** 2 + 0.1 * (x - 1) ** 2     # noqa: E731
    x, y = fitting.grid_descent(f, [grid, grid], [0.0, 0.0])
    assert all(f(x, y) <= f(v, y) for v in grid) and all(f(x, y) <= f(x, v) for v in grid)
    one_pass = fitting.grid_descent(f, [grid, grid], [0.0, 0.0], max_rounds=1)
    assert f(*one_pass) > f(x, y)
    # a coordinate-wise minimum, not always the grid's global one: a narrow diagonal valley stalls it at
    # (2.5, 2.5), where the brute-force minimum is (3, 3); the fits that use it start from the dense constants
    assert (x, y) == (2.5, 2.5) and min(((a, b) for a in grid for b in grid), key=lambda p: f(*p)) == (3.0, 3.0)
    # separable: the grid minimum exactly
    g = lambda a, b: (a - 1.5) ** 2 + abs(b - 4.0)        # noqa: E731
    assert fitting.grid_descent(g, [grid, grid], [6.0, 0.0]) == (1.5, 4.0)
