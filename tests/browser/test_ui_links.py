"""The web UI's Shovels and Federation pages end to end.

Method: a real broker and headless Chromium as in test_ui_admin.py; the browser adds a
shovel and an upstream through the pages' forms, pauses, resumes and deletes, and the test
checks the broker's parameters through the API. Running links are `TestLink`s (a real
implementation of the `Link` protocol, registered in `Broker.links` from the test), so the
state, transferred and error columns and the buttons are checked whatever the links
runtime does with the unreachable URIs of the parameters.
"""

from __future__ import annotations

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec

from tests.browser.test_ui_admin import (
    confirm_click,
    fill,
    go,
    gone,
    log_in,
    open_form,
    visible,
    wait,
)
from tests.integration.conftest import RunningBroker
from tests.integration.test_http_parameters import TestLink, register

pytestmark = pytest.mark.browser
ATTEMPTS = 5


def parameter_status(broker: RunningBroker, component: str, name: str) -> tuple[int, object]:
    status, body, _ = broker.http("GET", f"/api/parameters/{component}/%2F/{name}")
    return status, body


def confirm_click_fresh(driver: WebDriver, element_id: str) -> None:
    """`confirm_click` on the button with `element_id`, found again if a redraw (the
    refresh after a previous action) replaced it between the two clicks."""
    for _ in range(ATTEMPTS):
        try:
            confirm_click(visible(driver, f'[id="{element_id}"]'))
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{element_id} kept being redrawn")


def refresh(driver: WebDriver) -> None:
    driver.find_element(By.ID, "refresh").click()


def test_shovels_page(broker: RunningBroker, driver: WebDriver) -> None:
    link = TestLink("shovel", "/", "ui-running", transferred=1234)
    register(broker, link)
    log_in(driver, broker)
    go(driver, "shovels")
    row = visible(driver, 'tr[data-key="//ui-running"]')
    assert "running" in row.text and "1,234" in row.text

    open_form(driver, "shovel-form")
    fill(
        driver,
        {
            "shovel-name": "ui-shovel",
            "shovel-src-uri": "amqp://127.0.0.1:1",
            "shovel-src-name": "orders",
            "shovel-dest-uri": "amqp://user:secret@127.0.0.1:2/%2f",
            "shovel-dest-kind": "exchange",
            "shovel-dest-name": "archive",
            "shovel-ack-mode": "on-publish",
            "shovel-prefetch": "50",
        },
    )
    driver.find_element(By.ID, "shovel-forward-headers").click()
    driver.find_element(By.ID, "shovel-form-submit").click()
    added = visible(driver, 'tr[data-key="//ui-shovel"]')
    assert "exchange archive" in added.text and "queue orders" in added.text
    assert "********" in added.text and "secret" not in added.text
    status, body = parameter_status(broker, "shovel", "ui-shovel")
    assert status == 200 and isinstance(body, dict)
    assert body["value"] == {
        "src-uri": "amqp://127.0.0.1:1",
        "src-queue": "orders",
        "dest-uri": "amqp://user:secret@127.0.0.1:2/%2f",
        "dest-exchange": "archive",
        "ack-mode": "on-publish",
        "src-prefetch-count": 50,
        "dest-add-forward-headers": True,
    }

    # A bad value: the broker's reason shows, nothing changes.
    fill(driver, {"shovel-name": "ui-shovel", "shovel-src-uri": "ftp://nowhere"})
    driver.find_element(By.ID, "shovel-form-submit").click()
    toast = visible(driver, ".toast.error")
    assert "Validation failed" in toast.text and "scheme must be one of" in toast.text
    assert parameter_status(broker, "shovel", "ui-shovel")[1] == body

    # The state cell, not the row: the row's name "ui-running" holds "running" itself.
    state = (By.CSS_SELECTOR, 'tr[data-key="//ui-running"] td[data-field="state"]')
    driver.find_element(By.ID, "shovel-pause://ui-running").click()
    wait(driver).until(ec.text_to_be_present_in_element(state, "paused"))
    visible(driver, '[id="shovel-resume://ui-running"]').click()
    wait(driver).until(ec.text_to_be_present_in_element(state, "running"))
    visible(driver, '[id="shovel-restart://ui-running"]').click()
    wait(driver).until(lambda _: broker.ask(lambda: len(link.calls)) == 3)
    assert broker.ask(lambda: list(link.calls)) == ["pause", "resume", "restart"]

    confirm_click_fresh(driver, "shovel-delete://ui-shovel")
    gone(driver, 'tr[data-key="//ui-shovel"]')
    assert parameter_status(broker, "shovel", "ui-shovel")[0] == 404


def test_federation_page(broker: RunningBroker, driver: WebDriver) -> None:
    register(
        broker, TestLink("federation", "/", "fed.x up", state="error", error="connection refused")
    )
    log_in(driver, broker)
    go(driver, "federation")
    link_row = visible(driver, 'tr[data-key="//fed.x up"]')
    assert "connection refused" in link_row.text and "error" in link_row.text
    assert "exchange fed.x" in link_row.text

    open_form(driver, "upstream-form")
    fill(
        driver,
        {
            "upstream-name": "ui-up",
            "upstream-uri": "amqp://fed:secret@127.0.0.1:3",
            "upstream-exchange": "fed.x",
            "upstream-max-hops": "2",
        },
    )
    driver.find_element(By.ID, "upstream-form-submit").click()
    row = visible(driver, 'tr[data-key="//ui-up"]')
    assert "fed:********@" in row.text and "secret" not in row.text and "max-hops" in row.text
    status, body = parameter_status(broker, "federation-upstream", "ui-up")
    assert status == 200 and isinstance(body, dict)
    assert body["value"] == {
        "uri": "amqp://fed:secret@127.0.0.1:3",
        "exchange": "fed.x",
        "max-hops": 2,
        "ack-mode": "on-confirm",
    }
    confirm_click_fresh(driver, "upstream-delete://ui-up")
    gone(driver, 'tr[data-key="//ui-up"]')
    assert parameter_status(broker, "federation-upstream", "ui-up")[0] == 404
    refresh(driver)
    visible(driver, 'tr[data-key="//fed.x up"]')
