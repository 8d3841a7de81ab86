"""The web UI's other pages end to end: vhosts, users and permissions, policies, exchanges
and bindings, publishing to an exchange, closing a connection, definitions export and import.

Method: a real broker and headless Chromium as in test_ui.py; the browser does each change
through the page's forms, waits for the page to show it, and the test checks the broker's
state through the API (and AMQP, for the published message and the closed connection).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.integration.conftest import RunningBroker

pytestmark = pytest.mark.browser

WAIT_S = 15


def wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    # Pages redraw their tables; an element found just before a redraw is retried.
    return WebDriverWait(
        driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
    )


def visible(driver: WebDriver, css: str) -> WebElement:
    found: WebElement = wait(driver).until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
    return found


def gone(driver: WebDriver, css: str) -> None:
    wait(driver).until(lambda d: not d.find_elements(By.CSS_SELECTOR, css))


def _has_row(driver: WebDriver, table_id: str, cells: tuple[str, ...]) -> bool:
    """Whether a row of table `table_id` has each of `cells` as a cell's whole text."""
    for row in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tr"):
        texts = {cell.text for cell in row.find_elements(By.TAG_NAME, "td")}
        if all(cell in texts for cell in cells):
            return True
    return False


def api_get(broker: RunningBroker, path: str) -> object:
    status, parsed, _ = broker.http("GET", path)
    assert status == 200, f"GET {path}: {status} {parsed}"
    return parsed


def log_in(
    driver: WebDriver, broker: RunningBroker, username: str = "guest", password: str = "guest"
) -> None:
    driver.get(f"http://127.0.0.1:{broker.http_port}/")
    visible(driver, "#login-username").send_keys(username)
    driver.find_element(By.ID, "login-password").send_keys(password)
    driver.find_element(By.ID, "login-submit").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "whoami"), username))
    # No timed redraws: each step below waits for the redraw its own action causes.
    Select(driver.find_element(By.ID, "refresh-interval")).select_by_value("0")


def go(driver: WebDriver, page: str) -> None:
    driver.find_element(By.ID, f"nav-{page}").click()
    wait(driver).until(
        lambda d: "active" in (d.find_element(By.ID, f"nav-{page}").get_attribute("class") or "")
    )


def fill(driver: WebDriver, values: dict[str, str]) -> None:
    for element_id, text in values.items():
        element = visible(driver, f"#{element_id}")
        if element.tag_name == "select":
            Select(element).select_by_value(text)
        else:
            element.clear()
            element.send_keys(text)


def open_form(driver: WebDriver, form_id: str) -> None:
    """Forms on list pages sit in a collapsible panel; open it."""
    panel = driver.find_element(By.CSS_SELECTOR, f"details:has(#{form_id})")
    if panel.get_attribute("open") is None:
        panel.find_element(By.TAG_NAME, "summary").click()
    visible(driver, f"#{form_id}")


def confirm_click(button: WebElement) -> None:
    """Destructive buttons act on a second click."""
    button.click()
    button.click()


def test_vhosts_users_permissions_and_policies(broker: RunningBroker, driver: WebDriver) -> None:
    log_in(driver, broker)

    go(driver, "vhosts")
    open_form(driver, "vhost-form")
    fill(driver, {"vhost-name": "ui-staging"})
    driver.find_element(By.ID, "vhost-form-submit").click()
    visible(driver, 'tr[data-key="ui-staging"]')
    wait(driver).until(
        lambda d: "ui-staging" in d.find_element(By.ID, "vhost-filter").get_attribute("innerText")
    )
    vhost = api_get(broker, "/api/vhosts/ui-staging")
    assert isinstance(vhost, dict) and vhost["name"] == "ui-staging"

    go(driver, "users")
    open_form(driver, "user-form")
    fill(driver, {"user-name": "ops", "user-password": "s3cret", "user-tags": "monitoring"})
    driver.find_element(By.ID, "user-form-submit").click()
    assert "monitoring" in visible(driver, 'tr[data-key="ops"]').text
    open_form(driver, "permission-form")
    fill(
        driver,
        {"permission-user": "ops", "permission-vhost": "ui-staging", "permission-write": "^$"},
    )
    driver.find_element(By.ID, "permission-form-submit").click()
    # The creator of ui-staging (guest) has a row for it already: wait for ops's own row,
    # which the page draws once the PUT is answered.
    wait(driver).until(lambda d: _has_row(d, "permissions-table", ("ops", "ui-staging")))
    permission = api_get(broker, "/api/permissions/ui-staging/ops")
    assert isinstance(permission, dict)
    assert (permission["configure"], permission["write"], permission["read"]) == (".*", "^$", ".*")

    # A topic permission set through the form is listed and stored; Clear removes it.
    open_form(driver, "topic-permission-form")
    fill(
        driver,
        {
            "topic-permission-user": "ops",
            "topic-permission-vhost": "ui-staging",
            "topic-permission-exchange": "amq.topic",
            "topic-permission-write": "^ops\\.",
        },
    )
    driver.find_element(By.ID, "topic-permission-form-submit").click()
    row = ("ops", "ui-staging", "amq.topic", "^ops\\.")
    wait(driver).until(lambda d: _has_row(d, "topic-permissions-table", row))
    assert api_get(broker, "/api/topic-permissions/ui-staging/ops") == [
        {
            "user": "ops",
            "vhost": "ui-staging",
            "exchange": "amq.topic",
            "write": "^ops\\.",
            "read": ".*",
        }
    ]
    clear_button = visible(
        driver, '#topic-permissions-table tr[data-key="ui-staging/ops/amq.topic"] button'
    )
    gone(driver, ".toast")  # the "set" toast covers the last row's button for 4 s
    confirm_click(clear_button)
    wait(driver).until(lambda d: not _has_row(d, "topic-permissions-table", row))
    assert api_get(broker, "/api/users/ops/topic-permissions") == []

    # Saving the user again without a password keeps the password.
    fill(driver, {"user-name": "ops", "user-password": "", "user-tags": "monitoring, management"})
    driver.find_element(By.ID, "user-form-submit").click()
    wait(driver).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, 'tr[data-key="ops"]'), "management")
    )
    token = base64.b64encode(b"ops:s3cret").decode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}/api/whoami",
        headers={"Authorization": f"Basic {token}"},
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        assert json.loads(response.read())["name"] == "ops"

    go(driver, "policies")
    open_form(driver, "policy-form")
    fill(
        driver,
        {
            "policy-vhost": "/",
            "policy-name": "ui-limit",
            "policy-pattern": "^ui-",
            "policy-apply-to": "queues",
            "policy-definition": '{"max-length": 5}',
        },
    )
    driver.find_element(By.ID, "policy-form-submit").click()
    assert "max-length" in visible(driver, 'tr[data-key="//ui-limit"]').text
    policy = api_get(broker, "/api/policies/%2F/ui-limit")
    assert isinstance(policy, dict) and policy["definition"] == {"max-length": 5}

    # The new user logs in and sees only the pages its tags allow.
    driver.find_element(By.ID, "logout").click()
    log_in(driver, broker, "ops", "s3cret")
    visible(driver, "#nav-queues")
    assert not driver.find_elements(By.ID, "nav-users")
    assert not driver.find_elements(By.ID, "nav-policies")


def test_exchange_binding_publish_and_connection_close(
    broker: RunningBroker, driver: WebDriver
) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, client_properties={"connection_name": "ui-client"}
        )
    )
    channel = connection.channel()
    channel.queue_declare("ui-sink")
    log_in(driver, broker)

    go(driver, "exchanges")
    open_form(driver, "exchange-form")
    fill(driver, {"exchange-name": "ui-events", "exchange-type": "fanout"})
    driver.find_element(By.ID, "exchange-add").click()
    visible(driver, 'tr[data-key="//ui-events"]').find_element(By.LINK_TEXT, "ui-events").click()

    fill(driver, {"binding-other": "ui-sink"})
    driver.find_element(By.CSS_SELECTOR, "#binding-form button[type=submit]").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "bindings-table"), "ui-sink"))

    fill(driver, {"publish-payload": "fanned out"})
    driver.find_element(By.ID, "publish-submit").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "publish-result"), "published"))
    _, _, body = channel.basic_get("ui-sink", auto_ack=True)
    assert body == b"fanned out"

    unbind = driver.find_element(By.CSS_SELECTOR, "#bindings-table button.danger")
    confirm_click(unbind)
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "bindings-table"), "No bindings"))
    assert api_get(broker, "/api/exchanges/%2F/ui-events/bindings/source") == []

    go(driver, "connections")
    row = visible(driver, "#connections-table tbody tr")
    assert "ui-client" in row.text
    confirm_click(row.find_element(By.CSS_SELECTOR, "button.danger"))
    # The broker sends connection.close and, as RabbitMQ, keeps the connection until the
    # client's close-ok: a live client answers at once, so pika reads the close here.
    deadline = time.monotonic() + WAIT_S
    while connection.is_open and time.monotonic() < deadline:
        try:
            connection.process_data_events(0.1)
        except pika.exceptions.ConnectionClosedByBroker:
            break
    assert not connection.is_open
    # The page redrew right after its DELETE, maybe before the close-ok came (timed
    # redraws are off): once the broker has let the connection go, a refresh shows that.
    wait(driver).until(lambda _: api_get(broker, "/api/connections") == [])
    driver.find_element(By.ID, "refresh").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "connections-table"), "No open"))


def test_definitions_export_and_import(
    broker: RunningBroker, driver: WebDriver, tmp_path: Path
) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver.execute_cdp_cmd(
        "Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    log_in(driver, broker)
    go(driver, "definitions")
    driver.find_element(By.ID, "definitions-export").click()
    wait(driver).until(lambda _: any(downloads.glob("streamq_definitions_*.json")))
    exported = json.loads(next(downloads.glob("streamq_definitions_*.json")).read_text())
    assert {"name": "guest"}.items() <= exported["users"][0].items()

    imported = {"name": "ui-imported", "vhost": "/", "durable": True, "auto_delete": False}
    exported["queues"].append({**imported, "arguments": {}})
    upload = tmp_path / "definitions.json"
    upload.write_text(json.dumps(exported))
    driver.find_element(By.ID, "definitions-file").send_keys(str(upload))
    driver.find_element(By.ID, "definitions-import").click()
    wait(driver).until(
        ec.text_to_be_present_in_element((By.ID, "definitions-status"), "Imported definitions.json")
    )
    queue = api_get(broker, "/api/queues/%2F/ui-imported")
    assert isinstance(queue, dict) and queue["durable"] is True
