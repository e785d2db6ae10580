"""The Django app: ``INSTALLED_APPS = [..., "pyharvest.django"]`` (app label ``pyharvest``)."""

from __future__ import annotations

from django.apps import AppConfig


class PyharvestConfig(AppConfig):  # type: ignore[misc]  # Django ships no type information
    name = "pyharvest.django"
    label = "pyharvest"
    verbose_name = "pyharvest transactional outbox"
