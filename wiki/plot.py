"""Scatter plots for the wiki, drawn by matplotlib (its SVG backend; imported on first use).

`plot_svg(points, lines=...)`: each `Point` is coloured and shaped by its verdict (accepted,
rejected, baseline, unjudged; by its group when no point has a verdict, and shaped by its
group when verdicts are shown for several groups), and labelled (its block) beside it while
the plot has few points; each `Line` (an SLO, a gate's threshold) is drawn across the plot.
`scatter_svg(series)` is the older shape: a label to (x, y, label) points. `steps_svg(lines)`
draws step lines (`Steps`: a count over time, the journal's tasks in flight), on a figure of
its own; `cdf_svg(series)` overlays empirical distributions (`Cdf`: the compare view's TTFT,
ITL and E2E), on another; `order_svg(points)` is `plot_svg` with whole-number x ticks (points
in order: the history view's blocks), on a third.

Deterministic: a fixed hash salt for element ids, no date or creator metadata, text kept as
text. Safe: matplotlib's SVG writer escapes every text; labels are cleaned of control and
format characters, and `$` is text (math is not parsed); the SVG is then checked (`_checked`):
drawing elements only, no script, no event attribute, references only to its own ids.
Robust: points that are not finite numbers are left out, any range of finite values gets axes,
and a drawing matplotlib cannot make gives no plot (""), never a failed build.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import math
import re
import threading
import unicodedata
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..ledger.atomic import write_atomic
from .numbers import number

VERDICT_STYLE = {  # verdict -> (colour, marker), in legend order
    "accepted": ("#2b8a3e", "^"),
    "rejected": ("#c92a2a", "X"),
    "baseline": ("#868e96", "o"),
    "unjudged": ("#1c7ed6", "s"),
}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
GROUP_MARKERS = "osD^vP*X<>ph"
LINE_COLOURS = ["#e8590c", "#862e9c", "#0b7285", "#5c940d"]
MAX_LABELS = 30  # points labelled beside them; more would overlap
MAX_LEGEND_GROUPS = 12
LABEL_CHARS, LEGEND_CHARS, TITLE_CHARS = 24, 28, 80
RC: Any = {"svg.hashsalt": "infer-forge", "svg.fonttype": "none", "text.parse_math": False,
           "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"], "font.size": 9,
           "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
           "xtick.labelsize": 8, "ytick.labelsize": 8}  # matplotlib's rc parameters
METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_LOCK = threading.Lock()  # matplotlib's state (rc parameters, font cache) is not thread-safe


@dataclass(frozen=True)
class Point:
    x: Any
    y: Any
    label: str = ""  # drawn beside the point (e.g. its block)
    verdict: str | None = None  # a key of VERDICT_STYLE (another value counts as unjudged)
    group: str = ""  # e.g. its runtime profile


@dataclass(frozen=True)
class Line:
    """A threshold across the plot: `axis` "x" is a vertical line at x = value."""

    axis: Literal["x", "y"]
    value: Any
    label: str


def _finite(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v) and abs(v) < 1e300)


def clean_text(v: Any, limit: int) -> str:
    """One line of at most `limit` characters, without control, format (bidi overrides,
    zero-width characters) or surrogate characters."""
    s = "".join(c if unicodedata.category(c)[0] != "C" else " " for c in str(v))
    s = " ".join(s.split())
    return s if len(s) <= limit else s[:limit - 1] + "…"


def scatter_svg(series: dict[str, list[tuple[Any, Any, str]]], *, xlabel: str, ylabel: str,
                title: str) -> str:
    """`series` maps a label to (x, y, point label) points: one colour per series."""
    return plot_svg([Point(x, y, label, None, str(name))
                     for name, pts in series.items() for x, y, label in pts],
                    xlabel=xlabel, ylabel=ylabel, title=title)


def merged_guides(lines: Iterable[Line]) -> list[tuple[str, float, str]]:
    """(axis, value, label) of each line to draw: lines at the same place (an SLO and a gate
    on the same value) are one line whose label names them all, never two drawn on top of
    each other."""
    at: dict[tuple[str, float], list[str]] = {}
    for ln in lines:
        if _finite(ln.value) and ln.axis in ("x", "y"):
            labels = at.setdefault((ln.axis, float(ln.value)), [])
            label = clean_text(ln.label, LEGEND_CHARS)
            if label not in labels:
                labels.append(label)
    # One label a line (each cleaned above): a legend entry no wider than one label.
    return sorted((axis, value, "\n= ".join(sorted(labels)))
                  for (axis, value), labels in at.items())


def plot_svg(points: Iterable[Point], *, xlabel: str, ylabel: str, title: str,
             lines: Iterable[Line] = (), width: float = 8.0, height: float = 4.2) -> str:
    """An <svg> element (width and height in inches), or "" when no point is a pair of finite
    numbers or matplotlib cannot draw them."""
    pts = [p for p in points if _finite(p.x) and _finite(p.y)]
    if not pts:
        return ""
    guides = merged_guides(lines)
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # missing glyphs, singular limits: drawn anyway
        try:
            svg = _draw(pts, guides, xlabel, ylabel, title, width, height)
        except (ValueError, OverflowError, ArithmeticError, RuntimeError):
            _CANVAS.pop((width, height), None)  # the next drawing starts from a new figure
            return ""
    return _checked(svg)


# One figure per size, kept and emptied between drawings: a new Figure and Axes (their ticks,
# spines, texts) cost more than most drawings. What a drawing adds (points, lines, labels, the
# legend) is removed before the next; what it sets (limits, title, axis labels) is set by
# every drawing. So a drawing does not depend on the ones before it (tested).
_CANVAS: dict[tuple[float, float], Any] = {}
_STEPS_CANVAS: dict[tuple[float, float], Any] = {}  # step lines: a figure of their own
MARGINS = {"left": 0.1, "right": 0.7, "top": 0.9, "bottom": 0.15}  # of the figure
PAD = 0.08  # of the data's range, around it inside the frame (point labels need room)
TICK_SPACE_PT = 7 + 4  # tick length and padding (3.5 + 3.5 points), then a gap to the label
DIGIT_EM = 0.64  # width of a tick label's character (DejaVu Sans digits: 0.636 em)


def _tick(v: float, _pos: Any = None) -> str:
    return number(float(v))


def _canvas(width: float, height: float, kept: dict[tuple[float, float], Any] = _CANVAS
            ) -> Any:
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    got = kept.get((width, height))
    if got is None:
        fig = Figure(figsize=(width, height))
        FigureCanvasSVG(fig)
        ax = fig.add_subplot()
        for axis in (ax.xaxis, ax.yaxis):  # the journal's numbers: no offset, no exponent
            axis.set_major_formatter(FuncFormatter(_tick))
        fig.subplots_adjust(**MARGINS)
        ax.grid(True, color="#e9ecef", linewidth=0.6, zorder=0)
        got = kept[(width, height)] = (fig, ax)
    return got


def _limits(axis: Any, values: list[float]) -> tuple[float, float]:
    """What matplotlib's autoscaling makes of `values` on `axis` (a single value widened by its
    locator, then 5% margins), computed here once instead of from every artist's data."""
    lo, hi = axis.get_major_locator().nonsingular(min(values), max(values))
    pad = (hi - lo) * PAD
    return lo - pad, hi + pad


def _draw(pts: list[Point], guides: Sequence[tuple[str, float, str]], xlabel: str, ylabel: str,
          title: str, width: float, height: float,
          kept: dict[tuple[float, float], Any] = _CANVAS) -> str:
    import matplotlib
    from matplotlib.lines import Line2D

    judged = any(p.verdict is not None for p in pts)
    groups = sorted({p.group for p in pts})
    by_group = len(groups) > 1
    with matplotlib.rc_context(RC):
        fig, ax = _canvas(width, height, kept)
        for artist in [*ax.collections, *ax.lines, *ax.texts]:
            artist.remove()
        if ax.legend_ is not None:
            ax.legend_.remove()
        marks: dict[tuple[str, str], list[Point]] = {}
        for p in pts:
            if judged:
                colour, marker = VERDICT_STYLE.get(p.verdict or "", VERDICT_STYLE["unjudged"])
                if by_group:
                    marker = GROUP_MARKERS[groups.index(p.group) % len(GROUP_MARKERS)]
            else:
                colour, marker = PALETTE[groups.index(p.group) % len(PALETTE)], "o"
            marks.setdefault((colour, marker), []).append(p)
        for (colour, marker), ps in sorted(marks.items()):
            ax.scatter([p.x for p in ps], [p.y for p in ps], c=colour, marker=marker, s=36,
                       alpha=0.85, zorder=3, linewidths=0)
        drawn = [(ax.axvline if axis == "x" else ax.axhline)(
            value, color=LINE_COLOURS[i % len(LINE_COLOURS)], linestyle="--", linewidth=1,
            zorder=2, label=label) for i, (axis, value, label) in enumerate(guides)]
        ax.set_xlim(_limits(ax.xaxis, [p.x for p in pts] + [v for a, v, _ in guides if a == "x"]))
        ax.set_ylim(_limits(ax.yaxis, [p.y for p in pts] + [v for a, v, _ in guides if a == "y"]))
        if len(pts) <= MAX_LABELS:
            at: dict[tuple[float, float], list[str]] = {}
            for p in pts:
                if p.label:
                    at.setdefault((p.x, p.y), []).append(clean_text(p.label, LABEL_CHARS))
            (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
            for (x, y), labels in sorted(at.items()):
                # Inside the frame: a label of a point in the right third reads leftwards,
                # of a point near the top below it.
                left = x > x0 + (x1 - x0) * 0.66
                low = y > y0 + (y1 - y0) * 0.9
                ax.annotate(clean_text(", ".join(dict.fromkeys(labels)), 2 * LABEL_CHARS),
                            (x, y), xytext=(-5 if left else 5, -5 if low else 4),
                            textcoords="offset points", fontsize=7, color="#343a40",
                            ha="right" if left else "left", va="top" if low else "baseline")
        handles: list[Any] = []
        if judged:
            present = {p.verdict if p.verdict in VERDICT_STYLE else "unjudged" for p in pts}
            handles += [Line2D([], [], color=c, marker="o" if by_group else m, linestyle="",
                               label=v) for v, (c, m) in VERDICT_STYLE.items() if v in present]
        if by_group or not judged:
            for i, g in enumerate(groups[:MAX_LEGEND_GROUPS]):
                style: dict[str, Any] = (
                    {"marker": GROUP_MARKERS[i % len(GROUP_MARKERS)], "color": "#212529",
                     "markerfacecolor": "none"} if judged  # the shape of the group
                    else {"marker": "o", "color": PALETTE[i % len(PALETTE)]})
                handles.append(Line2D([], [], linestyle="", **style,
                                      label=clean_text(g or "—", LEGEND_CHARS)))
            if len(groups) > MAX_LEGEND_GROUPS:
                handles.append(Line2D([], [], linestyle="",
                                      label=f"… {len(groups) - MAX_LEGEND_GROUPS} more"))
        ax.legend(handles=handles + drawn, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  frameon=False, borderaxespad=0)
        return _finish(fig, ax, title, xlabel, ylabel)


def _finish(fig: Any, ax: Any, title: str, xlabel: str, ylabel: str) -> str:
    """Title and axis labels, then the SVG text (inside the rc context of the drawing)."""
    import matplotlib

    # Fixed places for the title and axis labels (matplotlib would measure every tick
    # label to place them): the x label below the tick labels (one line of a known
    # size), the y label left of the widest tick label, by its characters.
    ax.set_title(clean_text(title, TITLE_CHARS), loc="left", y=1.0)
    ax.set_xlabel(clean_text(xlabel, TITLE_CHARS))
    ax.set_ylabel(clean_text(ylabel, TITLE_CHARS))
    size_pt = fig.get_size_inches() * 72 * [MARGINS["right"] - MARGINS["left"],
                                            MARGINS["top"] - MARGINS["bottom"]]
    font_pt = matplotlib.rcParams["ytick.labelsize"]
    ax.xaxis.set_label_coords(0.5, -(TICK_SPACE_PT + font_pt * 1.2) / size_pt[1])
    lo, hi = ax.get_ylim()
    ticks = ax.yaxis.get_major_formatter().format_ticks(
        [t for t in ax.yaxis.get_major_locator()() if lo <= t <= hi])
    widest = max((len(t) for t in ticks), default=1) * DIGIT_EM * font_pt
    ax.yaxis.set_label_coords(-(TICK_SPACE_PT + widest) / size_pt[0], 0.5)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=METADATA)
    return buf.getvalue()


# --- step lines (a count over time) ------------------------------------------------------


@dataclass(frozen=True)
class Steps:
    """A step line: `ys[i]` holds from `xs[i]` until `xs[i + 1]`, the last until the plot's
    `x_end` (a count over time). `total`: drawn thicker, in black, first in the legend."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    total: bool = False


def steps_svg(lines: Iterable[Steps], *, x_end: float, xlabel: str, ylabel: str, title: str,
              width: float = 6.4, height: float = 4.0) -> str:
    """An <svg> element of step lines from zero (at most MAX_LEGEND_GROUPS + 1 drawn), or ""
    when none is a finite, non-empty series or matplotlib cannot draw them. Its own figure:
    the integer tick locator it sets never reaches the scatter plots."""
    ls = [s for s in lines if s.xs and len(s.xs) == len(s.ys)
          and all(_finite(v) for v in (*s.xs, *s.ys))]
    if not ls or not _finite(x_end):
        return ""
    ls = sorted(ls, key=lambda s: not s.total)[:MAX_LEGEND_GROUPS + 1]
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            svg = _draw_steps(ls, float(x_end), xlabel, ylabel, title, width, height)
        except (ValueError, OverflowError, ArithmeticError, RuntimeError):
            _STEPS_CANVAS.pop((width, height), None)
            return ""
    return _checked(svg)


def _draw_steps(ls: list[Steps], x_end: float, xlabel: str, ylabel: str, title: str,
                width: float, height: float) -> str:
    import matplotlib
    from matplotlib.ticker import MaxNLocator

    with matplotlib.rc_context(RC):
        fig, ax = _canvas(width, height, _STEPS_CANVAS)
        for artist in [*ax.lines]:
            artist.remove()
        if ax.legend_ is not None:
            ax.legend_.remove()
        colour = 0
        for s in ls:
            xs, ys = [*s.xs, max(x_end, s.xs[-1])], [*s.ys, s.ys[-1]]
            style: dict[str, Any] = {"color": "#212529", "linewidth": 2.0, "zorder": 4}
            if not s.total:
                style = {"color": PALETTE[colour % len(PALETTE)], "linewidth": 1.2,
                         "zorder": 3, "alpha": 0.9}
                colour += 1
            ax.step(xs, ys, where="post", label=clean_text(s.label or "—", LEGEND_CHARS),
                    **style)
        top = max(1.0, max(max(s.ys) for s in ls))
        ax.set_xlim(_limits(ax.xaxis, [x for s in ls for x in s.xs] + [x_end]))
        ax.set_ylim(-0.04 * top, top * 1.08 + 0.2)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: whole ticks
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, borderaxespad=0)
        return _finish(fig, ax, title, xlabel, ylabel)


# --- points in order (x: 1, 2, 3, ...) ----------------------------------------------------

_ORDER_CANVAS: dict[tuple[float, float], Any] = {}  # whole-number x ticks: a figure of its own


def order_svg(points: Iterable[Point], *, xlabel: str, ylabel: str, title: str,
              width: float = 6.4, height: float = 4.0) -> str:
    """`plot_svg` of points whose x is a place in an order (blocks one after another): the
    same drawing with whole-number x ticks, on a figure of its own (its tick locator never
    reaches the other plots)."""
    pts = [p for p in points if _finite(p.x) and _finite(p.y)]
    if not pts:
        return ""
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if (width, height) not in _ORDER_CANVAS:
                from matplotlib.ticker import MaxNLocator

                _canvas(width, height, _ORDER_CANVAS)[1].xaxis.set_major_locator(
                    MaxNLocator(integer=True))
            svg = _draw(pts, [], xlabel, ylabel, title, width, height, _ORDER_CANVAS)
        except (ValueError, OverflowError, ArithmeticError, RuntimeError):
            _ORDER_CANVAS.pop((width, height), None)
            return ""
    return _checked(svg)


# --- distributions (empirical CDFs) -------------------------------------------------------


@dataclass(frozen=True)
class Cdf:
    """An empirical distribution: `points` are (value, fraction of the values ≤ value), values
    ascending (`projections.comparison.distribution`'s `cdf`)."""

    label: str
    points: tuple[tuple[float, float], ...]


_CDF_CANVAS: dict[tuple[float, float], Any] = {}  # CDFs: a figure of their own


def cdf_svg(series: Iterable[Cdf], *, xlabel: str, title: str,
            ylabel: str = "fraction of requests ≤ x", width: float = 6.4,
            height: float = 4.0) -> str:
    """An <svg> element of overlaid CDFs (one colour each, in the given order, named in the
    legend), or "" when none has finite points or matplotlib cannot draw them."""
    ls = [s for s in series if s.points
          and all(_finite(x) and _finite(f) for x, f in s.points)][:MAX_LEGEND_GROUPS]
    if not ls:
        return ""
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            svg = _draw_cdf(ls, xlabel, ylabel, title, width, height)
        except (ValueError, OverflowError, ArithmeticError, RuntimeError):
            _CDF_CANVAS.pop((width, height), None)
            return ""
    return _checked(svg)


def _draw_cdf(ls: list[Cdf], xlabel: str, ylabel: str, title: str, width: float,
              height: float) -> str:
    import matplotlib

    with matplotlib.rc_context(RC):
        fig, ax = _canvas(width, height, _CDF_CANVAS)
        for artist in [*ax.lines]:
            artist.remove()
        if ax.legend_ is not None:
            ax.legend_.remove()
        xs_all: list[float] = []
        for i, s in enumerate(ls):
            xs = [float(s.points[0][0])] + [float(x) for x, _ in s.points]
            ys = [0.0] + [float(f) for _, f in s.points]
            xs_all += xs
            ax.step(xs, ys, where="post", color=PALETTE[i % len(PALETTE)], linewidth=1.6,
                    label=clean_text(s.label or "—", LEGEND_CHARS), zorder=3)
        ax.set_xlim(_limits(ax.xaxis, xs_all))
        ax.set_ylim(-0.03, 1.05)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, borderaxespad=0)
        return _finish(fig, ax, title, xlabel, ylabel)


# --- the check of the drawing -------------------------------------------------------------

_NS = {"svg": "http://www.w3.org/2000/svg", "xlink": "http://www.w3.org/1999/xlink"}
ELEMENTS = {"svg", "defs", "g", "path", "use", "clipPath", "rect", "text", "tspan"}
_REF = re.compile(r"url\(#([A-Za-z0-9_-]+)\)")


def _checked(svg: str) -> str:
    """The <svg> element alone (no XML prolog, no global style sheet, brackets as character
    references), or "" unless it holds only drawing elements, no event attribute and no
    reference outside itself."""
    start = svg.find("<svg")
    svg = re.sub(r"<style[^>]*>[^<]*</style>", "", svg[start:]) if start >= 0 else ""
    try:
        root = ET.fromstring(svg)
    except ET.ParseError:
        return ""
    ids = {e.get("id") for e in root.iter()}
    for e in root.iter():
        ns, _, tag = e.tag.rpartition("}")
        if ns != "{" + _NS["svg"] or tag not in ELEMENTS:
            return ""
        for name, value in e.attrib.items():
            local = name.rpartition("}")[2]
            if local.lower().startswith("on"):
                return ""
            if local == "href" and not (value.startswith("#") and value[1:] in ids):
                return ""
            refs = _REF.findall(value)
            if value.count("url(") != len(refs) or any(r not in ids for r in refs):
                return ""
    return svg.replace("[", "&#91;").replace("]", "&#93;")  # no wiki link in the journal


# --- drawings kept between builds -----------------------------------------------------------

PLOT_VERSION = 3  # bump when the drawing changes: cached drawings are drawn again
# (2: one figure kept between drawings, title and axis labels at fixed places; 3: wider,
# lines at one place merged, point labels kept inside the frame)


@functools.cache
def _matplotlib_version() -> str:
    return importlib.metadata.version("matplotlib")


class PlotCache:
    """Drawings by the digest of what they draw, kept between builds in a file (the wiki's
    `_plots.json`): a build draws only the plots whose points, lines or titles changed, and
    saves only the drawings it used. A drawing read from the file is checked again
    (`_checked`); a damaged file is ignored."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.kept: dict[str, str] = {}
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            if isinstance(data, dict):
                self.kept = {k: v for k, v in data.items() if isinstance(v, str)}
        self.used: dict[str, str] = {}
        self.drawn = 0

    def plot_svg(self, points: Iterable[Point], *, xlabel: str, ylabel: str, title: str,
                 lines: Iterable[Line] = ()) -> str:
        points, lines = tuple(points), tuple(lines)
        key = hashlib.sha256(repr((PLOT_VERSION, _matplotlib_version(), points, lines, xlabel,
                                   ylabel, title)).encode("utf-8", "surrogatepass")).hexdigest()
        svg = self.used.get(key)
        if svg is None and key in self.kept:  # a kept drawing that fails the check is redrawn
            svg = (_checked(self.kept[key]) or None) if self.kept[key] else ""
        if svg is None:
            svg = plot_svg(points, xlabel=xlabel, ylabel=ylabel, title=title, lines=lines)
            self.drawn += 1
        self.used[key] = svg
        return svg

    def order_svg(self, points: Iterable[Point], *, xlabel: str, ylabel: str,
                  title: str) -> str:
        """`order_svg`, kept by what it draws like the scatter plots."""
        points = tuple(points)
        return self._drawing(("order", points, xlabel, ylabel, title), lambda: order_svg(
            points, xlabel=xlabel, ylabel=ylabel, title=title))

    def cdf_svg(self, series: Iterable[Cdf], *, xlabel: str, title: str,
                ylabel: str = "fraction of requests ≤ x") -> str:
        """`cdf_svg`, kept by what it draws like the scatter plots."""
        series = tuple(series)
        return self._drawing(("cdf", series, xlabel, ylabel, title), lambda: cdf_svg(
            series, xlabel=xlabel, ylabel=ylabel, title=title))

    def _drawing(self, what: tuple[Any, ...], draw: Callable[[], str]) -> str:
        """The drawing of `what` (kept, or drawn by `draw()` and kept)."""
        key = hashlib.sha256(repr((PLOT_VERSION, _matplotlib_version(), what)).encode(
            "utf-8", "surrogatepass")).hexdigest()
        svg = self.used.get(key)
        if svg is None and key in self.kept:  # a kept drawing that fails the check is redrawn
            svg = (_checked(self.kept[key]) or None) if self.kept[key] else ""
        if svg is None:
            svg = draw()
            self.drawn += 1
        self.used[key] = svg
        return svg

    def save(self) -> None:
        if self.path is None or self.used == self.kept:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.used, sort_keys=True))
