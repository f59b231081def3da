"""The report is one self-contained page, and its numbers are the ones in summary.json."""
from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser

import pytest

from pdsim import config
from pdsim.output import write_outputs
from pdsim.simulation import simulate


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.topo = self.key = None
        self.cells: dict = {}
        self.imgs: list = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-topology" in a:
            self.topo = a["data-topology"]
        if tag == "td" and "data-key" in a:
            self.key = a["data-key"]
        if tag == "img":
            self.imgs.append(a.get("src", ""))

    def handle_data(self, data):
        if self.key:
            self.cells[(self.topo, self.key)] = data
            self.key = None


def _run(tmp_path, extra=None):
    sc = config.load("scenarios/quickstart.yaml", ["workload.num_requests=120"] + (extra or []))
    write_outputs(simulate(sc), sc, tmp_path)
    return (tmp_path / "report.html").read_text(), json.loads((tmp_path / "summary.json").read_text())


def _value(d, dotted):
    for k in dotted.split("."):
        d = d[k]
    return d


def test_report_numbers_equal_summary_json(tmp_path):
    html, summary = _run(tmp_path)
    p = _Cells()
    p.feed(html)
    assert len(p.cells) >= 3 * 10
    for (topo, key), text in p.cells.items():
        want = _value(summary["topologies"][topo], key)
        if want is None:
            assert text == "-"
        else:
            assert float(text) == pytest.approx(want, rel=1e-5), (topo, key)


def test_self_contained_with_decodable_images(tmp_path):
    html, _ = _run(tmp_path)
    assert not re.search(r'(src|href)\s*=\s*"https?://', html)
    p = _Cells()
    p.feed(html)
    assert p.imgs
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(html) < 3 * 1024 * 1024


@pytest.mark.parametrize("n", [1, 5])
def test_one_and_five_topologies_render(tmp_path, n):
    topo = {"kind": "colocated", "replicas": 2, "device": "h100-sxm"}
    raw = {"name": f"t{n}", "model": "llama-3.1-8b",
           "workload": {"arrival": "poisson", "rate": 4, "num_requests": 40, "prompt_tokens": 300, "output_tokens": 20},
           "topologies": {f"t{i}": {**topo, "replicas": i + 1} for i in range(n)}}
    sc = config.parse(raw, "x.yaml")
    write_outputs(simulate(sc), sc, tmp_path)
    p = _Cells()
    p.feed((tmp_path / "report.html").read_text())
    assert {t for t, _ in p.cells} == {f"t{i}" for i in range(n)}


def test_headless_chromium_renders_offline(tmp_path):
    import os
    import shutil
    import subprocess

    import matplotlib.image as mpimg
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed under CI (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed")
    _run(tmp_path)
    url = (tmp_path / "report.html").as_uri()
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'prof'}",
            "--proxy-server=127.0.0.1:9", "--window-size=1200,1600"]   # an unreachable proxy: no network
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert "pdsim report" in dom.stdout
    shot = tmp_path / "shot.png"
    subprocess.run(base + [f"--screenshot={shot}", url], capture_output=True, timeout=90)
    img = mpimg.imread(shot)
    assert img.std() > 0.01          # not a blank page
