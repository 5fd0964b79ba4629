"""An agent's name is one folder of the results: colons and slashes never nest folders."""

from __future__ import annotations

from pathlib import Path

from pytest_automedbench.config import RunConfig
from pytest_automedbench.results import CellKey, folder_name
from pytest_automedbench.session import AutoMedBenchSession


def test_an_agent_name_with_colons_and_slashes_is_one_folder(tmp_path: Path) -> None:
    session = AutoMedBenchSession(RunConfig(amb_out=tmp_path), "run1")
    runs = tmp_path / "runs" / "run1"
    for agent in ("codex:openai/fake", "claude-code:anthropic/x", "cmd:../up", "..", "a b"):
        cell_dir = session.cell_dir(CellKey(agent=agent, task="t", tier="lite", run=0))
        assert cell_dir.parent.parent == runs, agent  # one level: no nesting, no climbing
        assert cell_dir.name == "t-lite-r0"
        assert cell_dir.parent.name not in ("", ".", "..")
        assert not set(cell_dir.parent.name) & set(":/\\ "), cell_dir
    # A name that is already a folder name stays as it was (records keep their paths).
    plain = session.cell_dir(CellKey(agent="reference-v2.1_x", task="t", tier="lite", run=0))
    assert plain == runs / "reference-v2.1_x" / "t-lite-r0"
    # Two names that differ only in the replaced characters get different folders.
    assert folder_name("codex:a/b") != folder_name("codex/a:b") != folder_name("codex_a_b")
    assert folder_name("codex:a/b") == folder_name("codex:a/b")
