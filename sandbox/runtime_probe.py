"""The runtime probe: a start-up hook in the agent's Python that records training.

The harness copies this file as ``sitecustomize.py`` into the cell's probe folder, which
every isolating backend binds at :data:`PROBE_MOUNT`. It is loaded two ways:

* from the interpreter's own site machinery: the backends put :data:`PTH_NAME` (a
  ``.pth`` line, :func:`pth_line`) in the sandbox Python's site-packages folders
  (bubblewrap: a read-only overlay of the venv's and the base interpreter's folders;
  Docker: bound into the image's system ``dist-packages``, which ``/venv`` sees), so a
  Python started with a scrubbed environment (``env -i``, ``subprocess(env={})``),
  ``-E``, ``-s`` or ``-I`` loads it too; only ``-S`` (no site at all) escapes it, and
  then the static reading in :mod:`pytest_automedbench.protocol` is what sees the code;
* from ``PYTHONPATH`` (the folder itself), which is all the unisolated process backend
  has (it does not touch the host's interpreter).

When the agent's code imports torch, the probe hooks what training needs and writes what
it sees to ``<probe folder>/<pid>.jsonl`` (``$AMB_PROBE_DIR``, else :data:`PROBE_MOUNT`):

* ``optimizer_step``: every ``torch.optim`` optimizer step (torch's global step hook),
  with the optimizer's class, how many tensors it updates, whether they are
  ``nn.Parameter`` s, and whether they are a *network's* weights (see below);
* ``parameter_update``: weights that changed between two forward passes of their module
  run with gradients on, after a gradient was computed in between (a global forward
  pre-hook on ``nn.Module`` compares each module's own parameters: their version counters
  and storage, which every in-place update (``p -= lr * p.grad``, ``p.sub_``,
  ``p.copy_``) or re-assignment changes, and, at the 1st, 2nd, 4th, ... such forward, a
  sample of their values, which ``p.data.add_`` changes too). This is gradient descent
  written by hand, without any optimizer; reloading or moving weights
  (``load_state_dict``, ``.to``, ``.half``) is not an update;
* ``backward`` / ``autograd_grad``: gradient computations, which alone are not training
  (saliency maps, Grad-CAM) but show what an update came with.

A network's weights, as opposed to a transform's parameters (a rigid registration's
shift, an affine matrix, an image being optimised): parameters of one of torch's own
layers (``torch.nn.modules``: Conv, Linear, norms, ...), or ``nn.Parameter`` s totalling at
least :data:`NETWORK_ELEMENTS` elements. A user-defined module holding a 3-vector shift or
a 4x4 affine optimised by Adam is a transform; a small conv net is a network, whatever its
size; plain tensors with ``requires_grad`` (an image, a dense displacement field) are
never weights. The gap this leaves: a network written by hand from raw ``nn.Parameter`` s
(``F.conv2d(x, self.w)``) of fewer than 1000 elements in all passes for a transform.

A line is written at the 1st, 2nd, 4th, 8th, ... event of a kind and once more when
the process exits, so a long training run leaves a few dozen lines, not millions.

It is evidence, never isolation: nothing depends on it for safety, and an agent that
starts Python with ``-S`` or deletes its lines only hides evidence from itself (the
static reading of its code still sees it). It runs inside the sandbox on its own:
standard library only, nothing of the harness, and it never raises into the agent's
program.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import sys
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Where the probe folder appears inside the isolating sandboxes.
PROBE_MOUNT = "/run/amb-probe"
#: The variable naming the folder the probe writes to (unset: the probe does nothing).
PROBE_DIR_ENV = "AMB_PROBE_DIR"
#: The file name the harness gives this module in the probe folder.
SITE_HOOK_NAME = "sitecustomize.py"
#: The ``.pth`` file the backends put in the sandbox Python's site-packages folders.
PTH_NAME = "amb_runtime_probe.pth"
#: The module name the ``.pth`` line runs this file under.
PTH_MODULE = "amb_runtime_probe"
#: Parameters of at least this many elements are a network's weights even outside
#: torch's own layers (a 3-vector shift or a 4x4 affine is far below).
NETWORK_ELEMENTS = 1000
#: How many values of each parameter the content sample reads.
SAMPLE_VALUES = 16
#: How much of the command line a line keeps.
ARGV_ITEMS = 8
ARGV_CHARS = 200


class _Recorder:
    """Counts events per (kind, detail) and writes a line at each power of two."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, f"{os.getpid()}.jsonl")
        self.counts: dict[tuple[str, str], int] = {}
        self.fields: dict[tuple[str, str], dict[str, Any]] = {}
        self.written: dict[tuple[str, str], int] = {}
        atexit.register(self.flush)

    def note(self, kind: str, detail: str, fields: Callable[[], dict[str, Any]]) -> None:
        key = (kind, detail)
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        if key not in self.fields:
            self.fields[key] = fields()
        if count & (count - 1) == 0:  # 1, 2, 4, 8, ...
            self._write(key)

    def flush(self) -> None:
        for key, count in self.counts.items():
            if self.written.get(key) != count:
                self._write(key)

    def _write(self, key: tuple[str, str]) -> None:
        kind, detail = key
        line = {
            "probe": kind,
            "detail": detail,
            "count": self.counts[key],
            **self.fields.get(key, {}),
            "pid": os.getpid(),
            "argv": [str(arg)[:ARGV_CHARS] for arg in sys.argv[:ARGV_ITEMS]],
            "t": time.time(),
        }
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
            self.written[key] = self.counts[key]
        except (OSError, TypeError, ValueError):
            pass


class _Weights:
    """What the probe knows of the process's parameters: which belong to torch's own
    layers (a network), and whether a gradient was computed since a module's last forward.
    Modules and tensors are held weakly: the probe keeps nothing alive."""

    def __init__(self) -> None:
        #: id(parameter) -> a weak reference to it, for parameters of torch's own layers.
        self.layer_parameters: dict[int, Any] = {}
        #: Gradient computations and weight reloads so far (counters, compared per module).
        self.gradients = 0
        self.loads = 0
        #: Per module: (forwards seen, fingerprint, sample, gradients, loads) at its last
        #: forward with gradients on.
        self.last: weakref.WeakKeyDictionary[Any, tuple[int, Any, Any, int, int]] = (
            weakref.WeakKeyDictionary()
        )

    def in_layer(self, tensor: Any) -> bool:
        ref = self.layer_parameters.get(id(tensor))
        return ref is not None and ref() is tensor

    def network(self, tensors: list[Any]) -> bool:
        """Whether ``tensors`` are a network's weights (see the module's docstring):
        plain tensors (an image, a dense displacement field) never are."""
        import torch

        if any(self.in_layer(t) for t in tensors):
            return True
        parameters = [t for t in tensors if isinstance(t, torch.nn.Parameter)]
        return sum(int(t.numel()) for t in parameters) >= NETWORK_ELEMENTS


def _is_layer(module: Any) -> bool:
    return type(module).__module__.startswith("torch.nn.modules.")


def _sample(tensors: list[Any]) -> tuple[float, ...]:
    """A few values of each tensor (a strided sample, summed): changes when the values do."""
    out = []
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        step = max(1, int(flat.numel()) // SAMPLE_VALUES)
        out.append(float(flat[::step][:SAMPLE_VALUES].double().sum()))
    return tuple(out)


def _watch_modules(recorder: _Recorder, weights: _Weights, module: ModuleType) -> None:
    """torch.nn.modules.module: a global forward pre-hook that notices a module's own
    parameters changing between its forward passes with gradients on."""
    import torch

    def before_forward(layer: Any, args: Any) -> None:
        try:
            own = [p for p in layer._parameters.values() if p is not None]
            if not own:
                return
            if _is_layer(layer):
                for p in own:
                    weights.layer_parameters.setdefault(id(p), weakref.ref(p))
            if not torch.is_grad_enabled():
                return
            _compare(recorder, weights, layer, own)
        except Exception:
            pass

    module.register_module_forward_pre_hook(before_forward)
    # Loading weights and moving them (``.to``, ``.cuda``, ``.half``: ``_apply``) change
    # them without training: a forward after one is not compared with the one before.
    for name in ("load_state_dict", "_apply"):
        setattr(module.Module, name, _reloading(weights, getattr(module.Module, name)))


def _reloading(weights: _Weights, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reload(self: Any, *args: Any, **kwargs: Any) -> Any:
        weights.loads += 1
        return original(self, *args, **kwargs)

    return reload


def _compare(recorder: _Recorder, weights: _Weights, layer: Any, own: list[Any]) -> None:
    seen, before, sample, gradients, loads = weights.last.get(layer, (0, None, None, 0, 0))
    seen += 1
    fingerprint = tuple((p._version, p.data_ptr()) for p in own)
    moved = before is not None and before != fingerprint
    # A fresh sample after every move, so that the next one compares with the new values.
    now = _sample(own) if moved or seen & (seen - 1) == 0 else None
    changed = moved or (now is not None and sample is not None and now != sample)
    if changed and weights.gradients > gradients and weights.loads == loads:
        kind = type(layer)
        network = _is_layer(layer) or sum(int(p.numel()) for p in own) >= NETWORK_ELEMENTS
        what = "weights" if network else "parameters"
        fields = {
            "tensors": len(own),
            "elements": int(sum(int(p.numel()) for p in own)),
            "module_parameters": True,
            "network": network,
        }
        detail = f"{kind.__module__}.{kind.__qualname__} {what}"
        recorder.note("parameter_update", detail, lambda: fields)
    kept = now if now is not None else sample
    weights.last[layer] = (seen, fingerprint, kept, weights.gradients, weights.loads)


def _optimizer_fields(weights: _Weights, optimizer: Any) -> dict[str, Any]:
    import torch

    tensors = [p for group in optimizer.param_groups for p in group.get("params", ())]
    return {
        "tensors": len(tensors),
        "elements": int(sum(int(t.numel()) for t in tensors)),
        "module_parameters": any(isinstance(t, torch.nn.Parameter) for t in tensors),
        "network": weights.network(tensors),
    }


def _watch_optimizers(recorder: _Recorder, weights: _Weights, module: ModuleType) -> None:
    """torch.optim.optimizer: a global hook after every optimizer's step."""

    seen: dict[int, dict[str, Any]] = {}  # per optimizer: what it updates (read once)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            fields = seen.get(id(optimizer))
            if fields is None or not fields["network"]:  # a layer may have run since
                fields = seen[id(optimizer)] = _optimizer_fields(weights, optimizer)
            kind = type(optimizer)
            what = "weights" if fields["network"] else "tensors"
            detail = f"{kind.__module__}.{kind.__qualname__} on {what}"
            recorder.note("optimizer_step", detail, lambda: fields)
        except Exception:
            pass

    module.register_optimizer_step_post_hook(after_step)


def _watch_gradients(recorder: _Recorder, weights: _Weights, module: ModuleType) -> None:
    """torch.autograd: ``Tensor.backward`` calls ``torch.autograd.backward``; functional
    gradients go through ``torch.autograd.grad``."""
    for name, kind in (("backward", "backward"), ("grad", "autograd_grad")):
        setattr(module, name, _counted(recorder, weights, getattr(module, name), kind))


def _counted(
    recorder: _Recorder, weights: _Weights, original: Callable[..., Any], kind: str
) -> Callable[..., Any]:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            weights.gradients += 1
            recorder.note(kind, f"torch.autograd.{original.__name__}", dict)
        return original(*args, **kwargs)

    return counted


class _AfterImport:
    """A meta-path finder that runs a hook on a module right after it is executed (once
    per module name); it finds nothing itself, so every import resolves as without it."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path, target)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            run(module)
            with contextlib.suppress(Exception):
                hook(module)

        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_module  # type: ignore[union-attr]
        return spec


def _installed() -> bool:
    return any(type(finder).__name__ == "_AfterImport" for finder in sys.meta_path)


def install() -> None:
    """Start recording when there is a probe folder to record in: ``$AMB_PROBE_DIR`` when
    set (the harness's), else :data:`PROBE_MOUNT` when it exists (a Python started with a
    scrubbed environment inside a sandbox); once per process, however it was loaded."""
    folder = os.environ.get(PROBE_DIR_ENV) or PROBE_MOUNT
    if not os.path.isdir(folder) or _installed():
        return
    recorder = _Recorder(folder)
    weights = _Weights()
    hooks: dict[str, Callable[[ModuleType], None]] = {
        "torch.optim.optimizer": functools.partial(_watch_optimizers, recorder, weights),
        "torch.autograd": functools.partial(_watch_gradients, recorder, weights),
        "torch.nn.modules.module": functools.partial(_watch_modules, recorder, weights),
    }
    sys.meta_path.insert(0, _AfterImport(hooks))


def pth_line(hook: str = f"{PROBE_MOUNT}/{SITE_HOOK_NAME}") -> str:
    """The one line of :data:`PTH_NAME`: site runs a ``.pth`` line that starts with
    ``import`` at every start-up; it runs ``hook`` (this file) as :data:`PTH_MODULE`,
    silently when it is missing or fails (site would print a traceback into the agent's
    output)."""
    namespace = f"{{'__name__': {PTH_MODULE!r}, '__file__': p}}"
    body = (
        f"try:\n p = {hook!r}\n exec(compile(open(p).read(), p, 'exec'), {namespace})\n"
        "except Exception:\n pass\n"
    )
    return f"import sys; exec({body!r})\n"


if __name__ in ("sitecustomize", PTH_MODULE):  # start-up inside a sandbox
    with contextlib.suppress(Exception):
        install()
