"""Plots as inline SVG, drawn here on the server: the page needs no script and no network.

Each function takes plain numbers and labels and returns the SVG text, or None when there is nothing to draw
(the page then says "no data yet"). Every label is escaped here, which is why the templates may insert the SVG
as it is: domain and run names come from users' catalogs.
"""

from __future__ import annotations

from html import escape

BLUE, GREEN, ORANGE, GREY = "#3b6ea5", "#4c9a5b", "#d08a2e", "#888"
SERIES = (BLUE, ORANGE, GREEN, "#8e5ea2", "#c44e52", "#55a0b0")
FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                  f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" {FONT}>'
                  f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", fill: str = "#222", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}" {extra}>{escape(text)}</text>'


def _percent(x: float) -> str:
    return f"{100 * x:.0f}%"


def heatmap(cells: list[tuple[str, int, int, int]], title: str = "acceptance by domain × depth") -> str | None:
    """Acceptance rate per (row, column) cell, from (row, column, total, accepted) tuples; darker = higher."""
    if not cells:
        return None
    rows = sorted({c[0] for c in cells})
    cols = sorted({c[1] for c in cells})
    label_w, cell_w, cell_h, top = max(60, 7 * max(len(r) for r in rows) + 10), 74, 30, 34
    body = [_text(label_w + cell_w * len(cols) / 2, 14, "depth of the reference plan", "middle", GREY)]
    for j, col in enumerate(cols):
        body.append(_text(label_w + cell_w * (j + 0.5), top - 6, str(col), "middle"))
    by_cell = {(c[0], c[1]): c for c in cells}
    for i, row in enumerate(rows):
        y = top + i * cell_h
        body.append(_text(label_w - 8, y + cell_h / 2 + 4, row, "end"))
        for j, col in enumerate(cols):
            x = label_w + j * cell_w
            cell = by_cell.get((row, col))
            if cell is None:
                body.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="#f3f3f3"/>')
                continue
            _, _, total, accepted = cell
            rate = accepted / total if total else 0.0
            # light to dark blue with the rate; the text flips to white where the fill is dark
            shade = int(235 - 170 * rate)
            fill = f"rgb({shade - 40 if shade > 40 else 0},{shade},{min(255, shade + 30)})"
            body.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{fill}">'
                        f"<title>{escape(row)}, depth {col}: {accepted} of {total} accepted</title></rect>")
            body.append(_text(x + (cell_w - 2) / 2, y + cell_h / 2 + 4, f"{_percent(rate)} · {total}", "middle",
                              "#fff" if rate > 0.55 else "#222"))
    width = label_w + cell_w * len(cols) + 10
    return _svg(width, top + cell_h * len(rows) + 8, body, title)


def bars(items: list[tuple[str, float, str]], title: str, max_value: float = 1.0) -> str | None:
    """Horizontal bars from (label, value, text shown beside the bar)."""
    if not items:
        return None
    label_w = max(60, 7 * max(len(i[0]) for i in items) + 10)
    bar_w, bar_h = 260, 22
    body = []
    for i, (label, value, shown) in enumerate(items):
        y = 6 + i * (bar_h + 6)
        w = bar_w * max(0.0, min(1.0, value / max_value if max_value else 0.0))
        body.append(_text(label_w - 8, y + bar_h / 2 + 4, label, "end"))
        body.append(f'<rect x="{label_w}" y="{y}" width="{bar_w}" height="{bar_h}" fill="#eef1f5"/>')
        body.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{GREEN}">'
                    f"<title>{escape(label)}: {escape(shown)}</title></rect>")
        body.append(_text(label_w + bar_w + 6, y + bar_h / 2 + 4, shown))
    return _svg(label_w + bar_w + 90, 12 + len(items) * (bar_h + 6), body, title)


def histogram(values: list[float], title: str = "p̂ per probed task", bins: int = 10) -> str | None:
    """Counts of values in [0, 1] over ``bins`` equal bins (1.0 in the last)."""
    if not values:
        return None
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v * bins)))] += 1
    left, top, w, h = 36, 18, 320, 150
    peak = max(counts)
    body = [f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="{GREY}"/>',
            _text(left - 6, top + 10, str(peak), "end", GREY), _text(left - 6, top + h, "0", "end", GREY)]
    bw = w / bins
    for i, n in enumerate(counts):
        bh = h * n / peak if peak else 0
        body.append(f'<rect x="{left + i * bw + 1:.1f}" y="{top + h - bh:.1f}" width="{bw - 2:.1f}" '
                    f'height="{bh:.1f}" fill="{BLUE}"><title>p̂ {i / bins:.1f}–{(i + 1) / bins:.1f}: {n} task(s)'
                    "</title></rect>")
        if n:
            body.append(_text(left + (i + 0.5) * bw, top + h - bh - 3, str(n), "middle", GREY))
    for i in range(0, bins + 1, 2):
        body.append(_text(left + i * bw, top + h + 15, f"{i / bins:.1f}", "middle", GREY))
    body.append(_text(left + w / 2, top + h + 32, f"p̂ (policy pass rate), {len(values)} task(s)", "middle"))
    return _svg(left + w + 20, top + h + 40, body, title)


def lines(series: dict[str, list[tuple[int, float]]], title: str, y_label: str) -> str | None:
    """One line per series of (x, y) points, with a dot per point."""
    points = [p for s in series.values() for p in s]
    if not points:
        return None
    left, top, w, h = 44, 10, 380, 160
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(1.0, max(ys))

    def sx(x: float) -> float:
        return left + (w * (x - x0) / (x1 - x0) if x1 > x0 else w / 2)

    def sy(y: float) -> float:
        return top + h - h * (y - y0) / (y1 - y0)

    body = [f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="{GREY}"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="{GREY}"/>',
            _text(left - 6, sy(y1) + 4, f"{y1:g}", "end", GREY), _text(left - 6, sy(y0) + 4, f"{y0:g}", "end", GREY),
            _text(left, top + h + 15, str(x0), "middle", GREY), _text(left + w, top + h + 15, str(x1), "middle", GREY),
            _text(left + w / 2, top + h + 30, f"step · {y_label}", "middle")]
    for k, (name, pts) in enumerate(series.items()):
        color = SERIES[k % len(SERIES)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            body.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                        f"<title>{escape(name)} step {x}: {y:.3f}</title></circle>")
        body.append(_text(left + w + 8, top + 14 + 16 * k, name, fill=color))
    width = left + w + 20 + 7 * max(len(n) for n in series)
    return _svg(width, top + h + 40, body, title)


def grouped(groups: list[tuple[str, list[tuple[str, float | None]]]], title: str) -> str | None:
    """Vertical bars in [0, 1], one group per label, one bar per (series, value); None values are left out."""
    if not groups:
        return None
    names = list(dict.fromkeys(name for _, bars_ in groups for name, _ in bars_))
    colors = {n: SERIES[i % len(SERIES)] for i, n in enumerate(names)}
    left, top, h, bar_w, gap = 36, 10, 150, 26, 22
    group_w = bar_w * len(names) + gap
    body = [f'<line x1="{left}" y1="{top + h}" x2="{left + group_w * len(groups)}" y2="{top + h}" stroke="{GREY}"/>',
            _text(left - 6, top + 10, "1", "end", GREY), _text(left - 6, top + h, "0", "end", GREY)]
    for g, (label, values) in enumerate(groups):
        x = left + g * group_w + gap / 2
        for name, value in values:
            if value is None:
                continue
            i = names.index(name)
            bh = h * max(0.0, min(1.0, value))
            body.append(f'<rect x="{x + i * bar_w:.1f}" y="{top + h - bh:.1f}" width="{bar_w - 3}" '
                        f'height="{bh:.1f}" fill="{colors[name]}"><title>{escape(label)}: {escape(name)} '
                        f"{value:.3f}</title></rect>")
            body.append(_text(x + (i + 0.5) * bar_w, top + h - bh - 3, _percent(value), "middle", GREY,
                              'font-size="10"'))
        body.append(_text(x + bar_w * len(names) / 2, top + h + 15, label, "middle"))
    for i, name in enumerate(names):
        body.append(f'<rect x="{left + i * 110}" y="{top + h + 26}" width="10" height="10" fill="{colors[name]}"/>')
        body.append(_text(left + i * 110 + 14, top + h + 35, name))
    width = max(left + group_w * len(groups) + 10, left + 110 * len(names))
    return _svg(width, top + h + 44, body, title)
