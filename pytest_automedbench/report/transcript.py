"""A cell's trajectory as a self-contained HTML transcript (``transcript.html``).

What a reader of the cell wants to browse: the messages (system, brief, the agent's
turns), each tool call with its code and its output, the egress proxy's connections and
the gateway's events (failed or rejected requests, retries, tampering), and the tokens
and cost of every turn, totalled at the top. One file, no script, no request: the page
opens from disk, in an Allure attachment or from the leaderboard.

The agent is untrusted: every text it wrote (and every field of every event) is escaped
(:func:`html.escape` after :func:`~pytest_automedbench.printable.printable`), and the
page's Content-Security-Policy allows no script, no frame and no fetch, so markup in a
tool's output is shown, never run. A text longer than :data:`MAX_TEXT_CHARS` is cut, saying
how much was left out.

The trajectory is streamed: each line is read, rendered and written before the next is
read (a large trajectory is never held in memory); the page's head and totals are written
once the events are, then the events copied after them, and the file replaced atomically.
:func:`transcript_beside` is the cell's
:class:`~pytest_automedbench.agents.trajectory.TrajectoryWriter` view.
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pytest_automedbench.atomic import replaced
from pytest_automedbench.events import (
    EgressEvent,
    Event,
    MessageEvent,
    ToolResultEvent,
    parse_event,
)
from pytest_automedbench.printable import money, printable

__all__ = [
    "MAX_TEXT_CHARS",
    "TRANSCRIPT_FILENAME",
    "transcript_beside",
    "write_transcript",
]

TRANSCRIPT_FILENAME = "transcript.html"
#: The longest text shown of one field (a tool's output, a message); the rest is cut.
MAX_TEXT_CHARS = 50_000
#: Events of the cell's LLM gateway and of the model's provider, shown as such.
GATEWAY_KINDS = frozenset(
    {"request_failed", "request_rejected", "gateway_tampering", "gateway_error", "retry",
     "provider_error"}
)  # fmt: skip
#: Fields every event has (the generic table leaves them out: the header shows them).
STAMP_FIELDS = frozenset({"v", "seq", "t", "kind", "turn"})
#: No script, frame, form or request of any kind: styles of the page itself only.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:72em;padding:0 1em;
color:#1d232a}
h1{font-size:1.4em}
table{border-collapse:collapse;margin:.4em 0}
td,th{border:1px solid #ccd;padding:.15em .5em;text-align:left;vertical-align:top}
.event{border-left:4px solid #ccd;margin:.7em 0;padding:.2em .8em;background:#fafbfc}
.event header{font-weight:600;color:#445}
.event .meta{font-weight:400;color:#667;margin-left:.6em}
.role-system{border-color:#999}.role-user{border-color:#3a7bd5}
.role-assistant{border-color:#2e9e5b}.kind-tool_result{border-color:#c68a00}
.kind-egress{border-color:#7a4fd0}.denied{background:#fff3f3}
.gateway,.kind-crash,.kind-limit,.kind-violations,.kind-interrupted{border-color:#d33;
background:#fff3f3}
pre{white-space:pre-wrap;word-break:break-word;background:#f0f2f5;padding:.5em;margin:.3em 0;
max-height:40em;overflow:auto}
pre.stderr,pre.error{background:#fbeaea}
.tool-call{margin:.4em 0;padding:.2em .6em;border:1px dashed #aab}
.muted{color:#667}.cut{color:#a40}
"""


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    left = len(text) - MAX_TEXT_CHARS
    return f"{text[:MAX_TEXT_CHARS]}\n[... {left} more characters cut]"


def _e(value: object) -> str:
    """Any value as inert HTML text: control characters spelled out, markup escaped."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return html.escape(printable(text, multiline=True), quote=True)


def _pre(value: object, css: str = "") -> str:
    text = value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False)
    return f"<pre class='{css}'>{_e(_clip(text))}</pre>" if text else ""


def _tokens(tokens_in: int | None, tokens_out: int | None) -> str:
    return f"{tokens_in or 0:,} in / {tokens_out or 0:,} out tokens"


@dataclass
class Totals:
    """What the page's summary says, gathered while the events stream past."""

    title: str = "trajectory"
    events: int = 0
    turns: list[tuple[int, int, int, float, bool, float | None]] = field(default_factory=list)
    tool_calls: int = 0
    egress: int = 0
    gateway: int = 0
    end: Event | None = None

    def add(self, event: Event) -> None:
        self.events += 1
        if event.kind == "start":
            parts = [event.get(k) for k in ("agent", "task", "tier")]
            run = event.get("run")
            self.title = " / ".join(str(p) for p in parts if p is not None) + (
                f" run {run}" if run is not None else ""
            )
        elif isinstance(event, MessageEvent) and event.usage is not None:
            usage = event.usage
            self.turns.append((event.turn or len(self.turns) + 1, usage.tokens_in or 0,
                               usage.tokens_out or 0, usage.cost_usd or 0.0,
                               usage.price_known is not False, event.latency_s))  # fmt: skip
        elif isinstance(event, ToolResultEvent):
            self.tool_calls += 1
        elif isinstance(event, EgressEvent):
            self.egress += event.count or 1
        elif event.kind in GATEWAY_KINDS:
            self.gateway += 1
        elif event.kind == "end":
            self.end = event


def _cost(cost: float, known: bool) -> str:
    return money(cost) if known else "cost unknown (unpriced model)"


def _summary(totals: Totals) -> str:
    tokens_in = sum(t[1] for t in totals.turns)
    tokens_out = sum(t[2] for t in totals.turns)
    known = all(t[4] for t in totals.turns)
    cost = sum(t[3] for t in totals.turns)
    end = totals.end
    ending = f", ended {_e(end.get('termination'))}" if end is not None else ""
    rows = "".join(
        f"<tr><td>{turn}</td><td>{tin:,}</td><td>{tout:,}</td><td>{_e(_cost(c, k))}</td>"
        f"<td>{'' if lat is None else f'{lat:.1f} s'}</td></tr>"
        for turn, tin, tout, c, k, lat in totals.turns
    )
    table = (
        "<details><summary>Tokens per turn</summary><table class='turns'><tr><th>turn</th>"
        f"<th>tokens in</th><th>tokens out</th><th>cost</th><th>latency</th></tr>{rows}"
        "</table></details>"
        if rows
        else ""
    )
    return (
        f"<section class='summary'><p>{len(totals.turns)} turns, "
        f"{_tokens(tokens_in, tokens_out)}, {_e(_cost(cost, known))}; "
        f"{totals.tool_calls} tool calls, {totals.egress} egress connections, "
        f"{totals.gateway} gateway events; {totals.events} events{ending}.</p>{table}</section>"
    )


# --------------------------------------------------------------------------- events


def _header(event: Event, title: str, meta: str = "") -> str:
    when = f"t={event.t:.1f} s" if event.t is not None else ""
    seq = f"#{event.seq}" if event.seq is not None else ""
    extra = f" · {meta}" if meta else ""
    return f"<header>{_e(title)}<span class='meta'>{_e(seq)} {_e(when)}{extra}</span></header>"


def _arguments(raw: object) -> object:
    """A tool call's arguments: the JSON object they spell, or the text as it is."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _tool_call(name: object, arguments: object) -> str:
    args = _arguments(arguments)
    body = ""
    if isinstance(args, dict) and isinstance(args.get("code"), str):
        language = args.get("language") or ""
        rest = {k: v for k, v in args.items() if k not in ("code", "language")}
        body = _pre(args["code"], f"code language-{_e(language)}") + (_pre(rest) if rest else "")
    elif args not in (None, "", {}):
        body = _pre(args, "arguments")
    return (
        f"<div class='tool-call' data-tool='{_e(name)}'><strong>call {_e(name)}</strong>"
        f"{body}</div>"
    )


def _content(content: object) -> str:
    """A message's content: text, or the parts of a multi-part message (text, tool use
    and tool results as such; pictures named, not shown)."""
    if isinstance(content, str):
        return _pre(content, "text")
    if not isinstance(content, list):
        return _pre(content) if content is not None else ""
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part, dict):
            out.append(_pre(part.get("text") or "", "text"))
        elif kind == "tool_use" and isinstance(part, dict):
            out.append(_tool_call(part.get("name"), part.get("input")))
        elif kind == "tool_result" and isinstance(part, dict):
            out.append(_pre(part.get("content") or "", "output"))
        elif kind in ("image", "image_url", "input_image"):
            out.append("<p class='muted'>[a picture]</p>")
        else:
            out.append(_pre(part))
    return "".join(out)


def _message(event: Event) -> str:
    assert isinstance(event, MessageEvent)
    message = event.message or {}
    role = str(message.get("role") or "?")
    meta = []
    if event.turn is not None:
        meta.append(f"turn {event.turn}")
    if event.usage is not None:
        usage = event.usage
        meta.append(_tokens(usage.tokens_in, usage.tokens_out))
        meta.append(_cost(usage.cost_usd or 0.0, usage.price_known is not False))
    if event.latency_s is not None:
        meta.append(f"{event.latency_s:.1f} s")
    calls = message.get("tool_calls")
    tool_calls = "".join(
        _tool_call(call.get("function", {}).get("name"), call.get("function", {}).get("arguments"))
        for call in (calls if isinstance(calls, list) else [])
        if isinstance(call, dict) and isinstance(call.get("function"), dict)
    )
    return (
        f"<section class='event kind-message role-{_e(role)}' data-kind='message' "
        f"data-role='{_e(role)}'>{_header(event, role, ' · '.join(meta))}"
        f"{_content(message.get('content'))}{tool_calls}</section>"
    )


def _tool_result(event: Event) -> str:
    assert isinstance(event, ToolResultEvent)
    meta = [f"call {event.call_id}"] if event.call_id else []
    if event.exit_code is not None:
        meta.append(f"exit {event.exit_code}")
    if event.timed_out:
        meta.append("timed out")
    if event.duration_s is not None:
        meta.append(f"{event.duration_s:.1f} s")
    if event.skipped:
        meta.append("skipped")
    output = _pre(event.stdout or "", "stdout output") + _pre(event.stderr or "", "stderr")
    if not output and event.message is not None:
        output = _content(event.message.get("content"))
    if event.error:
        output += _pre(f"error: {event.error}", "error")
    if event.problems:
        output += _pre(event.problems, "error")
    header = _header(event, f"result of {event.tool}", " · ".join(meta))
    return (
        f"<section class='event kind-tool_result' data-kind='tool_result' "
        f"data-tool='{_e(event.tool)}'>{header}{output}</section>"
    )


def _egress(event: Event) -> str:
    assert isinstance(event, EgressEvent)
    verdict = "allowed" if event.allowed else "denied"
    target = f"{event.method or ''} {event.host or event.address or '?'}:{event.port or ''}"
    meta = [verdict, event.reason or "", "answer-seeking" if event.answer_seeking else ""]
    if event.bytes_up is not None or event.bytes_down is not None:
        meta.append(f"{event.bytes_up or 0} B up / {event.bytes_down or 0} B down")
    if (event.count or 1) > 1:
        meta.append(f"{event.count} connections")
    return (
        f"<section class='event kind-egress {verdict}' data-kind='egress' "
        f"data-allowed='{str(event.allowed).lower()}'>"
        f"{_header(event, f'egress {target.strip()}', ' · '.join(m for m in meta if m))}</section>"
    )


def _fields(event: Event) -> str:
    rows = "".join(
        f"<tr><th>{_e(key)}</th><td>{_pre(value) if isinstance(value, dict | list) else _e(_clip(str(value)))}</td></tr>"  # noqa: E501
        for key, value in event.raw.items()
        if key not in STAMP_FIELDS and value not in (None, "", [], {})
    )
    return f"<table class='fields'>{rows}</table>" if rows else ""


def _generic(event: Event) -> str:
    css = "gateway" if event.kind in GATEWAY_KINDS else ""
    return (
        f"<section class='event kind-{_e(event.kind)} {css}' data-kind='{_e(event.kind)}'>"
        f"{_header(event, event.kind.replace('_', ' '))}{_fields(event)}</section>"
    )


_RENDERERS: dict[str, Callable[[Event], str]] = {
    "message": _message,
    "tool_result": _tool_result,
    "egress": _egress,
}


def render_event(event: Event) -> str:
    """One event as an HTML ``<section>`` (``data-kind`` is its kind)."""
    return _RENDERERS.get(event.kind, _generic)(event) + "\n"


def _events(lines: TextIO) -> Iterator[Event | str]:
    """The trajectory's events, one line at a time; a line that does not parse as an
    event object is given back as its text."""
    for line in lines:
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            yield line
            continue
        yield parse_event(data) if isinstance(data, Mapping) else line


def _unreadable(line: str) -> str:
    return f"<section class='event unreadable' data-kind='unreadable'>{_pre(line)}</section>\n"


def _page_head(title: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        "<meta name='referrer' content='no-referrer'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>Transcript: {_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Transcript: {_e(title)}</h1>"
    )


def write_transcript(trajectory: Path, target: Path) -> Path | None:
    """``trajectory`` (a ``trajectory.jsonl``) as the HTML page ``target``, written
    atomically; None (nothing written) when the trajectory has no event."""
    body = target.with_name(f".{target.name}.events.tmp")
    totals = Totals()
    try:
        with (
            trajectory.open(encoding="utf-8", errors="replace") as lines,
            body.open("w", encoding="utf-8") as out,
        ):
            for item in _events(lines):
                if isinstance(item, str):
                    out.write(_unreadable(item))
                    continue
                totals.add(item)
                out.write(render_event(item))
        if not totals.events:
            return None
        with replaced(target) as page, body.open(encoding="utf-8") as events:
            page.write(_page_head(totals.title) + _summary(totals) + "<main>")
            shutil.copyfileobj(events, page)
            page.write("</main></body></html>\n")
        return target
    finally:
        body.unlink(missing_ok=True)


def transcript_beside(trajectory: Path) -> Path | None:
    """A trajectory file's transcript beside it (``transcript.html``): the view a cell's
    trajectory writer writes when it closes."""
    if not trajectory.is_file():
        return None
    return write_transcript(trajectory, trajectory.with_name(TRANSCRIPT_FILENAME))
