"""Fixtures for the web UI tests: the real broker (shared with the integration tests) and
headless Chromium driven through Debian's chromedriver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests.integration.conftest import RunningBroker

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PAGE_LOAD_TIMEOUT_S = 20
# Headless, and nothing that reaches out of the machine (updates, sync, QUIC probes).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1000",
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data")
    yield running
    running.stop()


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    # Both paths given, so Selenium Manager never looks for (or downloads) a driver.
    chrome = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    chrome.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    try:
        yield chrome
    finally:
        chrome.quit()
