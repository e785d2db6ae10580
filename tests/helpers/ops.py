"""The ops server as a test reads it: its metrics scraped, its probes asked (in this process, or
a ``reaper`` process's by its port)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

#: A ``metrics:`` section serving on a free loopback port.
LOCAL = {"address": "127.0.0.1", "port": 0}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def families(ops) -> list:
    """The metric families ``/metrics`` serves now."""
    from prometheus_client.parser import text_string_to_metric_families  # the metrics extra

    status, text = get(ops.url + "/metrics")
    assert status == 200
    return list(text_string_to_metric_families(text))


def scrape(ops) -> dict[str, float]:
    """Sample name (with labels, sorted) -> value."""
    out: dict[str, float] = {}
    for family in families(ops):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def probe(ops, path: str) -> tuple[int, dict]:
    status, body = get(ops.url + path)
    return status, json.loads(body)


def readyz(port: int) -> tuple[int, dict]:
    """A ``reaper`` process's ``/readyz``: status and body (-1 while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:  # noqa: S310
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError as e:
        return -1, {"error": str(e)}


def metric_total(port: int, name: str) -> float:
    """The sum of a ``reaper`` process's samples whose name starts with ``name``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:  # noqa: S310
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def count_readings(reading) -> list[int]:  # noqa: ANN001 - a Periodic (the backlog counter, the outbox watch)
    """Count the readings the ops server's background ``reading`` takes from now on: a later
    event to wait for, such as one more read after a drain. Returns the one-item counter."""
    done = [0]
    read = reading.read_once

    def counted():  # noqa: ANN202
        try:
            return read()
        finally:
            done[0] += 1

    reading.read_once = counted  # the reading's own thread calls it on the instance
    return done
