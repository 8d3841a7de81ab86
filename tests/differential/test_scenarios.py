"""Every registered scenario, run against a real RabbitMQ and against streamq: what a
client observes must be equal, but for the documented differences of allowlist.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.differential import scenarios
from tests.differential.allowlist import ALLOWED
from tests.differential.harness import SCENARIOS, explain, run_scenario
from tests.differential.peers import Endpoint

scenarios.load()


def prefix_of(name: str) -> str:
    """The prefix of every entity name of scenario `name`, the same on every broker."""
    return "d-" + re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") + "-"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_as_rabbitmq(name: str, rabbitmq: Endpoint, streamq: Endpoint) -> None:
    spec = SCENARIOS[name]
    expected = run_scenario(spec, rabbitmq, prefix_of(name))
    observed = run_scenario(spec, streamq, prefix_of(name))
    allowed = ALLOWED.get(name)
    if allowed is not None:
        expected, observed = allowed.mask(expected), allowed.mask(observed)
    assert observed == expected, explain(expected, observed)


def test_allowlist_names_scenarios() -> None:
    """An allow-list entry for a scenario that no longer exists hides nothing: refuse it."""
    assert set(ALLOWED) <= set(SCENARIOS)


def test_allowlist_is_documented() -> None:
    """docs/compatibility.md names every deliberate difference: each entry of the
    allow-list, or another scenario that shares its reason."""
    text = (Path(__file__).parents[2] / "docs" / "compatibility.md").read_text()
    documented = {id(ALLOWED[name]) for name in ALLOWED if f"`{name}`" in text}
    missing = [name for name, entry in ALLOWED.items() if id(entry) not in documented]
    assert not missing, f"not in docs/compatibility.md: {missing}"
