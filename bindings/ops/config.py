"""The ``metrics:`` section of ``reaper.yaml``: where the operations server listens.

.. code-block:: yaml

    metrics:
      address: 127.0.0.1      # interface to listen on (0.0.0.0: every one, e.g. in a pod)
      port: 9433              # /metrics, /healthz and /readyz
      backlogInterval: 30s    # optional: count the outbox this often (pyharvest_backlog_records)
      ageInterval: 5s         # read the oldest row's age (and the quarantine) this often

The section's presence turns the server on; ``enabled: false`` turns it off again (handy
from the environment: ``PYHARVEST_METRICS__ENABLED=false``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyharvest.core.config.durations import format_duration, parse_duration
from pyharvest.core.config.mapping import did_you_mean
from pyharvest.core.errors import ConfigError

__all__ = ["DEFAULT_ADDRESS", "DEFAULT_AGE_INTERVAL", "DEFAULT_PORT", "METRICS_KEYS", "OpsConfig"]

# This machine only, until the configuration says otherwise: what the server shows (metrics,
# health; never a record or a secret) is for the operators' tools, and a pod's probes and
# scrapes come through metrics.address: 0.0.0.0, which the Kubernetes example sets.
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9433
DEFAULT_AGE_INTERVAL = 5.0

#: The keys of the ``metrics:`` section.
METRICS_KEYS = ("address", "ageInterval", "backlogInterval", "enabled", "port")


@dataclass(frozen=True, slots=True)
class OpsConfig:
    """Settings of the operations server (Prometheus metrics and health probes).

    Attributes:
        address: the interface to listen on; ``127.0.0.1`` (this machine only) by default,
            ``0.0.0.0`` for every interface (a pod's probes and scrapes come from outside it).
        port: the TCP port; ``0`` picks a free one (see ``OpsServer.port``).
        backlog_interval: seconds between counts of the outbox for the
            ``pyharvest_backlog_records`` gauge; ``None`` leaves the gauge out.
        age_interval: seconds between reads of the oldest row's age
            (``pyharvest_oldest_record_age_seconds``, one look-up through the id index) and of
            the quarantine (``pyharvest_quarantined_records``), on every replica; also the
            status page's sampling interval.
        enabled: ``False`` keeps the server off although the section is present.
    """

    address: str = DEFAULT_ADDRESS
    port: int = DEFAULT_PORT
    backlog_interval: float | None = None
    enabled: bool = True
    age_interval: float = DEFAULT_AGE_INTERVAL

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, prefix: str = "metrics") -> OpsConfig:
        """Validate the ``metrics:`` section; errors are :class:`ConfigError` naming the key."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(prefix, f"expected a mapping with address, port and backlogInterval, got {data!r}")
        address, port, backlog, enabled, age = DEFAULT_ADDRESS, DEFAULT_PORT, None, True, DEFAULT_AGE_INTERVAL
        for key, value in data.items():
            where = f"{prefix}.{key}"
            if key not in METRICS_KEYS:
                raise ConfigError(
                    where, f"unknown key; {did_you_mean(key, METRICS_KEYS)}expected one of: {', '.join(METRICS_KEYS)}"
                )
            if value is None:
                continue
            if key == "address":
                if not isinstance(value, str) or not value.strip():
                    raise ConfigError(where, f"expected a host name or IP address, got {value!r}")
                address = value.strip()
            elif key == "port":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                    raise ConfigError(where, f"expected a TCP port number from 0 to 65535, got {value!r}")
                port = value
            elif key in ("backlogInterval", "ageInterval"):
                try:
                    seconds = parse_duration(value, where)
                except ValueError as e:
                    raise ConfigError("", str(e)) from None
                if seconds <= 0:
                    example = "30s" if key == "backlogInterval" else "5s"
                    raise ConfigError(
                        where, f"must be a positive duration like '{example}' (or omitted), got {value!r}"
                    )
                if key == "backlogInterval":
                    backlog = seconds
                else:
                    age = seconds
            else:  # enabled
                if not isinstance(value, bool):
                    raise ConfigError(where, f"expected true or false, got {value!r}")
                enabled = value
        return cls(address, port, backlog, enabled, age)

    def to_mapping(self) -> dict[str, object]:
        """The section as ``reaper --print-config`` shows it."""
        out: dict[str, object] = {"address": self.address, "port": self.port}
        if self.backlog_interval is not None:
            out["backlogInterval"] = format_duration(self.backlog_interval)
        if self.age_interval != DEFAULT_AGE_INTERVAL:
            out["ageInterval"] = format_duration(self.age_interval)
        if not self.enabled:
            out["enabled"] = False
        return out
