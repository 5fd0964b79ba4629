"""What an agent named reaches the terminal, JUnit and Allure escaped: control characters,
format characters and undecodable bytes are written out; everything else is kept."""

from __future__ import annotations

import pytest

from pytest_automedbench.printable import printable, printable_bytes

#: A file name that, printed raw, erases the terminal's line and writes a fake verdict.
FAKE_VERDICT = "\x1b[2K\r PASSED suites/vqa/test_vqa.py::test_cell OVERALL 97.0\n"


def raw_controls(text: str) -> list[str]:
    """Characters a terminal acts on (newline and tab allowed)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]


def test_a_fake_verdict_stays_on_its_line_and_shows_its_escapes() -> None:
    assert printable(FAKE_VERDICT) == (
        "\\x1b[2K\\r PASSED suites/vqa/test_vqa.py::test_cell OVERALL 97.0\\n"
    )
    # A whole message keeps its own line breaks; the carriage return is still escaped.
    assert printable("a\tb\nc\rd\x1b", multiline=True) == "a\tb\nc\\rd\\x1b"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x00\x07\x08\x7f", "\\x00\\x07\\x08\\x7f"),
        ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: CSI and NEL
        ("abc\u202edcba.txt", "abc\\u202edcba.txt"),  # a right-to-left override
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("bad\udc9bbyte", "bad\\udc9bbyte"),  # os.fsdecode of b"bad\x9bbyte"
        ("tag\U000e0041", "tag\\U000e0041"),
    ],
)
def test_controls_format_characters_and_surrogates_are_escaped(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(text, multiline=True) == shown


@pytest.mark.parametrize(
    "text",
    [
        "case_0001/mask.nii.gz",
        "Niere rechts: Läsion 3 mm, 肾脏, كلية, é",
        r"re.compile(r'case_(\d+)') C:\data",
        "emoji 🙂 and a no-break\u00a0space",
        "",
    ],
)
def test_printable_text_is_kept_as_it_is(text: str) -> None:
    assert printable(text) == text


def test_every_character_that_acts_is_escaped() -> None:
    every = "".join(map(chr, range(0x110000)))
    for text in (printable(every), printable(every, multiline=True)):
        assert not raw_controls(text)
        assert not any(0xD800 <= ord(c) < 0xE000 for c in text)


def test_text_attachments_are_escaped_bytes() -> None:
    data = b"# Plan\n\x1b[31mred\x1b[0m\r\n\xff\xfe end\n"
    assert printable_bytes(data) == b"# Plan\n\\x1b[31mred\\x1b[0m\\r\n\\udcff\\udcfe end\n"
    printable_bytes(data).decode("utf-8")  # valid UTF-8 whatever came in
