"""Human-readable numbers, inline SVG charts and sortable HTML tables for the HTML reports.

No matplotlib: a chart is a few hundred bytes of SVG written here, so a report costs milliseconds, its
text is real text (13 px at full width, never smaller than a 10 pt label at 1024 px) and it scales with
the page.  Legends are HTML below the chart, so they wrap instead of covering curves.  Every chart's
numbers are also in a table (``table``) whose cells carry the exact value in ``data-value``; a few
lines of script (``SORT_JS``) sort a table by a clicked header, and the page reads the same without it.
"""
from __future__ import annotations

import html
import math
import re

# Okabe-Ito palette: colour-blind safe; each series also gets its own dash pattern.
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
DASHES = ["", "7 4", "2 3", "9 3 2 3"]


# --- numbers for people ---------------------------------------------------------------
def finite(x) -> float | None:
    """A finite float, or None (bools and non-numbers too)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def num(x, sig: int = 3) -> str:
    """``sig`` significant figures, thousands separators, no trailing zeros: 1234.5 -> '1,230',
    0.025627 -> '0.0256', 9.9999999 -> '10', 4.0 -> '4'."""
    x = finite(x)
    if x is None:
        return "–"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if mag < -4:
        return f"{x:.{sig - 1}e}"
    decimals = max(0, sig - 1 - mag)
    text = f"{round(x, sig - 1 - mag):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def seconds(x) -> str:
    """A duration: milliseconds under 10 s ('25.6 ms'), seconds above ('12.3 s'), 3 significant figures."""
    x = finite(x)
    if x is None:
        return "–"
    if abs(x) < 1e-9:                 # float noise of a difference of equal times
        x = 0.0
    return f"{num(x * 1e3)}\u00a0ms" if abs(x) < 10 else f"{num(x)}\u00a0s"


def pct(x) -> str:
    """A fraction as a percentage, truncated (not rounded) to 0.1%: 0.8996 reads 89.9%, never 90.0%."""
    x = finite(x)
    if x is None:
        return "–"
    v = math.floor(x * 1000 + 1e-9) / 10
    return "100%" if v >= 100 else f"{v:.1f}%"


def usd(x) -> str:
    x = finite(x)
    return "–" if x is None else f"${num(x)}"


def esc(s) -> str:
    return html.escape(str(s), quote=True)


# --- tables ---------------------------------------------------------------------------------
def table(headers: list[str], rows: list[list], cls: str = "", row_attrs: list[str] | None = None) -> str:
    """A sortable table.  A cell is a string, or ``(text, value)`` / ``(text, value, attrs)``: ``value``
    goes in ``data-value`` (the exact number, for sorting and for checking) and ``attrs`` is extra markup."""
    out = [f'<table class="sortable {esc(cls)}"><thead><tr>']
    out += [f"<th>{esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        attrs = (row_attrs[i] if row_attrs else "") or ""
        out.append(f"<tr{attrs}>")
        for cell in row:
            if isinstance(cell, tuple):
                text, value = cell[0], cell[1]
                extra = cell[2] if len(cell) > 2 else ""
                v = "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else \
                    f' data-value="{esc(value if isinstance(value, str) else repr(float(value)))}"'
                out.append(f"<td{v}{extra}>{esc(text)}</td>")
            else:
                out.append(f"<td>{esc(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


SORT_JS = """<script>
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.title = 'click to sort'; th.style.cursor = 'pointer';
  th.addEventListener('click', function () {
    var tb = th.closest('table').tBodies[0], i = th.cellIndex, up = th.dataset.dir !== 'up';
    th.dataset.dir = up ? 'up' : 'down';
    var key = function (tr) { var c = tr.cells[i]; if (!c) return ''; var v = c.dataset.value;
      return v !== undefined && v !== '' && !isNaN(+v) ? +v : c.textContent; };
    Array.from(tb.rows).sort(function (a, b) { var x = key(a), y = key(b);
      var r = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
      return up ? r : -r; }).forEach(function (tr) { tb.appendChild(tr); });
  });
});
</script>"""


# --- charts -----------------------------------------------------------------------------------
def style(i: int) -> tuple[str, str]:
    return COLORS[i % len(COLORS)], DASHES[i % len(DASHES)]


def _trim(text: str) -> str:
    """A tick label without trailing zeros: '50.0 ms' -> '50 ms', '0.500' -> '0.5', '50.0%' -> '50%'."""
    return re.sub(r"(\d)\.(\d*?)0+(?!\d)", lambda m: m.group(1) + ("." + m.group(2) if m.group(2) else ""), text)


def _nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    if not (hi > lo):
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    t = math.ceil(lo / step - 1e-9) * step
    out = []
    while t <= hi + step * 1e-9:
        out.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return out


def _log_ticks(lo: float, hi: float) -> list[float]:
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in ((1, 2, 5) if math.log10(hi / lo) < 3 else (1,)):
            v = m * 10.0 ** e
            if lo <= v <= hi:
                out.append(v)
    return out or [lo, hi]


def downsample(x, y, max_points: int = 400):
    """At most ``max_points`` of a polyline, keeping both ends (a plotted CDF needs no more)."""
    n = len(x)
    if n <= max_points:
        return list(x), list(y)
    idx = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [x[i] for i in idx], [y[i] for i in idx]


def line_chart(series: list[dict], xlabel: str, ylabel: str, *, xlog: bool = False, xfmt=num, yfmt=num,
               ylim: tuple | None = None, xlim: tuple | None = None, vlines: list = (), hlines: list = (),
               marks: list = (), width: int = 900, height: int = 330, title: str = "") -> str:
    """An SVG line chart with an HTML legend.

    series: {name, x, y, i (style index), step (bool), points (bool), line (bool, default True)}; vlines/hlines: (value, label);
    marks: {x, y, label, i}: a labelled marker (a goodput, a winner)."""
    L, R, T, B = 92, 44, 12, 52
    pw, ph = width - L - R, height - T - B
    xs = [v for s in series for v in s["x"] if finite(v) is not None and (not xlog or v > 0)]
    ys = [v for s in series for v in s["y"] if finite(v) is not None]
    xs += [v for v, _ in vlines if finite(v) is not None and (not xlog or v > 0)]
    xs += [m["x"] for m in marks if finite(m.get("x")) is not None]
    ys += [v for v, _ in hlines if finite(v) is not None]
    if not xs or not ys:
        return '<p class="note">No data to plot.</p>'
    x0, x1 = xlim or (min(xs), max(xs))
    y0, y1 = ylim or (min(0.0, min(ys)), max(ys))
    if xlog:
        x0, x1 = max(x0, 1e-12), max(x1, x0 * 10)
        x0, x1 = 10 ** (math.log10(x0) - 0.02 * math.log10(x1 / x0)), x1
    if x1 <= x0:
        x1 = x0 + (abs(x0) or 1.0)
    if y1 <= y0:
        y1 = y0 + (abs(y0) or 1.0)
    if not ylim:
        y1 += (y1 - y0) * 0.04

    def X(v):
        f = (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) if xlog else (v - x0) / (x1 - x0)
        return L + pw * min(max(f, -0.01), 1.01)

    def Y(v):
        return T + ph * (1 - min(max((v - y0) / (y1 - y0), -0.01), 1.01))

    o = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title or ylabel)}" '
         f'font-size="14" font-family="system-ui,sans-serif">',
         f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for t in (_log_ticks(x0, x1) if xlog else _nice_ticks(x0, x1)):
        if x0 <= t <= x1:
            o.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{T}" y2="{T + ph}" stroke="#e4e4e4"/>'
                     f'<text x="{X(t):.1f}" y="{T + ph + 17}" text-anchor="middle">{esc(_trim(xfmt(t)))}</text>')
    for t in _nice_ticks(y0, y1, 5):
        if y0 <= t <= y1:
            o.append(f'<line x1="{L}" x2="{L + pw}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{L - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{esc(_trim(yfmt(t)))}</text>')
    o.append(f'<text x="{L + pw / 2}" y="{height - 8}" text-anchor="middle" font-size="15">{esc(xlabel)}</text>'
             f'<text transform="translate(16 {T + ph / 2}) rotate(-90)" text-anchor="middle" font-size="15">'
             f'{esc(ylabel)}</text>')
    for v, label in vlines:
        if finite(v) is not None and (not xlog or v > 0):
            o.append(f'<line x1="{X(v):.1f}" x2="{X(v):.1f}" y1="{T}" y2="{T + ph}" stroke="#000" '
                     f'stroke-dasharray="2 4" stroke-width="1.5"/>'
                     + (f'<text x="{X(v) - 4:.1f}" y="{T + 14}" text-anchor="end">' if X(v) > L + pw * 0.8 else
                        f'<text x="{X(v) + 4:.1f}" y="{T + 14}">') + f'{esc(label)}</text>')
    for v, label in hlines:
        if finite(v) is not None:
            o.append(f'<line x1="{L}" x2="{L + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#555" '
                     f'stroke-dasharray="6 5"/><text x="{L + 4}" y="{Y(v) - 4:.1f}" fill="#333">{esc(label)}</text>')
    o.append(f'<clipPath id="c{id(series)}"><rect x="{L}" y="{T}" width="{pw}" height="{ph}"/></clipPath>'
             f'<g clip-path="url(#c{id(series)})">')
    for s in series:
        color, dash = style(s.get("i", 0))
        pts = [(a, b) for a, b in zip(s["x"], s["y"])
               if finite(a) is not None and finite(b) is not None and (not xlog or a > 0)]
        if s.get("step"):
            stepped = []
            for k, (a, b) in enumerate(pts):
                if k:
                    stepped.append((a, pts[k - 1][1]))
                stepped.append((a, b))
            pts = stepped
        if len(pts) > 1 and s.get("line", True):
            path = " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in pts)
            o.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2.2"'
                     + (f' stroke-dasharray="{dash}"' if dash else "") + '/>')
        if s.get("points") or len(pts) == 1:
            o += [f'<circle cx="{X(a):.1f}" cy="{Y(b):.1f}" r="3.5" fill="{color}"><title>{esc(s["name"])}: '
                  f'{esc(xfmt(a))}, {esc(yfmt(b))}</title></circle>' for a, b in pts]
    o.append("</g>")
    for m in marks:
        if finite(m.get("x")) is None or finite(m.get("y")) is None:
            continue
        color, _ = style(m.get("i", 0))
        cx, cy = X(m["x"]), Y(m["y"])
        o.append(f'<path d="M{cx:.1f},{cy - 9:.1f} L{cx + 8:.1f},{cy + 6:.1f} L{cx - 8:.1f},{cy + 6:.1f} Z" '
                 f'fill="{color}" stroke="#000"><title>{esc(m.get("label", ""))}</title></path>')
        if m.get("label"):
            anchor = "end" if cx > L + pw * 0.7 else "start"
            o.append(f'<text x="{cx + (-10 if anchor == "end" else 10):.1f}" y="{cy - 8:.1f}" text-anchor="{anchor}" '
                     f'font-weight="bold" fill="{color}">{esc(m["label"])}</text>')
    o.append("</svg>")
    return "".join(o) + legend([s["name"] for s in series], [s.get("i", 0) for s in series],
                               [not s.get("line", True) for s in series])


def legend(names: list[str], idx: list[int] | None = None, dots: list[bool] | None = None) -> str:
    idx = idx if idx is not None else list(range(len(names)))
    items = []
    for k, (name, i) in enumerate(zip(names, idx)):
        color, dash = style(i)
        mark = (f'<circle cx="17" cy="6" r="4.5" fill="{color}"/>' if dots and dots[k] else
                f'<line x1="1" x2="33" y1="6" y2="6" stroke="{color}" stroke-width="3"'
                + (f' stroke-dasharray="{dash}"' if dash else "") + '/>')
        items.append(f'<span class="key"><svg width="34" height="12" aria-hidden="true">{mark}</svg>{esc(name)}</span>')
    return f'<div class="legend">{"".join(items)}</div>' if items else ""


def stacked_bars(rows: list[str], parts: list[str], values: list[list[float]], xlabel: str, xfmt=seconds,
                 width: int = 900) -> str:
    """Horizontal stacked bars, one per row, with an HTML legend of the parts."""
    L, R, T = 170, 44, 8
    bar, gap = 26, 12
    height = T + len(rows) * (bar + gap) + 46
    pw = width - L - R
    total = max([sum(max(0.0, v or 0.0) for v in vs) for vs in values] + [1e-12])
    ticks = _nice_ticks(0, total, 6)
    top = max(ticks[-1], total)
    o = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(xlabel)}" '
         f'font-size="14" font-family="system-ui,sans-serif">']
    axis_y = T + len(rows) * (bar + gap)
    for t in ticks:
        x = L + pw * t / top
        o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{T}" y2="{axis_y}" stroke="#e4e4e4"/>'
                 f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle">{esc(_trim(xfmt(t)))}</text>')
    for r, (name, vs) in enumerate(zip(rows, values)):
        y = T + r * (bar + gap)
        shown = name if len(name) <= 22 else name[:21] + "…"
        o.append(f'<text x="{L - 6}" y="{y + bar / 2 + 5}" text-anchor="end"><title>{esc(name)}</title>'
                 f'{esc(shown)}</text>')
        left = 0.0
        for i, v in enumerate(vs):
            v = max(0.0, v or 0.0)
            color, _ = style(i)
            o.append(f'<rect x="{L + pw * left / top:.1f}" y="{y}" width="{pw * v / top:.1f}" height="{bar}" '
                     f'fill="{color}" fill-opacity="{1.0 - 0.12 * (i % 3):.2f}"><title>{esc(name)}: {esc(parts[i])} '
                     f'{esc(xfmt(v))}</title></rect>')
            left += v
    o.append(f'<text x="{L + pw / 2}" y="{height - 6}" text-anchor="middle" font-size="15">{esc(xlabel)}</text></svg>')
    items = []
    for i, p in enumerate(parts):
        color, _ = style(i)
        items.append(f'<span class="key"><svg width="14" height="14" aria-hidden="true"><rect width="14" height="14" '
                     f'fill="{color}"/></svg>{esc(p)}</span>')
    return "".join(o) + f'<div class="legend">{"".join(items)}</div>'


#: CSS shared by report.html, sweep.html and plan.html: a fluid page that never overflows its width.
CSS = """*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1240px;
padding:1em 1.2em;color:#1a1a1a;background:#fff;overflow-wrap:break-word}
h1{font-size:1.6em;margin:.2em 0}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ccc}
h3{font-size:1.05em;margin:.3em 0}
.verdict{font-size:1.08em;background:#f5f8fc;border-left:5px solid #0072B2;padding:.7em 1em;margin:1em 0}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.87em;width:100%;table-layout:auto}
td,th{border:1px solid #c8c8c8;padding:3px 6px;text-align:right;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td:first-child,th:first-child{text-align:left}
tr.best td{background:#e8f5ec}td.text{text-align:left}
.pass{color:#05620a;font-weight:bold}.fail{color:#a00000;font-weight:bold}.note{color:#555}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:1em}
.card{border:1px solid #bbb;border-radius:6px;padding:.6em .9em;min-width:0}
.card.best{border:3px solid #009E73}
.card dl{display:grid;grid-template-columns:minmax(6em,45%) minmax(0,1fr);gap:3px .8em;margin:.4em 0;font-size:.92em}
.card dt{color:#555;min-width:0}.card dd{margin:0;text-align:right}
.badge{background:#009E73;color:#fff;border-radius:3px;padding:0 .4em;font-size:.85em;white-space:nowrap}
.meta{color:#444}svg.chart{width:100%;height:auto;display:block;max-width:1000px}
.legend{display:flex;flex-wrap:wrap;gap:.3em 1.2em;font-size:.92em;margin:.3em 0 .8em}
.key{display:inline-flex;align-items:center;gap:.35em;min-width:0;overflow-wrap:anywhere}
.key svg{flex:none}
figure{margin:0}details{margin:.4em 0}summary{cursor:pointer;color:#0057a0}
"""
