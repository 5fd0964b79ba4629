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
  - gradient descent by hand: ``backward()`` or ``torch.autograd.grad`` and an in-place
    update of the parameters in a loop over ``model.parameters()`` (``p -= lr * p.grad``,
    ``p.sub_(g)``, ``p.data.add_(...)``, ``p.copy_(...)``, ``torch._foreach_add_``);
  - a trainer's ``train()`` / ``fit()`` (Hugging Face, Lightning, Ultralytics ``train(data=...)``);
  - a supervised ``fit(X, y)`` / ``partial_fit(X, y)`` or ``fit(..., epochs=...)``;
  - ``lgb.train(params, data)``-style calls (two positional arguments);
  - a LoRA set-up (``LoraConfig``, ``get_peft_model``, ``prepare_model_for_kbit_training``).

  Code the code carries is read too: packed payloads it decodes itself
  (``zlib.decompress(base64.b85decode(b'...'))``, base64/85/32/16, hex, rot13, gzip, bz2,
  lzma, string joins and reversals, decoded here, never run) when they are ``exec``'d or
  written to a file (``open().write``, ``Path.write_text``); files written and then
  started (``subprocess``/``os.system`` with ``sys.executable``, ``exec(open(p).read())``,
  ``runpy.run_path``, a later shell command). A decoder's output that is ``exec``'d or
  written but cannot be read statically (the data comes from a file) is
  ``obfuscated_code`` evidence in itself.

* **runtime evidence**: the ``runtime`` events the sandbox's start-up probe
  (:mod:`pytest_automedbench.sandbox.runtime_probe`) recorded: an optimizer step on a
  network's weights, or a network's weights changing between its forward passes after a
  gradient (hand-written descent, at least :data:`MIN_PARAMETER_UPDATES` times), is
  training, whatever the script was called; a transform's parameters are not.

Never training: ``model.eval()`` / ``model.train(False)``, ``torch.no_grad()``,
``torch.compile``, test-time augmentation, ensembling, unsupervised ``fit(X)`` (k-means
on an image, a Gaussian mixture for a threshold, a scaler), threshold tuning on the
public inputs, ``backward()`` alone (saliency maps), an optimizer over plain tensors
(an image or a registration's transform being optimised), a transform module's
parameters optimised (a class deriving ``nn.Module`` that builds no layer and whose
``nn.Parameter`` s, where their size is written out, total under 1000 elements: a rigid
shift, an affine; the probe measures the real size), a line or curve fit
(``np.polyfit``, ``curve_fit``, ``LinearRegression().fit(a, b)`` unless ``a`` is visibly
several columns: supervised learning needs labels, which the public inputs do not hold),
loading a LoRA adapter for inference (``PeftModel.from_pretrained``), or a file called
``train.py``;
``tests/test_protocol.py`` keeps both corpora.

A task says whether training is allowed (``protocol.training`` in its ``task.yaml``);
where it is forbidden, a finding is a protocol violation, handled by the scoring
contract as an isolation violation is (S1-S5 = 0, TASK excluded, OVERALL = 0, flagged);
where it is allowed, the findings are recorded all the same.
"""

from __future__ import annotations

import ast
import base64
import binascii
import bz2
import codecs
import json
import lzma
import re
import shlex
import zlib
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
#: Regressors whose ``fit(x, y)`` is a least-squares line or curve through data (an
#: intensity calibration, a bias profile), not a model: allowed unless ``x`` is visibly
#: several features (``np.column_stack([...])``, ``X[:, 2:9]``). Supervised learning needs
#: labels, which the public inputs do not hold: a line fit's ``y`` is derived from inputs.
LINE_FITS = frozenset(
    {"LinearRegression", "TheilSenRegressor", "HuberRegressor", "RANSACRegressor",
     "IsotonicRegression"}
)  # fmt: skip
#: Calls that build a multi-column feature matrix out of several arrays.
_MULTI_COLUMN = frozenset({"column_stack", "hstack", "stack", "concatenate", "c_", "cat"})
#: In-place tensor updates that, on a model's parameters after a gradient, are a step of
#: hand-written gradient descent.
INPLACE_UPDATES = frozenset(
    {"sub_", "add_", "copy_", "addcdiv_", "addcmul_", "mul_", "set_", "lerp_", "div_"}
)
#: Constructors of torch.nn that are not layers (a module holding only these is a
#: transform, not a network).
NOT_LAYERS = frozenset(
    {"Parameter", "ParameterList", "ParameterDict", "Module", "ModuleList", "ModuleDict",
     "Identity", "Buffer"}
)  # fmt: skip
#: Elements from which parameters are a network's weights whatever module holds them (the
#: probe's own threshold: :data:`..sandbox.runtime_probe.NETWORK_ELEMENTS`).
NETWORK_ELEMENTS = 1000
#: Decoders whose output the static reading computes itself (no code of the agent runs).
_B64 = frozenset(
    {"b85decode", "b64decode", "a85decode", "b32decode", "b16decode", "urlsafe_b64decode",
     "standard_b64decode", "decodebytes"}
)  # fmt: skip
_DECOMPRESS_MODULES = frozenset({"zlib", "gzip", "bz2", "lzma"})
#: How much a decoded payload may grow to, and how deep payloads in payloads are read.
MAX_DECODED = 1024 * 1024
MAX_DEPTH = 3
#: Calls that start a process (their first argument is a command line or argv).
_PROCESS_CALLS = frozenset(
    {"run", "call", "check_call", "check_output", "Popen", "system", "popen", "execv",
     "execve", "execvp", "execvpe", "execl", "execlp", "spawnv", "spawnvp", "getoutput",
     "getstatusoutput"}
)  # fmt: skip

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
#: ``echo '<base64>' | base64 -d [| gunzip] | python`` or ``... > x.py``: packed code that
#: the shell unpacks (group 1: the data, 2: ``gunzip``/``zcat`` when present, 3: the
#: Python that runs it, 4: the file it goes to).
_PIPED_BASE64 = re.compile(
    r"(?:echo|printf)\s+(?:-[ne]+\s+)?['\"]?([A-Za-z0-9+/=\s]{16,}?)['\"]?\s*\|\s*base64\s+"
    r"(?:-d|--decode|-D)\s*(\|\s*(?:gunzip|zcat|gzip\s+-d)\s*)?"
    rf"(?:\|\s*(?:env(?:\s+-\w+|\s+\w+=\S*)*\s+)?({_PYTHON})(?:\s+-[A-Za-z]*)*\s*-?\s*(?:$|[;&|\n])|>\s*([\w./~-]+\.py))",
    re.M,
)
_CODE_CHARS = 300


@dataclass(frozen=True)
class TrainingFinding:
    """One piece of evidence that the cell trained or fine-tuned a model."""

    #: ``code``: read from the executed code; ``runtime``: recorded by the probe.
    source: Literal["code", "runtime"]
    #: What kind of training (``optimizer_loop``, ``manual_update``, ``trainer``,
    #: ``supervised_fit``, ``train_call``, ``lora``, ``obfuscated_code``,
    #: ``training_command``; from the probe ``optimizer_step``, ``parameter_update``).
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


def _mentions_parameters(
    node: ast.AST,
    transforms: frozenset[str] = frozenset(),
    bound: dict[str, ast.AST] | None = None,
    by_name: bool = True,
    depth: int = 0,
) -> bool:
    """Whether an optimizer's first argument is a model's parameters (``m.parameters()``,
    ``named_parameters``, a list of parameter groups built from them, a variable the code
    assigns one of those to (``bound``), ``filter(..., m.parameters())``); with
    ``by_name``, a ``params`` variable the code does not assign counts too (it holds them
    from an earlier call). The parameters of a transform (``transforms``: instances of a
    module with no layers, see :func:`_transform_names`) are not a model's."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and _name(inner.func) in (
            "parameters",
            "named_parameters",
        ):
            receiver = inner.func.value if isinstance(inner.func, ast.Attribute) else None
            if receiver is None or _dotted(receiver) not in transforms:
                return True
        if isinstance(inner, ast.Name) and inner.id not in transforms:
            value = (bound or {}).get(inner.id)
            if value is not None and value is not node and depth < 4:
                if _mentions_parameters(value, transforms, bound, by_name, depth + 1):
                    return True
            elif by_name and "param" in inner.id.lower():
                return True
        if (
            by_name
            and isinstance(inner, ast.Attribute)
            and "param" in inner.attr.lower()
            and inner.attr != "parameters"
            and not inner.attr.startswith("Parameter")  # nn.Parameter(...): a new tensor
            and _dotted(inner) not in transforms
        ):
            return True
    return False


def _over_parameters(
    call: ast.Call,
    transforms: frozenset[str] = frozenset(),
    bound: dict[str, ast.AST] | None = None,
) -> bool:
    """Whether an optimizer's ``params`` (its first argument) are a model's parameters."""
    first = call.args[0] if call.args else None
    first = first or next((k.value for k in call.keywords if k.arg == "params"), None)
    return first is not None and _mentions_parameters(first, transforms, bound)


# --------------------------------------------------------------- transforms, not models


def _literal_elements(node: ast.AST) -> int | None:
    """The element count of ``torch.zeros(3)``, ``torch.eye(4)``, ``torch.tensor([[..]])``
    and the like when it is written out in literals, else None."""
    if isinstance(node, ast.Call) and _name(node.func) in ("Parameter", "clone", "float"):
        inner = node.args[0] if node.args else getattr(node.func, "value", None)
        return None if inner is None else _literal_elements(inner)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
        return _literal_elements(node.value)
    if not isinstance(node, ast.Call):
        return None
    callee = _name(node.func)
    if callee in ("tensor", "as_tensor", "Tensor", "array"):
        return _literal_list_size(node.args[0]) if node.args else None
    dims = [
        a.value
        for a in node.args
        if isinstance(a, ast.Constant) and isinstance(a.value, int) and a.value >= 0
    ]
    if callee not in ("zeros", "ones", "randn", "rand", "empty", "eye"):
        return None
    if not dims or len(dims) != len(node.args):
        return None
    if callee == "eye":
        return dims[0] * dims[-1]
    total = 1
    for d in dims:
        total *= d
    return total


def _literal_list_size(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return 1
    if isinstance(node, ast.List | ast.Tuple):
        sizes = [_literal_list_size(e) for e in node.elts]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)
    return None


def _is_transform_class(node: ast.ClassDef) -> bool:
    """A module class with no layers: it builds no ``nn.<Layer>`` (nor calls anything
    that could be a model), and the parameters it makes are, where their size is written
    out, fewer than :data:`NETWORK_ELEMENTS` in all (a rigid shift, an affine matrix). A
    size the code does not spell out gets the benefit of the doubt: the runtime probe
    measures what really ran."""
    if not any(_name(base) == "Module" for base in node.bases):
        return False
    elements = 0
    for inner in ast.walk(node):
        if not isinstance(inner, ast.Call):
            continue
        dotted, callee = _dotted(inner.func), _name(inner.func)
        layer = dotted.startswith(("nn.", "torch.nn.")) or dotted == callee
        if layer and callee[:1].isupper() and callee not in NOT_LAYERS:
            return False
        if callee == "Parameter":
            elements += _literal_elements(inner) or 0
    return elements < NETWORK_ELEMENTS


def _transform_names(tree: ast.AST) -> frozenset[str]:
    """Names (``rigid``, ``self.reg``) of instances of the code's transform classes, and
    of variables holding their parameters (``params = rigid.parameters()``)."""
    classes = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and _is_transform_class(node)
    }
    names: set[str] = set()
    if not classes:
        return frozenset()
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)]
    for node in assigns:
        value = node.value
        if isinstance(value, ast.Call) and _name(value.func) in classes:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {_dotted(t) for t in targets if _dotted(t)}
    for node in assigns:
        value = node.value
        calls = [] if value is None else [c for c in ast.walk(value) if isinstance(c, ast.Call)]
        if (
            value is not None
            and any(_name(c.func) == "parameters" for c in calls)
            and not _mentions_parameters(value, frozenset(names))
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {_dotted(t) for t in targets if _dotted(t)}
    return frozenset(names)


# ---------------------------------------------------------------- what the code decodes


def _decompress(data: bytes) -> bytes | None:
    """``data`` inflated by whichever of zlib (raw, zlib or gzip framing), bz2 or lzma
    reads it, at most :data:`MAX_DECODED` bytes of it; None when none does."""
    for wbits in (47, -15):
        try:
            return zlib.decompressobj(wbits).decompress(data, MAX_DECODED)
        except zlib.error:
            continue
    for decompressor in (bz2.BZ2Decompressor, lzma.LZMADecompressor):
        try:
            inflated: bytes = decompressor().decompress(data, MAX_DECODED)
            return inflated
        except (OSError, EOFError, lzma.LZMAError, ValueError):
            continue
    return None


def _base64(callee: str, data: bytes | str) -> bytes | None:
    raw = data.encode() if isinstance(data, str) else data
    decoders: dict[str, Any] = {
        "b85decode": base64.b85decode,
        "a85decode": base64.a85decode,
        "b32decode": base64.b32decode,
        "b16decode": base64.b16decode,
        "urlsafe_b64decode": base64.urlsafe_b64decode,
    }
    try:
        return bytes(decoders.get(callee, base64.b64decode)(raw))
    except (ValueError, binascii.Error):
        return None


def _decodes(node: ast.AST) -> bool:
    """Whether ``node`` calls a decoder (``b85decode``, ``decompress``, ``fromhex``,
    ``codecs.decode``)."""
    return any(
        isinstance(inner, ast.Call)
        and (
            _name(inner.func) in _B64 | {"decompress", "fromhex"}
            or _dotted(inner.func) == "codecs.decode"
        )
        for inner in ast.walk(node)
    )


class _Values:
    """The value of an expression when the code spells it out in literals and decoders
    (``zlib.decompress(base64.b85decode(b'...')).decode()``): the static reading decodes
    packed code itself, never running any of the agent's."""

    def __init__(self, tree: ast.AST) -> None:
        self.bound: dict[str, ast.AST] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.bound[target.id] = node.value

    def of(self, node: ast.AST | None, depth: int = 0) -> str | bytes | None:
        if node is None or depth > 12:
            return None
        try:
            value = self._of(node, depth + 1)
        except (ValueError, TypeError, OverflowError, MemoryError):
            return None
        return value if value is None or len(value) <= MAX_DECODED else None

    def _of(self, node: ast.AST, depth: int) -> str | bytes | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            return node.value
        if isinstance(node, ast.Name):
            return self.of(self.bound.get(node.id), depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.of(node.left, depth), self.of(node.right, depth)
            if isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(left, bytes) and isinstance(right, bytes):
                return left + right
            return None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            step = node.slice.step
            if isinstance(step, ast.UnaryOp) and node.slice.lower is node.slice.upper is None:
                value = self.of(node.value, depth)
                return value[::-1] if value is not None else None
            return None
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        if isinstance(node, ast.JoinedStr):  # f"python {path}"
            parts = []
            for part in node.values:
                inner = part.value if isinstance(part, ast.FormattedValue) else part
                value = self.of(inner, depth)
                if not isinstance(value, str):
                    return None
                parts.append(value)
            return "".join(parts)
        return None

    def _call(self, node: ast.Call, depth: int) -> str | bytes | None:
        callee, dotted = _name(node.func), _dotted(node.func)
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        first = self.of(node.args[0], depth) if node.args else None
        if callee in _B64 and first is not None:
            return _base64(callee, first)
        if (
            callee == "decompress"
            and isinstance(first, bytes)
            and (dotted.split(".")[0] in _DECOMPRESS_MODULES or dotted == callee)
        ):
            return _decompress(first)
        if callee == "fromhex" and isinstance(first, str):
            return bytes.fromhex(first)
        if callee in ("decode", "encode") and receiver is not None:
            if dotted.startswith("codecs."):
                return self._codecs(node, depth)
            value = self.of(receiver, depth)
            if callee == "decode" and isinstance(value, bytes):
                return value.decode("utf-8", errors="replace")
            if callee == "encode" and isinstance(value, str):
                return value.encode()
        if callee == "join" and receiver is not None and node.args:
            sep = self.of(receiver, depth)
            items = node.args[0]
            if isinstance(sep, str) and isinstance(items, ast.List | ast.Tuple):
                parts = [self.of(e, depth) for e in items.elts]
                if all(isinstance(p, str) for p in parts):
                    return sep.join(p for p in parts if isinstance(p, str))
        if callee in ("str", "bytes") and len(node.args) == 1:
            return first if isinstance(first, str if callee == "str" else bytes) else None
        return None

    def _codecs(self, node: ast.Call, depth: int) -> str | bytes | None:
        value = self.of(node.args[0], depth) if node.args else None
        encoding = self.of(node.args[1], depth) if len(node.args) > 1 else None
        if value is None or not isinstance(encoding, str):
            return None
        encoding = encoding.lower().replace("-", "_")
        if encoding in ("rot13", "rot_13") and isinstance(value, str):
            return codecs.decode(value, "rot13")
        if not isinstance(value, bytes):
            return None
        if encoding in ("zlib", "zlib_codec", "bz2", "bz2_codec"):
            return _decompress(value)  # bounded: a bomb in the agent's code stays small
        if encoding in ("base64", "base64_codec"):
            return _base64("b64decode", value)
        if encoding in ("hex", "hex_codec"):
            return bytes.fromhex(value.decode("ascii"))
        return None

    def decoded(self, node: ast.AST) -> bool:
        """Whether ``node`` is built by a decoder (``b85decode``, ``decompress``, rot13,
        ``fromhex``), directly or through a variable: packed data, readable or not."""
        if _decodes(node):
            return True
        return any(
            isinstance(inner, ast.Name)
            and not isinstance(self.bound.get(inner.id, inner), ast.Name)
            and _decodes(self.bound[inner.id])
            for inner in ast.walk(node)
        )

    def text(self, node: ast.AST | None) -> str | None:
        value = self.of(node)
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        return value


# --------------------------------------------------------------------------- the reader


class _Reader(ast.NodeVisitor):
    """One pass over a module: what it builds and calls, by name."""

    def __init__(self, tree: ast.AST, scripts: dict[str, str]) -> None:
        self.transforms = _transform_names(tree)
        self.values = _Values(tree)
        #: Files the trajectory wrote before this code ran (read, never changed here).
        self.scripts = scripts
        self.model_optimizers: list[ast.Call] = []
        self.optimizer_names: set[str] = set()
        self.trainer_names: set[str] = set()
        self.line_fit_names: set[str] = set()
        self.steps: list[ast.Call] = []
        self.backwards: list[ast.Call] = []
        self.gradients: list[ast.Call] = []
        self.updates: list[ast.AST] = []
        self.findings: list[tuple[str, ast.AST]] = []
        #: Python payloads the code runs (decoded and exec'd) with where they come from.
        self.payloads: list[tuple[str, str]] = []
        #: Files the code writes (path -> text), and command lines it starts.
        self.writes: dict[str, str] = {}
        self.commands: list[str] = []
        self._open_files: dict[str, str] = {}

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
            if callee in LINE_FITS:
                self.line_fit_names |= names
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            opened = item.context_expr
            if (
                isinstance(opened, ast.Call)
                and _name(opened.func) == "open"
                and isinstance(item.optional_vars, ast.Name)
                and (path := self.values.text(opened.args[0] if opened.args else None))
            ):
                self._open_files[item.optional_vars.id] = path
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._loop(node.target, node.iter, node.body)
        self.generic_visit(node)

    def _visit_comp(self, node: ast.ListComp | ast.GeneratorExp | ast.SetComp) -> None:
        for generator in node.generators:
            self._loop(generator.target, generator.iter, [ast.Expr(node.elt)])
        self.generic_visit(node)

    visit_ListComp = _visit_comp
    visit_GeneratorExp = _visit_comp
    visit_SetComp = _visit_comp

    def _loop(self, target: ast.AST, over: ast.AST, body: list[ast.stmt]) -> None:
        """Hand-written descent: a loop over a model's parameters that updates them in
        place (``p -= lr * p.grad``, ``p.sub_(...)``, ``p.data.add_(...)``, ``p.copy_``)."""
        if not _mentions_parameters(over, self.transforms, self.values.bound, by_name=False):
            return
        names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        for statement in body:
            self.updates += [n for n in ast.walk(statement) if _updates_in_place(n, names)]

    def visit_Call(self, node: ast.Call) -> None:
        callee = _name(node.func)
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        positional = len(node.args)
        keywords = {k.arg for k in node.keywords if k.arg}
        self._code_it_runs(node, callee, receiver)
        if callee in OPTIMIZERS and _over_parameters(node, self.transforms, self.values.bound):
            self.model_optimizers.append(node)
        elif callee == "step" and receiver is not None:
            self.steps.append(node)
        elif callee == "backward":
            self.backwards.append(node)
        elif callee == "grad" and _dotted(node.func).endswith("autograd.grad"):
            self.gradients.append(node)
        elif callee.startswith("_foreach_") and callee.endswith("_") and node.args:
            if _mentions_parameters(
                node.args[0], self.transforms, self.values.bound, by_name=False
            ):
                self.updates.append(node)
        elif callee in LORA_CALLS:
            self.findings.append(("lora", node))
        elif callee in ("train", "fit") and receiver is not None and self._is_trainer(receiver):
            self.findings.append(("trainer", node))
        elif (
            callee in ("fit", "partial_fit", "fit_generator")
            and (positional >= 2 or keywords & TRAINING_KEYWORDS)
            and not (receiver is not None and _name(receiver) in CURVE_FITS)
            and not self._line_fit(node, receiver)
        ):
            self.findings.append(("supervised_fit", node))
        elif callee == "train" and (positional >= 2 or keywords - {"mode"}):
            self.findings.append(("train_call", node))
        self.generic_visit(node)

    def _line_fit(self, node: ast.Call, receiver: ast.AST | None) -> bool:
        """``LinearRegression().fit(a, b)`` whose ``a`` is not visibly several features."""
        if receiver is None:
            return False
        model = _name(receiver.func) if isinstance(receiver, ast.Call) else _name(receiver)
        if model not in LINE_FITS and model not in self.line_fit_names:
            return False
        features: ast.AST | None = node.args[0] if node.args else None
        if isinstance(features, ast.Name) and features.id in self.values.bound:
            features = self.values.bound[features.id]
        return features is None or not _several_columns(features)

    def _code_it_runs(self, node: ast.Call, callee: str, receiver: ast.AST | None) -> None:
        """Decoded payloads it ``exec``s, files it writes, programs it starts."""
        if callee in ("exec", "eval", "compile") and receiver is None and node.args:
            payload = self.values.text(node.args[0])
            if payload is not None and self.values.decoded(node.args[0]):
                self.payloads.append((f"a decoded payload run by {callee}()", payload))
            elif payload is None and self.values.decoded(node.args[0]):
                self.findings.append(("obfuscated_code", node))
            elif (source := self._file_read(node.args[0])) is not None:
                self.payloads.append((f"a written file run by {callee}()", source))
        elif callee == "run_path" and node.args:  # runpy.run_path("job.py")
            path = self.values.text(node.args[0])
            if path is not None and (source := self._written_file(path)) is not None:
                self.payloads.append((f"{path} run by runpy", source))
        elif callee in ("write", "write_text", "write_bytes") and receiver is not None:
            self._write(node, callee, receiver)
        elif (
            callee in _PROCESS_CALLS
            and receiver is not None
            and _name(receiver) in ("subprocess", "os", "sp", "commands")
            and node.args
            and (command := self._command(node.args[0]))
        ):
            self.commands.append(command)

    def _file_read(self, node: ast.AST) -> str | None:
        """The content of a written file that ``node`` reads (``open(p).read()``,
        ``Path(p).read_text()``), when the trajectory or this code wrote it."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return None
        opened = node.func.value
        if node.func.attr not in ("read", "read_text", "read_bytes"):
            return None
        if not (isinstance(opened, ast.Call) and _name(opened.func) in ("open", "Path")):
            return None
        path = self.values.text(opened.args[0] if opened.args else None)
        return None if path is None else self._written_file(path)

    def _written_file(self, path: str) -> str | None:
        return _written({**self.scripts, **self.writes}, path)

    def _write(self, node: ast.Call, callee: str, receiver: ast.AST) -> None:
        path: str | None = None
        if callee == "write":
            if isinstance(receiver, ast.Call) and _name(receiver.func) == "open":
                path = self.values.text(receiver.args[0] if receiver.args else None)
            elif isinstance(receiver, ast.Name):
                path = self._open_files.get(receiver.id)
        elif isinstance(receiver, ast.Call) and _name(receiver.func) in ("Path", "PurePath"):
            path = self.values.text(receiver.args[0] if receiver.args else None)
        if path is None or not node.args:
            return
        text = self.values.text(node.args[0])
        if text is not None:
            self.writes[_normal(path)] = text
        elif self.values.decoded(node.args[0]):
            self.findings.append(("obfuscated_code", node))

    def _command(self, node: ast.AST) -> str | None:
        """A process's command line as the shell would read it: a string, or an argv
        with ``sys.executable`` read as ``python``."""
        if isinstance(node, ast.List | ast.Tuple):
            words = []
            for element in node.elts:
                if _dotted(element) == "sys.executable":
                    words.append("python")
                    continue
                word = self.values.text(element)
                if word is None:
                    return None
                words.append(shlex.quote(word))
            return " ".join(words)
        return self.values.text(node)

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
        if self.updates and (self.backwards or self.gradients):
            found.append(("manual_update", self.updates[0]))
        return found


def _updates_in_place(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` changes one of ``names`` (or its ``.data``) in place: ``p -= g``,
    ``p.data = ...``, ``p.sub_(g)``, ``p.data.add_(g)``, ``p.copy_(new)``."""

    def named(target: ast.AST) -> bool:
        if isinstance(target, ast.Attribute) and target.attr == "data":
            target = target.value
        return isinstance(target, ast.Name) and target.id in names

    if isinstance(node, ast.AugAssign):
        return named(node.target)
    if isinstance(node, ast.Assign):
        return any(
            isinstance(t, ast.Attribute) and t.attr == "data" and named(t) for t in node.targets
        )
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in INPLACE_UPDATES
        and named(node.func.value)
    )


def _several_columns(node: ast.AST) -> bool:
    """Whether a feature matrix is visibly built of several columns."""
    if isinstance(node, ast.Call) and _name(node.func) in _MULTI_COLUMN:
        items = node.args[0] if node.args else None
        return not (isinstance(items, ast.List | ast.Tuple) and len(items.elts) < 2)
    if isinstance(node, ast.Subscript):
        index = node.slice
        if _name(node.value) == "c_" and isinstance(index, ast.Tuple):
            return len(index.elts) >= 2
        if isinstance(index, ast.Tuple) and len(index.elts) == 2:
            column = index.elts[1]
            return isinstance(column, ast.Slice) or (
                isinstance(column, ast.List) and len(column.elts) >= 2
            )
    return False


_MEANING = {
    "optimizer_loop": "an optimizer over a model's parameters, stepped",
    "manual_update": "a model's parameters updated in place after a gradient",
    "trainer": "a trainer's train()/fit()",
    "supervised_fit": "a model fit on labels or for epochs",
    "train_call": "a training call",
    "lora": "a LoRA fine-tuning set-up",
    "obfuscated_code": "packed data decoded and run or written as code, unreadable",
}


def training_in_code(code: str) -> list[tuple[str, str]]:
    """(rule, quoted source) for each training construct in Python source, including in
    the payloads it decodes and runs and the scripts it writes and starts; source that
    does not parse is read as nothing (the runtime probe still sees what it does)."""
    return _read_python(code, {})


def _read_python(code: str, scripts: dict[str, str], depth: int = 0) -> list[tuple[str, str]]:
    """:func:`training_in_code` with the trajectory's written files (``scripts``, which
    the files this code writes join) and how deep in payloads this code is."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    reader = _Reader(tree, scripts)
    reader.visit(tree)
    found = []
    for rule, node in reader.training():
        quoted = ast.get_source_segment(code, node) or _dotted(node)
        found.append((rule, f"{_MEANING[rule]}: {' '.join(quoted.split())[:_CODE_CHARS]}"))
    scripts.update(reader.writes)
    if depth >= MAX_DEPTH:
        return found
    for where, payload in reader.payloads:
        found += [(r, f"{where}: {e}") for r, e in _read_python(payload, scripts, depth + 1)]
    for command in reader.commands:
        for where, source in _shell_python(command, scripts):
            found += [(r, f"{where}: {e}") for r, e in _read_python(source, scripts, depth + 1)]
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
    for match in _PIPED_BASE64.finditer(code):
        payload = _shell_unpacked(match)
        if payload is not None and match.group(3):
            yield "base64 piped to Python", payload
    for match in _SCRIPT_RUN.finditer(code):
        if "m" in match.group(1):
            continue
        path = match.group(2)
        source = _written(scripts, path)
        if source is not None:
            yield path, source


def _shell_unpacked(match: re.Match[str]) -> str | None:
    """The text a ``base64 -d [| gunzip]`` pipe makes of its literal data."""
    data = _base64("b64decode", "".join(match.group(1).split()))
    if data is not None and match.group(2):
        data = _decompress(data)
    return None if data is None else data.decode("utf-8", errors="replace")


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


#: Weight updates between forward passes from which the probe's record is training (a
#: single change could be a one-off edit of the weights; gradient descent repeats).
MIN_PARAMETER_UPDATES = 2


def _runtime_finding(event: dict[str, Any]) -> TrainingFinding | None:
    """Training in the probe's records: optimizer steps or updates between forward passes
    of a network's weights (``network``; a record from before that field was written
    counts any ``nn.Parameter``), never of a transform's parameters or of plain tensors."""
    probe = event.get("probe")
    network = event.get("network", event.get("module_parameters"))
    if network is not True or probe not in ("optimizer_step", "parameter_update"):
        return None
    count = event.get("count")
    if probe == "parameter_update" and not (
        isinstance(count, int) and count >= MIN_PARAMETER_UPDATES
    ):
        return None
    argv = event.get("argv")
    command = " ".join(str(a) for a in argv) if isinstance(argv, list) else "?"
    what = (
        "optimizer step(s) of" if probe == "optimizer_step" else "updates between forward passes of"
    )
    return TrainingFinding(
        "runtime",
        str(probe),
        f"the probe recorded {count} {what} "
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
            for rule, evidence in _read_python(code, scripts):
                add(rule, evidence, event)
            continue
        for match in _HEREDOC_TO_FILE.finditer(code):
            scripts[_normal(match.group(1))] = match.group(4)
        for match in _PIPED_BASE64.finditer(code):
            payload = _shell_unpacked(match)
            if payload is not None and match.group(4):
                scripts[_normal(match.group(4))] = payload
        for evidence in _training_commands(code):
            add("training_command", evidence, event)
        for where, source in _shell_python(code, scripts):
            for rule, evidence in _read_python(source, scripts):
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
    "network": bool,
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
