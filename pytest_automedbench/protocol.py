"""The inference-only protocol: training or fine-tuning in a cell, found from what ran.

AutoMedBench's tasks are inference only: the agent may run, compare and tune the use of
pretrained models on the public inputs, not train or fine-tune one. The reference
implementation enforced that with regular-expression strikes on the code (any
``torch.optim.`` in it), which flagged honest agents. Here two readings of what ran
decide, and each finding keeps its evidence:

* **the executed code** (static): every ``execute`` call's Python, and the Python that
  a shell command runs (``python -c``, a heredoc piped to Python, a script the agent
  wrote earlier with ``write_file`` or ``cat > x.py <<EOF`` and then runs), parsed with
  :mod:`ast`; shell commands that start a training program (``nnUNetv2_train``,
  ``yolo train``, ...). Only calls that *train* count:

  - an optimizer built over a model's parameters (``torch.optim.Adam(model.parameters())``)
    that is stepped or fed by ``backward()``: a gradient-descent loop;
  - a trainer's ``train()`` / ``fit()`` (Hugging Face, Lightning, Ultralytics ``train(data=...)``);
  - a supervised ``fit(X, y)`` / ``partial_fit(X, y)`` or ``fit(..., epochs=...)``;
  - ``lgb.train(params, data)``-style calls (two positional arguments);
  - a LoRA set-up (``LoraConfig``, ``get_peft_model``, ``prepare_model_for_kbit_training``).

* **runtime evidence**: the ``runtime`` events the sandbox's start-up probe
  (:mod:`pytest_automedbench.sandbox.runtime_probe`) recorded; an optimizer step that
  updates a module's parameters is training, whatever the script was called.

Never training: ``model.eval()`` / ``model.train(False)``, ``torch.no_grad()``,
``torch.compile``, test-time augmentation, ensembling, unsupervised ``fit(X)`` (k-means
on an image, a Gaussian mixture for a threshold, a scaler), threshold tuning on the
public inputs, ``backward()`` alone (saliency maps), an optimizer over plain tensors
(an image or a registration's transform being optimised), loading a LoRA adapter for
inference (``PeftModel.from_pretrained``), or a file called ``train.py``;
``tests/test_protocol.py`` keeps both corpora.

A task says whether training is allowed (``protocol.training`` in its ``task.yaml``);
where it is forbidden, a finding is a protocol violation, handled by the scoring
contract as an isolation violation is (S1-S5 = 0, TASK excluded, OVERALL = 0, flagged);
where it is allowed, the findings are recorded all the same.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

__all__ = [
    "TRAINING_POLICIES",
    "TrainingFinding",
    "TrainingPolicy",
    "find_training",
    "read_probe_folder",
    "training_in_code",
]

TrainingPolicy = Literal["forbidden", "allowed"]
TRAINING_POLICIES: tuple[TrainingPolicy, ...] = ("forbidden", "allowed")

#: torch.optim's optimizers and the usual third-party ones (timm, transformers, lion).
OPTIMIZERS = frozenset(
    {
        "SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad",
        "Adadelta", "ASGD", "Rprop", "LBFGS", "SparseAdam", "Adafactor", "Lion",
        "LAMB", "Lamb", "LARS", "AdaBelief", "Ranger", "SophiaG",
    }
)  # fmt: skip
#: Calls that make a model's parameters trainable adapters.
LORA_CALLS = frozenset({"LoraConfig", "get_peft_model", "prepare_model_for_kbit_training"})
#: Keyword arguments that make ``fit``/``train`` a training run (not a mode switch).
TRAINING_KEYWORDS = frozenset(
    {"y", "labels", "epochs", "max_epochs", "max_steps", "num_epochs", "data", "train_data",
     "train_dataset", "train_dataloaders", "num_boost_round", "dtrain"}
)  # fmt: skip
#: Classes whose ``fit(x, y, deg)`` fits a curve to data (a bias field, a profile), not
#: a model.
CURVE_FITS = frozenset(
    {"Polynomial", "Chebyshev", "Legendre", "Laguerre", "Hermite", "HermiteE", "np", "numpy"}
)
#: Programs whose start is a training run.
TRAINING_COMMANDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?:^|[\s;&|(`])(nnUNetv2_train|nnUNet_train)\b"), "nnU-Net training"),
    (
        re.compile(r"(?:^|[\s;&|(`])yolo\s+(?:(?:detect|segment|classify|pose|obb)\s+)?train\b"),
        "Ultralytics YOLO training",
    ),
    (re.compile(r"(?:^|[\s;&|(`])llamafactory-cli\s+train\b"), "LLaMA-Factory training"),
    (re.compile(r"(?:^|[\s;&|(`])autotrain\s+\w+"), "AutoTrain"),
)
_PYTHON = r"(?:[\w./-]*/)?python(?:3(?:\.\d+)?)?"
_HEREDOC_TO_PYTHON = re.compile(
    rf"(?:^|[\s;&|(]){_PYTHON}(?:\s+-[A-Za-z]+)*(?:\s+-)?\s*<<-?\s*(['\"]?)(\w+)\1[^\n]*\n(.*?)\n\s*\2\s*$",
    re.S | re.M,
)
_HEREDOC_TO_FILE = re.compile(
    r"(?:^|[\s;&|(])(?:cat|tee)\s+(?:-a\s+)?>?\s*([\w./~-]+\.py)\s*<<-?\s*(['\"]?)(\w+)\2[^\n]*\n(.*?)\n\s*\3\s*$",
    re.S | re.M,
)
_SCRIPT_RUN = re.compile(rf"(?:^|[\s;&|(]){_PYTHON}((?:\s+-[A-Za-z]+)*)\s+([\w./~-]+\.py)\b")
_CODE_CHARS = 300


@dataclass(frozen=True)
class TrainingFinding:
    """One piece of evidence that the cell trained or fine-tuned a model."""

    #: ``code``: read from the executed code; ``runtime``: recorded by the probe.
    source: Literal["code", "runtime"]
    #: What kind of training (``optimizer_loop``, ``trainer``, ``supervised_fit``,
    #: ``train_call``, ``lora``, ``training_command``, ``optimizer_step``).
    rule: str
    evidence: str
    seq: int | None = None
    tool: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rule": self.rule,
            "evidence": self.evidence,
            "seq": self.seq,
            "tool": self.tool,
        }


# ----------------------------------------------------------------------- Python code


def _name(node: ast.AST) -> str:
    """The last name of a callee (``torch.optim.Adam`` -> ``Adam``), else ''."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _mentions_parameters(node: ast.AST) -> bool:
    """Whether an optimizer's first argument is a model's parameters (``m.parameters()``,
    ``named_parameters``, a list of parameter groups built from them, a ``params``
    variable holding them, ``filter(..., m.parameters())``)."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and _name(inner.func) in (
            "parameters",
            "named_parameters",
        ):
            return True
        if isinstance(inner, ast.Name) and "param" in inner.id.lower():
            return True
        if isinstance(inner, ast.Attribute) and "param" in inner.attr.lower():
            return True
    return False


def _over_parameters(call: ast.Call) -> bool:
    """Whether an optimizer's ``params`` (its first argument) are a model's parameters."""
    first = call.args[0] if call.args else None
    first = first or next((k.value for k in call.keywords if k.arg == "params"), None)
    return first is not None and _mentions_parameters(first)


class _Reader(ast.NodeVisitor):
    """One pass over a module: what it builds and calls, by name."""

    def __init__(self) -> None:
        self.model_optimizers: list[ast.Call] = []
        self.optimizer_names: set[str] = set()
        self.trainer_names: set[str] = set()
        self.steps: list[ast.Call] = []
        self.backwards: list[ast.Call] = []
        self.findings: list[tuple[str, ast.AST]] = []

    def visit_Assign(self, node: ast.Assign) -> None:
        value = node.value
        if isinstance(value, ast.Call):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            names |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)}
            callee = _name(value.func)
            if callee in OPTIMIZERS:
                self.optimizer_names |= names
            if callee.endswith("Trainer"):
                self.trainer_names |= names
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = _name(node.func)
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        positional = len(node.args)
        keywords = {k.arg for k in node.keywords if k.arg}
        if callee in OPTIMIZERS and _over_parameters(node):
            self.model_optimizers.append(node)
        elif callee == "step" and receiver is not None:
            self.steps.append(node)
        elif callee == "backward":
            self.backwards.append(node)
        elif callee in LORA_CALLS:
            self.findings.append(("lora", node))
        elif callee in ("train", "fit") and receiver is not None and self._is_trainer(receiver):
            self.findings.append(("trainer", node))
        elif (
            callee in ("fit", "partial_fit", "fit_generator")
            and (positional >= 2 or keywords & TRAINING_KEYWORDS)
            and not (receiver is not None and _name(receiver) in CURVE_FITS)
        ):
            self.findings.append(("supervised_fit", node))
        elif callee == "train" and (positional >= 2 or keywords - {"mode"}):
            self.findings.append(("train_call", node))
        self.generic_visit(node)

    def _is_trainer(self, receiver: ast.AST) -> bool:
        if isinstance(receiver, ast.Call):
            return _name(receiver.func).endswith("Trainer")
        return _name(receiver) in self.trainer_names

    def training(self) -> list[tuple[str, ast.AST]]:
        found = list(self.findings)
        if self.model_optimizers:
            stepped = [c for c in self.steps if _name(c.func.value) in self.optimizer_names]  # type: ignore[attr-defined]
            fed = stepped or self.backwards
            if fed:
                found.append(("optimizer_loop", self.model_optimizers[0]))
        return found


_MEANING = {
    "optimizer_loop": "an optimizer over a model's parameters, stepped",
    "trainer": "a trainer's train()/fit()",
    "supervised_fit": "a model fit on labels or for epochs",
    "train_call": "a training call",
    "lora": "a LoRA fine-tuning set-up",
}


def training_in_code(code: str) -> list[tuple[str, str]]:
    """(rule, quoted source) for each training construct in Python source; source that
    does not parse is read as nothing (the runtime probe still sees what it does)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    reader = _Reader()
    reader.visit(tree)
    found = []
    for rule, node in reader.training():
        quoted = ast.get_source_segment(code, node) or _dotted(node)
        found.append((rule, f"{_MEANING[rule]}: {' '.join(quoted.split())[:_CODE_CHARS]}"))
    return found


# ------------------------------------------------------------------ shell commands


def _python_c_arguments(code: str) -> Iterator[str]:
    """The code of each ``python -c CODE`` in a shell command."""
    for line in code.splitlines():
        if "-c" not in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words[:-1]):
            if re.fullmatch(_PYTHON, word) and words[i + 1] == "-c" and i + 2 < len(words):
                yield words[i + 2]


def _shell_python(code: str, scripts: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(where, Python source) of what a shell command runs in Python: ``-c`` code,
    heredocs piped to Python, and scripts it runs that the trajectory wrote."""
    for argument in _python_c_arguments(code):
        yield "python -c", argument
    for match in _HEREDOC_TO_PYTHON.finditer(code):
        yield "a heredoc run by Python", match.group(3)
    for match in _SCRIPT_RUN.finditer(code):
        if "m" in match.group(1):
            continue
        path = match.group(2)
        source = _written(scripts, path)
        if source is not None:
            yield path, source


def _written(scripts: dict[str, str], path: str) -> str | None:
    """The content last written to ``path`` (matched by its normalised path, else by its
    trailing components when that is unambiguous: ``python src/x.py`` after a
    ``write_file /workspace/src/x.py``)."""
    key = _normal(path)
    if key in scripts:
        return scripts[key]
    tails = [name for name in scripts if name.endswith("/" + key.lstrip("/"))]
    return scripts[tails[0]] if len(tails) == 1 else None


def _normal(path: str) -> str:
    return str(PurePosixPath(path.replace("~/", "/workspace/")))


def _training_commands(code: str) -> Iterator[str]:
    for pattern, meaning in TRAINING_COMMANDS:
        if match := pattern.search(code):
            start = code.rfind("\n", 0, match.start()) + 1
            end = code.find("\n", match.end())
            line = code[start : end if end >= 0 else len(code)].strip()
            yield f"{meaning}: {line[:_CODE_CHARS]}"


# ------------------------------------------------------------------- the trajectory


def _runtime_finding(event: dict[str, Any]) -> TrainingFinding | None:
    if event.get("probe") != "optimizer_step" or event.get("module_parameters") is not True:
        return None
    argv = event.get("argv")
    command = " ".join(str(a) for a in argv) if isinstance(argv, list) else "?"
    return TrainingFinding(
        "runtime",
        "optimizer_step",
        f"the probe recorded {event.get('count')} optimizer step(s) of "
        f"{event.get('detail')} ({event.get('tensors')} tensors) in `python {command}` "
        f"(pid {event.get('pid')})"[:_CODE_CHARS],
        event.get("seq"),
        "runtime",
    )


def find_training(events: Sequence[dict[str, Any]]) -> list[TrainingFinding]:
    """Every piece of evidence of training in a trajectory, in order, one per rule and
    tool call."""
    scripts: dict[str, str] = {}
    found: list[TrainingFinding] = []

    def add(rule: str, evidence: str, event: dict[str, Any]) -> None:
        found.append(
            TrainingFinding(
                "code", rule, evidence[:_CODE_CHARS], event.get("seq"), str(event.get("tool"))
            )
        )

    for event in events:
        kind = event.get("kind")
        if kind == "runtime":
            if finding := _runtime_finding(event):
                found.append(finding)
            continue
        if kind != "tool_result":
            continue
        tool = event.get("tool")
        if tool == "write_file" and isinstance(event.get("content"), str):
            scripts[_normal(str(event.get("path", "")))] = str(event["content"])
            continue
        if tool != "execute" or not isinstance(event.get("code"), str):
            continue
        code = str(event["code"])
        if event.get("language") == "python":
            for rule, evidence in training_in_code(code):
                add(rule, evidence, event)
            continue
        for match in _HEREDOC_TO_FILE.finditer(code):
            scripts[_normal(match.group(1))] = match.group(4)
        for evidence in _training_commands(code):
            add("training_command", evidence, event)
        for where, source in _shell_python(code, scripts):
            for rule, evidence in training_in_code(source):
                add(rule, f"{where}: {evidence}", event)
    return _dedupe(found)


def _dedupe(found: list[TrainingFinding]) -> list[TrainingFinding]:
    out, keys = [], set()
    for finding in found:
        key = (finding.source, finding.rule, finding.seq)
        if key not in keys:
            keys.add(key)
            out.append(finding)
    return out


# ------------------------------------------------------------------- the probe's folder

#: Bounds on what the harness reads back of the probe folder (the agent can write there).
PROBE_MAX_FILES = 500
PROBE_MAX_BYTES = 256 * 1024
PROBE_FIELDS = {
    "probe": str,
    "detail": str,
    "count": int,
    "tensors": int,
    "elements": int,
    "module_parameters": bool,
    "pid": int,
    "t": float,
}
#: The probe's own time field, renamed where the trajectory's ``t`` is taken.
_RENAMED = {"t": "at"}


def _probe_line(text: str) -> dict[str, Any] | None:
    """One line of the probe's log with only its known fields, each of its type."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("probe"), str):
        return None
    line: dict[str, Any] = {}
    for name, kind in PROBE_FIELDS.items():
        value = raw.get(name)
        key = _RENAMED.get(name, name)
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            line[key] = float(value)
        elif isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            line[key] = value[:200] if isinstance(value, str) else value
    argv = raw.get("argv")
    if isinstance(argv, list):
        line["argv"] = [str(a)[:200] for a in argv[:8]]
    return line


def read_probe_folder(folder: Path) -> list[dict[str, Any]]:
    """What the probe recorded, one entry per process and (kind, detail) with its last
    count, in time order; files that are not the probe's (or not regular files) and
    lines that do not parse are skipped, never trusted."""
    last: dict[tuple[str, Any, Any], dict[str, Any]] = {}
    files = sorted(p for p in folder.glob("*.jsonl") if p.is_file() and not p.is_symlink())
    for path in files[:PROBE_MAX_FILES]:
        try:
            with path.open("rb") as fh:
                text = fh.read(PROBE_MAX_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue
        for raw_line in text.splitlines():
            line = _probe_line(raw_line)
            if line is None:
                continue
            key = (line["probe"], line.get("detail"), line.get("pid"))
            if line.get("count", 0) >= last.get(key, {}).get("count", 0):
                last[key] = line
    return sorted(last.values(), key=lambda line: line.get("at", 0.0))
