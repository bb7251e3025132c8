"""Inline SVG scatter plots (no plotting library): deterministic text, one series per label.
Every text drawn is escaped (`page.esc`); points that are not finite numbers are left out, and
any range of finite values (one value, huge values) gets axes."""

from __future__ import annotations

import math

from .page import esc

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not hi > lo:
        hi = lo + max(1.0, abs(lo) * 0.1)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw), default=raw)
    start = math.floor(lo / step) * step
    out, v = [], start
    while v <= hi + step * 0.5 and len(out) < 20:
        out.append(round(v, 10))
        v += step
    return out


def _finite(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v) and abs(v) < 1e300)


def _lower(v: float) -> float:
    return v - abs(v) * 0.05


def _upper(v: float) -> float:
    return v + abs(v) * 0.05


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def scatter_svg(series: dict[str, list[tuple[float, float, str]]], *, xlabel: str,
                ylabel: str, title: str, width: int = 640, height: int = 400) -> str:
    """`series` maps a label to (x, y, tooltip) points. Returns an <svg> element."""
    series = {str(label): [(x, y, tip) for x, y, tip in s if _finite(x) and _finite(y)]
              for label, s in series.items()}
    pts = [(x, y) for s in series.values() for x, y, _ in s]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    try:
        xt = _ticks(_lower(min(xs)), _upper(max(xs)))
        yt = _ticks(_lower(min(ys)), _upper(max(ys)))
    except (ValueError, OverflowError):  # a range no float axis can span
        return ""
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    left, right, top, bottom = 70, 170, 30, 50
    pw, ph = width - left - right, height - top - bottom

    def sx(v: float) -> float:
        return left + (v - x0) / ((x1 - x0) or 1) * pw

    def sy(v: float) -> float:
        return top + ph - (v - y0) / ((y1 - y0) or 1) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{esc(title)}">',
           f'<text x="{left}" y="18" font-size="14" font-weight="bold">{esc(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for v in xt:
        x = sx(v)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" '
                   f'stroke="#999"/><text x="{x:.1f}" y="{top + ph + 16}" font-size="10" '
                   f'text-anchor="middle">{_fmt(v)}</text>')
    for v in yt:
        y = sy(v)
        out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" '
                   f'stroke="#999"/><text x="{left - 6}" y="{y + 3:.1f}" font-size="10" '
                   f'text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 10}" font-size="12" '
               f'text-anchor="middle">{esc(xlabel)}</text>')
    out.append(f'<text x="16" y="{top + ph / 2:.0f}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + ph / 2:.0f})">{esc(ylabel)}</text>')
    for i, (label, points) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        for x, y, tip in points:
            if x is None or y is None:
                continue
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}" '
                       f'fill-opacity="0.8"><title>{esc(tip)}</title></circle>')
        ly = top + 12 + i * 16
        if i < 16:
            out.append(f'<circle cx="{left + pw + 14}" cy="{ly - 4}" r="4" fill="{color}"/>'
                       f'<text x="{left + pw + 22}" y="{ly}" font-size="11">'
                       f'{esc(label[:22])}</text>')
    out.append("</svg>")
    return "".join(out)
