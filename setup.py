"""The package's layout, found rather than listed (the metadata is in pyproject.toml).

One import namespace for every top-level folder: ``fixtures/`` becomes
``pytest_automedbench.fixtures`` (nothing shadows the PyPI ``fixtures`` package, and
``sandbox`` and ``evaluators`` are not claimed as top-level names). Every package under
``pytest_automedbench/`` and under each mapped folder is discovered, so a new subpackage
ships without an edit here; ``tests/test_packaging.py`` builds the wheel and checks it.
"""

from setuptools import find_packages, setup

#: Top-level folders installed inside the ``pytest_automedbench`` namespace.
MAPPED_FOLDERS = ("fixtures", "evaluators", "sandbox")
NAMESPACE = "pytest_automedbench"


def discovered_packages() -> list[str]:
    """Every package of the namespace, the mapped folders' under their installed names."""
    packages = find_packages(include=[NAMESPACE, f"{NAMESPACE}.*"])
    for folder in MAPPED_FOLDERS:
        found = find_packages(include=[folder, f"{folder}.*"])
        packages += [f"{NAMESPACE}.{name}" for name in found]
    return sorted(packages)


setup(
    packages=discovered_packages(),
    package_dir={f"{NAMESPACE}.{folder}": folder for folder in MAPPED_FOLDERS},
)
