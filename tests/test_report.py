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
from pdsim.report import build_report, pick_best
from pdsim.simulation import simulate

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Report(HTMLParser):
    """Collects the summary table's data-key cells, the best-marked row, images and every src/href."""

    def __init__(self):
        super().__init__()
        self.in_summary = False
        self.topo = self.key = None
        self.cells: dict = {}           # (topology, data-key) -> the text people read
        self.values: dict = {}          # (topology, data-key) -> data-value, the exact number
        self.svgs = 0
        self.scripts: list = []
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
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self.svgs += 1
        if tag == "script":
            self.scripts.append(a)
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
            self.values[(self.topo, self.key)] = a.get("data-value")

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
    # one inline script (table sorting), nothing loaded: no src, no <link>, no @import
    assert len(p.scripts) == 1 and not p.scripts[0].get("src"), p.scripts
    assert "<link" not in html.lower() and "@import" not in html
    assert all(u.startswith("data:") or u.startswith("#") for u in p.urls), p.urls
    assert p.svgs >= 3                          # charts are inline SVG
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


HUMAN = re.compile(r"^(–|[\d,]+(\.\d+)?(\u00a0(ms|s))?%?|\$[\d,]+(\.\d+)?)$")


def _sig_digits(text: str) -> int:
    digits = re.sub(r"[^\d]", "", text.split("\u00a0")[0]).lstrip("0")
    return len(digits)


def test_report_numbers_equal_summary_json_in_human_units(quick):
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
        value = p.values[(topo, key)]
        if want is None:
            assert text == "–" and value is None, (topo, key)
            continue
        assert float(value) == pytest.approx(want, rel=1e-12, abs=1e-15), (topo, key, value, want)
        assert HUMAN.match(text), (topo, key, text)
        if key.endswith(("_s.p50", "_s.p90", "_s.p99")):
            # latencies: milliseconds under 10 s, 3 significant figures (0.02562696 s reads 25.6 ms)
            unit = "ms" if want < 10 else "s"
            assert text.endswith("\u00a0" + unit), (key, text)
            shown = float(text.split("\u00a0")[0].replace(",", "")) / (1e3 if unit == "ms" else 1)
            assert shown == pytest.approx(want, rel=5e-3), (key, text, want)
            assert _sig_digits(text) <= 3 or float(text.split("\u00a0")[0].replace(",", "")) >= 1000, text


def test_report_numbers_recomputed_from_the_raw_requests(quick):
    # an oracle that is not summary.json: the per-request rows (requests.csv), reduced here with numpy
    # by the definitions of README/DESIGN, and the GPU count from the scenario file
    import numpy as np
    import pandas as pd
    out, html, _ = quick
    cells = _parse(html).values
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
        # the client's tokens: behind a PD proxy the first one it sees is the decode instance's first
        # (client.ttft_at: first_decode_token), so the prefill's token is not among the gaps
        streamed = fin.output_tokens - (1 if topo.startswith("disagg") else 0)
        tpot = ((fin.finish_s - fin.first_token_s) / (streamed - 1))[streamed > 1]
        assert float(cells[(topo, "tpot_s.p90")]) == pytest.approx(np.percentile(tpot, 90), rel=1e-5)
        ok = (d.status == "finished") & (d.first_token_s - d.arrival_s <= slo["ttft_s"]) & \
            ((d.output_tokens <= 1) | ((d.finish_s - d.first_token_s) / (d.output_tokens - 1) <= slo["tpot_s"]))
        assert float(cells[(topo, "slo_attainment")]) == pytest.approx(ok.mean(), rel=1e-5)
        assert int(float(cells[(topo, "gpus")])) == gpus[topo]


def test_human_units_by_hand():
    from pdsim.charts import num, pct, seconds
    assert seconds(0.02562696) == "25.6\u00a0ms"
    assert seconds(9.99) == "9,990\u00a0ms" and seconds(12.345) == "12.3\u00a0s" and seconds(4321.0) == "4,320\u00a0s"
    assert num(1234567.8) == "1,230,000" and num(1500) == "1,500" and num(0.000123) == "0.000123"
    assert num(9.9999999) == "10" and num(4.0) == "4" and num(0.025627) == "0.0256" and num(1.5) == "1.5"
    assert pct(0.8996) == "89.9%" and pct(1.0) == "100%" and pct(None) == "–"


def _topo(att, cost_h, noise=0.0):
    return {"passes": att >= 0.9, "attainment": att, "noise": noise}, {"cost_per_hour_usd": cost_h}


def _best(**configs):
    analysis = {n: a for n, (a, _) in configs.items()}
    topos = {n: t for n, (_, t) in configs.items()}
    return pick_best(analysis, topos)[0]


def test_best_only_for_a_passing_config_and_beyond_noise():
    # a failing config is never best, however cheap or close to the target
    assert _best(a=_topo(0.899, 1.0), b=_topo(0.95, 8.0)) == "b"
    assert _best(a=_topo(0.5, 1.0), b=_topo(0.85, 2.0)) is None
    # cheaper per hour wins among passing configs
    assert _best(a=_topo(0.99, 12.0), b=_topo(0.91, 8.0)) == "b"
    # same price: an attainment lead inside twice the batch-means noise is a tie, outside it a win
    assert _best(a=_topo(0.95, 8.0, 0.01), b=_topo(0.93, 8.0, 0.01)) is None       # lead 0.02 < 2*0.0141
    assert _best(a=_topo(0.99, 8.0, 0.005), b=_topo(0.93, 8.0, 0.005)) == "a"      # lead 0.06 > 2*0.0071
    # a $0.00002 difference (within 1% of the price) is not a reason to pick one
    assert _best(a=_topo(0.97, 11.96002, 0.01), b=_topo(0.97, 11.96, 0.01)) is None


def test_best_topology_is_marked_consistently(quick):
    _, html, summary = quick
    p = _parse(html)
    topos = summary["topologies"]
    assert len(p.best_rows) <= 1
    for n in p.best_rows:
        assert topos[n]["slo_attainment"] >= summary["scenario"]["slo"]["attainment_target"]
        assert "★ best" in html
    assert "PASS" in html or "FAIL" in html


def test_self_contained_small_and_has_all_sections(quick):
    out, html, summary = quick
    p = _parse(html)
    _assert_self_contained(html, p)
    assert (out / "report.html").stat().st_size < 3 * 1024 * 1024
    for title in ("CDF of TTFT", "CDF of TPOT", "CDF of ITL", "Where the time goes", "Over time per pool",
                  "KV-cache transfer", 'class="card', 'class="verdict"', "Which SLO binds"):
        assert title in html
    assert summary["scenario"]["name"] in html and str(summary["pdsim_version"]) in html


def test_build_report_rebuilds_from_files(quick):
    out, html, _ = quick
    path = build_report(out)
    assert path == out / "report.html"
    assert _parse(path.read_text(encoding="utf-8")).values == _parse(html).values


@pytest.mark.parametrize("n", [1, 5])
def test_one_and_five_topologies_render(tmp_path, n):
    sc = config.load(str(REPO / "scenarios/quickstart.yaml"), ["workload.num_requests=40"])
    raw = sc.model_dump(mode="json", exclude_unset=True)
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


# --- the verdict names the binding SLO ------------------------------------------------------------
def _md1_like(rate: float, slo: dict, n: int = 400) -> config.Scenario:
    """One batch-1 replica, every step 10 ms: a request is 1 prefill step + 2 decode steps, so its TPOT is
    exactly 10 ms (two 10 ms steps over 3 - 1 tokens) and its TTFT is its queueing wait + 10 ms."""
    return config.parse({"seed": 0, "model": "llama-3.1-8b", "slo": slo,
                         "workload": {"arrival": "poisson", "rate": rate, "num_requests": n, "prompt_tokens": 8,
                                      "output_tokens": 3},
                         "topologies": {"c": {"kind": "colocated", "replicas": 1, "max_running": 1,
                                              "kv_blocks": 100000, "cost_model": {"kind": "constant", "step_s": 0.01}}}},
                        "verdict.yaml")


def _verdict(tmp_path, sc):
    write_outputs(simulate(sc), sc, tmp_path)
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    text = re.search(r'<p class="verdict"[^>]*>(.*?)</p>', html, re.S).group(1)
    import html as _h
    binding = re.search(r'<td data-value="(\w+)" data-key="binding">', html).group(1)
    return _h.unescape(text).replace("\u00a0", " "), binding


def test_verdict_names_tpot_when_tpot_binds(tmp_path):
    # TPOT is 10 ms for every request (hand: 2 steps of 10 ms / 2 gaps) against a 5 ms bound: all miss it,
    # while TTFT (a lightly loaded queue, rho = 5 x 30 ms = 0.15) is far inside 10 s
    text, binding = _verdict(tmp_path, _md1_like(5.0, {"ttft_s": 10.0, "tpot_s": 0.005, "attainment_target": 0.9}))
    assert binding == "tpot"
    assert "c fails" in text and "attainment 0.0% < 90.0%" in text, text
    assert "TPOT p90 10 ms vs 5 ms bound (100% over) binds" in text, text
    assert "100% of requests miss it" in text, text
    # and why: TPOT is flat (p10 = p90 = 10 ms), so no interference is blamed
    assert "every decode step itself is slow: TPOT p10 10 ms" in text and "prefills stall" not in text, text
    assert text.startswith("At 5 requests/s (400 requests), 0 of 1 topologies meet the SLO"), text


def test_verdict_names_ttft_when_ttft_binds(tmp_path):
    # rho = 30 req/s x 30 ms = 0.9: queueing pushes TTFT far past 30 ms, while TPOT stays 10 ms << 1 s
    text, binding = _verdict(tmp_path, _md1_like(30.0, {"ttft_s": 0.03, "tpot_s": 1.0, "attainment_target": 0.9}))
    assert binding == "ttft"
    m = re.search(r"c fails .*?; TTFT p90 ([\d,.]+) ms vs 30 ms bound \(([\d,.]+)% over\) binds", text)
    assert m, text
    assert float(m.group(1).replace(",", "")) > 30
    assert "requests queue for prefill" in text, text


def test_verdict_says_pass_and_headroom(tmp_path):
    # the same light load with loose bounds passes; TPOT binds at 10 ms of 100 ms = 90% headroom
    text, binding = _verdict(tmp_path, _md1_like(5.0, {"ttft_s": 10.0, "tpot_s": 0.1, "attainment_target": 0.9}))
    assert binding == "tpot"
    assert "1 of 1 topologies meet the SLO" in text and "TPOT p90 10 ms vs 100 ms bound (90.0% headroom)" in text
    assert "Best: c is the only topology that meets the SLO" in text


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
    assert not console, console                # no console errors from the sorting script
    assert "net::ERR" not in dom.stderr        # nothing tried to load from the network
    assert f"<title>pdsim report: {summary['scenario']['name']}</title>" in dom.stdout, dom.stderr[-2000:]
    assert 'class="sortable summary"' in dom.stdout and 'title="click to sort"' in dom.stdout   # the script ran
    shot = tmp_path / "shot.png"
    r = subprocess.run(base + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr[-2000:]
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    img = mpimg.imread(shot)
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.01          # not a single colour: the page painted


# Injected into a copy of the page: lists every element whose content is wider than its box, anything
# that sticks out past the viewport, and charts drawn so small that their 14-unit text is under 10 pt.
OVERFLOW_PROBE = """<script>
var bad = [], vw = document.documentElement.clientWidth;
document.querySelectorAll('body *').forEach(function (e) {
  if (e.closest('svg') && e.tagName.toLowerCase() !== 'svg') return;
  var name = e.tagName + (e.className && e.className.baseVal === undefined ? '.' + e.className : '');
  if (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1) bad.push(name + ' scroll ' + e.scrollWidth + '>' + e.clientWidth);
  var r = e.getBoundingClientRect();
  if (r.width > 0 && r.right > vw + 1) bad.push(name + ' right ' + Math.round(r.right) + '>' + vw);
});
if (document.documentElement.scrollWidth > vw + 1) bad.push('page ' + document.documentElement.scrollWidth + '>' + vw);
document.querySelectorAll('svg.chart').forEach(function (s) {
  var k = s.getBoundingClientRect().width / s.viewBox.baseVal.width;
  if (14 * k < 13.3) bad.push('chart text ' + (14 * k).toFixed(1) + 'px < 10pt');
});
document.body.setAttribute('data-probe', JSON.stringify(bad));
</script></body>"""


def _overflows(html_path: Path, tmp_path: Path, width: int) -> list:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed under CI (apt-get install -y chromium)")
        pytest.skip("chromium not installed")
    probe = tmp_path / f"probe-{width}.html"
    probe.write_text(html_path.read_text(encoding="utf-8").replace("</body>", OVERFLOW_PROBE), encoding="utf-8")
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          f"--user-data-dir={tmp_path / 'prof'}", "--proxy-server=127.0.0.1:9",
                          f"--window-size={width},1200", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r'data-probe="([^"]*)"', dom.stdout)
    assert m, dom.stderr[-2000:]
    import html as _h
    return json.loads(_h.unescape(m.group(1)))


@pytest.mark.parametrize("width", [1024, 1400])
def test_nothing_overflows_in_chromium(quick, tmp_path, width):
    """Three topologies (quickstart): no element's content is wider than its box at 1024 or 1400 px."""
    out, _, _ = quick
    assert _overflows(out / "report.html", tmp_path, width) == []


def test_itl_from_the_run_when_recorded_else_approximated_and_said(quick, tmp_path):
    out, html, summary = quick
    # today's runs record token times (client.itl: auto): the ITL table is the recorded gaps' percentiles
    itl = html[html.index("CDF of ITL"):]
    itl = itl[:itl.index("</table>")]
    assert "Approximated: per-token gaps" not in html
    for t in summary["topologies"].values():
        rec = t["itl_s"]
        assert rec["quantiles"][0] <= rec["p50"] <= rec["p90"] <= rec["p99"] <= rec["quantiles"][-1]
        assert rec["quantiles"] == sorted(rec["quantiles"]) and len(rec["quantiles"]) == 201
        assert rec["quantiles"][100] == pytest.approx(rec["p50"], rel=1e-9)   # the 50% level is the median
        assert f'<td data-value="{rec["p99"]!r}">' in itl
    # a run without recorded gaps: approximated from TPOT, and the page says so
    dst = tmp_path / "itl"
    shutil.copytree(out, dst)
    s = json.loads((dst / "summary.json").read_text())
    for t in s["topologies"].values():
        t.pop("itl_s")
    (dst / "summary.json").write_text(json.dumps(s))
    page = build_report(dst, progress=False).read_text(encoding="utf-8")
    assert "Approximated: per-token gaps are not recorded" in page
    # a per-row ITL column (another tool's export) is used as is
    import pandas as pd
    df = pd.read_csv(dst / "requests.csv")
    df["itl_s"] = 0.004
    df.to_csv(dst / "requests.csv", index=False)
    page = build_report(dst, progress=False).read_text(encoding="utf-8")
    assert "Approximated: per-token gaps" not in page
    itl = page[page.index("CDF of ITL"):]
    assert "<td data-value=\"0.004\">4\u00a0ms</td>" in itl[:itl.index("</table>")]


def test_report_follows_the_runs_own_verdict_and_mode(quick, tmp_path):
    """When summary.json says slo_met (e.g. percentile mode, semantics branch), the page agrees with it,
    even where attainment alone would say PASS."""
    out, _, _ = quick
    dst = tmp_path / "pct"
    shutil.copytree(out, dst)
    s = json.loads((dst / "summary.json").read_text())
    first = next(iter(s["topologies"]))
    for name, t in s["topologies"].items():
        t["slo"] = {"mode": "percentile"}
        t["slo_met"] = name != first
    (dst / "summary.json").write_text(json.dumps(s))
    page = build_report(dst, progress=False).read_text(encoding="utf-8")
    row = re.search(rf'<tr data-topology="{re.escape(first)}"[^>]*>(.*?)</tr>', page, re.S).group(1)
    assert '<td data-value="FAIL" class="fail">FAIL</td>' in row
    assert "percentile mode" in page and f"{first} fails" in page
    assert _parse(page).best_rows != [first]


def test_cli_table_truncates_attainment_as_the_report_does(capsys):
    """0.58668 reads 58.6% on the page (charts.pct truncates) and must read the same in the CLI table, and
    0.8996 must never print 90.0% beside a missed 90% target."""
    from pdsim.__main__ import _att, print_summary
    from pdsim.charts import pct
    for x in (0.58668, 0.8996, 0.9, 1.0, 0.0):
        assert float(_att(x)[:-1]) == float(pct(x)[:-1])
    assert (_att(0.8996), _att(0.58668), _att(1.0), _att(None)) == ("89.9%", "58.6%", "100.0%", "-")
    nan = {"p50": None, "p90": None, "p99": None}
    print_summary({"t": {"ttft_s": nan, "tpot_s": nan, "e2e_s": nan, "gpus": 1,
                         "requests": {"finished": 1, "total": 1}, "slo_attainment": 0.8996,
                         "throughput": {"output_tokens_per_s_per_gpu": 1.0},
                         "cost_per_million_output_tokens_usd": None}})
    out = capsys.readouterr().out
    assert "89.9%" in out and "90.0%" not in out


def test_a_run_that_rejects_every_request_says_so_on_stderr(tmp_path, capsys):
    """Five 120,000-token prompts against a 100-block pool of 16 tokens: all five rejected for KV capacity; the
    run exits 0 (the rejections are its result) but says so in one line per topology, not only in summary.json."""
    from pdsim.__main__ import main
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama-3.1-8b\nworkload: {rate: 1, num_requests: 5, prompt_tokens: 120000, output_tokens: 4}\n"
                  "topologies: {c: {kind: colocated, kv_blocks: 100, cost_model: {kind: constant, step_s: 0.01}}}\n")
    assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--quiet", "--no-report"]) == 0
    err = capsys.readouterr().err
    assert "pdsim: c: 5 of 5 requests rejected (kv_capacity 5); each one's reason is in the reject_reason column " \
           "(none was served)" in err


def test_a_warning_is_one_pdsim_line_not_a_source_excerpt(tmp_path):
    """A shared prefix that no pool caches warns once: 'pdsim: warning: ...' on one line, no file:line and no
    code excerpt from inside pdsim (a real process: pytest records warnings itself)."""
    import subprocess
    import sys
    sc = tmp_path / "s.yaml"
    sc.write_text("model: llama-3.1-8b\nworkload: {rate: 1, num_requests: 2, prompt_tokens: 40, output_tokens: 2, "
                  "shared_prefix_tokens: 24}\n"
                  "topologies: {c: {kind: colocated, kv_blocks: 100, cost_model: {kind: constant, step_s: 0.01}}}\n")
    p = subprocess.run([sys.executable, "-m", "pdsim", "run", str(sc), "--out", str(tmp_path / "o"), "--quiet",
                        "--no-report"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if not x.startswith("wrote ") and x.strip()]
    assert lines == ["pdsim: warning: workload.shared_prefix_tokens = 24: no pool caches prefixes (no prefix_cache "
                     "key, no engine that caches by default), so the shared prefix is computed again for every request"]
    # another library's warning keeps its own form (file:line: Category: message), not a pdsim label
    code = ("import sys, warnings; from pdsim.__main__ import main; main(['list', 'links']); "
            "warnings.warn_explicit('elsewhere', UserWarning, '/usr/lib/other/mod.py', 7)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "/usr/lib/other/mod.py:7: UserWarning: elsewhere" in p.stderr and "pdsim: warning" not in p.stderr


@pytest.mark.parametrize("pool, warns", [
    ({"router": "kv_aware"}, True),                                          # nothing caches: it warns
    ({"router": "prefix_aware", "prefix_cache": {"enabled": True}}, False),  # a cache: fine
    ({"router": "kv_aware", "device": "h100-sxm", "engine": "vllm-v1"}, False),  # the engine caches by default
])
def test_a_cache_aware_router_over_a_pool_without_a_cache_warns(pool, warns):
    import warnings
    from pdsim import config
    from pdsim.simulation import simulate
    base = {"kind": "colocated", "replicas": 2, "kv_blocks": 1000, "cost_model": {"kind": "constant", "step_s": 0.01}}
    if "device" in pool:
        base.pop("cost_model")
        base.pop("kv_blocks")
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"rate": 5, "num_requests": 3},
                       "topologies": {"t": {**base, **pool}}}, "s.yaml")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        simulate(sc)
    said = [str(w.message) for w in seen if "caches no prefixes" in str(w.message)]
    assert bool(said) == warns
    if warns:
        assert said[0].startswith("topologies.t.router = kv_aware: the pool it routes into caches no prefixes")
