"""The status page at ``/``: :func:`~pyharvest.bindings.ops.status.status_report` as HTML.

One self-contained document: inline CSS, charts drawn on the server as SVG, no script and no
external asset, so it works offline and behind any proxy. It reloads itself every sample
interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

__all__ = ["render_status_page"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#fafbfc}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #d8dde6;padding:.25em .6em;text-align:left}
th{background:#eef1f6}.ready{color:#176b2c}.down{color:#a4161a}.muted{color:#6b7280}
.badge{display:inline-block;padding:.1em .6em;border-radius:.8em;background:#e6f4ea}
.badge.down{background:#fde8e8}.badge.warn{background:#fdf1d8;color:#8a5300}.warn{color:#8a5300}.leader{font-weight:600;color:#176b2c}
code{background:#eef1f6;padding:.1em .3em;border-radius:.2em;font-size:.92em;white-space:nowrap}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{background:#fff;border:1px solid #d8dde6;padding:.4em}
.chart h3{font-size:.95em;margin:0 0 .2em}svg text{font-size:10px;fill:#6b7280}
td.error{min-width:16em;max-width:36em;font-size:.9em}tr.commands td{border-top:none;padding-bottom:.5em}
.command{margin:.15em 0}
"""

_WIDTH, _HEIGHT, _PAD = 420, 150, 34


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


Series = Sequence[tuple[str, str, Sequence[float | None]]]


def _chart(title: str, unit: str, times: Sequence[float], series: Series) -> str:
    """A line chart: ``series`` of (name, colour, values at ``times``); a gap where a value is None."""
    values = [v for _, _, vs in series for v in vs if v is not None]
    head = f'<div class="chart"><h3>{escape(title)}</h3>'
    if len(times) < 1 or not values:
        return head + '<p class="muted chart-empty">no samples yet</p></div>'
    top = max(values) * 1.15 or 1.0
    t0, t1 = times[0], times[-1]
    span = (t1 - t0) or 1.0
    inner_w, inner_h = _WIDTH - _PAD - 8, _HEIGHT - 24

    def xy(t: float, v: float) -> tuple[float, float]:
        return _PAD + (t - t0) / span * inner_w, 6 + inner_h - v / top * inner_h

    parts = [
        f'<svg class="series-chart" role="img" aria-label="{escape(title)}" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{_PAD}" y1="{6 + inner_h}" x2="{_WIDTH - 8}" y2="{6 + inner_h}" stroke="#c3cad5"/>',
        f'<line x1="{_PAD}" y1="6" x2="{_PAD}" y2="{6 + inner_h}" stroke="#c3cad5"/>',
        f'<text x="2" y="14">{escape(_number(top))}</text><text x="2" y="{6 + inner_h}">0</text>',
        # The time axis: how far back the first sample is (none while there is only one).
        *([f'<text x="{_PAD}" y="{_HEIGHT - 4}">-{escape(_duration(t1 - t0))}</text>'] if t1 > t0 else []),
        f'<text x="{_WIDTH - 30}" y="{_HEIGHT - 4}">now</text>',
    ]
    legend_x = _PAD + 60
    for name, colour, vs in series:
        # One line per run of samples: a gap (no sample, say no record published then) is left
        # blank, not bridged by a straight line that shows values nobody measured.
        runs: list[list[tuple[float, float]]] = [[]]
        for t, v in zip(times, vs, strict=True):
            if v is not None and math.isfinite(v):
                runs[-1].append(xy(t, v))
            elif runs[-1]:
                runs.append([])
        for run in runs:
            if len(run) > 1:
                coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{coords}"/>')
            parts += [f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{colour}"/>' for x, y in run]
        parts.append(f'<text x="{legend_x}" y="{_HEIGHT - 4}" style="fill:{colour}">{escape(name)} ({unit})</text>')
        legend_x += 110
    parts.append("</svg>")
    return head + "".join(parts) + "</div>"


def _row(*cells: str, header: bool = False, classes: Sequence[str] = ()) -> str:
    tag = "th" if header else "td"
    return "<tr>" + "".join(
        f'<{tag} class="{classes[i]}">{c}</{tag}>' if i < len(classes) and classes[i] else f"<{tag}>{c}</{tag}>"
        for i, c in enumerate(cells)
    ) + "</tr>"


def _blocked_section(status: dict[str, Any]) -> list[str]:
    """The keys held back by a record Kafka refuses for good (retried, not quarantined)."""
    blocked, count = status.get("blocked_keys") or [], status.get("blocked_key_count") or 0
    out = ["<h2>Blocked keys</h2>"]
    if not count:
        out.append('<p id="blocked-empty">none (no record is being retried after Kafka refused it)</p>')
        return out
    out.append(
        f'<p id="blocked-note" class="warn">{count} key{"" if count == 1 else "s"} held back: Kafka refuses '
        "the record for good, it is retried and the key's later records wait behind it. Fix the cause (the "
        "log's advice names it) or delete the record's row; <code>poisonPolicy: quarantine</code> parks such a "
        "key instead.</p>"
    )
    sharded = any("shard" in b for b in blocked)
    out.append('<table id="blocked">')
    out.append(_row("key", "topic", "record", "attempts", "since", "error", *(["shard"] if sharded else []),
                    header=True))
    for b in blocked:
        since = datetime.fromisoformat(b["since"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        out.append(_row(
            f"<code>{escape(b['key'])}</code>", escape(b["topic"]), str(b["record_id"]), str(b["attempts"]),
            since, escape(b["error"]), *([str(b.get("shard", ""))] if sharded else []),
            classes=("", "", "", "", "", "error"),
        ))
    out.append("</table>")
    if count > len(blocked):
        out.append(f'<p class="muted">and {count - len(blocked)} more</p>')
    return out


#: A snapshot held longer than this is shown as a warning (the alert OutboxCleanupHeldBack
#: fires at 5 minutes).
HORIZON_WARN_SECONDS = 60.0


def _horizon_section(horizon: dict[str, Any] | None) -> list[str]:
    """Who holds the database's clean-up back, when someone has for long enough to matter."""
    if horizon is None:
        return []
    age, behind = horizon.get("age_seconds"), horizon.get("behind")
    if not horizon.get("holder") or age is None or age < HORIZON_WARN_SECONDS:
        return []
    unit = horizon.get("behind_unit") or "behind"
    more = f" ({unit} {behind})" if behind is not None else ""
    return [
        "<h2>Clean-up horizon</h2>",
        f'<p id="horizon" class="error">The database keeps the outbox\'s dead rows for a snapshot held '
        f"{_duration(age)} by {escape(horizon['holder'])}{escape(more)}: the table grows and marks slow "
        "down until it ends.</p>",
    ]


def _led_by(who: dict[str, Any] | None, shard: int) -> str:
    """A standby's shard: which process leads it, as its last heartbeat said."""
    if who is None:
        return ' <span class="muted">(leader not known yet: reading the leader topic)</span>'
    return (f' <span class="led-by" id="led-by-{shard}">led by {escape(who["text"])} (last heartbeat '
            f'{_duration(who["last_heartbeat_seconds_ago"])} ago)</span>')


def render_status_page(status: dict[str, Any]) -> str:
    """The page for ``status`` (a :func:`~pyharvest.bindings.ops.status.status_report`)."""
    p = status["process"]
    ready = status["ready"]
    refresh = max(2, round(status.get("sample_interval_seconds") or 5))
    # Ready but holding keys back: a warning, not green (the relay serves every other key).
    badge = "down" if not ready else "warn" if status.get("degraded") else "ready"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{refresh}">',
        f"<title>pyharvest {escape(p['name'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>pyharvest <span class=\"muted\">{escape(p['name'])}</span></h1>",
        f'<p><span id="readiness" class="badge {badge}">{escape(status["status"])}</span> '
        f"{escape(p['host'])} pid {p['pid']} · pyharvest {escape(p['version'])} · up {_duration(p['uptime_seconds'])}"
        f" · group <code>{escape(p['leader_group_id'])}</code> · table <code>{escape(p['outbox_table'])}</code>"
        f" · {escape(p['delivery'])}</p>",
    ]
    down = status["health"].get("down")
    if down:
        errors = status["health"].get("errors", {})
        reasons = "; ".join(f"{d}: {errors[d]}" if d in errors else d for d in down)
        out.append(f'<p class="down">Not ready: {escape(reasons)}</p>')

    # What needs an operator comes first, right under the badge: the keys held back, then the
    # quarantine (the charts and tables below are for looking closer).
    out += _blocked_section(status)
    out.append("<h2>Quarantined keys</h2>")
    quarantined = status["quarantined"]
    if quarantined is None:
        out.append('<p class="muted">unknown (the database has not answered yet)</p>')
    elif not quarantined:
        policy = p["poison_policy"]
        note = "" if policy == "quarantine" else (
            f" (<code>poisonPolicy: {escape(policy)}</code> quarantines no key: a poison record blocks its key,"
            " under Blocked keys)"
        )
        out.append(f'<p id="quarantine-empty">none{note}</p>')
    else:
        out.append('<table id="quarantine">')
        out.append(_row("key", "topic", "record", "attempts", "since", "error", header=True))
        for q in quarantined:
            since = (
                datetime.fromisoformat(q["quarantine_time"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                if q["quarantine_time"] else "?"
            )
            out.append(_row(
                f"<code>{escape(q['key'])}</code>", escape(q["topic"]), str(q["record_id"]), str(q["attempts"]),
                since, escape(q["error"]), classes=("", "", "", "", "", "error"),
            ))
            commands = "".join(
                f'<div class="command">{action} once fixed: <code>{escape(line)}</code></div>' if action == "replay"
                else f'<div class="command">or {action} its poison record: <code>{escape(line)}</code></div>'
                for action, line in q["commands"].items()
            )
            out.append(f'<tr class="commands"><td colspan="6">{commands}</td></tr>')
        out.append("</table>")

    out += _horizon_section(status.get("cleanup_horizon"))

    out.append("<h2>Shards</h2><table id=\"shards\">")
    out.append(_row("shard", "role of this process", "in flight", "backlog", header=True))
    for s in status["shards"]:
        role = f'<span class="leader">{s["role"]}</span>' if s["role"] == "leader" else s["role"]
        if s["role"] != "leader" and "led_by" in s:
            role += _led_by(s["led_by"], s["shard"])
        backlog = "—" if s["backlog_records"] is None else str(s["backlog_records"])
        out.append(_row(str(s["shard"]), role, str(s["in_flight_records"]), backlog))
    out.append("</table>")

    backlog = status["backlog_records"]
    backlog_text = (
        f"{backlog} row{'' if backlog == 1 else 's'}" if backlog is not None
        else '<span class="muted">not counted (set <code>metrics.backlogInterval</code>)</span>'
    )
    out += [
        "<h2>Backlog and lag</h2><table id=\"lag\">",
        _row("backlog", backlog_text),
        _row("oldest record's age (lag)",
             f'<span id="lag-seconds">{_duration(status["oldest_record_age_seconds"])}</span>'),
        _row("records published", str(status["records_published_total"])),
        "</table>",
    ]

    history = status["history"]
    times = [h["time"] for h in history]
    span = _duration(times[-1] - times[0]) if len(times) > 1 else "minutes"
    out.append(f'<h2>The last {span}</h2><div class="charts">')
    out.append(_chart("publish rate", "records/s", times,
                      [("published", "#2563eb", [h["published_per_second"] for h in history])]))
    out.append(_chart("publish latency (create_time to ack)", "s", times, [
        ("p50", "#059669", [h["latency_p50_seconds"] for h in history]),
        ("p99", "#d97706", [h["latency_p99_seconds"] for h in history]),
    ]))
    out.append(_chart("oldest record's age", "s", times,
                      [("age", "#7c3aed", [h["oldest_record_age_seconds"] for h in history])]))
    out.append("</div>")

    out.append(
        '<p class="muted">'
        + " · ".join(f'<a href="{e}">{e}</a>' for e in status["endpoints"] if e not in ("/", "/status"))
        + " · JSON: <code>Accept: application/json</code> or <a href=\"/status\">/status</a></p></body></html>"
    )
    return "\n".join(out)
