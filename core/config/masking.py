"""Secrets hidden from what is logged or printed: database passwords and secret Kafka properties."""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["mask_data_source", "mask_kafka_config"]

# Kafka client properties whose values are secrets; matched case-insensitively.
_SECRET_KAFKA_KEYS = re.compile(r"(password|secret|\.key\.pem|private\.key|token|oauthbearer\.config)", re.IGNORECASE)


def mask_kafka_config(config: Mapping[str, object]) -> dict[str, object]:
    """A copy of ``config`` with the values of secret properties replaced by ``***``."""
    return {k: ("***" if _SECRET_KAFKA_KEYS.search(k) else v) for k, v in config.items()}


_URL_PASSWORD = re.compile(r"(?P<pre>://[^:/@?#]*:)(?P<pw>[^@/?#]*)(?P<post>@)")
# An empty password ("password= dbname=x", goharvest's own example) matches nothing.
_LIBPQ_PASSWORD = re.compile(r"(?P<pre>\bpassword\s*=)(?P<pw>'(?:[^'\\]|\\.)*'|[^\s']\S*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"(?P<pre>[?&](?:password|pwd)=)(?P<pw>[^&#]*)", re.IGNORECASE)


def mask_data_source(data_source: str) -> str:
    """Hide the password in a SQLAlchemy URL or a libpq ``key=value`` string."""
    masked = _URL_PASSWORD.sub(lambda m: m["pre"] + ("***" if m["pw"] else "") + m["post"], data_source)
    masked = _QUERY_PASSWORD.sub(lambda m: m["pre"] + "***", masked)
    if "://" not in masked:
        masked = _LIBPQ_PASSWORD.sub(lambda m: m["pre"] + "***", masked)
    return masked
