"""The ops server as a test reads it: its metrics scraped, its probes asked."""

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

