"""Cells are collected in a stable order with ids and marks a pytest user can select on."""

from __future__ import annotations

import pytest

from pytest_automedbench.tasks import discover_tasks

from .conftest import SUITES

TASKS = discover_tasks(SUITES)
KIDNEY = [
    "kidney-tumor-seg-lite-r0",
    "kidney-tumor-seg-standard-r0",
    "kidney-tumor-seg-pro-r0",
]


def _collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest(str(SUITES), "--collect-only", "-q", *args)
    return [
        line.split("[", 1)[1].rstrip("]") for line in result.stdout.lines if "::test_cell[" in line
    ]


def test_every_task_and_tier_in_sorted_order(pytester: pytest.Pytester) -> None:
    ids = _collected(pytester)
    by_track: dict[str, list[str]] = {}
    for task in TASKS:  # discover_tasks sorts by id; modules are collected per track folder
        by_track.setdefault(task.track, []).extend(
            f"{task.id}-{tier}-r0" for tier in ("lite", "standard", "pro")
        )
    assert sorted(ids) == sorted(i for group in by_track.values() for i in group)
    assert len(ids) == 3 * len(TASKS)
    assert _collected(pytester, "-m", "segmentation") == by_track["segmentation"]
    assert _collected(pytester) == ids  # stable across sessions


#: The published catalogue: how many tasks each track holds.
CATALOGUE = {
    "segmentation": 8,
    "enhancement": 3,
    "vqa": 5,
    "report": 3,
    "detection": 5,
    "healthagentbench": 7,  # HealthAgentBench's seven categories
}


def test_catalogue_is_complete_and_each_track_marker_selects_its_tasks(
    pytester: pytest.Pytester,
) -> None:
    assert len(TASKS) == sum(CATALOGUE.values()) == 31
    for track, count in CATALOGUE.items():
        expected = {t.id for t in TASKS if t.track == track}
        assert len(expected) == count, track
        selected = _collected(pytester, "-m", track, "--tier=lite")
        assert {i.removesuffix("-lite-r0") for i in selected} == expected


def test_track_tier_and_keyword_selection(pytester: pytest.Pytester) -> None:
    assert _collected(pytester, "-k", "kidney") == KIDNEY
    assert _collected(pytester, "-k", "kidney", "-m", "lite") == ["kidney-tumor-seg-lite-r0"]
    assert _collected(pytester, "-k", "kidney", "-m", "ct and pro") == ["kidney-tumor-seg-pro-r0"]
    assert _collected(pytester, "-k", "kidney and standard") == ["kidney-tumor-seg-standard-r0"]
    assert _collected(pytester, "-k", "no-such-task") == []
    lite = _collected(pytester, "-m", "lite")
    assert len(lite) == len(TASKS) and all(i.endswith("-lite-r0") for i in lite)
    mri = {t.id for t in TASKS if t.modality == "mri"}
    assert {i.rsplit("-", 2)[0] for i in _collected(pytester, "-m", "mri")} == mri


def test_tier_and_runs_options(pytester: pytest.Pytester) -> None:
    assert _collected(pytester, "-k", "kidney", "--tier=standard", "--runs=3") == [
        "kidney-tumor-seg-standard-r0",
        "kidney-tumor-seg-standard-r1",
        "kidney-tumor-seg-standard-r2",
    ]


def test_several_agents_prefix_the_agent(pytester: pytest.Pytester) -> None:
    ids = _collected(pytester, "-k", "kidney", "--tier=lite", "--agent=reference", "--agent=empty")
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
        "mri",
    ):
        result.stdout.fnmatch_lines([f"@pytest.mark.{marker}:*"])


def test_a_track_folder_without_tasks_is_one_visible_skip(pytester: pytest.Pytester) -> None:
    suite = pytester.mkdir("empty_track")
    (suite / "test_empty.py").write_text("def test_cell(cell):\n    pass\n")
    result = pytester.runpytest(str(suite), "-v", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*test_cell[[]no-tasks[]] SKIPPED*", "*no tasks in *empty_track*"])
