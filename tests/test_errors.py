"""pyharvest's exceptions form one hierarchy: `except HarvestError` catches every error of its own."""

from __future__ import annotations

import inspect

from pyharvest.core import errors
from pyharvest.core.ports import kafka


def test_every_error_is_a_harvest_error():
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if obj.__module__ == errors.__name__]
    assert {c.__name__ for c in classes} >= {"BindingError", "ConfigError", "TopicError"}
    assert all(issubclass(c, errors.HarvestError) for c in classes)


def test_topic_error_is_still_importable_beside_the_kafka_protocols():
    assert kafka.TopicError is errors.TopicError
    assert "TopicError" in kafka.__all__ and "TopicError" in errors.__all__
