"""A Harbor attempt's harness overhead against the bare Docker steps it is made of.

Not a test: wall-clock numbers depend on the machine, so this only prints them, with the
ratio, which is what carries across machines. Both sides run in this process, interleaved.

The attempt: one ``nop`` attempt of the example task ``basics/csv-stats`` through
``run_cell`` (its image already built: the environment phase is a cache hit), i.e. the
container with its hardening, the agent's turn, ``kill_all``, the verifier's copy-in and
run, the copies out, scoring and the Harbor trial folder. The reference: the same image
started bare (``docker run -d``), the verifier's files copied in (``docker cp``), the same
``bash /tests/test.sh`` run (``docker exec``) and the container removed, with the CLI.
The ratio is the price of what the harness adds (target: <= 3x, overhead <= 3 s median).

    .venv/bin/python benchmarks/harbor.py              # median of 7
    .venv/bin/python benchmarks/harbor.py --rounds 3
    .venv/bin/python benchmarks/harbor.py --quick --json harbor.json   # median of 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _record import add_json_option, figure, write_json

from pytest_automedbench.config import RunConfig
from pytest_automedbench.harbor import build_task_image, load_harbor_task
from pytest_automedbench.results import CellKey
from pytest_automedbench.runner import CellPlan, run_cell
from pytest_automedbench.sandbox.docker import docker_client
from pytest_automedbench.sandbox.images import ensure_images

TASK = Path(__file__).resolve().parent.parent / "examples" / "harbor-tasks" / "basics" / "csv-stats"


def attempt(config: RunConfig, out: Path, n: int) -> float:
    task = load_harbor_task(TASK)
    plan = CellPlan(
        key=CellKey(agent="nop", task=task.id, tier="harbor", run=n),
        task=task,
        staged=task.staged(),
        config=config,
        run_id="bench-harbor",
        cell_dir=out / f"attempt-{n}",
    )
    started = time.perf_counter()
    result = run_cell(plan)
    elapsed = time.perf_counter() - started
    if result.status != "scored":
        raise SystemExit(f"the attempt failed: {result.error}")
    return elapsed


def bare(image: str) -> float:
    def run(*argv: str) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()

    started = time.perf_counter()
    container = run("docker", "run", "-d", "--network", "none", image, "sleep", "600")
    try:
        run("docker", "cp", str(TASK / "tests"), f"{container}:/tests")
        run("docker", "exec", container, "mkdir", "-p", "/logs/verifier")
        run("docker", "exec", container, "bash", "/tests/test.sh")
    finally:
        run("docker", "rm", "-f", container)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, help="median of this many (default 7)")
    parser.add_argument("--quick", action="store_true", help="median of 3 (a busy machine)")
    add_json_option(parser)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    base = ensure_images(docker_client(), "debootstrap").base
    mapping = {"ubuntu:24.04": base}
    image = build_task_image(TASK / "environment", base_map=mapping, say=lambda _: None)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        config = RunConfig(
            amb_out=out, sandbox="docker", sandbox_network="off",
            harbor_base=tuple(f"{k}={v}" for k, v in mapping.items()),
        )  # fmt: skip
        ours, theirs = [], []
        for n in range(rounds):
            ours.append(attempt(config, out, n))
            theirs.append(bare(image))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"Harbor attempt (nop, csv-stats), median of {rounds}:")
    print(f"  run_cell          {a:6.2f} s")
    print(f"  bare docker steps {b:6.2f} s")
    print(f"  ratio {a / b:.2f}x (target <= 3x), overhead {a - b:.2f} s (target <= 3 s)")
    figure("Harbor attempt through run_cell (nop, csv-stats), median", a, "s")
    figure("the same steps as bare docker commands, median", b, "s")
    figure("Harbor attempt / bare docker steps", a / b, "x", at_most=3)
    figure("Harbor attempt overhead beyond the bare steps", a - b, "s", at_most=3)
    write_json(args.json, {"rounds": rounds})


if __name__ == "__main__":
    main()
