"""Shared helpers for the project's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"


@pytest.fixture
def repo() -> Path:
    return REPO
