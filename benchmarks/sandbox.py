"""Sandbox overheads against bare process starts, measured in one run.

Not a test: wall-clock numbers depend on the machine and on what else runs on it, so
this only prints them.  Each comparison runs both sides in the same process, interleaved
(so a busy neighbour hurts both alike), and prints the ratio, which is what carries
across machines.  Every timed call must succeed, or the run stops: a fast failure is not
a measurement.

(a) exec round trip of ``true`` (through bash) and of ``python -c pass``: the ``local``
    backend (bubblewrap, an unprivileged uid, fresh namespaces per call) and the
    ``process`` backend (no isolation) vs a bare ``subprocess.run`` of the same command
    line on the host (best of ``--repeats``; the issue asks for the ratio to be printed);
(b) one cell's sandbox lifecycle, ``start()`` + one ``exec`` + ``stop()`` on a fresh
    workspace, vs one exec in an already started sandbox (median, as the Docker target
    is a median);
(c) the Docker backend, when a daemon answers: our exec round trip vs a bare
    ``docker exec`` (the CLI) of the same command into the same container (target
    <= 1.5x), and the container lifecycle of one cell, both containers: the agent
    container's start + one exec + stop, plus one evaluator container run (the
    evaluator's ``--help``), vs the same two commands as bare host processes (target:
    overhead <= 2 s median);
(d) the egress proxy: a 10 MB download from a local server through the proxy's CONNECT
    tunnel vs the same download directly (median; target <= 1.2x), and the same download
    with curl inside a bubblewrap sandbox (relay on 127.0.0.1:3128, then the proxy) vs
    curl on the host (reported).

    .venv/bin/python benchmarks/sandbox.py            # best of 30, lifecycle median of 15
    .venv/bin/python benchmarks/sandbox.py --quick    # fewer rounds for a busy machine
    .venv/bin/python benchmarks/sandbox.py --quick --json sandbox.json   # and the figures
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from _record import add_json_option, figure, write_json
from timing import best_of

from pytest_automedbench.sandbox import Sandbox, SandboxSpec, backend_class, backend_names
from pytest_automedbench.sandbox.bubblewrap import bubblewrap_problem
from pytest_automedbench.sandbox.docker import docker_problem, run_evaluator_container

Language = Literal["bash", "python"]
#: (label, language, code, the same command line as the backend runs it, bare)
COMMANDS: list[tuple[str, Language, str, list[str]]] = [
    ("true", "bash", "true", ["bash", "-c", "true"]),
    ("python -c pass", "python", "pass", [sys.executable, "-c", "pass"]),
]


@dataclass
class Row:
    check: str
    ours: str
    reference: str
    ratio: str
    target: str


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def median_of(repeats: int, fn: Callable[[], None]) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bare(argv: list[str]) -> Callable[[], None]:
    """The reference: the same command as a plain child process, output captured."""

    def run() -> None:
        subprocess.run(argv, capture_output=True, check=True, stdin=subprocess.DEVNULL)

    return run


def sandboxed(box: Sandbox, language: Language, code: str) -> Callable[[], None]:
    def run() -> None:
        result = box.exec(language, code, timeout_s=60)
        if result.exit_code != 0:
            raise SystemExit(f"{type(box).__name__} exec of {code!r} failed: {result}")

    return run


def new_spec(root: Path, public: Path, name: str) -> SandboxSpec:
    # Network off: no egress relay in front of each command (section (d) measures it).
    return SandboxSpec(public_dir=public, workspace_dir=root / name)


# --------------------------------------------------------------------------- (a), (b)


def bench_exec(backend: str, root: Path, public: Path, repeats: int) -> list[Row]:
    box = backend_class(backend)(new_spec(root, public, f"ws-exec-{backend}"))
    box.start()
    rows = []
    try:
        for label, language, code, argv in COMMANDS:
            (ours, _), (reference, _) = best_of(repeats, sandboxed(box, language, code), bare(argv))
            figure(f"{backend} exec `{label}`, best", ours * 1e3, "ms")
            figure(f"bare subprocess `{label}` (beside {backend}), best", reference * 1e3, "ms")
            rows.append(
                Row(
                    f"(a) {backend} exec `{label}`",
                    ms(ours),
                    f"bare subprocess {ms(reference)}",
                    f"{ours / reference:.1f}x (+{ms(ours - reference)})",
                    "report",
                )
            )
    finally:
        box.stop()
    return rows


def bench_lifecycle(backend: str, root: Path, public: Path, repeats: int) -> Row:
    counter = iter(range(10**6))

    def cell() -> None:
        box = backend_class(backend)(new_spec(root, public, f"ws-cell-{backend}-{next(counter)}"))
        box.start()
        try:
            sandboxed(box, "bash", "true")()
        finally:
            box.stop()

    warm = backend_class(backend)(new_spec(root, public, f"ws-warm-{backend}"))
    warm.start()
    try:
        one_exec = median_of(repeats, sandboxed(warm, "bash", "true"))
    finally:
        warm.stop()
    lifecycle = median_of(repeats, cell)
    figure(f"{backend} start + exec + stop, one cell, median", lifecycle * 1e3, "ms")
    figure(f"{backend} one exec when started, median", one_exec * 1e3, "ms")
    return Row(
        f"(b) {backend} start+exec+stop, one cell",
        f"median {ms(lifecycle)}",
        f"one exec when started {ms(one_exec)}",
        f"{lifecycle / one_exec:.1f}x (+{ms(lifecycle - one_exec)})",
        "report",
    )


# --------------------------------------------------------------------------- (c) Docker


def bench_docker(root: Path, public: Path, repeats: int) -> list[Row]:
    exec_check = "(c) docker exec round trip"
    life_check = "(c) docker lifecycle, one cell, both containers"
    if (problem := docker_problem()) is not None:
        why = f"n/a: {problem}"
        figure("docker exec / bare docker exec `true`", None, "x", at_most=1.5, note=why)
        figure("docker lifecycle overhead, one cell", None, "s", at_most=2, note=why)
        return [Row(exec_check, why, "", "", "<= 1.5x"), Row(life_check, why, "", "", "<= 2 s")]
    docker_cli = shutil.which("docker")
    box = backend_class("docker")(new_spec(root, public, "ws-docker"))
    box.start()
    rows = []
    try:
        container = getattr(box, "container_id", None)
        for label, language, code, _ in COMMANDS:
            check = f"{exec_check} `{label}`"
            ours = sandboxed(box, language, code)
            if docker_cli is None or not isinstance(container, str):
                ((ours_s, _),) = best_of(repeats, ours)
                why = "no docker CLI" if docker_cli is None else "backend has no container_id"
                figure(f"docker exec `{label}`, best", ours_s * 1e3, "ms", note=why)
                rows.append(Row(check, ms(ours_s), f"n/a: {why}", "", "<= 1.5x"))
                continue
            inner = ["bash", "-c", code] if language == "bash" else ["python", "-c", code]
            (ours_s, _), (bare_s, _) = best_of(
                repeats, ours, bare([docker_cli, "exec", container, *inner])
            )
            figure(f"docker exec `{label}`, best", ours_s * 1e3, "ms")
            figure(f"bare docker exec `{label}`, best", bare_s * 1e3, "ms")
            figure(f"docker exec / bare docker exec `{label}`", ours_s / bare_s, "x", at_most=1.5)
            rows.append(
                Row(
                    check,
                    ms(ours_s),
                    f"bare docker exec {ms(bare_s)}",
                    f"{ours_s / bare_s:.2f}x",
                    "<= 1.5x",
                )
            )
    finally:
        box.stop()
    rows.append(docker_lifecycle(root, public, max(5, repeats // 2), life_check))
    return rows


def docker_lifecycle(root: Path, public: Path, repeats: int, check: str) -> Row:
    counter = iter(range(10**6))
    evaluator = ["-m", "pytest_automedbench.evaluators", "--help"]

    def cell() -> None:
        box = backend_class("docker")(new_spec(root, public, f"ws-docker-cell-{next(counter)}"))
        box.start()
        try:
            sandboxed(box, "bash", "true")()
        finally:
            box.stop()
        code, logs = run_evaluator_container(evaluator[2:], {}, root / "eval-out", 120)
        if code != 0:
            raise SystemExit(f"evaluator container failed ({code}): {logs}")

    def host() -> None:
        bare(["bash", "-c", "true"])()
        bare([sys.executable, *evaluator])()

    ours = median_of(repeats, cell)
    reference = median_of(repeats, host)
    figure("docker lifecycle, one cell, both containers, median", ours, "s")
    figure("the same commands on the host, median", reference, "s")
    figure("docker lifecycle overhead, one cell", ours - reference, "s", at_most=2)
    return Row(
        check,
        f"median {ms(ours)}",
        f"same commands on the host {ms(reference)}",
        f"overhead {ms(ours - reference)}",
        "overhead <= 2 s",
    )


# --------------------------------------------------------------------------- main


# --------------------------------------------------------------------------- (d)

DOWNLOAD_BYTES = 10 * 1024**2


class _Download(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    body = os.urandom(DOWNLOAD_BYTES)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _read_all(sock: socket.socket) -> int:
    total = 0
    while chunk := sock.recv(1 << 20):
        total += len(chunk)
    return total


def direct_download(port: int) -> Callable[[], None]:
    def run() -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\nHost: download.test\r\n\r\n")
            if _read_all(sock) < DOWNLOAD_BYTES:
                raise SystemExit("the direct download came back short")

    return run


def proxied_download(socket_path: Path, port: int) -> Callable[[], None]:
    """The same GET through a CONNECT tunnel of the proxy's unix socket."""

    def run() -> None:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(socket_path))
            sock.sendall(f"CONNECT download.test:{port} HTTP/1.1\r\n\r\n".encode())
            head = sock.recv(4096)
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"the proxy refused the download: {head[:200]!r}")
            sock.sendall(b"GET / HTTP/1.0\r\nHost: download.test\r\n\r\n")
            if _read_all(sock) < DOWNLOAD_BYTES:
                raise SystemExit("the proxied download came back short")

    return run


def bench_egress(root: Path, public: Path, repeats: int, bubblewrap: bool) -> list[Row]:
    """A 10 MB download from a local server: through the egress proxy's tunnel vs
    directly (median, interleaved), and from inside a bubblewrap sandbox (relay + proxy,
    curl) vs the same curl on the host."""
    from pytest_automedbench.egress import EgressPolicy, EgressProxy
    from pytest_automedbench.sandbox.egress import EGRESS_SOCKET_NAME

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Download)
    port = int(server.server_address[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    folder = Path(tempfile.mkdtemp(prefix="amb-bench-eg-"))
    folder.chmod(0o755)
    # A port beyond the usual ones is reached only where the allow-list names it.
    policy = EgressPolicy(
        mode="on", allow_hosts=(f"download.test:{port}",), allow_networks=("127.0.0.1/32",)
    )
    rows = []
    try:
        with (
            EgressProxy(hosts={"download.test": "127.0.0.1"}) as proxy,
            proxy.open_cell("bench", policy, folder / EGRESS_SOCKET_NAME) as lease,
        ):
            direct, proxied = direct_download(port), proxied_download(lease.socket_path, port)
            times = _interleaved_medians(repeats, proxied, direct)
            figure("10 MB download through the egress proxy, median", times[0] * 1e3, "ms")
            figure("10 MB download directly, median", times[1] * 1e3, "ms")
            figure("egress proxy download / direct", times[0] / times[1], "x", at_most=1.2)
            label = "(d) 10 MB download through the proxy"
            rows.append(_ratio_row(label, times[0], times[1], "<= 1.2x"))
            if bubblewrap and shutil.which("curl"):
                spec = SandboxSpec(
                    public_dir=public, workspace_dir=root / "ws-egress", egress_dir=folder
                )
                box = backend_class("bubblewrap")(spec)
                box.start()
                try:
                    url = f"http://download.test:{port}/"
                    inside = sandboxed(box, "bash", f"curl -sf -o /dev/null {url}")
                    host = bare(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/"])
                    times = _interleaved_medians(repeats, inside, host)
                    figure("10 MB curl in bubblewrap (relay + proxy), median", times[0] * 1e3, "ms")
                    figure("10 MB curl on the host, median", times[1] * 1e3, "ms")
                    label = "(d) 10 MB curl in bubblewrap (relay+proxy) vs on the host"
                    rows.append(_ratio_row(label, times[0], times[1], "report"))
                finally:
                    box.stop()
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _interleaved_medians(repeats: int, *fns: Callable[[], None]) -> list[float]:
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _ratio_row(check: str, ours: float, reference: float, target: str) -> Row:
    return Row(
        check,
        ms(ours),
        f"direct {ms(reference)}",
        f"{ours / reference:.2f}x (+{ms(ours - reference)})",
        target,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a busy machine)")
    parser.add_argument("--repeats", type=int, help="best of this many exec rounds")
    add_json_option(parser)
    args = parser.parse_args()
    repeats = args.repeats or (8 if args.quick else 30)
    cells = max(3, repeats // 2)
    problem = bubblewrap_problem()
    print(
        f"{'quick' if args.quick else 'full'}: exec best of {repeats}, lifecycle median of "
        f"{cells}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; "
        f"backends {', '.join(sorted(backend_names()))}",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="amb-bench-sandbox-") as tmp:
        root = Path(tmp)
        public = root / "public"
        public.mkdir()
        (public / "input.txt").write_text("public input\n")
        for backend in ("bubblewrap", "process"):
            if backend == "bubblewrap" and problem is not None:
                why = f"n/a: {problem}"
                figure("bubblewrap exec `true`, best", None, "ms", note=why)
                rows.append(Row("(a) local exec", why, "", "", "report"))
                rows.append(Row("(b) local start+exec+stop", why, "", "", "report"))
                continue
            print(f"  (a) {backend} exec ...", flush=True)
            rows += bench_exec(backend, root, public, repeats)
            print(f"  (b) {backend} lifecycle ...", flush=True)
            rows.append(bench_lifecycle(backend, root, public, cells))
        print("  (c) docker ...", flush=True)
        rows += bench_docker(root, public, repeats)
        print("  (d) egress proxy ...", flush=True)
        rows += bench_egress(root, public, max(5, repeats // 2), problem is None)

    headers = Row("check", "ours", "reference (same run)", "ratio", "target")
    fields = ("check", "ours", "reference", "ratio", "target")
    widths = [max(len(getattr(r, f)) for r in [headers, *rows]) for f in fields]
    for row in [headers, *rows]:
        cells_text = (getattr(row, f) for f in fields)
        print("  ".join(c.ljust(w) for c, w in zip(cells_text, widths, strict=True)).rstrip())
    write_json(args.json, {"repeats": repeats, "lifecycle_rounds": cells})


if __name__ == "__main__":
    main()
