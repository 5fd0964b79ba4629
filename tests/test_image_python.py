"""The Docker base image's Python facts (version tag and machine, which pick the agent
image's wheels) are asked of a container once per image content id and read from a cache
after that: a second pytest process starts no probe container, and a rebuilt image (a new
id under the same tag) is asked again."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_automedbench.sandbox import SandboxError
from pytest_automedbench.sandbox.docker import docker_client, docker_problem
from pytest_automedbench.sandbox.images import base_tag_for, python_of


class Engine:
    """An image store of tag -> content id whose containers answer the probe with
    ``answer``; counts the containers it runs."""

    def __init__(self, ids: dict[str, str], answer: bytes = b"312 aarch64\n") -> None:
        self.ids = ids
        self.answer = answer
        self.runs: list[tuple[str, list[str]]] = []
        self.images = SimpleNamespace(get=self._get)
        self.containers = SimpleNamespace(run=self._run)

    def _get(self, tag: str) -> Any:
        if tag not in self.ids:
            raise LookupError(f"no such image: {tag}")
        return SimpleNamespace(id=self.ids[tag])

    def _run(self, image: str, command: list[str], **options: Any) -> bytes:
        assert options == {"remove": True, "network_mode": "none"}
        self.runs.append((image, command))
        return self.answer


def test_an_image_is_probed_once_then_read_from_the_cache(tmp_path: Path) -> None:
    engine = Engine({"base:1": "sha256:aaaa"})
    assert python_of(engine, "base:1", tmp_path) == ("312", "aarch64")
    assert python_of(engine, "base:1", tmp_path) == ("312", "aarch64")
    assert len(engine.runs) == 1 and engine.runs[0][0] == "base:1"
    assert json.loads((tmp_path / "sha256-aaaa.json").read_text()) == {
        "py_tag": "312",
        "machine": "aarch64",
    }
    # Another process, another engine object: the cache answers, no container runs.
    other = Engine({"base:1": "sha256:aaaa"}, answer=b"399 never\n")
    assert python_of(other, "base:1", tmp_path) == ("312", "aarch64")
    assert other.runs == []


def test_a_rebuilt_image_under_the_same_tag_is_probed_again(tmp_path: Path) -> None:
    assert python_of(Engine({"base:1": "sha256:aaaa"}), "base:1", tmp_path)[0] == "312"
    rebuilt = Engine({"base:1": "sha256:bbbb"}, answer=b"313 x86_64\n")
    assert python_of(rebuilt, "base:1", tmp_path) == ("313", "x86_64")
    assert len(rebuilt.runs) == 1


@pytest.mark.parametrize(
    "stored",
    [
        "{not json",
        "[]",
        '{"py_tag": "3.12", "machine": "x86_64"}',
        '{"py_tag": "312"}',
        '{"py_tag": "312", "machine": "x 86"}',
    ],
)
def test_a_damaged_entry_is_probed_again_and_replaced(tmp_path: Path, stored: str) -> None:
    (tmp_path / "sha256-aaaa.json").write_text(stored)
    engine = Engine({"base:1": "sha256:aaaa"})
    assert python_of(engine, "base:1", tmp_path) == ("312", "aarch64")
    assert len(engine.runs) == 1
    assert json.loads((tmp_path / "sha256-aaaa.json").read_text())["py_tag"] == "312"


def test_a_cache_that_cannot_be_written_still_answers(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    engine = Engine({"base:1": "sha256:aaaa"})
    for _ in range(2):  # probed each time: nothing could be kept
        assert python_of(engine, "base:1", blocked / "cache") == ("312", "aarch64")
    assert len(engine.runs) == 2


def test_an_image_that_cannot_be_inspected_is_a_sandbox_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="base:2 cannot be inspected"):
        python_of(Engine({"base:1": "sha256:aaaa"}), "base:2", tmp_path)


@pytest.mark.skipif(docker_problem() is not None, reason="no Docker daemon")
def test_the_cached_facts_of_the_real_base_image_are_its_probed_ones(tmp_path: Path) -> None:
    client = docker_client()
    tag = base_tag_for()
    try:
        image_id = client.images.get(tag).id
    except Exception as exc:  # the images are built by the session's first Docker cell
        pytest.skip(f"no base image {tag}: {exc}")
    probed = python_of(client, tag, tmp_path)
    assert probed[0].isdigit() and probed[1]
    (entry,) = tmp_path.iterdir()
    assert entry.name == f"{image_id.replace(':', '-')}.json"
    assert python_of(client, tag, tmp_path) == probed
