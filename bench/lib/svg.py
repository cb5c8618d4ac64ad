"""Hand-written SVG plots in which every sample stays visible.

- `dots_boxes`: per panel, one column per side: every sample as a dot,
  a box (quartiles, median line) with whiskers to min and max; paired samples
  (same index on both sides) are joined by a thin line. Zero-based y axis.
- `timeseries`: polylines of (t, value) with phase markers. Zero-based.
"""
from __future__ import annotations

import math
from html import escape
from pathlib import Path

from .stats import quantile

COLORS = {"pvisor": "#1f77b4", "peer": "#d62728"}
FALLBACK = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"]


def _color(name: str, i: int) -> str:
    return COLORS.get(name, FALLBACK[i % len(FALLBACK)])


def _nice_max(v: float) -> float:
    if v <= 0 or math.isnan(v):
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ticks(top: float, n: int = 5) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def dots_boxes(path: Path, title: str, unit: str, panels: list[dict], note: str = "") -> None:
    """panels: [{"label": str, "sides": [(name, [values or None])], "paired": bool}]"""
    col_w, gap = 70, 40
    panel_w = 2 * col_w + gap
    left, right, top, bottom = 70, 20, 50, 90
    width = left + right + len(panels) * panel_w
    height = 440
    plot_h = height - top - bottom
    vmax = max((v for p in panels for _, vs in p["sides"] for v in vs if v is not None), default=1.0)
    ymax = _nice_max(vmax * 1.05)

    def y(v):
        return top + plot_h - (v / ymax) * plot_h

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'font-family="sans-serif" font-size="11">',
         f'<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>']
    if note:
        s.append(f'<text x="{width / 2}" y="36" text-anchor="middle" fill="#555">{escape(note)}</text>')
    for t in _ticks(ymax):
        yy = y(t)
        s.append(f'<line x1="{left}" x2="{width - right}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>')
        s.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    s.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="black"/>')
    s.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="black"/>')
    s.append(f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" '
             f'text-anchor="middle">{escape(unit)}</text>')

    for pi, p in enumerate(panels):
        x0 = left + pi * panel_w + gap / 2
        centers = [x0 + col_w * (k + 0.5) for k in range(len(p["sides"]))]
        # paired lines first, under the dots
        if p.get("paired") and len(p["sides"]) == 2:
            a, b = p["sides"][0][1], p["sides"][1][1]
            for i in range(min(len(a), len(b))):
                if a[i] is None or b[i] is None:
                    continue
                ja, jb = _jitter(i, len(a)), _jitter(i, len(b))
                s.append(f'<line x1="{centers[0] + ja:.1f}" y1="{y(a[i]):.1f}" x2="{centers[1] + jb:.1f}" '
                         f'y2="{y(b[i]):.1f}" stroke="#999" stroke-opacity="0.45" stroke-width="0.8"/>')
        for k, (name, vals) in enumerate(p["sides"]):
            cx, color = centers[k], _color(name, k)
            ok = [v for v in vals if v is not None]
            failed = len(vals) - len(ok)
            if ok:
                q1, med, q3 = quantile(ok, .25), quantile(ok, .5), quantile(ok, .75)
                lo, hi = min(ok), max(ok)
                bw = 36
                s.append(f'<line x1="{cx}" x2="{cx}" y1="{y(hi):.1f}" y2="{y(q3):.1f}" stroke="{color}"/>')
                s.append(f'<line x1="{cx}" x2="{cx}" y1="{y(q1):.1f}" y2="{y(lo):.1f}" stroke="{color}"/>')
                for w in (lo, hi):
                    s.append(f'<line x1="{cx - 8}" x2="{cx + 8}" y1="{y(w):.1f}" y2="{y(w):.1f}" stroke="{color}"/>')
                s.append(f'<rect x="{cx - bw / 2}" y="{y(q3):.1f}" width="{bw}" height="{max(y(q1) - y(q3), 0.8):.1f}" '
                         f'fill="{color}" fill-opacity="0.12" stroke="{color}"/>')
                s.append(f'<line x1="{cx - bw / 2}" x2="{cx + bw / 2}" y1="{y(med):.1f}" y2="{y(med):.1f}" '
                         f'stroke="{color}" stroke-width="2.5"/>')
                s.append(f'<text x="{cx}" y="{y(hi) - 6:.1f}" text-anchor="middle" fill="{color}">{_fmt(med)}</text>')
            for i, v in enumerate(vals):
                if v is None:
                    continue
                s.append(f'<circle cx="{cx + _jitter(i, len(vals)):.1f}" cy="{y(v):.1f}" r="2.6" fill="{color}" '
                         f'fill-opacity="0.75"><title>{escape(name)} #{i}: {v:.3f}</title></circle>')
            lab = escape(name) + (f" ({failed} failed)" if failed else "")
            s.append(f'<text x="{cx}" y="{top + plot_h + 16}" text-anchor="middle" fill="{color}">{lab}</text>')
            s.append(f'<text x="{cx}" y="{top + plot_h + 30}" text-anchor="middle" fill="#555">n={len(ok)}</text>')
        s.append(f'<text x="{x0 + col_w}" y="{top + plot_h + 52}" text-anchor="middle" font-weight="bold">'
                 f'{escape(p["label"])}</text>')
    s.append("</svg>")
    Path(path).write_text("\n".join(s) + "\n")


def _jitter(i: int, n: int) -> float:
    # deterministic spread across ±14 px
    if n <= 1:
        return 0.0
    return -14 + 28 * ((i * 7919) % n) / (n - 1)


def timeseries(path: Path, title: str, unit: str, series: list[dict], markers: list[tuple[float, str]] = (),
               note: str = "") -> None:
    """series: [{"label", "side", "points": [(t, v)]}]; markers: [(t, label)] vertical lines."""
    width, height = 900, 440
    left, right, top, bottom = 70, 160, 50, 50
    pw, ph = width - left - right, height - top - bottom
    tmax = max((t for s_ in series for t, _ in s_["points"]), default=1.0) or 1.0
    vmax = _nice_max(max((v for s_ in series for _, v in s_["points"]), default=1.0) * 1.05)
    X = lambda t: left + t / tmax * pw
    Y = lambda v: top + ph - v / vmax * ph
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
         f'font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>']
    if note:
        s.append(f'<text x="{width / 2}" y="36" text-anchor="middle" fill="#555">{escape(note)}</text>')
    for t in _ticks(vmax):
        s.append(f'<line x1="{left}" x2="{left + pw}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" stroke="#eee"/>')
        s.append(f'<text x="{left - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in _ticks(_nice_max(tmax)):
        if t <= tmax:
            s.append(f'<text x="{X(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    s.append(f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">seconds since service start</text>')
    s.append(f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" text-anchor="middle">'
             f'{escape(unit)}</text>')
    for t, lab in markers:
        s.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{top}" y2="{top + ph}" stroke="#bbb" stroke-dasharray="3,3"/>')
        s.append(f'<text x="{X(t) + 2:.1f}" y="{top + 10}" fill="#777" font-size="9">{escape(lab)}</text>')
    s.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="black"/>')
    s.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="black"/>')
    for i, s_ in enumerate(series):
        color = _color(s_.get("side", ""), i)
        pts = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in s_["points"])
        s.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-opacity="0.7" stroke-width="1.2"/>')
        for t, v in s_["points"]:
            s.append(f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" r="1.4" fill="{color}"/>')
        s.append(f'<text x="{left + pw + 8}" y="{top + 14 + 14 * i}" fill="{color}">{escape(s_["label"])}</text>')
    s.append("</svg>")
    Path(path).write_text("\n".join(s) + "\n")
