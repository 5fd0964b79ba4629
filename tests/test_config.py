"""Option parsing and validation: CLI over pyproject over defaults, clear usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_automedbench.config import ConfigError, build_config, read_pyproject_section

from .conftest import SUITES


def test_defaults_are_the_embedded_offline_setup(tmp_path: Path) -> None:
    config = build_config({}, {}, None, tmp_path)
    assert config.agents == ("reference",)
    assert config.tiers == ("lite", "standard", "pro")
    assert config.sandbox == "auto"
    assert config.judge == "rules"
    assert config.amb_out == tmp_path / "automedbench-results"


def test_cli_overrides_pyproject_and_paths_resolve_against_rootdir(tmp_path: Path) -> None:
    pyproject = {"tier": "pro", "agent": "reference", "amb_out": "out", "runs": 3}
    config = build_config({"tier": "lite", "runs": None}, pyproject, None, tmp_path)
    assert config.tier == "lite"  # CLI wins
    assert config.runs == 3  # pyproject fills what the CLI left unset
    assert config.agents == ("reference",)
    assert config.amb_out == tmp_path / "out"


def test_repeated_agents_are_deduplicated_in_order(tmp_path: Path) -> None:
    config = build_config({"agents": ["empty", "reference", "empty"]}, {}, None, tmp_path)
    assert config.agents == ("empty", "reference")


def test_bad_tier_in_pyproject_names_source_and_valid_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build_config({}, {"tier": "expert"}, tmp_path / "pyproject.toml", tmp_path)
    message = str(info.value)
    assert "[tool.automedbench] tier" in message
    assert "lite, standard, pro, all" in message


def test_unknown_pyproject_key_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'tiers'"):
        build_config({}, {"tiers": "lite"}, None, tmp_path)


def test_judge_syntax_is_checked(tmp_path: Path) -> None:
    assert build_config({"judge": "llm:openai/gpt-4o"}, {}, None, tmp_path).judge.startswith("llm:")
    with pytest.raises(ConfigError, match="judge"):
        build_config({"judge": "gpt"}, {}, None, tmp_path)


def test_scoring_hash_changes_with_the_judge(tmp_path: Path) -> None:
    a = build_config({}, {}, None, tmp_path).scoring_hash()
    b = build_config({"judge": "llm:x/y"}, {}, None, tmp_path).scoring_hash()
    assert a != b


def test_pyproject_section_skips_subtables(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.automedbench]\ntier = "lite"\n[tool.automedbench.slurm]\np = 1\n')
    assert read_pyproject_section(path) == {"tier": "lite"}


def test_cli_bad_tier_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(SUITES), "--collect-only", "--tier=expert")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tier*invalid choice*'expert'*lite*standard*pro*all*"])


def test_cli_unknown_agent_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(SUITES), "--collect-only", "--agent=gpt99")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown agent 'gpt99'; valid agents: *reference*"])


def test_llm_judges_are_accepted_and_echoed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        str(SUITES),
        "--collect-only",
        "--judge=llm:openai/gpt-4o",
        "--judge-votes=3",
        "--audit-judge=llm:openai/other",
    )
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*judge: llm:openai/gpt-4o*"])


def test_judge_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="audit judge 'gpt' is not 'llm:"):
        build_config({"audit_judges": ["gpt"]}, {}, None, tmp_path)
    with pytest.raises(ConfigError, match="--judge-votes"):
        build_config({"judge_votes": 0}, {}, None, tmp_path)
    votes = build_config({"judge": "llm:x/y", "judge_votes": 3}, {}, None, tmp_path)
    assert (
        votes.scoring_hash()
        != build_config({"judge": "llm:x/y"}, {}, None, tmp_path).scoring_hash()
    )


def test_docker_sandbox_without_a_daemon_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = pytester.runpytest(str(SUITES), "--collect-only", "--sandbox=docker")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*sandbox backend 'docker' cannot run here: no Docker daemon answers*"]
    )


def test_report_header_echoes_resolved_configuration(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    result = pytester.runpytest(
        str(SUITES), "--collect-only", "--tier=lite", f"--amb-out={tmp_path}/res"
    )
    result.stdout.fnmatch_lines(
        [
            "automedbench: run *",
            "automedbench: agents: reference",
            "automedbench: tier: lite  runs: task default*sandbox: auto (network allowlist, "
            "workspace 20480 MiB / 1000000 files)  judge: rules",
            "automedbench: data-root: (synthetic data, small)  "
            f"results: {tmp_path}/res  executor: local",
        ]
    )


def test_data_size_is_validated_and_part_of_the_scoring_hash(tmp_path: Path) -> None:
    small = build_config({}, {}, None, tmp_path)
    realistic = build_config({"data_size": "realistic"}, {}, None, tmp_path)
    assert small.data_size == "small" and realistic.data_size == "realistic"
    assert small.scoring_hash() != realistic.scoring_hash()
    with pytest.raises(ConfigError, match="valid values: small, realistic"):
        build_config({}, {"data_size": "huge"}, tmp_path / "pyproject.toml", tmp_path)


def test_sandbox_network_is_validated_and_part_of_the_scoring_hash(tmp_path: Path) -> None:
    default = build_config({}, {}, None, tmp_path)
    modes = {mode: build_config({"sandbox_network": mode}, {}, None, tmp_path) for mode in
             ("allowlist", "on", "off")}  # fmt: skip
    assert default.sandbox_network == "allowlist"
    assert default.scoring_hash() == modes["allowlist"].scoring_hash()
    assert len({config.scoring_hash() for config in modes.values()}) == 3
    with pytest.raises(ConfigError, match="valid values: allowlist, on, off"):
        build_config({}, {"sandbox_network": "maybe"}, tmp_path / "pyproject.toml", tmp_path)


def test_the_allow_list_and_its_exceptions_enter_the_hash_and_are_checked(
    tmp_path: Path,
) -> None:
    default = build_config({}, {}, None, tmp_path)
    more = build_config({}, {"sandbox_allow_hosts": "Mirror.Lab."}, None, tmp_path)
    assert more.sandbox_allow_hosts == ("mirror.lab",)  # one string is a list of one
    assert more.scoring_hash() != default.scoring_hash()
    networks = build_config({"sandbox_allow_networks": ["10.1.2.3/24"]}, {}, None, tmp_path)
    assert networks.sandbox_allow_networks == ("10.1.2.0/24",)
    hosts = build_config({"sandbox_hosts": ["Mirror.lab=10.1.2.3"]}, {}, None, tmp_path)
    assert hosts.host_map == {"mirror.lab": "10.1.2.3"}
    assert len({c.scoring_hash() for c in (default, more, networks, hosts)}) == 4
    where = tmp_path / "pyproject.toml"
    with pytest.raises(ConfigError, match=r"sandbox_allow_networks: .*'10\.1\.2' is not a network"):
        build_config({}, {"sandbox_allow_networks": ["10.1.2"]}, where, tmp_path)
    with pytest.raises(ConfigError, match=r"--sandbox-host: .*'mirror' is not NAME=IP"):
        build_config({"sandbox_hosts": ["mirror"]}, {}, None, tmp_path)
    with pytest.raises(ConfigError, match="--sandbox-allow-host"):
        build_config({"sandbox_allow_hosts": ["bad host!"]}, {}, None, tmp_path)
    # The workspace quota: bounded below, and part of the hash only when changed.
    assert build_config({"sandbox_disk_mb": 20480}, {}, None, tmp_path).scoring_hash() == (
        default.scoring_hash()
    )
    assert build_config({"sandbox_disk_mb": 512}, {}, None, tmp_path).scoring_hash() != (
        default.scoring_hash()
    )
    with pytest.raises(ConfigError, match="--sandbox-disk"):
        build_config({"sandbox_disk_mb": 1}, {}, None, tmp_path)
