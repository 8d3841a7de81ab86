"""The queue page shows which consumer of a single-active-consumer queue is active.

Method: two pika consumers subscribe to a queue with `x-single-active-consumer`; the
browser opens the queue's page and must show the first as `single_active`, the second as
`waiting` and the first's tag as the queue's single active consumer; after the first
cancels, the page (refreshed) shows the second as active.
"""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.browser.test_ui import log_in, visible, wait
from tests.integration.conftest import RunningBroker

pytestmark = pytest.mark.browser

SUMMARY_TITLE = "Single active consumer"


def _activity(driver: WebDriver) -> dict[str, str]:
    """Consumer tag -> the Activity column, as the consumers table shows them."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#consumers-table tbody tr")
    found = {}
    for row in rows:
        cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        if len(cells) > 6:
            found[cells[0]] = cells[6]
    return found


def _summary_row(driver: WebDriver, title: str) -> str:
    for row in driver.find_elements(By.CSS_SELECTOR, "#queue-summary tr"):
        if row.find_element(By.TAG_NAME, "th").text == title:
            return str(row.find_element(By.TAG_NAME, "td").text)
    return ""


def _shows(expected: dict[str, str], active: str) -> Callable[[WebDriver], bool]:
    def check(driver: WebDriver) -> bool:
        try:  # the page re-renders on its own timer: a row may go stale while read
            if _activity(driver) == expected and _summary_row(driver, SUMMARY_TITLE) == active:
                return True
            driver.find_element(By.ID, "refresh").click()
        except StaleElementReferenceException:
            pass
        return False

    return check


def test_queue_page_shows_single_active_and_waiting(
    broker: RunningBroker, driver: WebDriver
) -> None:
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port)
    with pika.BlockingConnection(params) as conn:
        first, second = conn.channel(), conn.channel()
        first.queue_declare("ui-sac", arguments={"x-single-active-consumer": True})
        first.basic_consume("ui-sac", lambda *a: None, consumer_tag="one")
        second.basic_consume("ui-sac", lambda *a: None, consumer_tag="two")
        log_in(driver, broker, "guest", "guest")
        visible(driver, "#nav-queues").click()
        visible(driver, 'tr[data-key="//ui-sac"]').find_element(By.LINK_TEXT, "ui-sac").click()
        wait(driver).until(_shows({"one": "single_active", "two": "waiting"}, "one"))
        first.basic_cancel("one")
        wait(driver).until(_shows({"two": "single_active"}, "two"))
