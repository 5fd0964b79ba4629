"""How a Harbor attempt is timed and run, without Docker: the record's ``wall_s`` is the
whole attempt (environment, agent and verifier), its phases beside it; scripts run as
Harbor runs them (their shebang decides; bash runs one without)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_automedbench.harbor import HarborTaskError, load_harbor_task
from pytest_automedbench.harbor._agents import oracle_command
from pytest_automedbench.harbor._harness import runs_in_harness_shell, script_command
from pytest_automedbench.harbor._runner import (
    HarborFields,
    Phases,
    declared_artifacts,
    script_first_line,
)
from pytest_automedbench.harbor._task import HarborTask
from pytest_automedbench.results import CellResult


def _phases(*lengths: tuple[str, float, float]) -> Phases:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    phases = Phases()
    for name, begin, end in lengths:
        phases.spans[name] = (start + timedelta(seconds=begin), start + timedelta(seconds=end))
        phases.seconds[name] = end - begin
    return phases


def test_wall_s_spans_every_phase_including_the_verifier() -> None:
    phases = _phases(("environment", 0, 10.5), ("agent", 11, 18.2), ("verifier", 18.4, 35.0))
    assert phases.whole_s() == 35.0
    result = CellResult.model_construct(wall_s=7.2)  # the agent loop's own clock
    filled = HarborFields(
        phase_s=phases.seconds, category="c", backend="docker", wall_s=phases.whole_s()
    ).onto(result)
    assert filled.wall_s == 35.0
    assert filled.wall_s >= sum(filled.phase_s.values())


def test_an_attempt_with_no_phase_keeps_the_loops_wall_clock() -> None:
    assert Phases().whole_s() is None
    result = CellResult.model_construct(wall_s=3.0)
    assert HarborFields(phase_s={}, category="c", backend="docker").onto(result).wall_s == 3.0


@pytest.mark.parametrize(
    ("line", "shell", "options"),
    [("#!/bin/bash", True, []), ("#!/bin/bash -e", True, ["-e"]), ("#!/bin/sh", True, []),
     ("#!/usr/bin/env bash", True, []), ("#!/usr/bin/env -S bash -eu", True, ["-eu"]),
     ("echo no shebang", True, []), ("", True, []),
     ("#!/usr/bin/env python3", False, []), ("#!/usr/bin/python3 -u", False, []),
     ("#!/usr/bin/env -i", False, [])],
)  # fmt: skip
def test_which_scripts_the_harness_shell_runs(line: str, shell: bool, options: list[str]) -> None:
    assert runs_in_harness_shell(line) == (shell, options)


def test_script_commands_run_directly_unless_bash_would() -> None:
    out = "/logs/verifier/test-stdout.txt"
    assert script_command("/tests/test.sh", "#!/usr/bin/env python3", out) == (
        f"/tests/test.sh > {out} 2>&1"
    )
    assert script_command("/tests/test.sh", "#!/bin/bash -e", out) == (
        f'"$0" --noprofile --norc -e /tests/test.sh > {out} 2>&1'
    )
    assert script_command("/tests/test.sh", "", out) == (
        f'"$0" --noprofile --norc /tests/test.sh > {out} 2>&1'
    )


def test_a_scripts_first_line_is_read_bounded(tmp_path: Path) -> None:
    script = tmp_path / "test.sh"
    script.write_bytes(b"#!/usr/bin/env python3\r\nprint(1)\n")
    assert script_first_line(script) == "#!/usr/bin/env python3"
    script.write_bytes(b"x" * 1000)
    assert script_first_line(script) == "x" * 256
    assert script_first_line(tmp_path / "absent.sh") == ""


def test_the_oracle_runs_solve_sh_directly_into_its_log() -> None:
    command = oracle_command()
    assert command.startswith("/solution/solve.sh > /logs/agent/oracle.txt 2>&1;")
    assert command.endswith("exit $status") and "bash " not in command


def _task_with(tmp_path: Path, toml: str) -> HarborTask:
    folder = tmp_path / "task"
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text("FROM scratch\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text(toml)
    return load_harbor_task(folder)


def test_declared_artifacts_land_where_harbor_puts_them(tmp_path: Path) -> None:
    toml = (
        'version = "1.0"\nartifacts = ["/var/log/app.log", "out/", '
        '{source = "/app/result.json", destination = "results/r.json"}]\n'
    )
    assert declared_artifacts(_task_with(tmp_path, toml)) == [
        ("/var/log/app.log", "var/log/app.log"),
        ("out/", "out"),
        ("/app/result.json", "results/r.json"),
    ]
    assert declared_artifacts(_task_with(tmp_path / "none", 'version = "1.0"\n')) == []


@pytest.mark.parametrize(
    "entry",
    ['"/app/../etc/passwd"', '{source = "/app/x", destination = "../x"}',
     '{source = "/app/x", destination = "/abs"}', '{source = "/x", destination = "manifest.json"}',
     '{destination = "x"}', '"/"'],
)  # fmt: skip
def test_a_malformed_artifact_entry_is_refused_naming_it(tmp_path: Path, entry: str) -> None:
    task = _task_with(tmp_path, f'version = "1.0"\nartifacts = [{entry}]\n')
    with pytest.raises(HarborTaskError, match="artifacts entry"):
        declared_artifacts(task)
