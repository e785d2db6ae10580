"""Which delivery mode an engine builds: the one place in the engine that reads ``config.delivery``."""

from __future__ import annotations

from collections.abc import Mapping

from pyharvest.core.config.choices import Delivery
from pyharvest.core.config.settings import Config
from pyharvest.core.publishing.at_least_once import AtLeastOnce
from pyharvest.core.publishing.contract import DeliveryModeType
from pyharvest.core.publishing.exactly_once import ExactlyOnce

__all__ = ["delivery_mode"]

_MODES: Mapping[str, DeliveryModeType] = {Delivery.AT_LEAST_ONCE: AtLeastOnce, Delivery.EXACTLY_ONCE: ExactlyOnce}


def delivery_mode(config: Config) -> DeliveryModeType:
    """The delivery mode ``config`` (resolved) names."""
    return _MODES[config.delivery]
