"""docs/changelog.md and the package version: the newest released heading is
`streamq.__version__`, and the file keeps Keep a Changelog's shape."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

import streamq
from streamq import cli

CHANGELOG = Path(__file__).resolve().parents[2] / "docs" / "changelog.md"
VERSION_HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")
RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def version_headings(text: str) -> list[tuple[str, str | None]]:
    """Every `## [...]` heading, as (name, date or None), top to bottom."""
    headings = []
    for line in text.splitlines():
        if line.startswith("## "):
            match = VERSION_HEADING.match(line)
            assert match, f"not a version heading: {line!r}"
            headings.append((match["name"], match["date"]))
    return headings


def released() -> list[tuple[tuple[int, int, int], datetime.date]]:
    """The released versions, newest first, as ((major, minor, patch), date)."""
    versions = []
    for name, date in version_headings(CHANGELOG.read_text())[1:]:
        match = RELEASE.match(name)
        assert match, f"a released version is X.Y.Z: {name!r}"
        assert date is not None, f"[{name}] has no date"
        major, minor, patch = (int(part) for part in match.groups())
        versions.append(((major, minor, patch), datetime.date.fromisoformat(date)))
    return versions


def test_unreleased_comes_first_then_releases() -> None:
    headings = version_headings(CHANGELOG.read_text())
    assert headings[0] == ("Unreleased", None)
    assert len(headings) >= 2, "no released version"


def test_package_version_is_the_newest_release() -> None:
    (major, minor, patch), _ = released()[0]
    assert streamq.__version__ == f"{major}.{minor}.{patch}"


def test_releases_are_newest_first() -> None:
    versions = released()
    assert [v for v, _ in versions] == sorted((v for v, _ in versions), reverse=True)
    assert len({v for v, _ in versions}) == len(versions), "a version appears twice"
    dates = [d for _, d in versions]
    assert dates == sorted(dates, reverse=True)


def test_sections_are_keep_a_changelog_kinds() -> None:
    sections = [line[4:] for line in CHANGELOG.read_text().splitlines() if line.startswith("### ")]
    assert sections, "no sections"
    assert set(sections) <= KINDS, set(sections) - KINDS


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"streamq {streamq.__version__}\n"
