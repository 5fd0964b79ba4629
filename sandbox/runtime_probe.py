"""The runtime probe: a start-up hook in the agent's Python that records training.

The harness copies this file as ``sitecustomize.py`` into the cell's probe folder, which
every isolating backend binds at :data:`PROBE_MOUNT` (on the agent's ``PYTHONPATH``):
each Python the agent starts imports it at start-up, the agent's own scripts and the
ones an agent system (Claude Code, Codex) runs alike. When the agent's code imports
torch, the probe hooks two things and writes what they see to
``$AMB_PROBE_DIR/<pid>.jsonl``:

* ``optimizer_step``: every ``torch.optim`` optimizer step (torch's global step hook),
  with the optimizer's class, how many tensors it updates and whether they are a
  module's parameters (``nn.Parameter``: weights) or plain tensors (an image being
  optimised, a registration's transform: not training);
* ``backward``: gradient computations (``torch.autograd.backward``), which alone are
  not training (saliency maps, Grad-CAM) but show what an optimizer step came with.

A line is written at the 1st, 2nd, 4th, 8th, ... event of a kind and once more when
the process exits, so a long training run leaves a few dozen lines, not millions.

It is evidence, never isolation: nothing depends on it for safety, and an agent that
starts Python with ``-I`` or deletes its lines only hides evidence from itself (the
static reading of its code in :mod:`pytest_automedbench.protocol` still sees it). It
runs inside the sandbox on its own: standard library only, nothing of the harness, and
it never raises into the agent's program.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Where the probe folder appears inside the isolating sandboxes.
PROBE_MOUNT = "/run/amb-probe"
#: The variable naming the folder the probe writes to (unset: the probe does nothing).
PROBE_DIR_ENV = "AMB_PROBE_DIR"
#: The file name the harness gives this module in the probe folder.
SITE_HOOK_NAME = "sitecustomize.py"
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


def _optimizer_fields(optimizer: Any) -> dict[str, Any]:
    import torch

    tensors = [p for group in optimizer.param_groups for p in group.get("params", ())]
    return {
        "tensors": len(tensors),
        "elements": int(sum(int(t.numel()) for t in tensors)),
        "module_parameters": any(isinstance(t, torch.nn.Parameter) for t in tensors),
    }


def _watch_optimizers(recorder: _Recorder, module: ModuleType) -> None:
    """torch.optim.optimizer: a global hook after every optimizer's step."""

    seen: dict[int, dict[str, Any]] = {}  # per optimizer: what it updates (read once)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            fields = seen.get(id(optimizer))
            if fields is None:
                fields = seen[id(optimizer)] = _optimizer_fields(optimizer)
            kind = type(optimizer)
            weights = "weights" if fields["module_parameters"] else "tensors"
            detail = f"{kind.__module__}.{kind.__qualname__} on {weights}"
            recorder.note("optimizer_step", detail, lambda: fields)
        except Exception:
            pass

    module.register_optimizer_step_post_hook(after_step)


def _watch_backward(recorder: _Recorder, module: ModuleType) -> None:
    """torch.autograd: ``Tensor.backward`` calls ``torch.autograd.backward``."""
    original = module.backward

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            recorder.note("backward", "torch.autograd.backward", dict)
        return original(*args, **kwargs)

    setattr(module, "backward", backward)  # noqa: B010 (a module attribute)


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


def install() -> None:
    """Start recording when the harness asked for it (``AMB_PROBE_DIR`` is a folder)."""
    folder = os.environ.get(PROBE_DIR_ENV, "")
    if not folder or not os.path.isdir(folder):
        return
    recorder = _Recorder(folder)
    hooks: dict[str, Callable[[ModuleType], None]] = {
        "torch.optim.optimizer": functools.partial(_watch_optimizers, recorder),
        "torch.autograd": functools.partial(_watch_backward, recorder),
    }
    sys.meta_path.insert(0, _AfterImport(hooks))


if __name__ == "sitecustomize":  # imported at start-up inside a sandbox
    with contextlib.suppress(Exception):
        install()
