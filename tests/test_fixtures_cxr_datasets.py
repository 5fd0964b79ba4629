"""Stager tests for the chest X-ray tasks, on tiny trees in each dataset's official layout.

Every tree is written in the real formats (JPEG and PNG images, gzipped and plain CSV,
DICOM with MONOCHROME1 and a VOI window, MetaImage) and the tests check what the stagers
promise: opaque case ids in the dataset's own order, the FINDINGS section (not the
impression) as the private reference, nothing of it in public/, the class subset and box
geometry of the detection sets, and errors that name the offending file, row or column.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from PIL import Image

from pytest_automedbench.fixtures import cxr_datasets as cd
from pytest_automedbench.fixtures.registry import get_stager
from pytest_automedbench.fixtures.staging import case_ids_of

from .data_checks import write_dicom

#: Digital X-ray image storage (for presentation).
DX_STORAGE = "1.2.840.10008.5.1.4.1.1.1.1"


def _csv(path: Path, header: list[str], rows: list[list[object]], gz: bool = False) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = buffer.getvalue().encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def _image(
    path: Path, value: int, size: tuple[int, int] = (40, 32), fmt: str | None = None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full(size[::-1], value, dtype=np.uint8)
    pixels[5:15, 5:15] = 255 - value  # some structure, so nothing is constant
    Image.fromarray(pixels).save(path, format=fmt)


def _gray(path: Path) -> npt.NDArray[np.uint8]:
    with Image.open(path) as im:
        assert im.format == "PNG" and im.mode == "L"
        return np.asarray(im)


def _report(findings: str | None, impression: str = "No acute cardiopulmonary process.") -> str:
    parts = [
        "                                 FINAL REPORT",
        " EXAMINATION:  CHEST (PA AND LAT)",
        "",
        " INDICATION:  ___ with cough.",
        "",
    ]
    if findings is not None:
        parts += [" FINDINGS: ", " ", f" {findings[:40]}", f" {findings[40:]}", ""]
    parts += [" IMPRESSION: ", " ", f" {impression}", ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- registry


def test_stagers_are_registered() -> None:
    for name, dirname, credentialed in (
        ("mimic-cxr", "mimic-cxr-jpg", True),
        ("iu-xray", "iu-xray", False),
        ("chexpert-plus", "chexpert-plus", True),
        ("vindr-cxr", "vindr-cxr", True),
        ("node21", "node21", False),
    ):
        stager = get_stager(name)
        assert stager.dirname == dirname and stager.credentialed is credentialed
        assert stager.source and stager.access


def test_findings_section_is_cut_at_the_next_header() -> None:
    text = _report(
        "The lungs are clear. No pleural effusion or pneumothorax. Heart size is normal."
    )
    assert (
        cd.extract_findings(text)
        == "The lungs are clear. No pleural effusion or pneumothorax. Heart size is normal."
    )
    assert cd.extract_findings(_report(None)) == ""


# --------------------------------------------------------------------------- MIMIC-CXR


def _mimic_tree(root: Path) -> None:
    # (subject, study, [(dicom_id, view, split)], findings or None)
    studies = [
        (
            10000032,
            50414267,
            [("d1", "PA", "test"), ("d2", "LATERAL", "test")],
            "The lungs are clear. No pleural effusion or pneumothorax.",
        ),
        (
            10000032,
            53189527,
            [("d3", "AP", "test")],
            "Small left pleural effusion. Heart size is normal.",
        ),
        (10000033, 50000001, [("d4", "PA", "test")], None),  # impression only: skipped
        (
            10000034,
            50000002,
            [("d5", "LATERAL", "test")],
            "Only a lateral view was obtained here.",
        ),  # no frontal
        (10000035, 50000003, [("d6", "PA", "train")], "Training study, never staged."),
    ]
    meta, split = [], []
    for subject, study, images, findings in studies:
        folder = root / "files" / f"p{str(subject)[:2]}" / f"p{subject}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{study}.txt").write_text(_report(findings), encoding="utf-8")
        for dicom_id, view, part in images:
            _image(folder / f"s{study}" / f"{dicom_id}.jpg", 60 + len(meta) * 10, fmt="JPEG")
            meta.append([dicom_id, subject, study, "CHEST (PA AND LAT)", view, 32, 40])
            split.append([dicom_id, study, subject, part])
    header = [
        "dicom_id",
        "subject_id",
        "study_id",
        "PerformedProcedureStepDescription",
        "ViewPosition",
        "Rows",
        "Columns",
    ]
    _csv(root / "mimic-cxr-2.0.0-metadata.csv.gz", header, meta, gz=True)
    _csv(
        root / "mimic-cxr-2.0.0-split.csv.gz",
        ["dicom_id", "study_id", "subject_id", "split"],
        split,
        gz=True,
    )


def test_mimic_stager_keeps_test_studies_with_findings(tmp_path: Path) -> None:
    src, out = tmp_path / "mimic", tmp_path / "out"
    _mimic_tree(src)
    ids = cd.stage_mimic_cxr(src, out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"] == case_ids_of(out, "reports")
    first, second = out / "public" / "case_0001", out / "public" / "case_0002"
    assert sorted(p.name for p in first.iterdir()) == ["frontal.png", "lateral.png", "meta.json"]
    assert json.loads((first / "meta.json").read_text()) == {
        "views": ["frontal", "lateral"],
        "view_position": "PA",
    }
    assert json.loads((second / "meta.json").read_text()) == {
        "views": ["frontal"],
        "view_position": "AP",
    }
    assert _gray(first / "frontal.png").shape == (32, 40)
    assert (
        out / "private" / "case_0001.txt"
    ).read_text() == "The lungs are clear. No pleural effusion or pneumothorax.\n"
    assert (
        out / "private" / "case_0002.txt"
    ).read_text() == "Small left pleural effusion. Heart size is normal.\n"
    assert not list((out / "public").rglob("*.txt"))
    assert cd.stage_mimic_cxr(
        src, tmp_path / "one" / "public", tmp_path / "one" / "private", 1
    ) == ["case_0001"]


def test_mimic_stager_names_missing_reports_and_columns(tmp_path: Path) -> None:
    src = tmp_path / "mimic"
    _mimic_tree(src)
    report = src / "files" / "p10" / "p10000032" / "s53189527.txt"
    report.unlink()
    with pytest.raises(ValueError, match=re.escape("s53189527.txt: report missing")):
        cd.stage_mimic_cxr(src, tmp_path / "o" / "public", tmp_path / "o" / "private", None)
    _csv(
        src / "mimic-cxr-2.0.0-split.csv.gz",
        ["dicom_id", "study_id", "subject_id"],
        [["d1", 1, 1]],
        gz=True,
    )
    with pytest.raises(ValueError, match=r"split\.csv\.gz: missing column\(s\) split"):
        cd.stage_mimic_cxr(src, tmp_path / "p" / "public", tmp_path / "p" / "private", None)


# --------------------------------------------------------------------------- IU X-Ray


def test_iu_stager_pairs_views_in_uid_order(tmp_path: Path) -> None:
    src, out = tmp_path / "iu", tmp_path / "out"
    images = src / "images" / "images_normalized"
    reports = [
        [
            10,
            "normal",
            "normal",
            "Xray Chest PA and Lateral",
            "cough",
            "None.",
            "The heart is normal in size. The lungs are clear.",
            "No acute disease.",
        ],
        [
            2,
            "Cardiomegaly",
            "Cardiomegaly",
            "Xray Chest PA and Lateral",
            "dyspnea",
            "None.",
            "The heart is enlarged. No pneumothorax or pleural effusion.",
            "Cardiomegaly.",
        ],
        [
            3,
            "normal",
            "normal",
            "Xray Chest PA",
            "",
            "",
            "",
            "Normal chest.",
        ],  # no findings: skipped
    ]
    _csv(
        src / "indiana_reports.csv",
        ["uid", "MeSH", "Problems", "image", "indication", "comparison", "findings", "impression"],
        reports,
    )
    projections = [
        [10, "10_IM-0002-1001.dcm.png", "Frontal"],
        [10, "10_IM-0002-2001.dcm.png", "Lateral"],
        [2, "2_IM-0652-1001.dcm.png", "Frontal"],
        [3, "3_IM-1384-1001.dcm.png", "Frontal"],
    ]
    _csv(src / "indiana_projections.csv", ["uid", "filename", "projection"], projections)
    for n, (_uid, name, _view) in enumerate(projections):
        _image(images / name, 40 + 30 * n)
    ids = cd.stage_iu_xray(src, out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"]
    # uid 2 comes before uid 10 (numeric order), and has no lateral view.
    assert (out / "private" / "case_0001.txt").read_text().startswith("The heart is enlarged.")
    assert json.loads((out / "public" / "case_0001" / "meta.json").read_text())["views"] == [
        "frontal"
    ]
    assert json.loads((out / "public" / "case_0002" / "meta.json").read_text())["views"] == [
        "frontal",
        "lateral",
    ]
    assert np.array_equal(
        _gray(out / "public" / "case_0002" / "lateral.png"),
        _gray(images / "10_IM-0002-2001.dcm.png"),
    )
    (images / "2_IM-0652-1001.dcm.png").unlink()
    with pytest.raises(
        ValueError,
        match=re.escape("2_IM-0652-1001.dcm.png: listed in indiana_projections.csv but missing"),
    ):
        cd.stage_iu_xray(src, tmp_path / "x" / "public", tmp_path / "x" / "private", None)


# --------------------------------------------------------------------------- CheXpert Plus


def test_chexpert_plus_stager_takes_one_frontal_per_study(tmp_path: Path) -> None:
    src, out = tmp_path / "chexpert", tmp_path / "out"
    header = [
        "path_to_image",
        "path_to_dcm",
        "frontal_lateral",
        "ap_pa",
        "deid_patient_id",
        "section_findings",
        "section_impression",
        "split",
    ]
    rows = [
        [
            "valid/patient00002/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "p2",
            "Endotracheal tube in place. Small left effusion.",
            "Effusion.",
            "valid",
        ],
        [
            "valid/patient00002/study1/view2_lateral.jpg",
            "",
            "Lateral",
            "",
            "p2",
            "Endotracheal tube in place. Small left effusion.",
            "Effusion.",
            "valid",
        ],
        [
            "valid/patient00001/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "PA",
            "p1",
            "The lungs are clear.",
            "Normal.",
            "valid",
        ],
        [
            "valid/patient00003/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "p3",
            "",
            "Stable.",
            "valid",
        ],  # no findings
        [
            "train/patient00004/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "p4",
            "Train study.",
            "",
            "train",
        ],
    ]
    _csv(src / "df_chexpert_plus_240401.csv", header, rows)
    for n, row in enumerate(rows):
        _image(src / "PNG" / Path(row[0]).with_suffix(".png"), 30 + 40 * n)
    ids = cd.stage_chexpert_plus(src, out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"]
    assert (out / "private" / "case_0001.txt").read_text() == "The lungs are clear.\n"
    meta = json.loads((out / "public" / "case_0002" / "meta.json").read_text())
    assert meta == {"views": ["frontal"], "view_position": "AP"}
    assert np.array_equal(
        _gray(out / "public" / "case_0002" / "frontal.png"),
        _gray(src / "PNG" / "valid" / "patient00002" / "study1" / "view1_frontal.png"),
    )
    (src / "PNG" / "valid" / "patient00001" / "study1" / "view1_frontal.png").unlink()
    with pytest.raises(
        ValueError, match=re.escape("patient00001/study1/view1_frontal.jpg not found")
    ):
        cd.stage_chexpert_plus(src, tmp_path / "x" / "public", tmp_path / "x" / "private", None)


# --------------------------------------------------------------------------- VinDr-CXR


def _dicom(
    path: Path,
    pixels: npt.NDArray[np.uint16],
    *,
    monochrome1: bool,
    window: tuple[float, float] | None,
) -> None:
    center, width = window if window is not None else (None, None)
    photometric = "MONOCHROME1" if monochrome1 else "MONOCHROME2"
    write_dicom(
        path, DX_STORAGE, "DX", pixels, 12, photometric, WindowCenter=center, WindowWidth=width
    )


def test_vindr_stager_converts_dicom_and_keeps_six_classes(tmp_path: Path) -> None:
    src, out = tmp_path / "vindr", tmp_path / "out"
    pixels = np.full((60, 80), 3000, dtype=np.uint16)
    pixels[10:30, 10:30] = 500  # low value: bright once MONOCHROME1 is inverted
    _dicom(src / "test" / "bbb.dicom", pixels, monochrome1=True, window=(1800.0, 3000.0))
    _dicom(src / "test" / "aaa.dicom", pixels, monochrome1=False, window=None)
    rows = [
        ["bbb", "Cardiomegaly", 20.5, 30, 70, 55],
        ["bbb", "Nodule/Mass", 12, 12, 28, 28],
        ["bbb", "Pleural thickening", 1, 1, 10, 10],  # not in the task's subset
        ["aaa", "No finding", "", "", "", ""],
    ]
    _csv(
        src / "annotations" / "annotations_test.csv",
        ["image_id", "class_name", "x_min", "y_min", "x_max", "y_max"],
        rows,
    )
    ids = cd.stage_vindr_cxr(src, out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"] == case_ids_of(out, "coco")
    coco = json.loads((out / "private" / "annotations.json").read_text())
    assert [c["name"] for c in coco["categories"]] == list(cd.VINDR_CATEGORIES)
    names = {c["id"]: c["name"] for c in coco["categories"]}
    boxes = {(a["image_id"], names[a["category_id"]]): a["bbox"] for a in coco["annotations"]}
    assert boxes == {
        (2, "Cardiomegaly"): [20.5, 30.0, 49.5, 25.0],
        (2, "Nodule/Mass"): [12.0, 12.0, 16.0, 16.0],
    }
    inverted = _gray(out / "public" / "images" / "case_0002.png")
    plain = _gray(out / "public" / "images" / "case_0001.png")
    assert inverted.shape == (60, 80)
    assert inverted[20, 20] > inverted[50, 70]  # MONOCHROME1: low values are bright
    assert plain[20, 20] < plain[50, 70]
    public = json.loads((out / "public" / "images.json").read_text())
    assert "annotations" not in public and public["images"] == coco["images"]


def test_vindr_stager_refuses_bad_boxes_and_missing_images(tmp_path: Path) -> None:
    src = tmp_path / "vindr"
    _dicom(
        src / "test" / "ccc.dicom",
        np.full((20, 20), 100, dtype=np.uint16),
        monochrome1=False,
        window=None,
    )
    header = ["image_id", "class_name", "x_min", "y_min", "x_max", "y_max"]
    _csv(
        src / "annotations" / "annotations_test.csv",
        header,
        [["ccc", "Cardiomegaly", 15, 5, 10, 9]],
    )
    with pytest.raises(ValueError, match=r"annotations_test.csv: row 2: empty or invalid box"):
        cd.stage_vindr_cxr(src, tmp_path / "o" / "public", tmp_path / "o" / "private", None)
    _csv(
        src / "annotations" / "annotations_test.csv", header, [["ddd", "Cardiomegaly", 1, 1, 5, 5]]
    )
    with pytest.raises(
        ValueError, match=re.escape("ddd.dicom: image listed in annotations_test.csv is missing")
    ):
        cd.stage_vindr_cxr(src, tmp_path / "p" / "public", tmp_path / "p" / "private", None)
    (src / "test" / "ddd.dicom").write_bytes(b"not a dicom")
    with pytest.raises(ValueError, match=re.escape("ddd.dicom: not a readable DICOM image")):
        cd.stage_vindr_cxr(src, tmp_path / "q" / "public", tmp_path / "q" / "private", None)


# --------------------------------------------------------------------------- NODE21


def _mha(path: Path, values: npt.NDArray[np.float32]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(sitk.GetImageFromArray(values), str(path))


def test_node21_stager_reads_metaimages_and_nodule_rows(tmp_path: Path) -> None:
    src, out = tmp_path / "node21", tmp_path / "out"
    base = src / "cxr_images" / "proccessed_data"
    image = np.zeros((64, 48), dtype=np.float32)
    image[40:50, 20:30] = 4000.0  # a bright blob where the nodule row says
    _mha(base / "images" / "n0002.mha", image)
    _mha(
        base / "images" / "c0001.mha", np.linspace(0, 1, 64 * 48, dtype=np.float32).reshape(64, 48)
    )
    rows = [
        [0, "n0002.mha", 20, 40, 10, 10, 1],
        [1, "n0002.mha", 2, 3, 5, 6, 1],
        [2, "c0001.mha", 0, 0, 0, 0, 0],
    ]
    _csv(base / "metadata.csv", ["", "img_name", "x", "y", "width", "height", "label"], rows)
    ids = cd.stage_node21(src, out / "public", out / "private", None)
    assert ids == ["case_0001", "case_0002"] == case_ids_of(out, "coco")
    coco = json.loads((out / "private" / "annotations.json").read_text())
    assert [c["name"] for c in coco["categories"]] == ["nodule"]
    by_image = {(a["image_id"], tuple(a["bbox"])) for a in coco["annotations"]}
    assert by_image == {(2, (20.0, 40.0, 10.0, 10.0)), (2, (2.0, 3.0, 5.0, 6.0))}
    staged = _gray(out / "public" / "images" / "case_0002.png")
    assert staged.shape == (64, 48) and staged[45, 25] == 255 and staged[5, 5] == 0
    _csv(
        base / "metadata.csv",
        ["", "img_name", "x", "y", "width", "height", "label"],
        [[0, "c0001.mha", 0, 0, 0, 0, "yes"]],
    )
    with pytest.raises(ValueError, match=r"metadata.csv: row 2: label 'yes' is not 0 or 1"):
        cd.stage_node21(src, tmp_path / "x" / "public", tmp_path / "x" / "private", None)
    with pytest.raises(ValueError, match="expected the NODE21 layout"):
        cd.stage_node21(
            tmp_path / "empty", tmp_path / "y" / "public", tmp_path / "y" / "private", None
        )
