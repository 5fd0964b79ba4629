"""The package's optional extras, as the code that needs one sees them.

An extra (``pip install 'pytest-automedbench[NAME]'``) brings libraries that only some
tasks need. A module that cannot work without them calls :func:`require` before importing
them, so a missing extra is one clear error naming the install command, never a bare
``ModuleNotFoundError``. The distributions each extra installs are declared in
``pyproject.toml``; here are the import names they give (``tests/test_packaging.py``
checks the two stay in step). Standard library only.
"""

from __future__ import annotations

from importlib.util import find_spec

DISTRIBUTION = "pytest-automedbench"

#: Extra -> the top-level modules its distributions give, in pyproject's order.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "healthagentbench": ("pyarrow", "tifffile", "openslide", "sklearn", "lightgbm"),
}

#: Who needs each extra (for the message).
NEEDED_BY: dict[str, str] = {
    "healthagentbench": "HealthAgentBench's tasks (their data, baselines and scorers)",
}


class MissingExtraError(ImportError):
    """An extra's libraries are not installed; the message names the command."""

    def __init__(self, extra: str, missing: tuple[str, ...]) -> None:
        self.extra = extra
        self.missing = missing
        super().__init__(
            f"{NEEDED_BY[extra]} need the '{extra}' extra: {install_command(extra)} "
            f"(not importable here: {', '.join(missing)})"
        )


def install_command(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_modules(extra: str) -> tuple[str, ...]:
    """The extra's modules that this environment cannot import."""
    return tuple(name for name in EXTRA_MODULES[extra] if find_spec(name) is None)


def require(extra: str) -> None:
    """Raise :class:`MissingExtraError` unless every library of ``extra`` is importable."""
    if missing := missing_modules(extra):
        raise MissingExtraError(extra, missing)
