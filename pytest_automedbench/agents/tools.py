"""The tools an agent can call, their JSON schemas, and how each call is executed.

Tool results are plain text for the model plus structured fields for the
trajectory (exit code, duration, what the workspace looked like afterwards), so
the stage scorer can reason about what each call achieved without re-running it.
The fields are those of :class:`pytest_automedbench.events.ToolResultEvent`, and how a
call ended is read from them by :func:`pytest_automedbench.events.call_outcome` alone.
"""

from __future__ import annotations

import base64
import io
import json
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_automedbench.evaluation import EvaluatorError
from pytest_automedbench.evaluators.safe_io import encodable, valid_text
from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.sandbox import ExecResult, Sandbox, SandboxError

#: Characters of each output stream shown to the model (head and tail).
OUTPUT_HEAD = 4000
OUTPUT_TAIL = 4000
DEFAULT_EXEC_TIMEOUT_S = 600.0
#: execute: the longest code accepted, in UTF-8 bytes. It is one argument of a process, and
#: Linux refuses a longer one than 128 KiB (E2BIG): the sandbox would seem broken.
EXEC_MAX_CODE_BYTES = 100_000
MAX_SUBMISSIONS = 3
#: read_file: characters returned by default and at most; bytes read from the sandbox.
READ_DEFAULT_CHARS = 20_000
READ_MAX_CHARS = 100_000
READ_MAX_BYTES = 4 * 1024**2
#: write_file: the largest content accepted in one call.
WRITE_MAX_CHARS = 2_000_000
#: view_image: the largest file read, the longest side sent to the model, the formats read
#: and the most pixels decoded (checked in the header first: a 0.7 MB PNG can hold 177 Mpx,
#: over a gigabyte decoded; 25 Mpx is 100 MB at 4 bytes a pixel, 24 times what is shown).
IMAGE_MAX_BYTES = 20 * 1024**2
IMAGE_MAX_SIDE = 1024
IMAGE_MAX_PIXELS = 25_000_000
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP")

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "execute",
            "description": (
                "Run bash or Python code in your sandbox (working directory: your workspace). "
                "Returns the exit code and stdout/stderr; long output is truncated in the middle."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": ["bash", "python"]},
                    "code": {"type": "string"},
                    "timeout_s": {
                        "type": "number",
                        "description": f"Per-call limit in seconds "
                        f"(default {DEFAULT_EXEC_TIMEOUT_S:.0f})",
                    },
                },
                "required": ["language", "code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": (
                "Read a text file (a path in your workspace, or an absolute path you can see). "
                f"Returns at most max_chars characters (default {READ_DEFAULT_CHARS}) "
                "from offset, and says when there is more."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "offset": {"type": "integer", "description": "first character (default 0)"},
                    "max_chars": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": (
                "Write a text file in your workspace (folders are created; an existing file "
                "is replaced)."
            ),
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view_image",
            "description": (
                "Look at an image file (PNG, JPEG, GIF, BMP, TIFF or WebP): it is shown to you "
                f"in the next message, downscaled to at most {IMAGE_MAX_SIDE} px (images over "
                f"{IMAGE_MAX_PIXELS // 1_000_000} Mpx are refused). Convert other formats "
                "(NIfTI, DICOM) to PNG with execute first."
            ),
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit_results",
            "description": (
                "Submit the outputs for scoring. A format pre-check runs first; if it finds "
                f"problems you are told what is wrong and may fix and resubmit (at most "
                f"{MAX_SUBMISSIONS} submissions)."
            ),
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def truncate_middle(text: str, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> str:
    if len(text) <= head + tail:
        return text
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{text[-tail:]}"


def exec_content(result: ExecResult, timeout_s: float, what: str = "call") -> str:
    """What the model is told of an executed command: its exit code, a timeout, and its
    output streams (each truncated in the middle)."""
    parts = [f"exit_code: {result.exit_code}"]
    if result.timed_out:
        parts.append(f"TIMEOUT: the {what} was killed after {timeout_s:.0f} s")
    parts.append("stdout:\n" + truncate_middle(result.stdout))
    if result.stderr:
        parts.append("stderr:\n" + truncate_middle(result.stderr))
    return "\n".join(parts)


def exec_record(
    language: str, code: str, result: ExecResult, observed: dict[str, Any]
) -> dict[str, Any]:
    """The trajectory fields of an ``execute`` call that ran
    (:class:`pytest_automedbench.events.ToolResultEvent`): always its exit code, which
    :func:`pytest_automedbench.events.call_outcome` needs to call it a success."""
    return {
        "language": language,
        "code": code,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "duration_s": result.duration_s,
        "stdout": truncate_middle(result.stdout),
        "stderr": truncate_middle(result.stderr),
        "observed": observed,
    }


@dataclass
class ToolOutcome:
    """What a call returns to the model (``content``) and to the trajectory (``record``).

    ``attachments`` are messages added after the tool results (an image for view_image:
    tool messages cannot carry images in the chat-completions protocol).
    """

    content: str
    record: dict[str, Any]
    ends_episode: bool = False
    attachments: list[dict[str, Any]] = field(default_factory=list)


def _error(message: str, kind: str, **record: Any) -> ToolOutcome:
    return ToolOutcome(f"ERROR: {message}", {"error": kind, **record})


def _why(exc: OSError | ValueError) -> str:
    """An OS error's own words (``No such file or directory``), else the message."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _string_argument(arguments: dict[str, Any], key: str, tool: str) -> str | ToolOutcome:
    value = arguments.get(key)
    if not isinstance(value, str) or not value:
        return _error(f"{tool} needs {key} (a non-empty string).", "malformed_arguments")
    return value


@dataclass
class Toolbox:
    sandbox: Sandbox
    precheck: Callable[[], FormatReport]
    observe: Callable[[], dict[str, Any]]
    remaining_s: Callable[[], float]
    submissions: int = 0
    submitted: bool = False
    last_format: FormatReport | None = None
    calls: list[str] = field(default_factory=list)

    def call(self, name: str, raw_arguments: str) -> ToolOutcome:
        """Run one call. Whatever the agent passed or made, the call ends as a tool result:
        an exception while handling it is the call's failure (recorded with its traceback),
        never the harness's; only the sandbox or the evaluator failing in itself
        (:class:`SandboxError`, :class:`EvaluatorError`) is."""
        self.calls.append(name)
        try:
            arguments = json.loads(raw_arguments or "{}")
        except (ValueError, RecursionError) as exc:  # a 5000-digit number is a ValueError
            where = f" ({exc.msg} at {exc.pos})" if isinstance(exc, json.JSONDecodeError) else ""
            return ToolOutcome(
                f"ERROR: the arguments of {name} are not valid JSON{where}.",
                {"error": "malformed_arguments"},
            )
        if not isinstance(arguments, dict):
            return ToolOutcome(
                f"ERROR: the arguments of {name} must be a JSON object.",
                {"error": "malformed_arguments"},
            )
        # A lone surrogate ("\\ud800" in the JSON) cannot be encoded for the sandbox or a file.
        arguments = {k: valid_text(v) if isinstance(v, str) else v for k, v in arguments.items()}
        try:
            return self._dispatch(name, arguments)
        except (SandboxError, EvaluatorError):
            raise
        except Exception as exc:
            shown = {k: arguments[k] for k in ("language", "code", "path") if k in arguments}
            return ToolOutcome(
                f"ERROR: {name} failed on what it was given or found "
                f"({encodable(f'{type(exc).__name__}: {exc}')[:500]}).",
                {"error": "call_failed", **shown, "traceback": traceback.format_exc()[-4000:]},
            )

    def _dispatch(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        if name == "execute":
            return self._execute(arguments)
        if name == "read_file":
            return self._read_file(arguments)
        if name == "write_file":
            return self._write_file(arguments)
        if name == "view_image":
            return self._view_image(arguments)
        if name == "submit_results":
            return self._submit()
        known = ", ".join(t["function"]["name"] for t in TOOL_SCHEMAS)
        return ToolOutcome(
            f"ERROR: unknown tool {name!r}; available tools: {known}.", {"error": "unknown_tool"}
        )

    def _execute(self, arguments: dict[str, Any]) -> ToolOutcome:
        language = arguments.get("language")
        code = arguments.get("code")
        if language not in ("bash", "python") or not isinstance(code, str):
            return ToolOutcome(
                "ERROR: execute needs language ('bash' or 'python') and code (a string).",
                {"error": "malformed_arguments"},
            )
        if (size := len(code.encode("utf-8"))) > EXEC_MAX_CODE_BYTES:
            return _error(
                f"execute: the code is {size} bytes, over {EXEC_MAX_CODE_BYTES}; write it to "
                "a file with write_file and run that file.",
                "too_large",
                language=language,
                code=truncate_middle(code),
            )
        requested = arguments.get("timeout_s", DEFAULT_EXEC_TIMEOUT_S)
        if not isinstance(requested, int | float) or not 0 < requested < float("inf"):
            requested = DEFAULT_EXEC_TIMEOUT_S
        remaining = self.remaining_s()
        if remaining <= 0:  # never a floor past the deadline
            return _error(
                "the wall-clock limit is reached; the command was not run.",
                "time_limit",
                language=language,
                code=code,
            )
        timeout = min(float(requested), remaining)
        result: ExecResult = self.sandbox.exec(language, code, timeout)
        return ToolOutcome(
            exec_content(result, timeout), exec_record(language, code, result, self.observe())
        )

    def _read_file(self, arguments: dict[str, Any]) -> ToolOutcome:
        path = _string_argument(arguments, "path", "read_file")
        if isinstance(path, ToolOutcome):
            return path
        offset, limit = arguments.get("offset", 0), arguments.get("max_chars", READ_DEFAULT_CHARS)
        if not isinstance(offset, int) or offset < 0 or not isinstance(limit, int) or limit < 1:
            return _error(
                "read_file: offset must be an integer >= 0 and max_chars >= 1.",
                "malformed_arguments",
            )
        limit = min(limit, READ_MAX_CHARS)
        try:
            data = self.sandbox.read_file(path, READ_MAX_BYTES)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
            return _error(f"read_file {path}: {_why(exc)}", "file_error", path=path)
        if b"\0" in data[:8192]:
            return _error(
                f"read_file {path}: a binary file ({len(data)} bytes read); inspect it with "
                "execute (or view_image for pictures).",
                "binary_file",
                path=path,
            )
        text = data.decode("utf-8", errors="replace")
        chunk = text[offset : offset + limit]
        more = len(text) > offset + limit or len(data) >= READ_MAX_BYTES
        note = (
            f"\n[... more follows: call read_file with offset={offset + len(chunk)} ...]"
            if more
            else ""
        )
        record = {"path": path, "offset": offset, "chars": len(chunk), "truncated": more}
        return ToolOutcome(chunk + note, record)

    def _write_file(self, arguments: dict[str, Any]) -> ToolOutcome:
        path = _string_argument(arguments, "path", "write_file")
        if isinstance(path, ToolOutcome):
            return path
        content = arguments.get("content")
        if not isinstance(content, str):
            return _error("write_file needs content (a string).", "malformed_arguments")
        if len(content) > WRITE_MAX_CHARS:
            return _error(
                f"write_file: content has {len(content)} characters, over {WRITE_MAX_CHARS}; "
                "write large files with execute.",
                "too_large",
                path=path,
            )
        data = content.encode("utf-8")
        try:
            self.sandbox.write_file(path, data)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
            return _error(f"write_file {path}: {_why(exc)}", "file_error", path=path)
        record = {
            "path": path,
            "bytes": len(data),
            "content": truncate_middle(content),
            "observed": self.observe(),
        }
        return ToolOutcome(f"Wrote {len(data)} bytes to {path}.", record)

    def _view_image(self, arguments: dict[str, Any]) -> ToolOutcome:
        from PIL import Image, UnidentifiedImageError

        path = _string_argument(arguments, "path", "view_image")
        if isinstance(path, ToolOutcome):
            return path
        try:
            data = self.sandbox.read_file(path, IMAGE_MAX_BYTES + 1)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
            return _error(f"view_image {path}: {_why(exc)}", "file_error", path=path)
        if len(data) > IMAGE_MAX_BYTES:
            return _error(
                f"view_image {path}: over {IMAGE_MAX_BYTES} bytes; save a smaller PNG first.",
                "too_large",
                path=path,
            )
        try:
            with warnings.catch_warnings():  # Pillow's own bomb warning: refused below
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            with image:
                size = image.size  # from the header: nothing is decoded yet
                if size[0] * size[1] > IMAGE_MAX_PIXELS:
                    return _error(
                        f"view_image {path}: {size[0]}x{size[1]} px is over "
                        f"{IMAGE_MAX_PIXELS // 1_000_000} Mpx; save a smaller copy (at most "
                        f"{IMAGE_MAX_SIDE} px a side is shown) with execute first.",
                        "too_large",
                        path=path,
                        size=list(size),
                    )
                image.load()
                shown = image.convert("RGB") if image.mode not in ("L", "RGB", "RGBA") else image
                shown.thumbnail((IMAGE_MAX_SIDE, IMAGE_MAX_SIDE))
                buffer = io.BytesIO()
                shown.save(buffer, format="PNG")
                shown_size = shown.size
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            return _error(
                f"view_image {path}: not an image Pillow can read ({exc}); convert it to PNG "
                "with execute first.",
                "not_an_image",
                path=path,
            )
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
        scaled = "" if shown_size == size else f", shown at {shown_size[0]}x{shown_size[1]}"
        caption = f"The image {path} ({size[0]}x{size[1]} px{scaled}), as requested:"
        attachment = {
            "role": "user",
            "content": [
                {"type": "text", "text": caption},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
        record = {"path": path, "size": list(size), "shown_size": list(shown_size)}
        return ToolOutcome(
            f"{path}: {size[0]}x{size[1]} px; the image follows in the next message.",
            record,
            attachments=[attachment],
        )

    def _submit(self) -> ToolOutcome:
        self.submissions += 1
        report = self.precheck()
        self.last_format = report
        record: dict[str, Any] = {
            "attempt": self.submissions,
            "format_valid": report.valid,
            "problems": report.problems[:50],
            "observed": self.observe(),
        }
        if report.valid or self.submissions >= MAX_SUBMISSIONS:
            self.submitted = True
            record["accepted"] = True
            verdict = (
                "accepted" if report.valid else "accepted with format problems (no attempts left)"
            )
            return ToolOutcome(f"Submission {verdict}. The episode ends.", record, True)
        record["accepted"] = False
        left = MAX_SUBMISSIONS - self.submissions
        problems = "\n".join(f"- {p}" for p in report.problems[:30])
        return ToolOutcome(
            f"Submission REJECTED by the format pre-check ({report.n_valid}/{report.n_expected} "
            f"cases valid). Fix these and call submit_results again ({left} attempt(s) left):\n"
            f"{problems}",
            record,
        )
