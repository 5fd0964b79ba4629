"""The inference-only protocol (issue 22): training is found from the executed code and
from the runtime probe's evidence, and honest inference never is.

Two corpora keep both sides of the promise: ``MUST_FLAG`` (training and fine-tuning as
agents write it) and ``MUST_ALLOW`` (inference as agents write it, including what the
reference implementation's regular expressions struck: ``torch.compile``, a ``train`` in
a file name, ``torch.optim`` over an image). The probe is exercised in a real Python
with torch; the sandboxes' own runs are in ``test_protocol_sandboxes.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.protocol import find_training, read_probe_folder, training_in_code
from pytest_automedbench.sandbox import runtime_probe
from pytest_automedbench.violations import Policy, find_violations, violation_reason


def execute(code: str, language: str = "python", seq: int = 5) -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "tool": "execute",
        "language": language,
        "code": code,
        "seq": seq,
    }


def write(path: str, content: str, seq: int = 4) -> dict[str, Any]:
    return {
        "kind": "tool_result",
        "tool": "write_file",
        "path": path,
        "content": content,
        "seq": seq,
    }


TORCH_LOOP = """
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for batch, target in loader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch), target)
    loss.backward()
    optimizer.step()
"""

#: (name, trajectory events, the rule that must be found)
MUST_FLAG: list[tuple[str, list[dict[str, Any]], str]] = [
    ("torch loop", [execute(TORCH_LOOP)], "optimizer_loop"),
    (
        "optimizer on self, step only",
        [
            execute(
                "from torch.optim import SGD\n"
                "self.optimizer = SGD(self.net.parameters(), lr=0.1)\n"
                "self.optimizer.step()\n"
            )
        ],
        "optimizer_loop",
    ),
    (
        "parameter groups",
        [
            execute(
                "import torch\nparams = [{'params': head.parameters(), 'lr': 1e-3}]\n"
                "opt = torch.optim.Adam(params)\nloss.backward()\n"
            )
        ],
        "optimizer_loop",
    ),
    (
        "hugging face trainer",
        [
            execute(
                "from transformers import Trainer, TrainingArguments\n"
                "trainer = Trainer(model=model, args=TrainingArguments('out'), "
                "train_dataset=ds)\ntrainer.train()\n"
            )
        ],
        "trainer",
    ),
    (
        "lightning fit",
        [execute("import lightning as L\nL.Trainer(max_epochs=3).fit(model, dm)")],
        "trainer",
    ),
    (
        "sklearn supervised fit",
        [
            execute(
                "from sklearn.linear_model import LogisticRegression\n"
                "clf = LogisticRegression().fit(X, y)"
            )
        ],
        "supervised_fit",
    ),
    ("keras fit for epochs", [execute("model.fit(train_ds, epochs=5)")], "supervised_fit"),
    (
        "partial_fit",
        [execute("clf.partial_fit(X_batch, y_batch, classes=[0, 1])")],
        "supervised_fit",
    ),
    (
        "lightgbm train",
        [execute("import lightgbm as lgb\nbooster = lgb.train(params, dataset)")],
        "train_call",
    ),
    (
        "ultralytics train",
        [
            execute(
                "from ultralytics import YOLO\n"
                "YOLO('yolov8s.pt').train(data='vindr.yaml', epochs=10)"
            )
        ],
        "train_call",
    ),
    (
        "lora set-up",
        [
            execute(
                "from peft import LoraConfig, get_peft_model\n"
                "model = get_peft_model(base, LoraConfig(r=8, target_modules=['q_proj']))\n"
            )
        ],
        "lora",
    ),
    (
        "nnU-Net training command",
        [execute("CUDA_VISIBLE_DEVICES=0 nnUNetv2_train 501 3d_fullres 0 --npz", "bash")],
        "training_command",
    ),
    (
        "yolo cli",
        [execute("cd /workspace && yolo detect train data=x.yaml epochs=3", "bash")],
        "training_command",
    ),
    (
        "script written then run",
        [
            write("/workspace/src/infer.py", TORCH_LOOP),
            execute("cd src && python -u infer.py --fast", "bash"),
        ],
        "optimizer_loop",
    ),
    (
        "heredoc file then run",
        [
            execute(
                f"cat > /workspace/step.py <<'EOF'\n{TORCH_LOOP}\nEOF\npython3 /workspace/step.py",
                "bash",
            )
        ],
        "optimizer_loop",
    ),
    (
        "heredoc piped to python",
        [execute(f"python3 - <<'PY'\n{TORCH_LOOP}\nPY", "bash")],
        "optimizer_loop",
    ),
    (
        "python -c",
        [execute("""python -c "from sklearn.svm import SVC; SVC().fit(X, y)" """, "bash")],
        "supervised_fit",
    ),
    (
        "runtime: optimizer steps on weights",
        [
            {
                "kind": "runtime",
                "seq": 9,
                "probe": "optimizer_step",
                "detail": "torch.optim.sgd.SGD on weights",
                "count": 40,
                "tensors": 6,
                "module_parameters": True,
                "pid": 321,
                "argv": ["run_inference.py"],
            }
        ],
        "optimizer_step",
    ),
]

INFERENCE = """
import numpy as np
import torch

model = load_pretrained("/workspace/weights.pt")
model.eval()
model.train(False)
compiled = torch.compile(model)
with torch.no_grad(), torch.inference_mode():
    # test-time augmentation: flips, averaged
    logits = (model(x) + model(x.flip(-1)).flip(-1) + model(x.flip(-2)).flip(-2)) / 3
    # an ensemble of three pretrained models
    ensemble = torch.stack([m(x).softmax(1) for m in (model, second, third)]).mean(0)
# threshold tuning on the public inputs (no labels: the foreground share the brief gives)
thresholds = np.linspace(0.1, 0.9, 17)
best = min(thresholds, key=lambda t: abs((ensemble[:, 1] > t).float().mean() - 0.02))
# Grad-CAM: gradients of a class score, no weight changes
x.requires_grad_(True)
model(x)[0, 1].sum().backward()
saliency = x.grad.abs()
# optimise the image, not the model (deconvolution)
image = x.detach().clone().requires_grad_(True)
opt = torch.optim.Adam([image], lr=0.01)
for _ in range(10):
    opt.zero_grad()
    ((blur(image) - x) ** 2).mean().backward()
    opt.step()
"""

#: (name, trajectory events): none of them is training.
MUST_ALLOW: list[tuple[str, list[dict[str, Any]]]] = [
    ("inference, TTA, ensemble, compile, thresholds, Grad-CAM", [execute(INFERENCE)]),
    (
        "unsupervised fits",
        [
            execute(
                "from sklearn.cluster import KMeans\nfrom sklearn.mixture import GaussianMixture\n"
                "from sklearn.preprocessing import StandardScaler\n"
                "labels = KMeans(n_clusters=2, n_init=3).fit(pixels).labels_\n"
                "gmm = GaussianMixture(2).fit(intensities.reshape(-1, 1))\n"
                "scaled = StandardScaler().fit(features).transform(features)\n"
                "vectors = TfidfVectorizer().fit_transform(documents)\n"
            )
        ],
    ),
    (
        "curve fits",
        [
            execute(
                "import numpy as np\ncoef = np.polyfit(x, y, 3)\n"
                "p = np.polynomial.Polynomial.fit(x, y, 3)\n"
                "from scipy.optimize import curve_fit\npopt, _ = curve_fit(f, x, y)\n"
            )
        ],
    ),
    (
        "a LoRA adapter loaded for inference",
        [
            execute(
                "from peft import PeftModel\n"
                "model = PeftModel.from_pretrained(base, 'adapter')\nmodel.eval()"
            )
        ],
    ),
    (
        "a train word in file names and splits",
        [
            write(
                "/workspace/train_free_inference.py", "import torch\nprint(torch.load('w.pt'))\n"
            ),
            execute("python /workspace/train_free_inference.py && ls /public/train_split", "bash"),
            execute("python train.py --help", "bash"),
            execute(
                "from sklearn.model_selection import train_test_split\n"
                "a, b = train_test_split(cases)\nsubset = dataset['train']\n"
                "mnist = MNIST(root, train=False)\n"
            ),
        ],
    ),
    (
        "training named in prose, comments and strings",
        [
            execute(
                "# no training here: loss.backward() and optimizer.step() are forbidden\n"
                "print('ok')"
            ),
            execute("print('we will not call model.fit(X, y) or nnUNetv2_train')"),
            execute("grep -n 'nnUNetv2_train' README.md; ls nnUNet_trained_models", "bash"),
            execute("pip install nnunetv2 ultralytics peft", "bash"),
        ],
    ),
    ("code that does not parse", [execute("def broken(:\n  loss.backward()\n  opt.step()")]),
    (
        "runtime: backward alone and an optimizer over an image",
        [
            {
                "kind": "runtime",
                "probe": "backward",
                "detail": "torch.autograd.backward",
                "count": 3,
            },
            {
                "kind": "runtime",
                "probe": "optimizer_step",
                "detail": "torch.optim.adam.Adam on tensors",
                "count": 10,
                "tensors": 1,
                "module_parameters": False,
            },
        ],
    ),
]


@pytest.mark.parametrize(
    ("events", "rule"), [(e, r) for _, e, r in MUST_FLAG], ids=[n for n, _, _ in MUST_FLAG]
)
def test_training_is_found_with_its_evidence(events: list[dict[str, Any]], rule: str) -> None:
    found = find_training(events)
    assert [f.rule for f in found] == [rule], found
    finding = found[0]
    assert finding.seq == events[-1]["seq"]
    assert finding.evidence and len(finding.evidence) <= 300
    assert finding.source == ("runtime" if rule == "optimizer_step" else "code")


@pytest.mark.parametrize("events", [e for _, e in MUST_ALLOW], ids=[n for n, _ in MUST_ALLOW])
def test_honest_inference_is_never_training(events: list[dict[str, Any]]) -> None:
    assert find_training(events) == []
    assert find_violations(events, Policy()) == []


def test_the_evidence_quotes_the_call() -> None:
    (finding,) = find_training([execute(TORCH_LOOP)])
    assert "torch.optim.AdamW(model.parameters(), lr=1e-3)" in finding.evidence
    (lora,) = training_in_code("cfg = LoraConfig(r=8)")
    assert lora[0] == "lora" and "LoraConfig(r=8)" in lora[1]


def test_a_script_is_read_as_last_written() -> None:
    """The content that ran is the last one written before the run: a fine-tuning script
    overwritten by an inference one before it runs is not training, and the other way
    round is."""
    honest = "import torch\nmodel.eval()\n"
    before = [write("/workspace/run.py", TORCH_LOOP, 1), write("/workspace/run.py", honest, 2)]
    assert find_training([*before, execute("python run.py", "bash", 3)]) == []
    after = [write("/workspace/run.py", honest, 1), write("/workspace/run.py", TORCH_LOOP, 2)]
    assert [f.rule for f in find_training([*after, execute("python run.py", "bash", 3)])] == [
        "optimizer_loop"
    ]


def test_the_task_decides_whether_training_is_a_violation() -> None:
    events = [execute(TORCH_LOOP, seq=7)]
    (violation,) = find_violations(events, Policy(training="forbidden"))
    assert violation.category == "training" and violation.seq == 7
    assert violation_reason(violation).startswith("protocol violation (training")
    assert find_violations(events, Policy(training="allowed")) == []


# ------------------------------------------------------------------------ the probe


def run_probed(tmp_path: Path, code: str) -> list[dict[str, Any]]:
    """Run ``code`` in a Python whose start-up loads the probe (as a sandbox does)."""
    folder = tmp_path / "probe"
    folder.mkdir()
    (folder / runtime_probe.SITE_HOOK_NAME).write_text(Path(runtime_probe.__file__).read_text())
    script = tmp_path / "innocent_name.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(folder), runtime_probe.PROBE_DIR_ENV: str(folder)}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return read_probe_folder(folder)


#: Training that no reading of the code can see: every name is built at run time.
HIDDEN_TRAINING = """
import importlib
t = importlib.import_module("to" + "rch")
net = t.nn.Linear(8, 1)
opt = getattr(t.optim, "S" + "GD")(net.parameters(), lr=0.1)
for _ in range(37):
    opt.zero_grad()
    out = net(t.randn(16, 8)).pow(2).mean()
    getattr(out, "back" + "ward")()
    getattr(opt, "st" + "ep")()
"""


@pytest.mark.slow
def test_the_probe_records_training_the_code_hides(tmp_path: Path) -> None:
    assert training_in_code(HIDDEN_TRAINING) == []
    lines = run_probed(tmp_path, HIDDEN_TRAINING)
    steps = [line for line in lines if line["probe"] == "optimizer_step"]
    (step,) = steps
    assert step["count"] == 37 and step["module_parameters"] is True and step["tensors"] == 2
    assert step["detail"] == "torch.optim.sgd.SGD on weights"
    assert step["argv"][0].endswith("innocent_name.py")
    backward = next(line for line in lines if line["probe"] == "backward")
    assert backward["count"] == 37
    events = [{"kind": "runtime", "seq": 3, **line} for line in lines]
    step_finding, update = find_training(events)
    assert step_finding.source == "runtime" and "37 optimizer step(s)" in step_finding.evidence
    # The forward pre-hook saw the same weights change between the 37 forward passes.
    assert update.rule == "parameter_update" and "36 updates" in update.evidence


@pytest.mark.slow
def test_the_probe_sees_no_training_in_honest_inference(tmp_path: Path) -> None:
    code = """
import torch
nn = torch.nn
net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
net.eval()
x = torch.randn(1, 1, 16, 16)
with torch.no_grad():
    tta = (net(x) + net(x.flip(-1)).flip(-1)) / 2
    ensemble = torch.stack([net(x), net(x.flip(-2)).flip(-2)]).mean(0)
compiled = torch.compile(net, backend="eager")
with torch.no_grad():
    compiled(x)
x.requires_grad_(True)
net(x)[0, 1].sum().backward()  # a saliency map
image = torch.zeros(1, 1, 16, 16, requires_grad=True)
opt = torch.optim.Adam([image], lr=0.1)
for _ in range(5):
    opt.zero_grad()
    ((image - x.detach()) ** 2).mean().backward()
    opt.step()
"""
    lines = run_probed(tmp_path, code)
    kinds = {line["probe"]: line for line in lines}
    assert kinds["optimizer_step"]["module_parameters"] is False  # seen, and not weights
    assert kinds["backward"]["count"] == 6
    events = [{"kind": "runtime", "seq": 1, **line} for line in lines]
    assert find_training([execute(code), *events]) == []


def test_the_probe_does_nothing_unasked_and_never_breaks_the_program(tmp_path: Path) -> None:
    folder = tmp_path / "probe"
    folder.mkdir()
    (folder / runtime_probe.SITE_HOOK_NAME).write_text(Path(runtime_probe.__file__).read_text())
    env = {**os.environ, "PYTHONPATH": str(folder)}
    env.pop(runtime_probe.PROBE_DIR_ENV, None)
    code = "import sys; print(type(sys.meta_path[0]).__name__)"
    unasked = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert unasked.returncode == 0 and unasked.stdout.strip() != "_AfterImport"
    env[runtime_probe.PROBE_DIR_ENV] = str(folder / "gone")  # a folder that is not there
    missing = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert missing.returncode == 0 and missing.stdout.strip() != "_AfterImport"
    env[runtime_probe.PROBE_DIR_ENV] = str(folder)
    asked = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert asked.returncode == 0 and asked.stdout.strip() == "_AfterImport"


def test_the_probe_folder_is_read_as_untrusted(tmp_path: Path) -> None:
    """The agent can write in the probe's folder: what the harness reads back is bounded,
    typed, and the last count per process and kind."""
    folder = tmp_path
    line = {
        "probe": "optimizer_step",
        "detail": "x on weights",
        "pid": 7,
        "module_parameters": True,
    }
    (folder / "7.jsonl").write_text(
        "\n".join(
            [
                json.dumps({**line, "count": 1, "t": 10.0}),
                "not json",
                json.dumps([1, 2]),
                json.dumps({"probe": 5}),
                json.dumps({**line, "count": 8, "t": 11.0, "argv": ["a"] * 50, "kind": "end"}),
                json.dumps({**line, "count": 4, "t": 12.0}),  # an older count, out of order
            ]
        )
    )
    (folder / "8.jsonl").write_text(
        json.dumps({"probe": "backward", "count": "many", "pid": True, "tensors": 2.5, "t": 1})
    )
    (folder / "9.jsonl").symlink_to("/etc/passwd")
    (folder / "huge.jsonl").write_text("x" * (2 * 1024 * 1024))
    lines = read_probe_folder(folder)
    assert [line["probe"] for line in lines] == ["backward", "optimizer_step"]
    backward, step = lines
    assert backward == {"probe": "backward", "at": 1.0}  # wrong types dropped
    assert step["count"] == 8 and len(step["argv"]) == 8 and "kind" not in step


@pytest.mark.slow
def test_reloading_or_moving_weights_between_saliency_passes_is_not_training(
    tmp_path: Path,
) -> None:
    """An ensemble by reloading checkpoints into one model, and a dtype round trip, with
    gradients on (saliency maps): the weights change between forward passes, after a
    gradient, and still nobody trained."""
    code = """
import torch
nn = torch.nn
net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 1))
checkpoints = [{k: v + i * 0.01 for k, v in net.state_dict().items()} for i in range(4)]
x = torch.randn(2, 1, 16, 16)
for state in checkpoints:
    net.load_state_dict(state)
    for case in range(3):
        xi = x.clone().requires_grad_(True)
        net(xi)[:, 1].sum().backward()
    net.half()
    net.float()
"""
    lines = run_probed(tmp_path, code)
    assert next(line for line in lines if line["probe"] == "backward")["count"] == 12
    assert [line for line in lines if line["probe"] == "parameter_update"] == []
    events = [{"kind": "runtime", "seq": 1, **line} for line in lines]
    assert find_training([execute(code), *events]) == []
