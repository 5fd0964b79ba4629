"""Re-capture the real gateway logs in this folder (documented; not run by the tests).

Each agent system -- the real ``claude`` and ``codex`` binaries from ``.agent-tools`` --
runs headless, as an unprivileged user (uid 65534: Claude Code refuses to skip its
permission prompts as root), through a real :class:`Gateway` lease against
:class:`tests.scripted_upstream.ScriptedUpstream` playing :data:`SCRIPT` (the ``-files``
systems: :func:`files_script`). ``chat-text-actions`` is mini-swe-agent's text-action
loop, re-told here with httpx. The lease's log is saved as ``<system>.jsonl``; a log over
:data:`LIMIT` bytes (Claude Code's: ~110 KB of tool schemas and system prompt per
request) loses the bulky, fixed request fields :data:`TRIMMED` (see ``README.md``). The
systems' own stdout goes to ``$TMPDIR/<system>.stdout.jsonl``.

    LITELLM_LOCAL_MODEL_COST_MAP=True .venv/bin/python -m tests.wire_samples.capture \
        [SYSTEM ...] [--trim]     # SYSTEM: a key of SYSTEMS; default: all of them

Needs root (for ``setpriv``) and ``scripts/bootstrap`` run (the CLIs installed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from pytest_automedbench.gateway import CellLease, Gateway, Prices, RetryPolicy, read_history
from tests.scripted_upstream import Call, ScriptedUpstream, Shell, Step, StepUsage, Text

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BIN = REPO / ".agent-tools" / "node_modules" / ".bin"
NOBODY = 65534
PRICES = Prices(input_per_mtok=3.0, output_per_mtok=15.0)
KEY_ENV = "AMB_CAPTURE_UPSTREAM_KEY"
#: A model Codex knows (its built-in metadata): it then offers ``apply_patch`` too.
CODEX_MODEL = "gpt-5.5"
PROMPT = "Make out/a.txt containing hello, then check the exit status of `exit 3`."
#: The script both systems are played; each step's usage differs so turns can be told apart.
SCRIPT: list[Shell | Text] = [
    Shell(
        "mkdir -p out && echo hello > out/a.txt && cat out/a.txt",
        StepUsage(input_tokens=1200, output_tokens=40),
    ),
    Shell("exit 3", StepUsage(input_tokens=1300, output_tokens=30)),
    Text("done", StepUsage(input_tokens=1400, output_tokens=10)),
]
SIDE_USAGE = StepUsage(input_tokens=50, output_tokens=5)
#: Request-body fields dropped from a log over :data:`LIMIT` bytes (or with ``--trim``):
#: the same long text in every request of a run (tools keep their names: :func:`trim`).
TRIMMED = ("tools", "system", "instructions")
LIMIT = 200_000


def _as_nobody(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run(
        setpriv + argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _base_env(home: Path) -> dict[str, str]:
    return {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
    }


def run_claude(
    lease: CellLease, home: Path, work: Path, *, quiet: bool = True
) -> subprocess.CompletedProcess[str]:
    """``quiet``: no non-essential traffic. Without it Claude Code also asks the model
    for a session title (a request with no tools: not the agent's conversation)."""
    env = {
        **_base_env(home),
        "DISABLE_AUTOUPDATER": "1",
        "ANTHROPIC_BASE_URL": lease.anthropic_base_url,
        "ANTHROPIC_AUTH_TOKEN": lease.token,
    }
    if quiet:
        env.update(
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
    argv = ["claude", "-p", PROMPT, "--output-format", "stream-json", "--verbose"]
    argv += ["--dangerously-skip-permissions", "--model", "claude-sonnet-4-5"]
    return _as_nobody(argv, env, work)


def run_codex(lease: CellLease, home: Path, work: Path) -> subprocess.CompletedProcess[str]:
    codex_home = home / ".codex"
    codex_home.mkdir()
    os.chown(codex_home, NOBODY, NOBODY)
    env = {**_base_env(home), "CODEX_HOME": str(codex_home), "AMB_GATEWAY_TOKEN": lease.token}
    provider = (
        f'model_providers.amb={{name="amb", base_url="{lease.openai_base_url}", '
        'env_key="AMB_GATEWAY_TOKEN", wire_api="responses"}'
    )
    argv = ["codex", "exec", "--json", "--skip-git-repo-check"]
    argv += ["--dangerously-bypass-approvals-and-sandbox", "-C", str(work), "-m", CODEX_MODEL]
    argv += ["-c", "model_provider=amb", "-c", provider]
    argv += ["-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false", PROMPT]
    return _as_nobody(argv, env, work)


def run_claude_background(
    lease: CellLease, home: Path, work: Path
) -> subprocess.CompletedProcess[str]:
    return run_claude(lease, home, work, quiet=False)


#: mini-swe-agent 2.x's text-based prompts (``config/mini_textbased.yaml``), shortened.
MINI_SYSTEM = """You are a helpful assistant that can interact with a computer.

Your response must contain exactly ONE bash code block with ONE command (or commands \
connected with && or ||).
Include a THOUGHT section before your command where you explain your reasoning process.
Format your response as shown in <format_example>.

<format_example>
Your reasoning and analysis here. Explain why you want to perform the action.

```mswea_bash_command
your_command_here
```
</format_example>

Failure to follow these rules will cause your response to be rejected."""
MINI_ACTION = re.compile(r"```mswea_bash_command\s*\n(.*?)\n```", re.DOTALL)
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MINI_SCRIPT: list[Shell | Text] = [*SCRIPT[:2], Shell(MINI_SUBMIT, StepUsage(1400, 10))]


def run_mini_text(lease: CellLease, home: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """mini-swe-agent's text-action loop, re-told with httpx (the package is not a
    dependency): chat completions without tools, one fenced command per reply, the
    observation sent back as its ``<returncode>``/``<output>`` user message, and the
    submission command ending the run unanswered, as mini-swe-agent does."""
    task = f"Please solve this issue: {PROMPT}\n\nSubmit with `{MINI_SUBMIT}`."
    messages = [{"role": "system", "content": MINI_SYSTEM}, {"role": "user", "content": task}]
    headers = {"Authorization": f"Bearer {lease.token}"}
    url = f"{lease.openai_base_url}/chat/completions"
    for _ in range(10):
        body = {"model": "gpt-4o-mini", "messages": messages, "drop_params": True}
        reply = httpx.post(url, json=body, headers=headers, timeout=60).json()
        content = reply["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": content})
        [command] = MINI_ACTION.findall(content)
        if command.strip() == MINI_SUBMIT:
            break
        done = _as_nobody(["bash", "-c", command], _base_env(home), work)
        output = done.stdout + done.stderr
        observation = f"<returncode>{done.returncode}</returncode>\n<output>\n{output}</output>"
        messages.append({"role": "user", "content": observation})
    return subprocess.CompletedProcess(["mini-text"], 0, json.dumps(messages), "")


Runner = Callable[[CellLease, Path, Path], subprocess.CompletedProcess[str]]
SYSTEMS: dict[str, tuple[str, Runner]] = {
    "claude-code": ("anthropic/claude-sonnet-4-5", run_claude),
    "claude-code-background": ("anthropic/claude-sonnet-4-5", run_claude_background),
    "claude-code-files": ("anthropic/claude-sonnet-4-5", run_claude),
    "codex": (f"openai/{CODEX_MODEL}", run_codex),
    "codex-files": (f"openai/{CODEX_MODEL}", run_codex),
    "chat-text-actions": ("openai/gpt-4o-mini", run_mini_text),
}
PATCH = "*** Begin Patch\n*** Add File: out/b.txt\n+hi\n*** End Patch\n"
BAD_PATCH = "*** Begin Patch\n*** Update File: missing.txt\n@@\n-a\n+b\n*** End Patch\n"


def files_script(system: str, work: Path) -> list[Step]:
    """The file tools: write ``out/b.txt``, read it, and fail on a missing file."""
    if system == "codex-files":
        return [
            Call("apply_patch", PATCH, StepUsage(1200, 40)),
            Call("apply_patch", BAD_PATCH, StepUsage(1300, 30)),
            Text("done", StepUsage(1400, 10)),
        ]
    target = str(work / "out" / "b.txt")
    return [
        Call("Write", {"file_path": target, "content": "hi\n"}, StepUsage(1200, 40)),
        Call("Read", {"file_path": target}, StepUsage(1300, 30)),
        Call("Read", {"file_path": str(work / "missing.txt")}, StepUsage(1350, 20)),
        Text("done", StepUsage(1400, 10)),
    ]


def script_for(system: str, work: Path) -> list[Step]:
    if system == "chat-text-actions":
        return list(MINI_SCRIPT)
    return files_script(system, work) if system.endswith("-files") else list(SCRIPT)


def trim(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` without :data:`TRIMMED`, except that each tool keeps its name and type
    (so the log still shows which tools each request offered)."""
    request = line.get("request")
    if not isinstance(request, dict):
        return line
    kept = {k: v for k, v in request.items() if k not in TRIMMED}
    if isinstance(request.get("tools"), list):
        kept["tools"] = [
            {k: t[k] for k in ("type", "name") if k in t}
            for t in request["tools"]
            if isinstance(t, dict)
        ]
    return {**line, "request": kept}


def capture(system: str, out: Path, *, trim_bodies: bool) -> dict[str, Any]:
    """Run ``system`` through the gateway; save its log to ``out``; return a summary."""
    model, run = SYSTEMS[system]
    os.environ[KEY_ENV] = "sk-scripted-upstream"
    root = Path(tempfile.mkdtemp(prefix=f"amb-capture-{system}-"))
    home, work = root / "home", root / "work"
    for folder in (home, work):
        folder.mkdir()
        os.chown(folder, NOBODY, NOBODY)
    os.chmod(root, 0o755)
    retry = RetryPolicy(max_attempts=3, base_delay_s=0.05, max_delay_s=0.2, timeout_s=60)
    with (
        ScriptedUpstream(script_for(system, work), side_usage=SIDE_USAGE) as upstream,
        Gateway(root / "gateway", retry=retry) as gateway,
    ):
        api_base = upstream.url if model.startswith("anthropic/") else upstream.openai_url
        chat_only = system == "chat-text-actions"
        lease = gateway.open_cell(system, model, api_base, KEY_ENV, PRICES, chat_only=chat_only)
        done = run(lease, home, work)
        lines = read_history(lease.log_path)
        requests = upstream.requests
    text = "".join(json.dumps(line) + "\n" for line in lines)
    trimmed = trim_bodies or len(text.encode()) > LIMIT
    if trimmed:
        text = "".join(json.dumps(trim(line)) + "\n" for line in lines)
    out.write_text(text, encoding="utf-8")
    Path(tempfile.gettempdir(), f"{system}.stdout.jsonl").write_text(done.stdout)
    written = {p.name: p.read_text() for p in sorted((work / "out").glob("*.txt"))}
    summary = {
        "system": system,
        "rc": done.returncode,
        "stderr": done.stderr[-2000:],
        "log_lines": len(lines),
        "trimmed": trimmed,
        "upstream": [(r.path, r.status, type(r.step).__name__) for r in requests],
        "out": written,
    }
    shutil.rmtree(root, ignore_errors=True)
    return summary


def main(argv: list[str]) -> int:
    trim_bodies = "--trim" in argv
    systems = [a for a in argv if not a.startswith("--")] or list(SYSTEMS)
    for system in systems:
        summary = capture(system, HERE / f"{system}.jsonl", trim_bodies=trim_bodies)
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
