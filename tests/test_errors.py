"""pyharvest's exceptions form one hierarchy: `except HarvestError` catches every error of its own."""

from __future__ import annotations

import pyharvest.errors
from pyharvest.core import errors
from pyharvest.core.inbox import errors as inbox_errors
from pyharvest.core.ports import kafka


def test_every_error_is_a_harvest_error_and_public():
    classes = [getattr(m, name) for m in (errors, inbox_errors) for name in m.__all__ if name.endswith("Error")]
    assert {c.__name__ for c in classes} >= {"BindingError", "ConfigError", "TopicError", "HandlerError"}
    for c in classes:
        assert issubclass(c, errors.HarvestError)
        assert getattr(pyharvest.errors, c.__name__) is c and c.__module__ == "pyharvest.errors"


def test_topic_error_is_still_importable_beside_the_kafka_protocols():
    assert kafka.TopicError is errors.TopicError
    assert "TopicError" in kafka.__all__ and "TopicError" in errors.__all__
