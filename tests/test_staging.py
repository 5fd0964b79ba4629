"""Tests for once-per-session, lock-protected staging of a task's data split."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from pytest_automedbench.fixtures.registry import RealStager, get_generator
from pytest_automedbench.fixtures.staging import (
    MANIFEST_NAME,
    CaseGenerator,
    StagedData,
    StagingError,
    data_hash_of,
    load_prepared,
    make_ids_opaque,
    opaque_id,
    real_salt,
    references_manifest,
    stage_real,
    stage_synthetic,
    synthetic_dirname,
    synthetic_salt,
    verify,
    write_manifest,
)

TASK = "kidney-tumor-seg"


class CountingGenerator:
    """A tiny CaseGenerator that records every call in a counter file.

    Lives at module level so that spawned worker processes can unpickle it.
    """

    def __init__(self, counter: Path, delay: float = 0.0) -> None:
        self.counter = counter
        self.delay = delay

    def __call__(self, public_dir: Path, private_dir: Path, n_cases: int, seed: int) -> list[str]:
        with self.counter.open("a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
        ids = [f"case_{i + 1:04d}" for i in range(n_cases)]
        for index, cid in enumerate(ids):
            (public_dir / cid).mkdir()
            (private_dir / cid).mkdir()
            (public_dir / cid / "image.txt").write_text(f"image {seed} {index}\n")
            (private_dir / cid / "label.txt").write_text(f"label {seed} {index}\n")
        # Widen the window in which a second process could wrongly start too.
        time.sleep(self.delay)
        return ids


class FailingGenerator:
    def __call__(self, public_dir: Path, private_dir: Path, n_cases: int, seed: int) -> list[str]:
        (public_dir / "case_0001").mkdir()
        (public_dir / "case_0001" / "half.txt").write_text("half written")
        raise RuntimeError("generator exploded")


def _opaque(seed: int = 1, n_cases: int = 3) -> dict[str, str]:
    """The ids staging gives the generator's ``case_0001``... for TASK and ``seed``."""
    salt = synthetic_salt(TASK, seed)
    return {f"case_{i:04d}": opaque_id(salt, f"case_{i:04d}") for i in range(1, n_cases + 1)}


def _calls(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def _stage(cache: Path, generator: CaseGenerator, n_cases: int = 3, seed: int = 1) -> StagedData:
    return stage_synthetic(
        TASK, "counting", generator, cache, n_cases=n_cases, seed=seed, generator_version="1"
    )


def _staging_worker(cache: str, counter: str, out: str, barrier: Barrier) -> None:
    barrier.wait()
    staged = _stage(Path(cache), CountingGenerator(Path(counter), delay=0.5))
    Path(out).write_text(staged.model_dump_json())


# --- stage_synthetic ----------------------------------------------------------------


def test_stages_layout_and_manifest(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    staged = _stage(tmp_path / "cache", CountingGenerator(counter))
    root = tmp_path / "cache" / TASK / synthetic_dirname("counting", 1, 3, "1")
    assert root.name == "synthetic-counting-s1-n3-v1"
    assert staged.root == root
    assert staged.public_dir == root / "public"
    assert staged.private_dir == root / "private"
    ids = _opaque()
    assert staged.case_ids == sorted(ids.values())
    assert staged.source == "synthetic:counting"
    assert staged.task_id == TASK
    assert staged.seed == 1
    assert staged.schema_version == 2
    assert set(staged.files) == {
        f"{half}/{case}/{name}"
        for case in ids.values()
        for half, name in (("public", "image.txt"), ("private", "label.txt"))
    }
    # The renamed folders still hold the generator's bytes for their original case.
    for index, original in enumerate(ids):
        case = ids[original]
        assert (staged.public_dir / case / "image.txt").read_text() == f"image 1 {index}\n"
        assert (staged.private_dir / case / "label.txt").read_text() == f"label 1 {index}\n"
    assert all(len(digest) == 64 for digest in staged.files.values())
    on_disk = StagedData.model_validate_json((root / MANIFEST_NAME).read_text())
    assert on_disk == staged
    verify(staged)


def test_second_call_reuses_cache_without_regenerating(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    first = _stage(tmp_path / "cache", CountingGenerator(counter))
    second = _stage(tmp_path / "cache", CountingGenerator(counter))
    assert _calls(counter) == 1
    assert second == first
    # A different seed or size is a different dataset.
    _stage(tmp_path / "cache", CountingGenerator(counter), seed=2)
    _stage(tmp_path / "cache", CountingGenerator(counter), n_cases=2)
    assert _calls(counter) == 3


def test_concurrent_processes_generate_exactly_once(tmp_path: Path) -> None:
    cache, counter = tmp_path / "cache", tmp_path / "calls"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    outs = [tmp_path / f"out-{i}.json" for i in range(3)]
    procs = [
        ctx.Process(target=_staging_worker, args=(str(cache), str(counter), str(out), barrier))
        for out in outs
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    assert _calls(counter) == 1
    manifests = [json.loads(out.read_text()) for out in outs]
    assert manifests[0] == manifests[1] == manifests[2]
    task_dir = cache / TASK
    assert not [p for p in task_dir.iterdir() if ".tmp-" in p.name]


def test_failing_generator_leaves_nothing_staged(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="generator exploded"):
        _stage(cache, FailingGenerator())
    task_dir = cache / TASK
    leftovers = [p.name for p in task_dir.iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []
    # The failure is not cached: the next attempt generates for real.
    counter = tmp_path / "calls"
    staged = _stage(cache, CountingGenerator(counter))
    assert _calls(counter) == 1
    verify(staged)


def test_leftovers_of_a_killed_run_are_cleaned_up(tmp_path: Path) -> None:
    task_dir = tmp_path / "cache" / TASK
    stale = task_dir / f".{synthetic_dirname('counting', 1, 3, '1')}.tmp-dead"
    (stale / "public" / "case_0001").mkdir(parents=True)
    (stale / "public" / "case_0001" / "x.txt").write_text("partial")
    (stale / "public" / "case_0001").chmod(0o555)
    staged = _stage(tmp_path / "cache", CountingGenerator(tmp_path / "calls"))
    assert not stale.exists()
    verify(staged)


def test_staged_files_are_read_only(tmp_path: Path) -> None:
    staged = _stage(tmp_path / "cache", CountingGenerator(tmp_path / "calls"))
    for directory in (staged.public_dir, staged.private_dir):
        for dirpath, _dirnames, filenames in os.walk(directory):
            assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o555
            for name in filenames:
                assert stat.S_IMODE(os.stat(Path(dirpath) / name).st_mode) == 0o444
    assert stat.S_IMODE(staged.root.stat().st_mode) == 0o555
    assert stat.S_IMODE((staged.root / MANIFEST_NAME).stat().st_mode) == 0o444


def test_generator_that_misreports_cases_is_rejected(tmp_path: Path) -> None:
    class Liar(CountingGenerator):
        def __call__(
            self, public_dir: Path, private_dir: Path, n_cases: int, seed: int
        ) -> list[str]:
            return [*super().__call__(public_dir, private_dir, n_cases, seed), "case_9999"]

    with pytest.raises(StagingError, match="case_9999"):
        _stage(tmp_path / "cache", Liar(tmp_path / "calls"))
    assert not (tmp_path / "cache" / TASK / synthetic_dirname("counting", 1, 3, "1")).exists()


def test_unsafe_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="task id"):
        stage_synthetic(
            "../escape", "counting", CountingGenerator(tmp_path / "c"), tmp_path, 1, 0, "1"
        )
    with pytest.raises(StagingError, match="generator version"):
        stage_synthetic(TASK, "counting", CountingGenerator(tmp_path / "c"), tmp_path, 1, 0, "1/2")


def test_cache_survives_being_moved(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    _stage(tmp_path / "old", CountingGenerator(counter))
    (tmp_path / "old").rename(tmp_path / "new")
    staged = _stage(tmp_path / "new", CountingGenerator(counter))
    assert _calls(counter) == 1
    assert staged.root.parent == tmp_path / "new" / TASK
    verify(staged)


def test_real_kidney_generator_stages_and_verifies(tmp_path: Path) -> None:
    staged = stage_synthetic(
        TASK,
        "kidney-ct",
        get_generator("kidney-ct").generate,
        tmp_path,
        n_cases=2,
        seed=0,
        generator_version=get_generator("kidney-ct").version,
    )
    salt = synthetic_salt(TASK, 0)
    ids = sorted(opaque_id(salt, c) for c in ["case_0001", "case_0002"])
    assert staged.case_ids == ids
    assert staged.source == "synthetic:kidney-ct"
    assert sorted(staged.files) == sorted(
        [f"private/{case}/label.nii.gz" for case in ids]
        + [f"public/{case}/ct.nii.gz" for case in ids]
    )
    verify(staged)


# --- task and data hash ------------------------------------------------------------


def test_the_manifest_records_a_data_hash_of_the_split(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    staged = _stage(tmp_path / "a", CountingGenerator(counter))
    assert staged.data_hash is not None and len(staged.data_hash) == 64
    assert staged.data_hash == data_hash_of(staged.files)
    on_disk = json.loads((staged.root / MANIFEST_NAME).read_text())
    assert on_disk["data_hash"] == staged.data_hash and on_disk["task_id"] == TASK
    # The same bytes elsewhere hash alike; other bytes (another seed) do not.
    assert _stage(tmp_path / "b", CountingGenerator(counter)).data_hash == staged.data_hash
    assert _stage(tmp_path / "a", CountingGenerator(counter), seed=2).data_hash != staged.data_hash
    # The hash covers names as well as contents.
    renamed = dict(staged.files)
    first = _opaque()["case_0001"]
    renamed["public/case_0009/image.txt"] = renamed.pop(f"public/{first}/image.txt")
    assert data_hash_of(renamed) != staged.data_hash


def test_a_version_1_manifest_is_read_with_its_data_hash_derived(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    staged = _stage(tmp_path / "cache", CountingGenerator(counter))
    manifest = staged.root / MANIFEST_NAME
    old = json.loads(manifest.read_text())
    del old["data_hash"]
    old["schema_version"] = 1
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(old))
    again = _stage(tmp_path / "cache", CountingGenerator(counter))
    assert _calls(counter) == 1
    assert again.schema_version == 1
    assert again.data_hash == staged.data_hash


def _real_stager(root: Path, public: Path, private: Path, max_cases: int | None) -> list[str]:
    (public / "case_0001").mkdir()
    (private / "case_0001").mkdir()
    (public / "case_0001" / "image.txt").write_text((root / "image.txt").read_text())
    (private / "case_0001" / "label.txt").write_text("label\n")
    return ["case_0001"]


def test_a_real_split_gets_a_data_hash_but_no_file_list(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "image.txt").write_text("image\n")
    stager = RealStager("fake", "1", "fake", _real_stager, "a fake dataset", "none")
    staged = stage_real(TASK, stager, source, tmp_path / "cache")
    assert staged.files == {}
    case = opaque_id(real_salt(tmp_path / "cache"), "case_0001")
    assert staged.case_ids == [case]
    hashes = {
        f"private/{case}/label.txt": hashlib.sha256(b"label\n").hexdigest(),
        f"public/{case}/image.txt": hashlib.sha256(b"image\n").hexdigest(),
    }
    assert staged.data_hash == data_hash_of(hashes)
    assert stage_real(TASK, stager, source, tmp_path / "cache").data_hash == staged.data_hash


def test_a_split_written_in_place_records_its_task_for_its_references(tmp_path: Path) -> None:
    root = tmp_path / "staged"
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    CountingGenerator(tmp_path / "calls")(root / "public", root / "private", 3, 1)
    # write_manifest records the split as it is; with the ids the cache gives it, it
    # holds the same bytes as the cached split.
    assert make_ids_opaque(root, "folders", synthetic_salt(TASK, 1)) == _opaque()
    written = write_manifest(root, "other-task", "synthetic:counting", "folders")
    cached = _stage(tmp_path / "cache", CountingGenerator(tmp_path / "calls"))
    assert written.data_hash == cached.data_hash  # the same bytes, staged either way
    assert written.files == cached.files
    found = references_manifest(root / "private")
    assert found is not None
    assert (found.task_id, found.data_hash) == ("other-task", written.data_hash)
    assert found.case_ids == sorted(_opaque().values()) == cached.case_ids
    cached_found = references_manifest(cached.private_dir)
    assert cached_found is not None and cached_found.task_id == TASK
    assert references_manifest(root / "public") is None
    assert references_manifest(tmp_path / "cache") is None


def test_a_prepared_split_has_no_data_hash(tmp_path: Path) -> None:
    root = _prepared(tmp_path / "prepared", ["case_1"], ["case_1"])
    assert load_prepared(TASK, root).data_hash is None


# --- verify -------------------------------------------------------------------------


def test_verify_detects_modified_file(tmp_path: Path) -> None:
    staged = _stage(tmp_path / "cache", CountingGenerator(tmp_path / "calls"))
    case = _opaque()["case_0002"]
    target = staged.private_dir / case / "label.txt"
    target.chmod(0o644)
    target.write_text("tampered\n")
    with pytest.raises(StagingError, match=rf"{case}/label\.txt"):
        verify(staged)


def test_verify_detects_missing_and_extra_files(tmp_path: Path) -> None:
    staged = _stage(tmp_path / "cache", CountingGenerator(tmp_path / "calls"))
    case = _opaque()["case_0001"]
    case_dir = staged.public_dir / case
    case_dir.chmod(0o755)
    (case_dir / "leak.txt").write_text("a copied label")
    with pytest.raises(StagingError, match=rf"{case}/leak\.txt"):
        verify(staged)
    (case_dir / "leak.txt").unlink()
    (case_dir / "image.txt").unlink()
    with pytest.raises(StagingError, match=rf"{case}/image\.txt"):
        verify(staged)


# --- load_prepared ------------------------------------------------------------------


def _prepared(root: Path, public: list[str], private: list[str]) -> Path:
    for half, cases in (("public", public), ("private", private)):
        (root / half).mkdir(parents=True, exist_ok=True)
        for cid in cases:
            (root / half / cid).mkdir()
            (root / half / cid / "data.bin").write_bytes(b"\0")
    return root


def test_load_prepared_accepts_matching_split(tmp_path: Path) -> None:
    root = _prepared(tmp_path / "data", ["b", "a"], ["a", "b"])
    (root / "public" / ".hidden").mkdir()
    staged = load_prepared(TASK, root)
    assert staged.case_ids == ["a", "b"]
    assert staged.files == {}
    assert staged.seed is None
    assert staged.source == f"local:{root}"
    assert staged.public_dir == root / "public"
    verify(staged)


def test_load_prepared_names_case_missing_from_private(tmp_path: Path) -> None:
    root = _prepared(tmp_path / "data", ["a", "b", "c"], ["a", "c"])
    with pytest.raises(StagingError) as info:
        load_prepared(TASK, root)
    message = str(info.value)
    assert "'b'" in message
    assert str(root / "private") in message


def test_load_prepared_names_case_missing_from_public(tmp_path: Path) -> None:
    root = _prepared(tmp_path / "data", ["a"], ["a", "zz"])
    with pytest.raises(StagingError, match="'zz'") as info:
        load_prepared(TASK, root)
    assert str(root / "public") in str(info.value)


def test_load_prepared_requires_both_halves(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "public" / "a").mkdir(parents=True)
    with pytest.raises(StagingError, match="private"):
        load_prepared(TASK, root)
    with pytest.raises(StagingError, match="does not exist"):
        load_prepared(TASK, tmp_path / "nowhere")
    assert issubclass(StagingError, ValueError)


def test_load_prepared_rejects_empty_case_folder(tmp_path: Path) -> None:
    root = _prepared(tmp_path / "data", ["a"], [])
    (root / "private" / "a").mkdir()
    with pytest.raises(StagingError, match="'a'"):
        load_prepared(TASK, root)


def test_the_registry_index_read_from_source_matches_the_modules_declarations() -> None:
    """Task loading checks generator and stager names against an index read from the
    fixture modules' source (no import); it must list exactly what the modules declare."""
    import importlib

    from pytest_automedbench.fixtures import registry

    declared: dict[str, dict[str, str]] = {"generator": {}, "stager": {}}
    for module in registry._modules():
        loaded = importlib.import_module(f"pytest_automedbench.fixtures.{module}")
        for generator in getattr(loaded, "GENERATORS", []):
            declared["generator"][generator.name] = module
        for stager in getattr(loaded, "STAGERS", []):
            declared["stager"][stager.name] = module
    assert registry._index() == declared
    assert len(declared["generator"]) >= 19 and len(declared["stager"]) >= 20
