"""The web UI end to end: a real broker, headless Chromium, the pages an operator uses.

Method: the browser logs in as guest, declares a queue with the queue form, publishes a
message with the queue page's publish form, gets it back (requeued) with the get form, and
waits until the queue list counts it; the same count is read from the API directly. Each
step waits on what the page shows, with a bounded wait. Screenshots are checked to be real
PNG images of a rendered page. A wrong password must bring back the login page with the
broker's reason.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.conftest import RunningBroker

pytestmark = pytest.mark.browser

WAIT_S = 15
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCREENSHOT_BYTES_MIN = 20_000  # a rendered page, not a blank or tiny image


def wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1)


def visible(driver: WebDriver, css: str) -> WebElement:
    found: WebElement = wait(driver).until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
    return found


def log_in(driver: WebDriver, broker: RunningBroker, username: str, password: str) -> None:
    driver.get(f"http://127.0.0.1:{broker.http_port}/")
    visible(driver, "#login-username").clear()
    driver.find_element(By.ID, "login-username").send_keys(username)
    driver.find_element(By.ID, "login-password").send_keys(password)
    driver.find_element(By.ID, "login-submit").click()


def api_get(broker: RunningBroker, path: str) -> object:
    status, parsed, _ = broker.http("GET", path)
    assert status == 200, f"GET {path}: {status} {parsed}"
    return parsed


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    # IHDR is the first chunk: length, type, then width and height (big-endian).
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 600, (width, height)
    assert len(data) >= SCREENSHOT_BYTES_MIN, len(data)


def queue_count(driver: WebDriver, key: str) -> str:
    cells = driver.find_elements(By.CSS_SELECTOR, f'tr[data-key="{key}"] td[data-field="messages"]')
    return cells[0].text if cells else ""


def test_log_in_create_queue_publish_and_see_it_counted(
    broker: RunningBroker, driver: WebDriver, tmp_path: Path
) -> None:
    log_in(driver, broker, "guest", "guest")
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "whoami"), "guest"))
    visible(driver, "#stat-queues")
    visible(driver, "#chart-rates svg polyline, #chart-rates svg circle")

    driver.find_element(By.ID, "nav-queues").click()
    visible(driver, "#queue-name").send_keys("ui-orders")
    driver.find_element(By.ID, "queue-add").click()
    row = visible(driver, 'tr[data-key="//ui-orders"]')
    assert "classic" in row.text

    row.find_element(By.LINK_TEXT, "ui-orders").click()
    visible(driver, "#publish-payload").send_keys("hello from the browser")
    driver.find_element(By.ID, "publish-submit").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "publish-result"), "published"))
    assert "not routed" not in driver.find_element(By.ID, "publish-result").text

    driver.find_element(By.ID, "get-submit").click()  # nack with requeue: the count stays
    wait(driver).until(
        ec.text_to_be_present_in_element((By.ID, "get-result"), "hello from the browser")
    )

    driver.find_element(By.ID, "nav-queues").click()

    def counted(d: WebDriver) -> bool:
        if queue_count(d, "//ui-orders") == "1":
            return True
        d.find_element(By.ID, "refresh").click()
        return False

    wait(driver).until(counted)
    queue = api_get(broker, "/api/queues/%2F/ui-orders")
    assert isinstance(queue, dict) and queue["messages"] == 1

    screenshot = tmp_path / "queues.png"
    assert driver.save_screenshot(str(screenshot))
    check_png(screenshot)

    driver.find_element(By.ID, "nav-overview").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "stat-messages"), "1"))
    overview = tmp_path / "overview.png"
    assert driver.save_screenshot(str(overview))
    check_png(overview)


def test_wrong_password_shows_the_login_error(broker: RunningBroker, driver: WebDriver) -> None:
    log_in(driver, broker, "guest", "not-the-password")
    error = visible(driver, "#login-error")
    assert error.text == "Login failed"
    assert not driver.find_element(By.ID, "shell").is_displayed()

    driver.find_element(By.ID, "login-password").send_keys("guest")
    driver.find_element(By.ID, "login-submit").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "whoami"), "guest"))
    assert not driver.find_element(By.ID, "login").is_displayed()
