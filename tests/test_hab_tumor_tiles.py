"""The ``tumor_tiles`` kind (HealthAgentBench pathology tumour tiles): the tile F1 against
scikit-learn, the pass rule at its edge, the options, the synthetic slides (opened with
OpenSlide) and the CAMELYON16 stager on a tiny replica of the official layout."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import openslide
import pytest
from sklearn.metrics import f1_score

from pytest_automedbench.evaluators.hab_tumor_tiles import (
    TileSubmission,
    TumorTilesScorer,
    tile_f1,
)
from pytest_automedbench.evaluators.safe_io import SubmissionFileError
from pytest_automedbench.evaluators.schema import EvaluatorInputError
from pytest_automedbench.fixtures import hab_tumor_tiles as tt


def _reference(folder: Path, cols: int, rows: int, tiles: list[list[int]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"columns": cols, "rows": rows, "tiles": tiles}
    (folder / "reference.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def _score(tmp: Path, cols: int, rows: int, ref: list[list[int]], sub: list[list[int]], **opts):
    scorer = TumorTilesScorer(opts)
    (tmp / "sub" / "c").mkdir(parents=True, exist_ok=True)
    (tmp / "sub" / "c" / "tiles.json").write_text(json.dumps({"tiles": sub}), encoding="utf-8")
    parsed = scorer.read(tmp / "sub", "c/tiles.json")
    return scorer.score(parsed, _reference(tmp / "ref", cols, rows, ref))


# --------------------------------------------------------------------------- the metric


def test_tile_f1_matches_sklearn_on_random_sets(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    for trial in range(40):
        cols, rows = int(rng.integers(1, 12)), int(rng.integers(1, 12))
        truth = rng.uniform(size=rows * cols) < rng.uniform(0, 0.5)
        pred = rng.uniform(size=rows * cols) < rng.uniform(0, 0.5)
        as_tiles = [
            [[int(i % cols), int(i // cols)] for i in np.nonzero(m)[0]] for m in (truth, pred)
        ]
        order = rng.permutation(len(as_tiles[1]))
        result = _score(
            tmp_path / str(trial), cols, rows, as_tiles[0], [as_tiles[1][i] for i in order]
        )
        expected = f1_score(truth, pred, zero_division=1.0)
        assert result.score == pytest.approx(expected, abs=1e-12), (trial, truth, pred)
        assert result.metrics["n_reference"] == truth.sum()


def test_empty_sets() -> None:
    assert tile_f1(set(), set()) == 1.0
    assert tile_f1({(0, 0)}, set()) == 0.0
    assert tile_f1(set(), {(0, 0)}) == 0.0


def test_pass_rule_at_the_threshold(tmp_path: Path) -> None:
    ref = [[i, 0] for i in range(10)]
    # 9 TP, 1 FP, 1 FN: F1 = 18 / 20 = 0.9 exactly, which passes.
    at = _score(tmp_path / "at", 12, 1, ref, [[i, 0] for i in range(1, 11)])
    assert at.score == 0.9 and at.passed
    assert at.metrics["precision"] == 0.9 and at.metrics["recall"] == 0.9
    # 8 TP, 1 FP, 2 FN: F1 = 16 / 19 < 0.9, which fails.
    below = _score(tmp_path / "below", 12, 1, ref, [[i, 0] for i in range(2, 11)])
    assert below.score == pytest.approx(16 / 19) and not below.passed
    stricter = _score(tmp_path / "strict", 12, 1, ref, [[i, 0] for i in range(1, 11)], pass_f1=0.95)
    assert not stricter.passed
    normal = _score(tmp_path / "normal", 12, 1, [], [])
    assert normal.score == 1.0 and normal.passed and normal.metrics["precision"] is None


def test_out_of_grid_names_the_entry(tmp_path: Path) -> None:
    with pytest.raises(SubmissionFileError, match=r"c/tiles.json: tiles\[1\]: \[0, 3\] is outside"):
        _score(tmp_path, 4, 3, [], [[0, 0], [0, 3]])


def test_a_broken_reference_is_the_hosts_error(tmp_path: Path) -> None:
    scorer = TumorTilesScorer({})
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "reference.json").write_text('{"columns": 2, "tiles": []}')
    with pytest.raises(EvaluatorInputError, match="reference"):
        scorer.score(TileSubmission("c/tiles.json", []), tmp_path / "ref")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pass_f": 0.9}, "unknown options"),
        ({"pass_f1": 1.5}, "pass_f1 must be within"),
        ({"pass_f1": True}, "pass_f1 must be a number"),
        ({"pass_f1": "0.9"}, "pass_f1 must be a number"),
    ],
)
def test_options_are_checked(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TumorTilesScorer(options)


# --------------------------------------------------------------------------- tile fractions


def test_tile_fractions_clip_edge_tiles() -> None:
    # A 300 x 256 slide: column 1 is 44 px wide; a tumour over x in [256, 300) fills it.
    square = np.array([[256, 0], [320, 0], [320, 256], [256, 256]], dtype=float)
    fractions = tt.tile_fractions([square], [], 300, 256, 16)
    assert fractions.shape == (1, 2)
    assert fractions[0, 0] == 0.0 and fractions[0, 1] == 1.0
    # A hole removes what it covers: a quarter of tile (0, 0).
    full = np.array([[0, 0], [256, 0], [256, 256], [0, 256]], dtype=float)
    hole = np.array([[0, 0], [128, 0], [128, 128], [0, 128]], dtype=float)
    assert tt.tile_fractions([full], [hole], 256, 256, 16)[0, 0] == pytest.approx(0.75)


# --------------------------------------------------------------------------- the generator


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_generator_writes_openslide_pyramids_deterministically(tmp_path: Path) -> None:
    for run in ("a", "b"):
        ids = tt.generate_tumor_tiles_dataset(
            tmp_path / run / "pub", tmp_path / run / "priv", 3, 5, side=1024
        )
        assert ids == ["case_0001", "case_0002", "case_0003"]
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    with_tumour = 0
    for cid in ids:
        public = tmp_path / "a" / "pub" / cid
        assert sorted(p.name for p in public.iterdir()) == ["grid.json", "slide.tif"]
        grid = json.loads((public / "grid.json").read_text())
        ref = json.loads((tmp_path / "a" / "priv" / cid / "reference.json").read_text())
        slide = openslide.OpenSlide(str(public / "slide.tif"))
        assert slide.level_count > 1
        assert slide.level_dimensions[0] == (grid["slide_width"], grid["slide_height"])
        assert slide.level_downsamples[1] == pytest.approx(2.0, rel=0.01)
        assert (grid["columns"], grid["rows"]) == tt.grid_shape(*slide.level_dimensions[0])
        assert ref["columns"] == grid["columns"] and ref["rows"] == grid["rows"]
        # The tumour tiles are where the nuclei crowd: darker in red than other tissue.
        level = slide.level_count - 1
        w, h = slide.level_dimensions[level]
        red = np.asarray(slide.read_region((0, 0), level, (w, h)).convert("RGB"))[..., 0]
        assert red[0, 0] > 230  # glass in the corner
        tile = round(256 / slide.level_downsamples[level])
        means = {
            (c, r): red[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile].mean()
            for r in range(grid["rows"])
            for c in range(grid["columns"])
        }
        tumour = [means[tuple(t)] for t in ref["tiles"]]
        if tumour:
            with_tumour += 1
            others = [v for k, v in means.items() if list(k) not in ref["tiles"] and v < 230]
            assert max(tumour) < np.median(others)
    assert with_tumour >= 1


def test_registry_declarations() -> None:
    (generator,) = tt.GENERATORS
    assert generator.name == "hab-tumor-tiles"
    assert generator.generate is tt.generate_tumor_tiles_dataset
    assert isinstance(generator.realistic, functools.partial)
    assert generator.realistic.keywords == {"side": 32768}
    (stager,) = tt.STAGERS
    assert (stager.name, stager.dirname) == ("camelyon16", "CAMELYON16")
    with pytest.raises(ValueError, match="side must be at least"):
        tt.generate_tumor_tiles_dataset(Path("unused"), Path("unused"), 1, 0, side=512)


# --------------------------------------------------------------------------- the stager


def _slide(path: Path, width: int, height: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = tt.grid_shape(width, height)[0]
    strips = (
        np.full((256, cols * 256, 3), 200, np.uint8) for _ in range(tt.grid_shape(width, height)[1])
    )
    tt.write_pyramid(path, width, height, strips)


def _xml(path: Path, annotations: list[tuple[str, list[tuple[float, float]]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(
        f'<Annotation Name="A{i}" Type="Polygon" PartOfGroup="{group}" Color="#F4FA58">'
        "<Coordinates>"
        + "".join(f'<Coordinate Order="{k}" X="{x}" Y="{y}" />' for k, (x, y) in enumerate(points))
        + "</Coordinates></Annotation>"
        for i, (group, points) in enumerate(annotations)
    )
    path.write_text(
        f'<?xml version="1.0"?><ASAP_Annotations><Annotations>{body}</Annotations>'
        '<AnnotationGroups><Group Name="_0" PartOfGroup="None" Color="#ff0000" />'
        "</AnnotationGroups></ASAP_Annotations>"
    )


def _rect(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def test_stager_on_a_replica(tmp_path: Path) -> None:
    root = tmp_path / "src" / "CAMELYON16"
    _slide(root / "images" / "tumor_001.tif", 1100, 800)  # 5 x 4 grid, clipped edges
    _slide(root / "images" / "normal_001.tif", 600, 600)
    _xml(
        root / "annotations" / "tumor_001.xml",
        [
            ("_0", _rect(256, 256, 768, 512)),  # tiles (1, 1) and (2, 1)
            ("_2", _rect(512, 256, 768, 512)),  # ... minus (2, 1)
            ("Tumor", _rect(0, 512, 256, 570)),  # 23 % of tile (0, 2): in
            ("_1", _rect(1024, 0, 1100, 40)),  # 76 x 40 px of the 76 x 256 edge tile (4, 0): out
            ("_1", [(10, 10), (20, 20)]),  # two points: no area, skipped
        ],
    )
    ids = tt.stage_camelyon16(tmp_path / "src", tmp_path / "pub", tmp_path / "priv", None)
    assert ids == ["case_0001", "case_0002"]
    ref = json.loads((tmp_path / "priv" / "case_0001" / "reference.json").read_text())
    assert (ref["columns"], ref["rows"]) == (5, 4)
    assert sorted(map(tuple, ref["tiles"])) == [(0, 2), (1, 1)]
    assert (
        json.loads((tmp_path / "priv" / "case_0002" / "reference.json").read_text())["tiles"] == []
    )
    names = [str(p.relative_to(tmp_path / "pub")).lower() for p in (tmp_path / "pub").rglob("*")]
    assert not any("camelyon" in n or "tumor" in n or "normal" in n for n in names)
    staged = tmp_path / "pub" / "case_0001" / "slide.tif"
    assert staged.read_bytes() == (root / "images" / "tumor_001.tif").read_bytes()
    assert openslide.OpenSlide(str(staged)).level_count > 1
    assert tt.stage_camelyon16(tmp_path / "src", tmp_path / "p2", tmp_path / "q2", 1) == [
        "case_0001"
    ]


def test_stager_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no CAMELYON16/images/ folder"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    root = tmp_path / "CAMELYON16"
    _slide(root / "images" / "tumor_001.tif", 512, 512)
    with pytest.raises(ValueError, match=r"tumor_001\.xml: missing"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    xml = root / "annotations" / "tumor_001.xml"
    _xml(xml, [("Lymphocytes", _rect(0, 0, 10, 10))])
    with pytest.raises(
        ValueError, match=r"tumor_001\.xml: annotation 'A0' has PartOfGroup='Lymphocytes'"
    ):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    _xml(xml, [("_0", [(0, 0), (1, "x"), (2, 2)])])
    with pytest.raises(ValueError, match="is not numeric"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    _xml(xml, [("_2", _rect(0, 0, 10, 10))])
    with pytest.raises(ValueError, match="no tumour polygon"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    xml.write_text("<ASAP_Annotations><Annotations>")
    with pytest.raises(ValueError, match="not valid XML"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    xml.unlink()
    (root / "images" / "tumor_001.tif").write_bytes(b"not a tiff")
    with pytest.raises(ValueError, match=r"tumor_001\.tif: not a readable TIFF"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
    (root / "images" / "tumor_001.tif").unlink()
    _slide(root / "images" / "normal_001.tif", 512, 512)
    _xml(root / "annotations" / "normal_001.xml", [("_0", _rect(0, 0, 10, 10))])
    with pytest.raises(ValueError, match="a normal slide should have no tumour annotation"):
        tt.stage_camelyon16(tmp_path, tmp_path / "p", tmp_path / "q", None)
