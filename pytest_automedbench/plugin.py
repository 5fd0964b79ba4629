"""pytest entry point of AutoMedBench: options, markers, and the machinery on demand.

Every pytest session of an environment with the plugin installed loads this module, so
it imports only pytest and the standard-library modules that declare the options
(:mod:`.settings`) and markers (:mod:`.terms`). The machinery is registered only when
benchmark cells are collected, in the way pytest-cov registers its engine only when
coverage is asked for: a :class:`~pytest_automedbench.worker.BenchmarkWorker` in every
process that runs cells and a :class:`~pytest_automedbench.controller.BenchmarkController`
in the process that oversees them (the only process, or the xdist controller).
"""

from __future__ import annotations

import os
import secrets
import tomllib
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from pytest_automedbench import settings
from pytest_automedbench.formats import FORMAT_MARKERS, FORMAT_PATHS, MODULE_TASKS
from pytest_automedbench.formats.known import load
from pytest_automedbench.terms import ERROR_CODES, MODALITIES, TIERS, TRACKS

if TYPE_CHECKING:
    from pytest_automedbench.cells import Cell
    from pytest_automedbench.config import RunConfig
    from pytest_automedbench.controller import BenchmarkController
    from pytest_automedbench.fixtures.staging import StagedData
    from pytest_automedbench.results import CellResult
    from pytest_automedbench.session import AutoMedBenchSession
    from pytest_automedbench.worker import BenchmarkWorker


class _State:
    """What the plugin keeps per pytest process before and after activation."""

    def __init__(self, run_id: str, run_config: RunConfig | None) -> None:
        self.run_id = run_id
        self.run_config = run_config
        self.session: AutoMedBenchSession | None = None
        self.worker: BenchmarkWorker | None = None
        self.controller: BenchmarkController | None = None


STATE_KEY = pytest.StashKey[_State]()


class PathCollection(Protocol):
    """How the plugin collects a format whose tasks come from paths the user gives (a
    path setting named in ``formats.known.FORMAT_PATHS``) rather than from a suite's test files."""

    def initial_args(self, given: list[str], file_or_dir: list[str]) -> list[str]:
        """The paths to put before pytest's arguments before any conftest loads."""
        ...

    def session_args(self, args: list[str], roots: tuple[Path, ...], explicit: bool) -> list[str]:
        """pytest's arguments with the format's paths (``explicit``: the command line
        named test paths of its own)."""
        ...

    def collect_file(
        self, file_path: Path, parent: pytest.Collector, run_config: RunConfig
    ) -> pytest.Collector | None:
        """The collector of one of the format's files, or None: not the format's."""
        ...

    def ignore_collect(self, path: Path, roots: tuple[Path, ...]) -> bool | None:
        """True: the path is not collected; None lets pytest decide elsewhere."""
        ...


def new_run_id() -> str:
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser.getgroup("automedbench", "AutoMedBench benchmark cells"))


def pytest_configure(config: pytest.Config) -> None:
    for track in TRACKS:
        config.addinivalue_line("markers", f"{track}: AutoMedBench {track} track cells")
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: AutoMedBench {tier.upper()} tier cells")
    for modality in MODALITIES:
        config.addinivalue_line("markers", f"{modality}: AutoMedBench cells on {modality} data")
    for name, meaning in FORMAT_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    for code, meaning in ERROR_CODES.items():
        config.addinivalue_line("markers", f"{code}: a cell diagnosed with {meaning}")
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    run_id = workerinput["amb_run_id"] if workerinput else new_run_id()
    # Settings that were given are checked now, so a typo is a usage error before any
    # collection; a session that gives none (any other project) pays nothing for them.
    given = settings.given_on_command_line(config.getoption) or _has_settings_table(config)
    config.stash[STATE_KEY] = _State(run_id, _resolve_config(config) if given else None)
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    for collection, roots in _path_collections(config):
        config.args[:] = collection.session_args(list(config.args), roots, explicit)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    """A format collected from paths (its path setting given on the command line or in the
    pyproject file's settings table) with no test path: its paths become the session's
    paths before the first conftest loads, so a checkout's ``testpaths`` (its tests'
    conftest) never reaches such a run."""
    namespace = early_config.known_args_namespace
    for task_paths in FORMAT_PATHS.values():
        given = getattr(namespace, settings.BY_FIELD[task_paths.setting].dest, None)
        if not given:
            given = _paths_in_settings_table(early_config.rootpath, task_paths.setting)
        if not given:
            continue
        collection: PathCollection = load(task_paths.collection)
        paths = collection.initial_args(list(given), list(namespace.file_or_dir or []))
        namespace.file_or_dir = [*paths, *(namespace.file_or_dir or [])]
        args[:0] = paths


def _path_collections(config: pytest.Config) -> Iterator[tuple[PathCollection, tuple[Path, ...]]]:
    """The collections of the formats whose paths this session gives, with the paths
    (none given: nothing of the format is imported)."""
    state = config.stash.get(STATE_KEY, None)
    run_config = state.run_config if state is not None else None
    if run_config is None:
        return
    for task_paths in FORMAT_PATHS.values():
        roots: tuple[Path, ...] = getattr(run_config, task_paths.setting)
        if roots:
            yield load(task_paths.collection), roots


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A file of a format collected from paths (a task folder's own definition file, say) is a
    module of cells."""
    for collection, _ in _path_collections(parent.config):
        run_config = parent.config.stash[STATE_KEY].run_config
        assert run_config is not None
        if (collector := collection.collect_file(file_path, parent, run_config)) is not None:
            return collector
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """What a format collected from paths keeps out (inside one of its task folders, all
    but the file that defines the task)."""
    for collection, roots in _path_collections(config):
        if (ignored := collection.ignore_collect(collection_path, roots)) is not None:
            return ignored
    return None


def _paths_in_settings_table(rootpath: Path, setting: str) -> list[str]:
    """A path setting as ``[tool.automedbench]`` of the rootdir's pyproject file gives it,
    each path relative to the file's folder (as the configuration reads it); [] when the
    file does not set it or cannot be read (the configuration reports that, later)."""
    try:
        table = tomllib.loads((rootpath / "pyproject.toml").read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    tool = table.get("tool")
    section = tool.get("automedbench") if isinstance(tool, dict) else None
    value = section.get(setting) if isinstance(section, dict) else None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        return []
    return [str(rootpath / Path(item).expanduser()) for item in items]


def _has_settings_table(config: pytest.Config) -> bool:
    pyproject = config.rootpath / "pyproject.toml"
    try:
        return pyproject.is_file() and "[tool.automedbench" in pyproject.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def _resolve_config(config: pytest.Config) -> RunConfig:
    from pytest_automedbench.agents.registry import UnknownAgentError
    from pytest_automedbench.config import ConfigError, load_config

    try:
        return load_config(
            settings.given_on_command_line(config.getoption),
            config.rootpath / "pyproject.toml",
            config.rootpath,
        )
    except (ConfigError, UnknownAgentError) as exc:
        raise pytest.UsageError(str(exc)) from None


#: What pydantic says, once per TypedDict and place, while litellm's own types load
#: (hundreds of times in a session, a dozen in pytest's warnings summary): about
#: litellm's code, nothing a benchmark's user can act on.
LITELLM_TYPE_WARNING = r"Items? .* on TypedDict class .* (is|are) using the `ReadOnly` qualifier"


def _quiet_litellm_types(config: pytest.Config) -> None:
    """Leave out :data:`LITELLM_TYPE_WARNING` from this benchmark session's warnings:
    for every test from now on (pytest reads its ``filterwarnings`` for each) and for the
    rest of this phase (the filters in force now)."""
    config.addinivalue_line("filterwarnings", f"ignore:{LITELLM_TYPE_WARNING}:UserWarning")
    warnings.filterwarnings("ignore", LITELLM_TYPE_WARNING, UserWarning)


def _activate(config: pytest.Config, *, collecting: bool) -> _State:
    """Build the session and register its machinery, once per process."""
    state = config.stash[STATE_KEY]
    if state.session is not None:
        return state
    _quiet_litellm_types(config)
    from pytest_automedbench.controller import BenchmarkController
    from pytest_automedbench.session import AutoMedBenchSession
    from pytest_automedbench.worker import BenchmarkWorker

    run_config = state.run_config or _resolve_config(config)
    state.run_config = run_config
    state.session = AutoMedBenchSession(config=run_config, run_id=state.run_id)
    if collecting:
        state.worker = BenchmarkWorker(state.session)
        config.pluginmanager.register(state.worker, "automedbench-worker")
    if not hasattr(config, "workerinput"):
        state.controller = BenchmarkController(config, state.session)
        config.pluginmanager.register(state.controller, "automedbench-controller")
    return state


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker shares the controller's run id."""
    node.workerinput["amb_run_id"] = node.config.stash[STATE_KEY].run_id


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per cell of the test file's folder (agent x task x tier x run)."""
    if "cell" not in metafunc.fixturenames:
        return
    from pytest_automedbench.cells import plan_cells
    from pytest_automedbench.tasks import discover_tasks

    state = _activate(metafunc.config, collecting=True)
    assert state.session is not None
    suite_dir = Path(str(metafunc.definition.fspath)).parent
    module = metafunc.definition.getparent(pytest.Module)
    own = module.stash.get(MODULE_TASKS, None) if module is not None else None
    tasks = list(own) if own is not None else discover_tasks(suite_dir)
    cells = plan_cells(state.session.config, tasks)
    params = [pytest.param(cell, id=cell.test_id, marks=_marks_of(cell)) for cell in cells]
    if not params:  # a track folder without tasks: say so instead of pytest's "NOTSET"
        reason = f"no tasks in {suite_dir}"
        params.append(pytest.param(None, id="no-tasks", marks=pytest.mark.skip(reason=reason)))
    metafunc.parametrize("cell", params)


def _marks_of(cell: Cell) -> list[pytest.MarkDecorator]:
    """The cell's track, tier and modality markers; a skip, decided at collection, when
    the cell cannot run (no data is staged for it)."""
    marks = [getattr(pytest.mark, m) for m in cell.markers]
    if cell.skip_reason is not None:
        marks.append(pytest.mark.skip(reason=cell.skip_reason))
    return marks


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist: the collected cells are what this process will run."""
    state = session.config.stash[STATE_KEY]
    if state.controller is None or hasattr(session.config, "workerinput"):
        return
    from pytest_automedbench.worker import cells_of

    state.controller.begin(cells_of(session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """The xdist controller collects nothing: the cells come from a worker's node ids
    (every worker collects the same ones; xdist checks), before any is scheduled."""
    config: pytest.Config = node.config
    state = config.stash[STATE_KEY]
    if state.controller is not None and state.controller.progress is not None:
        return
    from pytest_automedbench.cells import cells_of_nodeids

    invocation = config.invocation_params.dir
    roots = [config.rootpath] + [
        folder if folder.is_dir() else folder.parent
        for folder in (invocation / arg.partition("::")[0] for arg in config.args)
    ]
    if state.run_config is None:
        state.run_config = _resolve_config(config)
    cells = cells_of_nodeids(ids, roots, state.run_config)
    if not cells:
        return  # not a benchmark session: nothing to oversee
    state = _activate(config, collecting=False)
    assert state.controller is not None
    state.controller.begin(cells)


def _worker(request: pytest.FixtureRequest) -> BenchmarkWorker:
    worker = request.config.stash[STATE_KEY].worker
    if worker is None:  # a test asked for a benchmark fixture outside a benchmark test
        raise pytest.UsageError(f"{request.node.nodeid}: no AutoMedBench cells collected")
    return worker


@pytest.fixture(scope="session")
def amb_session(request: pytest.FixtureRequest) -> AutoMedBenchSession:
    """The session state of this process (configuration, run id, data, ledger)."""
    return _worker(request).session


@pytest.fixture
def staged_task(cell: Cell, request: pytest.FixtureRequest) -> StagedData:
    """The cell's task data (public/private split), staged once per session."""
    return _worker(request).staged(cell)


@pytest.fixture
def cell_result(
    cell: Cell, staged_task: StagedData, request: pytest.FixtureRequest
) -> Iterator[CellResult]:
    """Run the cell (in setup, so a harness fault is a pytest ERROR) and record it."""
    yield from _worker(request).run(cell, staged_task, request.node)
