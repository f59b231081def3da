"""The report is one self-contained page, and its numbers are the ones in summary.json."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pdsim import config
from pdsim.output import write_outputs
from pdsim.report import build_report
from pdsim.simulation import simulate

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Report(HTMLParser):
    """Collects the summary table's data-key cells, the best-marked row, images and every src/href."""

    def __init__(self):
        super().__init__()
        self.in_summary = False
        self.topo = self.key = None
        self.cells: dict = {}
        self.best_rows: list = []
        self.imgs: list = []
        self.urls: list = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href"):
            if a.get(k):
                self.urls.append(a[k])
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "table" and "summary" in (a.get("class") or "").split():
            self.in_summary = True
        if not self.in_summary:
            return
        if tag == "tr" and "data-topology" in a:
            self.topo = a["data-topology"]
            if "best" in (a.get("class") or "").split():
                self.best_rows.append(self.topo)
        if tag == "td" and "data-key" in a:
            self.key = a["data-key"]
            self.cells[(self.topo, self.key)] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self.key = None
        if tag == "table":
            self.in_summary = False

    def handle_data(self, data):
        if self.key:
            self.cells[(self.topo, self.key)] += data.strip()


def _parse(html: str) -> _Report:
    p = _Report()
    p.feed(html)
    return p


def _value(d, dotted):
    for k in dotted.split("."):
        d = d[k]
    return d


def _assert_self_contained(html: str, p: _Report):
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:)?//', html, re.I)
    assert "<script" not in html.lower() and "<link" not in html.lower() and "@import" not in html
    assert all(u.startswith("data:") or u.startswith("#") for u in p.urls), p.urls
    assert p.imgs
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1], validate=True)[:8] == PNG_SIGNATURE


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick")
    sc = config.load(str(REPO / "scenarios/quickstart.yaml"), ["workload.num_requests=150"])
    write_outputs(simulate(sc), sc, out)
    html = (out / "report.html").read_text(encoding="utf-8")
    return out, html, json.loads((out / "summary.json").read_text())


def test_report_numbers_equal_summary_json(quick):
    _, html, summary = quick
    p = _parse(html)
    topos = summary["topologies"]
    assert {t for t, _ in p.cells} == set(topos)
    keys = {k for _, k in p.cells}
    assert {"ttft_s.p50", "ttft_s.p90", "ttft_s.p99", "tpot_s.p90", "e2e_s.p99", "slo_attainment", "gpus",
            "throughput.output_tokens_per_s_per_gpu", "cost_per_million_output_tokens_usd"} <= keys
    assert len(p.cells) == len(topos) * len(keys)
    for (topo, key), text in p.cells.items():
        want = _value(topos[topo], key)
        if want is None:
            assert text == "-", (topo, key)
        else:
            assert float(text) == pytest.approx(want, rel=1e-6, abs=1e-12), (topo, key, text, want)


def test_report_numbers_recomputed_from_the_raw_requests(quick):
    # an oracle that is not summary.json: the per-request rows (requests.csv), reduced here with numpy
    # by the definitions of README/DESIGN, and the GPU count from the scenario file
    import numpy as np
    import pandas as pd
    out, html, _ = quick
    cells = _parse(html).cells
    df = pd.read_csv(out / "requests.csv")
    slo = {"ttft_s": 0.5, "tpot_s": 0.05}                               # scenarios/quickstart.yaml
    gpus = {"colocated-4": 4, "colocated-4-chunked": 4, "disagg-3p1d": 4}
    for topo, d in df.groupby("topology"):
        fin = d[d.status == "finished"]
        ttft = d.ttft_s[d.status != "rejected"].dropna().to_numpy()
        for p in (50, 90, 99):
            assert float(cells[(topo, f"ttft_s.p{p}")]) == pytest.approx(np.percentile(ttft, p), rel=1e-5)
        e2e = (fin.finish_s - fin.arrival_s).to_numpy()                 # E2E from the raw timestamps
        assert float(cells[(topo, "e2e_s.p99")]) == pytest.approx(np.percentile(e2e, 99), rel=1e-5)
        tpot = ((fin.finish_s - fin.first_token_s) / (fin.output_tokens - 1))[fin.output_tokens > 1]
        assert float(cells[(topo, "tpot_s.p90")]) == pytest.approx(np.percentile(tpot, 90), rel=1e-5)
        ok = (d.status == "finished") & (d.first_token_s - d.arrival_s <= slo["ttft_s"]) & \
            ((d.output_tokens <= 1) | ((d.finish_s - d.first_token_s) / (d.output_tokens - 1) <= slo["tpot_s"]))
        assert float(cells[(topo, "slo_attainment")]) == pytest.approx(ok.mean(), rel=1e-5)
        assert int(float(cells[(topo, "gpus")])) == gpus[topo]


def test_best_topology_is_marked(quick):
    _, html, summary = quick
    topos = summary["topologies"]

    def rank(n):
        t = topos[n]
        att, cost = t["slo_attainment"], t["cost_per_million_output_tokens_usd"]
        return (-1 if att is None else att, -(float("inf") if cost is None else cost))
    assert _parse(html).best_rows == [max(topos, key=rank)]
    assert "PASS" in html or "FAIL" in html


def test_self_contained_small_and_has_all_sections(quick):
    out, html, summary = quick
    p = _parse(html)
    _assert_self_contained(html, p)
    assert (out / "report.html").stat().st_size < 3 * 1024 * 1024
    for title in ("CDF of TTFT", "CDF of TPOT", "Where the time goes", "Over time per pool", "KV-cache transfer",
                  'class="card'):
        assert title in html
    assert summary["scenario"]["name"] in html and str(summary["pdsim_version"]) in html


def test_build_report_rebuilds_from_files(quick):
    out, html, _ = quick
    path = build_report(out)
    assert path == out / "report.html"
    assert _parse(path.read_text(encoding="utf-8")).cells == _parse(html).cells


@pytest.mark.parametrize("n", [1, 5])
def test_one_and_five_topologies_render(tmp_path, n):
    sc = config.load(str(REPO / "scenarios/quickstart.yaml"), ["workload.num_requests=40"])
    raw = sc.model_dump(mode="json")
    kinds = [{"kind": "colocated", "replicas": 1, "device": "h100-sxm"},
             {"kind": "colocated", "replicas": 2, "device": "h100-sxm", "chunked_prefill": {"token_budget": 512}},
             {"kind": "disaggregated", "prefill": {"instances": 1, "device": "h100-sxm"},
              "decode": {"instances": 1, "device": "h100-sxm"}, "kv_link": {"preset": "infiniband"}}]
    raw = {k: raw[k] for k in ("name", "description", "seed", "model", "workload", "slo") if k in raw}
    raw["topologies"] = {f"t{i}": kinds[i % len(kinds)] for i in range(n)}
    sc = config.parse(raw, "x.yaml")
    write_outputs(simulate(sc), sc, tmp_path)
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    p = _parse(html)
    assert {t for t, _ in p.cells} == {f"t{i}" for i in range(n)}
    _assert_self_contained(html, p)
    assert ("KV-cache transfer" in html) == (n >= 3)


def test_headless_chromium_renders_offline(quick, tmp_path):
    import matplotlib.image as mpimg

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed under CI (apt-get install -y chromium)")
        pytest.skip("chromium not installed")
    out, _, summary = quick
    url = (out / "report.html").as_uri()
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'prof'}",
            "--proxy-server=127.0.0.1:9",        # an unreachable proxy: any external fetch would fail
            "--window-size=1200,2000"]
    dom = subprocess.run(base + ["--enable-logging=stderr", "--v=0", "--dump-dom", url], capture_output=True,
                         text=True, timeout=120)
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console                # no console errors (the page has no script to raise any)
    assert "net::ERR" not in dom.stderr        # nothing tried to load from the network
    assert f"<title>pdsim report: {summary['scenario']['name']}</title>" in dom.stdout, dom.stderr[-2000:]
    assert 'class="summary"' in dom.stdout
    shot = tmp_path / "shot.png"
    r = subprocess.run(base + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr[-2000:]
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    img = mpimg.imread(shot)
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.01          # not a single colour: the page painted
