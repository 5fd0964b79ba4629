"""The malformed-submission corpus: hostile inputs for all five tracks, built programmatically.

Every :class:`Malformed` entry names one hostile input, how to build it, and what the
evaluator must answer: the attacked case's status and a substring of the problem it
reports. Nothing is stored as a binary fixture: gzip bombs, 10 GB sparse files, FIFOs and
symbolic links are made at test time, in real formats (NIfTI through SimpleITK/nibabel or
byte by byte, ``.npy`` through numpy or byte by byte, JSON and text as bytes).

Scopes:

* ``case``: the input belongs to one case. All such entries of a track share one
  submission (each attacks its own case) next to two perfect cases, so a single evaluator
  run shows every bad case scored 0 with its reason while the others still score.
* ``submission``: an oddity of the submission folder (stray names, links); it shares that
  run too, is reported at the top of the format report, and blames no case.
* ``file``: the single submission file of VQA or detection is itself unusable; the entry
  gets a run of its own, in which every case fails with the same reason.

:func:`plan_runs` groups the corpus into runs, :func:`build_run` writes one run's spec,
references and submission to disk.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import nibabel as _nib
import numpy as np
import SimpleITK as _sitk

from pytest_automedbench.evaluators.schema import (
    DetectionSpec,
    EnhancementSpec,
    EvalSpec,
    HealthAgentSpec,
    ReportSpec,
    SegmentationRegion,
    SegmentationSpec,
    VqaSpec,
)

# nibabel and SimpleITK are unannotated; Any keeps the rest of this module checked.
nib: Any = _nib
sitk: Any = _sitk

Track = Literal["segmentation", "enhancement", "report", "vqa", "detection", "healthagentbench"]
TRACKS: tuple[Track, ...] = (
    "segmentation",
    "enhancement",
    "report",
    "vqa",
    "detection",
    "healthagentbench",
)
Scope = Literal["case", "submission", "file"]

#: A "10 GB" file: sparse, so it costs nothing on disk, and it must never be read.
SPARSE_BYTES = 10 * 1024**3
#: What a gzip bomb inflates to.
BOMB_BYTES = 1024**3
_BOMB_MEMBER = 64 * 1024**2


@dataclass
class Ctx:
    """What a builder may touch for its entry."""

    submission: Path
    references: Path
    #: The attacked case (case id, question id or image stem); None outside case scope.
    case_id: str | None = None
    #: Where the case's output belongs (per-case tracks) or the single submission file.
    out: Path | None = None
    #: Raw JSON pieces of the single submission file: ``"qid": value`` pairs (VQA) or
    #: entry objects (detection). Builders at case scope add theirs here.
    fragments: list[str] = field(default_factory=list)
    #: Detection: the attacked image's id.
    image_id: int | None = None

    @property
    def output(self) -> Path:
        assert self.out is not None
        self.out.parent.mkdir(parents=True, exist_ok=True)
        return self.out


Builder = Callable[[Ctx], None]


@dataclass(frozen=True)
class Malformed:
    """One hostile input and the verdict the evaluator owes it."""

    name: str
    track: Track
    build: Builder
    #: Must appear in the attacked case's problems (file scope: in the format report).
    reason: str
    status: Literal["invalid", "missing"] = "invalid"
    scope: Scope = "case"
    #: VQA: the attacked question's reference entry (default: closed, answer "yes").
    question: Mapping[str, Any] | None = None
    #: HealthAgentBench: the kind of deliverable attacked (one run per kind).
    kind: str | None = None

    @property
    def id(self) -> str:
        if self.kind is not None:
            return f"{self.track}/{self.kind}/{self.name}"
        return f"{self.track}/{self.name}"

    @property
    def bundle(self) -> str:
        """The run that scores this entry with the others of its track (or kind)."""
        return self.track if self.kind is None else f"{self.track}/{self.kind}"


# --------------------------------------------------------------------------- helpers


@functools.cache
def _zero_member() -> bytes:
    return gzip.compress(bytes(_BOMB_MEMBER), compresslevel=9)


def zeros_gzip(n_bytes: int) -> bytes:
    """``n_bytes`` zeros as concatenated gzip members: about 1 KB per MB inflated."""
    full, rest = divmod(n_bytes, _BOMB_MEMBER)
    return _zero_member() * full + (gzip.compress(bytes(rest), 9) if rest else b"")


def sparse(path: Path, n_bytes: int = SPARSE_BYTES) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(n_bytes)


def fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def write_bytes(data: bytes) -> Builder:
    def build(ctx: Ctx) -> None:
        ctx.output.write_bytes(data)

    return build


def nothing(ctx: Ctx) -> None:
    """The output is simply not written."""


def make_sparse(ctx: Ctx) -> None:
    sparse(ctx.output)


def make_fifo(ctx: Ctx) -> None:
    fifo(ctx.output)


def make_directory(ctx: Ctx) -> None:
    ctx.output.mkdir()


def link_to(target: Callable[[Ctx], Path]) -> Builder:
    def build(ctx: Ctx) -> None:
        ctx.output.symlink_to(target(ctx))

    return build


def stray(name: str, data: bytes = b"x") -> Builder:
    def build(ctx: Ctx) -> None:
        (ctx.submission / name).write_bytes(data)

    return build


@dataclass(frozen=True)
class KindEntries:
    """Makes the entries of one HealthAgentBench kind: ``entry(name, build, reason[,
    status])`` is a ``healthagentbench`` entry of that kind, whose deliverable lies at
    ``output_pattern`` (its file name starts the reasons of :meth:`file_attacks`)."""

    kind: str
    output_pattern: str = ""

    def __call__(
        self,
        name: str,
        build: Builder,
        reason: str,
        status: Literal["invalid", "missing"] = "invalid",
    ) -> Malformed:
        return Malformed(name, "healthagentbench", build, reason, status=status, kind=self.kind)

    def json_object_attacks(self, bad_byte: bytes, a_list: bytes) -> list[Malformed]:
        """What every JSON-object deliverable meets alike: an empty file, the content
        ``bad_byte`` (not UTF-8) and ``a_list`` (a JSON list where the object belongs)."""
        return [
            self("empty-file", write_bytes(b""), "not valid JSON"),
            self("not-utf8", write_bytes(bad_byte), "not UTF-8"),
            self("a-list", write_bytes(a_list), "must be a JSON object"),
        ]

    def file_attacks(self, reference: str | Callable[[Ctx], Path]) -> list[Malformed]:
        """What every single-file deliverable meets alike: no file, a 10 GB sparse file, a
        FIFO, a directory, a link to the reference file (``reference``: its name in the
        case's reference folder, or where it lies)."""

        def path(ctx: Ctx) -> Path:
            return ctx.references / str(ctx.case_id) / str(reference)

        output = Path(self.output_pattern).name
        at = f"{output}: " if output else ""
        return [
            self("missing", nothing, f"{at}missing file", status="missing"),
            self("huge-sparse", make_sparse, f"{at}file is {SPARSE_BYTES} bytes, over the"),
            self("fifo", make_fifo, f"{at}is a FIFO, not a regular file"),
            self("directory", make_directory, f"{at}not a regular file"),
            self(
                "symlink-to-reference",
                link_to(reference if callable(reference) else path),
                f"{at}is a symbolic link",
            ),
        ]


def top_link_to_references(ctx: Ctx) -> None:
    (ctx.submission / "notes").symlink_to(ctx.references, target_is_directory=True)


def unknown_folder(ctx: Ctx) -> None:
    (ctx.submission / "case_9999").mkdir()


# --------------------------------------------------------------------------- segmentation

SEG_SHAPE = (16, 32, 32)  # (z, y, x); 16384 voxels: the size bound is 20 * 8 bytes each
SEG_SPACING = (0.9, 0.8, 2.5)
SEG_ORIGIN = (-50.0, 20.0, 300.0)
SEG_DIRECTION = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)


def seg_label_map() -> np.ndarray:
    labels = np.zeros(SEG_SHAPE, dtype=np.uint8)
    labels[4:12, 8:24, 6:26] = 1
    labels[6:10, 12:18, 10:16] = 2
    return labels


def write_seg(path: Path, array_zyx: np.ndarray, **geometry: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = sitk.GetImageFromArray(array_zyx)
    image.SetSpacing(geometry.get("spacing", SEG_SPACING))
    image.SetOrigin(geometry.get("origin", SEG_ORIGIN))
    image.SetDirection(geometry.get("direction", SEG_DIRECTION))
    sitk.WriteImage(image, str(path), True)


def seg_reference_path(ctx: Ctx) -> Path:
    assert ctx.case_id is not None
    return ctx.references / ctx.case_id / "label.nii.gz"


def _nib_like_reference(ctx: Ctx, data_xyz: np.ndarray, **header: Any) -> None:
    """Write with nibabel reusing the reference's affine, as a typical agent does."""
    ref: Any = nib.load(seg_reference_path(ctx))
    image = nib.Nifti1Image(data_xyz, ref.affine)
    for key, value in header.items():
        image.header[key] = value
    nib.save(image, ctx.output)


def seg_values(values: Mapping[tuple[int, int, int], float], dtype: Any = np.float32) -> Builder:
    def build(ctx: Ctx) -> None:
        data = seg_label_map().T.astype(dtype)
        for index, value in values.items():
            data[index] = value
        _nib_like_reference(ctx, data)

    return build


def seg_scaled(ctx: Ctx) -> None:
    # int16 voxels with scl_slope 0.5: nibabel reads 0.5, 1.0, ... -- fractional labels.
    _nib_like_reference(
        ctx, seg_label_map().T.astype(np.int16), scl_slope=np.float32(0.5), scl_inter=0.0
    )


def seg_dtype(dtype: Any) -> Builder:
    def build(ctx: Ctx) -> None:
        _nib_like_reference(ctx, seg_label_map().T.astype(dtype))

    return build


def seg_ndim(shape: tuple[int, ...]) -> Builder:
    def build(ctx: Ctx) -> None:
        ref: Any = nib.load(seg_reference_path(ctx))
        nib.save(nib.Nifti1Image(np.zeros(shape, np.uint8), ref.affine), ctx.output)

    return build


def seg_geometry(**geometry: Any) -> Builder:
    def build(ctx: Ctx) -> None:
        write_seg(ctx.output, seg_label_map(), **geometry)

    return build


def seg_shape(ctx: Ctx) -> None:
    write_seg(ctx.output, seg_label_map()[:, :, :31])


def _seg_valid_bytes(ctx: Ctx) -> bytes:
    """A perfect prediction's .nii.gz bytes, to be damaged."""
    scratch = ctx.output.with_name(".scratch.nii.gz")
    write_seg(scratch, seg_label_map())
    data = scratch.read_bytes()
    scratch.unlink()
    return data


def seg_cut_gzip(ctx: Ctx) -> None:
    data = _seg_valid_bytes(ctx)
    ctx.output.write_bytes(data[:-30])  # an agent killed mid-write: the header is intact


def seg_short_payload(ctx: Ctx) -> None:
    raw = gzip.decompress(_seg_valid_bytes(ctx))
    ctx.output.write_bytes(gzip.compress(raw[:-100]))  # a complete stream, too few voxels


def nifti_header(
    ctx: Ctx,
    shape: tuple[int, ...] = SEG_SHAPE[::-1],
    endianness: str = "<",
    vox_offset: float = 352,
    kind: Any = None,
) -> bytes:
    """A header byte for byte, with the reference's geometry: only its size fields lie."""
    header = (kind or nib.Nifti1Header)(endianness=endianness)
    header.set_data_shape(shape)
    header.set_data_dtype(np.uint8)
    reference: Any = nib.load(seg_reference_path(ctx))
    header.set_qform(reference.affine, code=1)
    header.set_sform(reference.affine, code=1)
    header["vox_offset"] = vox_offset
    block: bytes = header.binaryblock
    return block


def seg_vox_offset_bomb(ctx: Ctx) -> None:
    # The right shape, but the voxels "start" after 1 GiB of zeros.
    head = nifti_header(ctx, vox_offset=352 + BOMB_BYTES) + bytes(4)
    ctx.output.write_bytes(gzip.compress(head) + zeros_gzip(BOMB_BYTES + 16384))


def seg_huge_volume_bomb(ctx: Ctx) -> None:
    # A header claiming a 2048 x 2048 x 256 volume, and the 1 GiB to go with it.
    head = nifti_header(ctx, shape=(2048, 2048, 256)) + bytes(4)
    ctx.output.write_bytes(gzip.compress(head) + zeros_gzip(BOMB_BYTES))


def extension_bomb(endianness: Literal["little", "big"], esize: int) -> Builder:
    def build(ctx: Ctx) -> None:
        # vox_offset 0: nibabel then reads extensions to the end of the stream.
        head = nifti_header(ctx, endianness="<" if endianness == "little" else ">", vox_offset=0)
        ext = b"\x01\x00\x00\x00" + esize.to_bytes(4, endianness, signed=True) + bytes(4)
        ctx.output.write_bytes(gzip.compress(head + ext) + zeros_gzip(BOMB_BYTES))

    return build


def seg_nifti2_offset_bomb(ctx: Ctx) -> None:
    head = nifti_header(ctx, vox_offset=1 << 40, kind=nib.Nifti2Header) + bytes(4)
    ctx.output.write_bytes(gzip.compress(head) + zeros_gzip(BOMB_BYTES))


def seg_png(ctx: Ctx) -> None:
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(ctx.output, format="PNG")


SEGMENTATION: list[Malformed] = [
    Malformed("missing", "segmentation", nothing, "missing file", status="missing"),
    Malformed(
        "garbage",
        "segmentation",
        write_bytes(b"this is not a NIfTI file" * 20),
        "unreadable or not a NIfTI",
    ),
    Malformed(
        "gzipped-noise",
        "segmentation",
        write_bytes(gzip.compress(np.random.default_rng(0).bytes(4096))),
        "unreadable or not a NIfTI",
    ),
    Malformed("png-named-nifti", "segmentation", seg_png, "unreadable or not a NIfTI"),
    Malformed("cut-gzip-stream", "segmentation", seg_cut_gzip, "voxel data unreadable"),
    Malformed("short-payload", "segmentation", seg_short_payload, "voxel data unreadable"),
    Malformed(
        "gzip-bomb-huge-volume",
        "segmentation",
        seg_huge_volume_bomb,
        "header declares 1073741824 bytes of voxels, over 2621440",
    ),
    Malformed(
        "gzip-bomb-vox-offset",
        "segmentation",
        seg_vox_offset_bomb,
        "header puts the voxels at byte 1.07374e+09",
    ),
    Malformed(
        "gzip-bomb-nifti2-vox-offset",
        "segmentation",
        seg_nifti2_offset_bomb,
        "header puts the voxels at byte 1.09951e+12",
    ),
    Malformed(
        "gzip-bomb-extension",
        "segmentation",
        extension_bomb("little", BOMB_BYTES),
        "header extension at byte 352 declares 1073741824 bytes",
    ),
    Malformed(
        "gzip-bomb-extension-big-endian",
        "segmentation",
        extension_bomb("big", BOMB_BYTES),
        "header extension at byte 352 declares 1073741824 bytes",
    ),
    Malformed(
        "negative-extension-size",  # nibabel would read(-16): the whole stream
        "segmentation",
        extension_bomb("little", -8),
        "header extension at byte 352 declares -8 bytes",
    ),
    Malformed(
        "sparse-10GB",
        "segmentation",
        make_sparse,
        f"file is {SPARSE_BYTES} bytes, over the 2621440-byte limit; not read",
    ),
    Malformed(
        "symlink-to-reference",
        "segmentation",
        link_to(seg_reference_path),
        "is a symbolic link; symlinks are not followed",
    ),
    Malformed(
        "symlink-to-dev-zero",
        "segmentation",
        link_to(lambda ctx: Path("/dev/zero")),
        "is a symbolic link; symlinks are not followed",
    ),
    Malformed("directory", "segmentation", make_directory, "not a regular file"),
    Malformed("fifo", "segmentation", make_fifo, "not a regular file"),
    Malformed(
        "wrong-shape",
        "segmentation",
        seg_shape,
        "shape (31, 32, 16) does not match the reference shape (32, 32, 16)",
    ),
    Malformed(
        "wrong-spacing",
        "segmentation",
        seg_geometry(spacing=(0.9, 0.8, 3.0)),
        "differs from the reference spacing",
    ),
    Malformed(
        "wrong-origin",
        "segmentation",
        seg_geometry(origin=(-50.0, 20.0, 310.0)),
        "differs from the reference origin",
    ),
    Malformed(
        "wrong-direction",
        "segmentation",
        seg_geometry(direction=(0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0)),
        "differs from the reference direction",
    ),
    Malformed(
        "nan", "segmentation", seg_values({(0, 0, 0): np.nan}), "1 NaN and 0 infinite voxel values"
    ),
    Malformed(
        "inf", "segmentation", seg_values({(3, 3, 3): np.inf}), "0 NaN and 1 infinite voxel values"
    ),
    Malformed(
        "non-integer-labels",
        "segmentation",
        seg_values({(0, 0, 0): 0.5, (1, 1, 1): 1.25}),
        "non-integer labels, e.g. [0.5, 1.25]",
    ),
    Malformed("scaled-to-fractions", "segmentation", seg_scaled, "non-integer labels"),
    Malformed(
        "unknown-label",
        "segmentation",
        seg_values({(0, 0, 0): 7}, np.uint8),
        "unknown label values [7]; allowed are [0, 1, 2]",
    ),
    Malformed(
        "negative-label",
        "segmentation",
        seg_values({(0, 0, 0): -1}, np.int16),
        "negative label values [-1]",
    ),
    Malformed(
        "wrong-dtype-complex",
        "segmentation",
        seg_dtype(np.complex64),
        "unsupported voxel type complex64; expected integer labels",
    ),
    Malformed("4-D", "segmentation", seg_ndim((32, 32, 16, 2)), "image is 4-D"),
    Malformed("2-D", "segmentation", seg_ndim((32, 32)), "image is 2-D"),
    Malformed(
        "path-traversal-name",
        "segmentation",
        stray("..\\..\\references\\case_0001\\label.nii.gz"),
        "..\\..\\references\\case_0001\\label.nii.gz: stray file",
        scope="submission",
    ),
    Malformed(
        "newline-in-name",
        "segmentation",
        stray("case_0001.nii.gz\nok"),
        "case_0001.nii.gz\nok: stray file",
        scope="submission",
    ),
    Malformed(
        "top-level-symlink",
        "segmentation",
        top_link_to_references,
        "notes: symbolic link in the submission; it is not followed",
        scope="submission",
    ),
    Malformed(
        "unknown-folder",
        "segmentation",
        unknown_folder,
        "case_9999/: unknown folder",
        scope="submission",
    ),
]


# --------------------------------------------------------------------------- enhancement

ENH_SHAPE = (32, 32)


def enh_image() -> np.ndarray:
    yy, xx = np.mgrid[0 : ENH_SHAPE[0], 0 : ENH_SHAPE[1]].astype(np.float64)
    image = np.exp(-((yy - 12) ** 2 + (xx - 18) ** 2) / 60.0) + 0.3 * (yy > 20)
    scaled: np.ndarray = 1000.0 * (image - image.min()) / (image.max() - image.min())
    return scaled


def npy(array: np.ndarray, *, allow_pickle: bool = False) -> Builder:
    def build(ctx: Ctx) -> None:
        np.save(ctx.output, array, allow_pickle=allow_pickle)

    return build


def npy_header(header: Mapping[str, Any], version: tuple[int, int] = (1, 0)) -> bytes:
    """A .npy header written by hand (numpy refuses to write the hostile ones)."""
    text = repr(dict(header)).encode("latin-1")
    prefix = b"\x93NUMPY" + bytes(version)
    size_bytes = 2 if version == (1, 0) else 4
    total = len(prefix) + size_bytes + len(text) + 1
    text += b" " * (-total % 64) + b"\n"
    return prefix + len(text).to_bytes(size_bytes, "little") + text


def enh_with(values: Mapping[tuple[int, int], float]) -> Builder:
    image = enh_image()
    for index, value in values.items():
        image[index] = value
    return npy(image)


def enh_truncated(ctx: Ctx) -> None:
    np.save(ctx.output, enh_image())
    ctx.output.write_bytes(ctx.output.read_bytes()[:-100])


def enh_reference_path(ctx: Ctx) -> Path:
    assert ctx.case_id is not None
    return ctx.references / ctx.case_id / "reference.npy"


_STRUCTURED = np.zeros(ENH_SHAPE, dtype=[("re", "<f8"), ("im", "<f8")])

ENHANCEMENT: list[Malformed] = [
    Malformed("missing", "enhancement", nothing, "missing file", status="missing"),
    Malformed(
        "pickled-objects",
        "enhancement",
        npy(np.array([{"exec": "print(1)"}] * 4, dtype=object), allow_pickle=True),
        "holds Python objects (dtype object), a pickled array that is never loaded",
    ),
    Malformed(
        "header-claims-1e24-pixels",
        "enhancement",
        write_bytes(npy_header({"descr": "<f8", "fortran_order": False, "shape": (2**40, 2**40)})),
        "shape (1099511627776, 1099511627776) does not match the reference shape (32, 32)",
    ),
    Malformed(
        "negative-dimension",
        "enhancement",
        write_bytes(npy_header({"descr": "<f8", "fortran_order": False, "shape": (-1, 32)})),
        "negative dimension in the header's shape (-1, 32)",
    ),
    Malformed(
        "npy-version-3",
        "enhancement",
        write_bytes(
            npy_header({"descr": "<f8", "fortran_order": False, "shape": ENH_SHAPE}, (3, 0))
        ),
        "unsupported .npy format version 3.0",
    ),
    Malformed(
        "truncated",
        "enhancement",
        enh_truncated,
        "truncated: the header declares 8192 bytes of pixels, the file holds 8092",
    ),
    Malformed("nan", "enhancement", enh_with({(0, 0): np.nan}), "1 NaN and 0 infinite pixel"),
    Malformed("inf", "enhancement", enh_with({(5, 5): -np.inf}), "0 NaN and 1 infinite pixel"),
    Malformed(
        "implausible-1e300",
        "enhancement",
        enh_with({(1, 1): 1e300}),
        "pixel values up to 1e+300 in magnitude",
    ),
    Malformed(
        "integer-dtype",
        "enhancement",
        npy(enh_image().astype(np.int16)),
        "integer dtype int16; expected a floating-point image",
    ),
    Malformed(
        "boolean-dtype",
        "enhancement",
        npy(enh_image() > 500),
        "boolean dtype bool; expected a floating-point image",
    ),
    Malformed(
        "complex-dtype",
        "enhancement",
        npy(enh_image().astype(np.complex128)),
        "complex dtype complex128; expected a real floating-point image",
    ),
    Malformed("structured-dtype", "enhancement", npy(_STRUCTURED), "structured dtype"),
    Malformed(
        "wrong-shape",
        "enhancement",
        npy(enh_image()[:, :31]),
        "shape (32, 31) does not match the reference shape (32, 32)",
    ),
    Malformed("3-D", "enhancement", npy(np.stack([enh_image()] * 3, axis=-1)), "image is 3-D"),
    Malformed(
        "text-not-npy",
        "enhancement",
        write_bytes(b"0.0 1.0 2.0\n" * 100),
        "unreadable or not a .npy file",
    ),
    Malformed("empty-file", "enhancement", write_bytes(b""), "unreadable or not a .npy file"),
    Malformed(
        "symlink-to-reference",
        "enhancement",
        link_to(enh_reference_path),
        "is a symbolic link; symlinks are not followed",
    ),
    Malformed(
        "sparse-10GB",
        "enhancement",
        make_sparse,
        f"file is {SPARSE_BYTES} bytes, over the 166400-byte limit; not read",
    ),
    Malformed("fifo", "enhancement", make_fifo, "not a regular file"),
    Malformed("directory", "enhancement", make_directory, "not a regular file"),
]


# --------------------------------------------------------------------------- report

REPORT_TEXT = (
    "FINDINGS: The heart size is normal. Small left pleural effusion. No pneumothorax.\n"
    "IMPRESSION: Small left effusion."
)


def report_reference_path(ctx: Ctx) -> Path:
    assert ctx.case_id is not None
    return ctx.references / f"{ctx.case_id}.txt"


REPORT: list[Malformed] = [
    Malformed("missing", "report", nothing, "missing file", status="missing"),
    Malformed(
        "latin-1",
        "report",
        write_bytes("Poumons clairs, pas d'épanchement.".encode("latin-1")),
        "not UTF-8 text (bad byte at offset 22)",
    ),
    Malformed(
        "lone-surrogate",
        "report",
        write_bytes(b"Lungs are clear \xed\xa0\x80 and no effusion."),
        "not UTF-8 text (bad byte at offset 16)",
    ),
    Malformed("empty", "report", write_bytes(b""), "empty report"),
    Malformed("whitespace", "report", write_bytes(b" \n\t\r\n  "), "empty report"),
    Malformed(
        "nul-bytes",
        "report",
        write_bytes(b"The lungs are clear\x00\x00 without effusion."),
        "holds 2 control characters",
    ),
    Malformed(
        "huge-64KiB-plus",
        "report",
        write_bytes(b"The lungs are clear. " * 4000),
        "file is 84000 bytes, over the 65536-byte limit; not read",
    ),
    Malformed(
        "too-many-characters",
        "report",
        write_bytes(b"The lungs are clear. " * 400),
        "8400 characters, over the limit of 8000",
    ),
    Malformed(
        "empty-findings",
        "report",
        write_bytes(b"FINDINGS:\nIMPRESSION: Normal chest radiograph."),
        "the FINDINGS section is empty",
    ),
    Malformed("too-short", "report", write_bytes(b"Lungs clear."), "under the minimum of 20"),
    Malformed(
        "no-letters",
        "report",
        write_bytes(b"12345 67890 12345 67890 !!! ???"),
        "FINDINGS text has 0 letters",
    ),
    Malformed(
        "sparse-10GB",
        "report",
        make_sparse,
        f"file is {SPARSE_BYTES} bytes, over the 65536-byte limit; not read",
    ),
    Malformed(
        "symlink-to-reference",
        "report",
        link_to(report_reference_path),
        "is a symbolic link; symlinks are not followed",
    ),
    Malformed("directory", "report", make_directory, "not a regular file"),
    Malformed("fifo", "report", make_fifo, "not a regular file"),
    Malformed(
        "path-traversal-name",
        "report",
        stray("..\\private\\case_0001.txt", REPORT_TEXT.encode()),
        "..\\private\\case_0001.txt: stray file",
        scope="submission",
    ),
]


# --------------------------------------------------------------------------- VQA

CHOICE_QUESTION = {"answer": "B", "answer_type": "choice", "choices": ["A", "B", "C", "D"]}


def answer(raw_json: str) -> Builder:
    """The attacked question's answer, as raw JSON text."""

    def build(ctx: Ctx) -> None:
        ctx.fragments.append(f"{json.dumps(ctx.case_id)}: {raw_json}")

    return build


def answered_twice(ctx: Ctx) -> None:
    key = json.dumps(ctx.case_id)
    ctx.fragments += [f'{key}: "yes"', f'{key}: "no"']


def unknown_question_ids(ctx: Ctx) -> None:
    for key in ("q_9999", "../../references/answers.json", "Q_0001"):
        ctx.fragments.append(f'{json.dumps(key)}: "yes"')


def file_bytes(data: bytes) -> Builder:
    """The whole submission file (file scope)."""

    def build(ctx: Ctx) -> None:
        ctx.output.write_bytes(data)

    return build


@dataclass(frozen=True)
class FileEntries:
    """Makes the entries of a track that attack its deliverable file ``filename`` as a whole
    (file scope): ``entry(name, content or build, reason[, status])``."""

    track: Track
    filename: str

    def __call__(
        self,
        name: str,
        build: Builder | bytes,
        reason: str,
        status: Literal["invalid", "missing"] = "invalid",
    ) -> Malformed:
        if isinstance(build, bytes):
            build = file_bytes(build)
        return Malformed(name, self.track, build, reason, status=status, scope="file")

    def file_attacks(self, reference: Callable[[Ctx], Path]) -> list[Malformed]:
        """What every such file meets alike: a link to the references' file ``reference``,
        a directory and a FIFO in its place."""
        name = self.filename
        return [
            self(
                "symlink-to-references",
                link_to(reference),
                f"{name}: is a symbolic link; symlinks are not followed",
            ),
            self("directory", make_directory, f"{name}: not a regular file"),
            self("fifo", make_fifo, f"{name}: is a FIFO, not a regular file"),
        ]


def vqa_reference_file(ctx: Ctx) -> Path:
    return ctx.references / "answers.json"


_vqa_file = FileEntries("vqa", "answers.json")

VQA: list[Malformed] = [
    Malformed("not-answered", "vqa", nothing, "not answered", status="missing"),
    Malformed("number", "vqa", answer("1"), "answer must be a string, found a number (1)"),
    Malformed("null", "vqa", answer("null"), "answer must be a string, found a null"),
    Malformed("list", "vqa", answer('["yes", "no"]'), "answer must be a string, found a list"),
    Malformed(
        "object",
        "vqa",
        answer('{"answer": {"text": "yes"}}'),
        "answer must be a string, found a object",
    ),
    Malformed("nan-literal", "vqa", answer("NaN"), "answer must be a string, found a number (nan)"),
    Malformed(
        "huge-answer",
        "vqa",
        answer(json.dumps("yes " * 50_000)),
        "answer is 200000 characters, over the limit of 200",
    ),
    Malformed("empty-answer", "vqa", answer('""'), "empty answer"),
    Malformed("whitespace-answer", "vqa", answer('" \\n\\t "'), "empty answer"),
    Malformed(
        "control-characters", "vqa", answer('"ye\\u0000s"'), "answer holds control characters"
    ),
    Malformed(
        "duplicate-key",
        "vqa",
        answered_twice,
        "answered more than once in answers.json; give one answer per question",
    ),
    Malformed(
        "choice-not-a-letter",
        "vqa",
        answer('"the second one"'),
        "choice question: answer 'the second one' is not an option letter",
        question=CHOICE_QUESTION,
    ),
    Malformed(
        "choice-unknown-letter",
        "vqa",
        answer('"E"'),
        "choice question: option 'E' is not one of A, B, C, D",
        question=CHOICE_QUESTION,
    ),
    Malformed(
        "unknown-question-ids",
        "vqa",
        unknown_question_ids,
        "answers.json: 3 unknown question ids (not among the",
        scope="submission",
    ),
    Malformed(
        "top-level-symlink",
        "vqa",
        top_link_to_references,
        "notes: symbolic link in the submission; it is not followed",
        scope="submission",
    ),
    _vqa_file(
        "not-utf-8", b'{"q_0001": "s\xed"}', "answers.json: not UTF-8 text (bad byte at offset 13)"
    ),
    _vqa_file(
        "deeply-nested",
        b"[" * 100_000 + b"]" * 100_000,
        "answers.json: JSON nested more than 16 levels deep",
    ),
    _vqa_file(
        "list-not-object",
        b'["yes", "B"]',
        "must be a JSON object mapping question id to answer string, found a list",
    ),
    _vqa_file("empty-file", b"", "answers.json: file is empty", status="missing"),
    _vqa_file("syntax-error", b'{"q_0001": "yes",}', "answers.json: not valid JSON"),
    _vqa_file("utf-8-bom", b'\xef\xbb\xbf{"q_0001": "yes"}', "answers.json: not valid JSON"),
    _vqa_file(
        "sparse-10GB",
        make_sparse,
        f"answers.json: file is {SPARSE_BYTES} bytes, over the 5242880-byte limit; not read",
    ),
    *_vqa_file.file_attacks(vqa_reference_file),
]


# --------------------------------------------------------------------------- detection

DET_SIZE = (64, 48)  # width, height
DET_BOX = [10.0, 8.0, 20.0, 16.0]
DET_CATEGORIES = [{"id": 1, "name": "nodule"}, {"id": 2, "name": "mass"}]


def det_entry(image_id: int, **change: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"image_id": image_id, "category_id": 1, "bbox": DET_BOX, "score": 0.9}
    entry.update(change)
    return entry


def box(raw_json_template: str) -> Builder:
    """One entry for the attacked image, as raw JSON; ``{id}`` is its image id."""

    def build(ctx: Ctx) -> None:
        ctx.fragments.append(raw_json_template.replace("{id}", str(ctx.image_id)))

    return build


def million_boxes(ctx: Ctx) -> None:
    # Compact, so the file (about 60 MB) stays under the 64 MiB bound on results files.
    one = f'{{"image_id":{ctx.image_id},"category_id":1,"bbox":[1,1,2,2],"score":1}}'
    ctx.fragments.append(",".join([one] * 1_000_000))


def unknown_images(ctx: Ctx) -> None:
    for image_id in (999, 0, -1):
        ctx.fragments.append(json.dumps(det_entry(image_id)))


def unattributed_entries(ctx: Ctx) -> None:
    ctx.fragments += [
        '"a box"',
        "[1, 2, 3, 4]",
        json.dumps({**det_entry(0), "image_id": "../annotations.json"}),
        json.dumps({"category_id": 1, "bbox": DET_BOX, "score": 0.5}),
    ]


def det_reference_file(ctx: Ctx) -> Path:
    return ctx.references / "annotations.json"


_WHOLE = '{{"image_id": {{id}}, "category_id": 1, "bbox": {bbox}, "score": 0.9}}'

_det_file = FileEntries("detection", "predictions.json")

DETECTION: list[Malformed] = [
    Malformed(
        "negative-width",
        "detection",
        box(_WHOLE.format(bbox="[30, 8, -20, 16]")),
        "has non-positive width or height",
    ),
    Malformed(
        "negative-coordinates",
        "detection",
        box(_WHOLE.format(bbox="[-5, -5, 10, 10]")),
        "lies outside the 64x48 image",
    ),
    Malformed(
        "beyond-right-edge",
        "detection",
        box(_WHOLE.format(bbox="[60, 8, 20, 16]")),
        "lies outside the 64x48 image",
    ),
    Malformed(
        "nan-bbox",
        "detection",
        box(_WHOLE.format(bbox="[NaN, 8, 20, 16]")),
        "bbox holds NaN or infinite values",
    ),
    Malformed(
        "400-digit-coordinate",
        "detection",
        box(_WHOLE.format(bbox="[" + "9" * 400 + ", 8, 20, 16]")),
        "bbox holds NaN or infinite values",
    ),
    Malformed(
        "three-number-bbox",
        "detection",
        box(_WHOLE.format(bbox="[10, 8, 20]")),
        "bbox must be a list [x, y, width, height]",
    ),
    Malformed(
        "unknown-category",
        "detection",
        box('{"image_id": {id}, "category_id": 9, "bbox": [10, 8, 20, 16], "score": 0.9}'),
        "unknown category_id 9 (categories are 1, 2)",
    ),
    Malformed(
        "boolean-category",
        "detection",
        box('{"image_id": {id}, "category_id": true, "bbox": [10, 8, 20, 16], "score": 0.9}'),
        "category_id must be an integer, found True",
    ),
    Malformed(
        "string-score",
        "detection",
        box('{"image_id": {id}, "category_id": 1, "bbox": [10, 8, 20, 16], "score": "high"}'),
        "score must be a finite number, found 'high'",
    ),
    Malformed(
        "missing-keys",
        "detection",
        box('{"image_id": {id}, "bbox": [10, 8, 20, 16]}'),
        "missing category_id, score",
    ),
    Malformed(
        "a-million-boxes",
        "detection",
        million_boxes,
        "1000000 boxes, more than the limit of 100 per image",
    ),
    Malformed(
        "unknown-image-ids",
        "detection",
        unknown_images,
        "predictions.json: 3 entries name image ids that are not among the",
        scope="submission",
    ),
    Malformed(
        "entries-without-an-image",
        "detection",
        unattributed_entries,
        "predictions.json: 4 entries name no image and were dropped",
        scope="submission",
    ),
    _det_file(
        "object-not-list",
        b'{"annotations": []}',
        "predictions.json: must be a JSON list; found a object",
    ),
    _det_file(
        "deeply-nested",
        b"[" * 200_000 + b"]" * 200_000,
        "predictions.json: JSON nested more than 16 levels deep",
    ),
    _det_file(
        "not-utf-8", b'[{"image_id": 1, "note": "\xff"}]', "predictions.json: not UTF-8 text"
    ),
    _det_file("empty-file", b"  \n", "predictions.json: file is empty", status="missing"),
    _det_file(
        "trailing-garbage",
        b"[] <script>",
        "predictions.json: not valid JSON (extra data after the list",
    ),
    _det_file(
        "sparse-10GB",
        make_sparse,
        f"predictions.json: file is {SPARSE_BYTES} bytes, over the 67108864-byte limit",
    ),
    *_det_file.file_attacks(det_reference_file),
]


def _healthagent_kinds() -> dict[str, Any]:
    """The HealthAgentBench kinds' corpus modules (``hab_<kind>.py`` beside this one)."""
    import importlib
    import pkgutil

    package = Path(__file__).parent
    modules = sorted(
        m.name for m in pkgutil.iter_modules([str(package)]) if m.name.startswith("hab_")
    )
    loaded = [importlib.import_module(f"{__package__}.{name}") for name in modules]
    return {module.KIND: module for module in loaded}


#: Kind -> its corpus module: KIND, OUTPUT_PATTERN, OPTIONS, write_reference(folder),
#: write_good(path) and ENTRIES (each with track "healthagentbench" and its kind).
HEALTHAGENT_KINDS = _healthagent_kinds()
HEALTHAGENT: list[Malformed] = [e for m in HEALTHAGENT_KINDS.values() for e in m.ENTRIES]

CORPUS: list[Malformed] = [*SEGMENTATION, *ENHANCEMENT, *REPORT, *VQA, *DETECTION, *HEALTHAGENT]


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Run:
    """One evaluator run over one submission: a track's bundle or one whole-file entry."""

    name: str
    track: Track
    entries: tuple[Malformed, ...]
    #: HealthAgentBench: the kind all entries attack.
    kind: str | None = None

    @property
    def good(self) -> tuple[str, ...]:
        """Case ids written perfectly, which must still score."""
        return ("q_0001", "q_0002") if self.track == "vqa" else ("case_0001", "case_0002")

    def targets(self) -> dict[str, str]:
        """Entry id -> the case id it attacks (case scope only)."""
        prefix = "q_" if self.track == "vqa" else "case_"
        attacked = [e for e in self.entries if e.scope == "case"]
        first = len(self.good) + 1
        return {e.id: f"{prefix}{first + i:04d}" for i, e in enumerate(attacked)}

    @property
    def case_ids(self) -> list[str]:
        return [*self.good, *self.targets().values()]


def plan_runs(corpus: list[Malformed] = CORPUS) -> list[Run]:
    bundles = dict.fromkeys(e.bundle for e in corpus if e.scope != "file")
    runs = []
    for bundle in bundles:
        entries = tuple(e for e in corpus if e.bundle == bundle and e.scope != "file")
        runs.append(Run(bundle, entries[0].track, entries, entries[0].kind))
    runs += [Run(e.id, e.track, (e,), e.kind) for e in corpus if e.scope == "file"]
    return runs


@dataclass(frozen=True)
class BuiltRun:
    run: Run
    spec: Path
    submission: Path
    references: Path


def build_run(run: Run, root: Path) -> BuiltRun:
    """Write the run's spec, references and submission under ``root``."""
    refs, sub = root / "references", root / "submission"
    refs.mkdir(parents=True)
    sub.mkdir()
    targets = run.targets()
    builder = _TRACK_BUILDERS[run.track]
    spec = builder(run, targets, refs, sub)
    spec_path = root / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    return BuiltRun(run, spec_path, sub, refs)


def _per_case(
    run: Run,
    targets: dict[str, str],
    refs: Path,
    sub: Path,
    write_reference: Callable[[str], object],
    output: Callable[[str], Path],
    write_good: Callable[[Path], object],
) -> None:
    for case_id in run.case_ids:
        write_reference(case_id)
    for case_id in run.good:
        path = output(case_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_good(path)
    for entry in run.entries:
        target = targets.get(entry.id)
        out = output(target) if target is not None else None
        entry.build(Ctx(sub, refs, target, out))


def _segmentation(run: Run, targets: dict[str, str], refs: Path, sub: Path) -> EvalSpec:
    _per_case(
        run,
        targets,
        refs,
        sub,
        lambda c: write_seg(refs / c / "label.nii.gz", seg_label_map()),
        lambda c: sub / f"{c}.nii.gz",
        lambda p: write_seg(p, seg_label_map()),
    )
    return EvalSpec(
        task_id="malformed-seg",
        track="segmentation",
        case_ids=run.case_ids,
        segmentation=SegmentationSpec(
            labels={"kidney": 1, "tumor": 2},
            regions=[
                SegmentationRegion(name="kidney", labels=[1, 2], kind="organ"),
                SegmentationRegion(name="tumor", labels=[2], kind="lesion"),
            ],
        ),
    )


def _enhancement(run: Run, targets: dict[str, str], refs: Path, sub: Path) -> EvalSpec:
    def reference(case_id: str) -> None:
        (refs / case_id).mkdir(parents=True, exist_ok=True)
        np.save(refs / case_id / "reference.npy", enh_image())

    _per_case(
        run,
        targets,
        refs,
        sub,
        reference,
        lambda c: sub / f"{c}.npy",
        lambda p: np.save(p, enh_image()),
    )
    return EvalSpec(
        task_id="malformed-enh",
        track="enhancement",
        case_ids=run.case_ids,
        enhancement=EnhancementSpec(psnr_band=(20.0, 40.0), ssim_band=(0.5, 1.0)),
    )


def _report(run: Run, targets: dict[str, str], refs: Path, sub: Path) -> EvalSpec:
    _per_case(
        run,
        targets,
        refs,
        sub,
        lambda c: (refs / f"{c}.txt").write_text(REPORT_TEXT, encoding="utf-8"),
        lambda c: sub / f"{c}.txt",
        lambda p: p.write_text(REPORT_TEXT, encoding="utf-8"),
    )
    return EvalSpec(
        task_id="malformed-report",
        track="report",
        case_ids=run.case_ids,
        report=ReportSpec(task_metrics=["bleu", "rouge_l", "clinical_f1"]),
    )


def _vqa(run: Run, targets: dict[str, str], refs: Path, sub: Path) -> EvalSpec:
    references: dict[str, Any] = {
        "q_0001": {"answer": "yes", "answer_type": "closed"},
        "q_0002": dict(CHOICE_QUESTION),
    }
    fragments = ['"q_0001": "Yes."', '"q_0002": "B"']
    file_entry = None
    for entry in run.entries:
        qid = targets.get(entry.id)
        if qid is not None:
            references[qid] = dict(entry.question or {"answer": "yes", "answer_type": "closed"})
        if entry.scope == "file":
            file_entry = entry
            continue
        entry.build(Ctx(sub, refs, qid, None, fragments))
    (refs / "answers.json").write_text(json.dumps(references), encoding="utf-8")
    out = sub / "answers.json"
    if file_entry is not None:
        file_entry.build(Ctx(sub, refs, None, out))
    else:
        out.write_text("{" + ", ".join(fragments) + "}", encoding="utf-8")
    return EvalSpec(task_id="malformed-vqa", track="vqa", case_ids=run.case_ids, vqa=VqaSpec())


def _detection(run: Run, targets: dict[str, str], refs: Path, sub: Path) -> EvalSpec:
    width, height = DET_SIZE
    image_ids = {case_id: 100 + i for i, case_id in enumerate(run.case_ids)}
    gt = {
        "images": [
            {"id": i, "file_name": f"images/{c}.png", "width": width, "height": height}
            for c, i in image_ids.items()
        ],
        "annotations": [
            {"id": n + 1, "image_id": i, "category_id": 1, "bbox": DET_BOX, "area": 320.0}
            for n, i in enumerate(image_ids.values())
        ],
        "categories": DET_CATEGORIES,
    }
    (refs / "annotations.json").write_text(json.dumps(gt), encoding="utf-8")
    fragments = [json.dumps(det_entry(image_ids[c])) for c in run.good]
    out = sub / "predictions.json"
    file_entry = None
    for entry in run.entries:
        if entry.scope == "file":
            file_entry = entry
            continue
        case_id = targets.get(entry.id)
        image_id = None if case_id is None else image_ids[case_id]
        entry.build(Ctx(sub, refs, case_id, None, fragments, image_id))
    if file_entry is not None:
        file_entry.build(Ctx(sub, refs, None, out))
    else:
        out.write_text("[" + ",\n".join(fragments) + "]", encoding="utf-8")
    return EvalSpec(
        task_id="malformed-det", track="detection", case_ids=run.case_ids, detection=DetectionSpec()
    )


def _healthagent(run: Run, targets: dict[str, str], refs: Path, sub: Path) -> EvalSpec:
    assert run.kind is not None
    kind = HEALTHAGENT_KINDS[run.kind]
    spec = HealthAgentSpec(kind=kind.KIND, output_pattern=kind.OUTPUT_PATTERN, options=kind.OPTIONS)
    _per_case(
        run,
        targets,
        refs,
        sub,
        lambda c: kind.write_reference(refs / c),
        lambda c: sub / spec.output_path(c),
        kind.write_good,
    )
    return EvalSpec(
        task_id=f"malformed-{run.kind}",
        track="healthagentbench",
        case_ids=run.case_ids,
        healthagentbench=spec,
    )


_TRACK_BUILDERS: dict[Track, Callable[[Run, dict[str, str], Path, Path], EvalSpec]] = {
    "segmentation": _segmentation,
    "enhancement": _enhancement,
    "report": _report,
    "vqa": _vqa,
    "detection": _detection,
    "healthagentbench": _healthagent,
}
