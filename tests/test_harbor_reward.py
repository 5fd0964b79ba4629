"""Reading a Harbor verifier's reward.txt / reward.json by the one rule of ``_reward``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_automedbench.harbor._reward import (
    MAX_REWARD_BYTES,
    RewardOrder,
    RewardReading,
    VerifierError,
    passed,
    read_reward,
    reward_order,
)


def _verifier(tmp_path: Path, txt: str | bytes | None = None, js: str | None = None) -> Path:
    folder = tmp_path / "verifier"
    folder.mkdir()
    if txt is not None:
        data = txt.encode() if isinstance(txt, str) else txt
        (folder / "reward.txt").write_bytes(data)
    if js is not None:
        (folder / "reward.json").write_text(js, encoding="utf-8")
    return folder


def _error(folder: Path) -> VerifierError:
    with pytest.raises(VerifierError) as caught:
        read_reward(folder)
    return caught.value


# ---- reward.txt -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1.0), ("0\n", 0.0), ("  0.25 \n", 0.25), ("-2e-3", -0.002), (".5", 0.5), ("+3.", 3.0)],
)
def test_txt_number_is_the_reward(tmp_path: Path, text: str, value: float) -> None:
    reading = read_reward(_verifier(tmp_path, txt=text))
    assert reading == RewardReading({"reward": value}, "reward.txt")


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_txt_empty(tmp_path: Path, text: str) -> None:
    error = _error(_verifier(tmp_path, txt=text))
    assert error.kind == "reward_empty"
    assert "reward.txt" in str(error)


@pytest.mark.parametrize(
    "text", ["pass", "1 2", "1\n0", "nan", "inf", "-Infinity", "1_000", "0x1", "1,5", "1e"]
)
def test_txt_not_one_number_is_unreadable_and_quoted(tmp_path: Path, text: str) -> None:
    error = _error(_verifier(tmp_path, txt=text))
    assert error.kind == "reward_unreadable"
    assert "reward.txt" in error.message
    assert text.split("\n")[0] in error.message


def test_txt_number_too_large_for_a_float(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, txt="1e999"))
    assert error.kind == "reward_unreadable"
    assert "1e999" in error.message


def test_txt_quote_is_truncated_and_printable(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, txt="\x1b[2K\rPASSED " + "x" * 500))
    assert error.kind == "reward_unreadable"
    assert "\x1b" not in error.message and "\r" not in error.message
    assert "\\x1b[2K\\rPASSED" in error.message
    assert "x" * 200 not in error.message
    assert "characters)" in error.message


# ---- reward.json ------------------------------------------------------------------


def test_json_reward_key_decides_and_other_keys_are_kept(tmp_path: Path) -> None:
    reading = read_reward(_verifier(tmp_path, js='{"reward": 1, "n_pass": 3, "rate": 0.5}'))
    assert reading.source == "reward.json"
    assert reading.rewards == {"reward": 1.0, "n_pass": 3.0, "rate": 0.5}
    assert all(type(value) is float for value in reading.rewards.values())


def test_json_single_key_is_the_reward(tmp_path: Path) -> None:
    reading = read_reward(_verifier(tmp_path, js='{"accuracy": 0.75}'))
    assert reading.rewards == {"accuracy": 0.75, "reward": 0.75}


def test_json_several_keys_without_reward_is_unreadable(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, js='{"recall": 1.0, "precision": 0.2}'))
    assert error.kind == "reward_unreadable"
    assert "reward.json" in error.message
    assert "which key is the reward?" in error.message
    assert '"recall"' in error.message and '"precision"' in error.message


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("true", "true"),
        ("false", "false"),
        ("null", "null"),
        ('"1"', '"1"'),
        ("[1]", "array"),
        ('{"x": 1}', "nested object"),
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("-Infinity", "-Infinity"),
        ("1e400", "not a finite number"),
    ],
)
def test_json_value_that_is_not_a_finite_number(tmp_path: Path, value: str, shown: str) -> None:
    error = _error(_verifier(tmp_path, js=f'{{"reward": 1, "score": {value}}}'))
    assert error.kind == "reward_unreadable"
    assert "reward.json" in error.message
    assert '"score"' in error.message
    assert shown in error.message


def test_json_integer_too_large_for_a_float(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, js='{"reward": ' + "9" * 400 + "}"))
    assert error.kind == "reward_unreadable"
    assert '"reward"' in error.message


@pytest.mark.parametrize("text", ["[1]", "[]", "1", '"reward"', "null", "{", '{"reward": 1} x'])
def test_json_not_one_object_is_unreadable(tmp_path: Path, text: str) -> None:
    error = _error(_verifier(tmp_path, js=text))
    assert error.kind == "reward_unreadable"
    assert "reward.json" in error.message


def test_json_repeated_key_is_unreadable(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, js='{"reward": 0, "reward": 1}'))
    assert error.kind == "reward_unreadable"
    assert 'repeats key "reward"' in error.message


@pytest.mark.parametrize("text", ["", "  \n", "{}", " { } "])
def test_json_empty(tmp_path: Path, text: str) -> None:
    error = _error(_verifier(tmp_path, js=text))
    assert error.kind == "reward_empty"
    assert "reward.json" in error.message


# ---- both, neither ----------------------------------------------------------------


def test_both_under_harbor_0_3_reward_txt_decides_and_json_is_ignored(tmp_path: Path) -> None:
    folder = _verifier(tmp_path, txt="0\n", js='{"reward": 0.75, "n_tasks": 5}')
    reading = read_reward(folder, "txt_first")
    assert reading.source == "reward.txt" and reading.rewards == {"reward": 0.0}
    assert read_reward(folder).rewards == {"reward": 0.0}  # 0.3.x is the default


def test_both_under_later_harbor_reward_json_decides_with_every_key(tmp_path: Path) -> None:
    folder = _verifier(tmp_path, txt="0\n", js='{"reward": 0.75, "n_tasks": 5}')
    reading = read_reward(folder, "json_first")
    assert reading.source == "reward.json"
    assert reading.rewards == {"reward": 0.75, "n_tasks": 5.0}


@pytest.mark.parametrize(
    ("txt", "js", "order", "broken"),
    [("1", '{"reward": null}', "json_first", "reward.json"),
     ("yes", '{"reward": 1}', "txt_first", "reward.txt")],
)  # fmt: skip
def test_the_deciding_file_must_parse(
    tmp_path: Path, txt: str, js: str, order: RewardOrder, broken: str
) -> None:
    folder = _verifier(tmp_path, txt=txt, js=js)
    with pytest.raises(VerifierError) as caught:
        read_reward(folder, order)
    assert caught.value.kind == "reward_unreadable"
    assert caught.value.message.startswith(broken)


def test_a_broken_file_that_does_not_decide_is_ignored(tmp_path: Path) -> None:
    folder = _verifier(tmp_path, txt="yes", js='{"reward": 1}')
    assert read_reward(folder, "json_first").rewards == {"reward": 1.0}
    (tmp_path / "b").mkdir()
    folder2 = _verifier(tmp_path / "b", txt="1", js='{"reward": null}')
    assert read_reward(folder2, "txt_first").rewards == {"reward": 1.0}


def test_both_with_empty_deciding_txt_is_empty(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, txt="", js='{"reward": 1}'))
    assert error.kind == "reward_empty"
    assert "reward.txt" in error.message


@pytest.mark.parametrize(
    ("version", "renamed", "order"),
    [("1.0", False, "txt_first"), ("1.1", False, "txt_first"), ("1.2", False, "json_first"),
     ("1.4", False, "json_first"), ("2.0", False, "json_first"), ("1.0", True, "json_first"),
     (None, False, "txt_first"), ("draft", False, "txt_first")],
)  # fmt: skip
def test_the_declared_schema_version_picks_the_harbor_rule(
    version: str | None, renamed: bool, order: RewardOrder
) -> None:
    assert reward_order(version, renamed) == order


def test_neither_is_missing_naming_folder_and_files(tmp_path: Path) -> None:
    folder = _verifier(tmp_path)
    (folder / "test-stdout.txt").write_text("all tests passed\n")
    error = _error(folder)
    assert error.kind == "reward_missing"
    assert str(folder) in error.message
    assert "reward.txt" in error.message and "reward.json" in error.message


def test_missing_folder_is_missing(tmp_path: Path) -> None:
    error = _error(tmp_path / "never-created")
    assert error.kind == "reward_missing"


# ---- hostile files ----------------------------------------------------------------


def test_file_over_one_mebibyte_is_unreadable(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, txt="1" + " " * MAX_REWARD_BYTES))
    assert error.kind == "reward_unreadable"
    assert "reward.txt" in error.message and "larger than" in error.message


def test_file_of_exactly_one_mebibyte_is_read(tmp_path: Path) -> None:
    reading = read_reward(_verifier(tmp_path, txt="1" + " " * (MAX_REWARD_BYTES - 1)))
    assert reading.rewards == {"reward": 1.0}


def test_non_utf8_is_unreadable(tmp_path: Path) -> None:
    error = _error(_verifier(tmp_path, txt=b"1\xff"))
    assert error.kind == "reward_unreadable"
    assert "reward.txt" in error.message and "UTF-8" in error.message


def test_non_utf8_json_is_unreadable(tmp_path: Path) -> None:
    folder = _verifier(tmp_path)
    (folder / "reward.json").write_bytes(b'{"reward": 1, "\xc3": 2}')
    error = _error(folder)
    assert error.kind == "reward_unreadable"
    assert "reward.json" in error.message


@pytest.mark.parametrize("name", ["reward.txt", "reward.json"])
def test_planted_symlink_is_refused_not_followed(tmp_path: Path, name: str) -> None:
    target = tmp_path / "host-secret"
    target.write_text('{"reward": 1}' if name.endswith(".json") else "1")
    folder = _verifier(tmp_path)
    (folder / name).symlink_to(target)
    error = _error(folder)
    assert error.kind == "reward_unreadable"
    assert name in error.message and "symbolic link" in error.message


def test_dangling_symlink_is_refused_not_missing(tmp_path: Path) -> None:
    folder = _verifier(tmp_path)
    (folder / "reward.txt").symlink_to(tmp_path / "nowhere")
    error = _error(folder)
    assert error.kind == "reward_unreadable"
    assert "symbolic link" in error.message


def test_symlink_beside_a_good_file_is_still_refused(tmp_path: Path) -> None:
    target = tmp_path / "other"
    target.write_text('{"reward": 1}')
    folder = _verifier(tmp_path, txt="1")
    (folder / "reward.json").symlink_to(target)
    assert _error(folder).kind == "reward_unreadable"


def test_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    folder = _verifier(tmp_path)
    (folder / "reward.txt").mkdir()
    error = _error(folder)
    assert error.kind == "reward_unreadable"
    assert "reward.txt" in error.message and "not a regular file" in error.message


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    folder = _verifier(tmp_path)
    os.mkfifo(folder / "reward.json")
    error = _error(folder)
    assert error.kind == "reward_unreadable"
    assert "reward.json" in error.message and "not a regular file" in error.message


# ---- the error and the pass rule --------------------------------------------------


def test_verifier_error_is_an_exception_with_kind_and_message() -> None:
    error = VerifierError("reward_missing", "nothing there")
    assert isinstance(error, Exception)
    assert (error.kind, error.message, str(error)) == (
        "reward_missing",
        "nothing there",
        "nothing there",
    )


@pytest.mark.parametrize(
    ("reward", "threshold", "expected"),
    [(1.0, 1.0, True), (0.9, 0.9, True), (0.89, 0.9, False), (0.0, 0.5, False), (2.0, 1.0, True)],
)
def test_passed_is_reward_at_least_threshold(
    reward: float, threshold: float, expected: bool
) -> None:
    assert passed({"reward": reward, "other": 99.0}, threshold) is expected


def test_passed_reads_only_the_reward_key() -> None:
    with pytest.raises(KeyError):
        passed({"accuracy": 1.0}, 0.5)
