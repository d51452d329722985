"""Evaluation output shared by the eval stages: a plain-text table, a markdown one, a grouped bar
figure, line figures of metrics by step and figures of means with their intervals; figures are written
atomically (a reader never sees half a PNG).

Rows are flat dicts of one model x setting (`{"system": "sft", "decoding": "none", "compliance": 0.9}`),
the same dicts that go into the stage's JSON file, so the table, the JSON and the figure never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from emoji_rl.io.jsonl import replacing

Row = Mapping[str, str | int | float | None]


def _cell(value: str | int | float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[Row], columns: Sequence[str]) -> str:
    """Fixed-width text table; text columns left-aligned, numbers right-aligned, a missing value is `-`."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), int | float | None) for row in rows) for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
        )

    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)]).rstrip()


def number_cell(value: object, digits: int = 3) -> str:
    """A markdown table's cell: a float to `digits` places, a missing value as n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table of text cells (a `|` in a cell escaped, a line break made a space)."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def bar_figure(
    rows: Sequence[Row], metrics: Sequence[str], group: str, series: str, title: str, path: str | Path
) -> Path:
    """One panel per metric; bars grouped by `group` (e.g. decoding), one colour per `series` (e.g. model).
    Rows with no value for a metric leave a gap."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    groups = list(dict.fromkeys(str(r[group]) for r in rows))
    names = list(dict.fromkeys(str(r[series]) for r in rows))
    values = {(str(r[group]), str(r[series])): r for r in rows}
    width = 0.8 / len(names)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for k, name in enumerate(names):
            for g, label in enumerate(groups):
                value = values.get((label, name), {}).get(metric)
                if isinstance(value, int | float):
                    ax.bar(g + (k - (len(names) - 1) / 2) * width, value, width, color=f"C{k}")
        ax.set_xticks(range(len(groups)), groups)
        ax.set_title(metric, fontsize=10)
    handles = [Patch(color=f"C{k}", label=name) for k, name in enumerate(names)]
    fig.legend(handles=handles, loc="lower center", ncol=len(names), fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, path)


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Each value replaced by the mean of it and the `window - 1` before it (fewer at the start)."""
    assert window >= 1, window
    sums = [0.0]
    for v in values:
        sums.append(sums[-1] + v)
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


def line_figure(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    path: str | Path,
    xlabel: str = "step",
    per_row: int = 5,
    smooth_from: int = 20,
) -> Path:
    """One panel per curve (name -> (x, y) points), e.g. a training run's metrics by step; at most
    `per_row` panels a row, so that a page shows them at a readable size. A curve of `smooth_from`
    points or more is drawn faint with its trailing mean over a tenth of them on top: one GRPO step's
    numbers swing with its few targets, and the trend is what a reader looks for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(curves), per_row)
    rows = -(-len(curves) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.2 * rows), squeeze=False)
    panels = list(axes.flat)
    for ax, (name, points) in zip(panels, curves.items(), strict=False):
        xs, ys = [x for x, _ in points], [y for _, y in points]
        if len(points) < smooth_from:
            ax.plot(xs, ys, marker=".")
        else:
            ax.plot(xs, ys, color="C0", alpha=0.3, linewidth=0.8)
            ax.plot(xs, trailing_mean(ys, len(ys) // 10), color="C0")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
    for ax in panels[len(curves) :]:  # the last row's empty places
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def interval_figure(
    panels: Mapping[str, Sequence[tuple[float, float, float | None, float | None]]],
    title: str,
    path: str | Path,
    xlabel: str,
) -> Path:
    """One panel per measure: its (x, mean, low, high) points joined in order of x, each interval an
    error bar, and a dashed line at 0, where a difference changes sign."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (name, points) in zip(axes.flat, panels.items(), strict=True):
        points = sorted(points)
        xs, means = [p[0] for p in points], [p[1] for p in points]
        below = [m - lo if lo is not None else 0.0 for _, m, lo, _ in points]
        above = [hi - m if hi is not None else 0.0 for _, m, _, hi in points]
        ax.errorbar(xs, means, yerr=[below, above], marker="o", capsize=4)
        ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path
