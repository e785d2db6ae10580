"""The soak's plot: one panel per series of its CSV (:mod:`benchmarks.soak`), minutes along x.

    python -m benchmarks.soak_plots OUT.csv OUT.png     # redraw from a CSV
    python -m benchmarks.soak_plots OUT.csv OUT.png --mark "25.9=storage changed" ...

``--mark MINUTE=LABEL`` draws a vertical line at a minute on every panel: a run whose settings
were changed while it ran (``ALTER TABLE … SET``) says where.

Needs matplotlib (``pip install 'pyharvest[benchmarks]'``).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

# (title, [(column, label, scale)], unit): a panel is drawn when any of its columns has values.
# Latency is drawn on a log scale: a run that falls behind for a minute spans milliseconds to
# tens of seconds, and a linear axis would flatten everything else to its floor.
PANELS = [
    ("rate", [("offered_per_s", "committed", 1), ("published_per_s", "published", 1)], "records/s"),
    ("latency from commit", [("create_p50_ms", "CreateTime p50", 1), ("create_p99_ms", "CreateTime p99", 1),
                             ("visible_p50_ms", "visible p50", 1), ("visible_p99_ms", "visible p99", 1)], "ms (log)"),
    ("backlog at each minute's end", [("backlog", "records", 1)], "records"),
    ("marks", [("mark_ms", "mean mark ms", 1), ("purge_ms", "mean purge ms", 1)], "ms"),
    ("reaper memory", [("rss_mib", "RSS", 1)], "MiB"),
    ("reaper threads and file descriptors", [("threads", "threads", 1), ("fds", "fds", 1)], "count"),
    ("outbox size", [("table_bytes", "table", 1 / 2**20), ("index_bytes", "indexes", 1 / 2**20),
                     ("file_bytes", "file on disk", 1 / 2**20)], "MiB"),
    ("dead tuples and autovacuum", [("dead_tuples", "dead tuples", 1), ("live_tuples", "live tuples", 1)], "tuples"),
    ("pages a mark reads (probe)", [("mark_probe_buffers", "from the lowest id", 1),
                                    ("cursor_probe_buffers", "from the key-set cursor", 1)], "pages (log)"),
    ("autovacuum runs (cumulative)", [("autovacuum_runs", "autovacuum", 1)], "runs"),
    ("InnoDB history list length (server-wide)", [("history_list_length", "undo records", 1)], "records"),
]


def _values(rows: list[dict[str, str]], column: str) -> list[float | None]:
    return [float(r[column]) if r.get(column) not in (None, "") else None for r in rows]


def plot(csv_path: Path, png_path: Path, summary: dict[str, object] | None = None,
         marks: Sequence[tuple[float, str]] = ()) -> None:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    minutes = [float(r["minute"]) for r in rows]
    # A held clean-up horizon (soak --hold) shades the rows it was held in.
    step = minutes[1] - minutes[0] if len(minutes) > 1 else minutes[0]
    held = [m for m, r in zip(minutes, rows, strict=True) if r.get("held") in ("1", "1.0")]
    panels = [p for p in PANELS if any(v is not None for col, _, _ in p[1] for v in _values(rows, col))]
    cols = 2
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(12, 2.8 * nrows), squeeze=False, sharex=True)
    for ax, (title, series, unit) in zip(axes.flat, panels, strict=False):
        for column, label, scale in series:
            ys = _values(rows, column)
            if any(v is not None for v in ys):
                ax.plot(minutes, [None if v is None else v * scale for v in ys], marker=".", label=label)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        if unit.endswith("(log)"):
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        for minute in held:
            ax.axvspan(minute - step, minute, color="orange", alpha=0.15, linewidth=0)
        for minute, label in marks:
            ax.axvline(minute, color="grey", linestyle="--", linewidth=1)
            ax.text(minute, 1, f" {label}", transform=ax.get_xaxis_transform(), fontsize=7, va="top", color="dimgrey")
        if len(series) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("minute")
    if summary:
        fig.suptitle(f"soak: {summary.get('database')}, {summary.get('rate'):,.0f} records/s offered, "  # type: ignore[str-format]
                     f"{summary.get('minutes'):g} min, {summary.get('delivery')}", fontsize=12)
    fig.tight_layout()
    fig.savefig(png_path, dpi=80)
    plt.close(fig)


def _mark(text: str) -> tuple[float, str]:
    minute, _, label = text.partition("=")
    return float(minute), label


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", type=Path)
    p.add_argument("png", type=Path)
    p.add_argument("--mark", type=_mark, action="append", default=[], help="MINUTE=LABEL: a vertical line")
    p.add_argument("--summary", type=Path, default=None, help="the soak's OUT.json, for the title")
    args = p.parse_args()
    plot(args.csv, args.png, json.loads(args.summary.read_text()) if args.summary else None, args.mark)
