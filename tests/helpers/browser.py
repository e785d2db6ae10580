"""A real headless Chromium (Debian's ``chromium`` and ``chromium-driver``) through selenium.

Started with a fresh profile and nothing that reaches out on its own (no QUIC, no background
networking, component updates or sync): the page under test must work offline.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.helpers.tools import require_module, require_tool

__all__ = ["CHROMIUM_FLAGS", "chromium"]

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator[Any]:
    """A selenium WebDriver on headless Chromium; skips (fails in CI) where either is missing."""
    binary = require_tool("chromium", "chromium")
    driver_path = require_tool("chromedriver", "chromium-driver")
    require_module("selenium", "selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="pyharvest-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        # The driver's path is given, so selenium's manager downloads nothing.
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            yield driver
        finally:
            driver.quit()
