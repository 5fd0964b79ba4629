"""Cells are collected in a stable order with ids and marks a pytest user can select on."""

from __future__ import annotations

import pytest

from .conftest import SUITES

TIER_IDS = [
    "kidney-tumor-seg-lite-r0",
    "kidney-tumor-seg-standard-r0",
    "kidney-tumor-seg-pro-r0",
]


def _collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest(str(SUITES), "--collect-only", "-q", *args)
    return [
        line.split("[", 1)[1].rstrip("]") for line in result.stdout.lines if "::test_cell[" in line
    ]


def test_ids_and_order(pytester: pytest.Pytester) -> None:
    assert _collected(pytester) == TIER_IDS


def test_track_tier_and_keyword_selection(pytester: pytest.Pytester) -> None:
    assert _collected(pytester, "-m", "segmentation") == TIER_IDS
    assert _collected(pytester, "-m", "lite") == ["kidney-tumor-seg-lite-r0"]
    assert _collected(pytester, "-m", "ct and pro") == ["kidney-tumor-seg-pro-r0"]
    assert _collected(pytester, "-m", "detection") == []
    assert _collected(pytester, "-k", "kidney and standard") == ["kidney-tumor-seg-standard-r0"]
    assert _collected(pytester, "-k", "liver") == []


def test_tier_and_runs_options(pytester: pytest.Pytester) -> None:
    assert _collected(pytester, "--tier=standard", "--runs=3") == [
        "kidney-tumor-seg-standard-r0",
        "kidney-tumor-seg-standard-r1",
        "kidney-tumor-seg-standard-r2",
    ]


def test_several_agents_prefix_the_agent(pytester: pytest.Pytester) -> None:
    ids = _collected(pytester, "--tier=lite", "--agent=reference", "--agent=empty")
    assert ids == ["reference-kidney-tumor-seg-lite-r0", "empty-kidney-tumor-seg-lite-r0"]


def test_markers_are_registered_for_strict_markers(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(SUITES), "--markers")
    for marker in (
        "segmentation",
        "enhancement",
        "vqa",
        "report",
        "detection",
        "lite",
        "standard",
        "pro",
        "ct",
    ):
        result.stdout.fnmatch_lines([f"@pytest.mark.{marker}:*"])
