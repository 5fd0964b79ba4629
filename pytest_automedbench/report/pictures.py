"""Pictures of a cell's outputs next to the references, for its Allure result.

* segmentation: the prediction (red) and reference (green) contours on the input slice
  where the reference is largest, for the cases with the largest reference;
* detection: the predicted boxes with a score of at least :data:`BOX_SCORE_MIN` (red) and
  the reference boxes (green) on the images with the most reference boxes, with a legend;
* enhancement: degraded input | agent's output | reference side by side in one grey
  window (the reference's percentiles), the middle slice of a volume, for the cases with
  the lowest and the highest PSNR.

The outputs are written by the agent under evaluation, so they are hostile input: a
missing, oversized or malformed output gives a picture without it (its absence stated in
the legend and the attachment's name) or a text note, never an exception. Every picture
is a :class:`Picture`; :func:`cell_pictures` is the one entry point.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFont

if TYPE_CHECKING:
    from pytest_automedbench.tasks import TaskSpec

#: Cases (images) pictured per cell.
PICTURE_CASES = 2
PREDICTION_RGB = (230, 0, 0)
REFERENCE_RGB = (0, 220, 0)
#: Detection: predicted boxes below this score are not drawn (the legend counts them).
BOX_SCORE_MIN = 0.5
#: Detection: category names are written next to boxes only up to this many per image.
MAX_LABELLED_BOXES = 25
#: Largest submission read for a picture (the evaluator's own limit for detection).
MAX_SUBMISSION_BYTES = 64 * 1024**2
#: Largest public input image read (trusted benchmark data; a bound on memory only).
MAX_INPUT_BYTES = 1024**3
#: An enhancement or segmentation output over this multiple of its reference is not read.
SIZE_FACTOR = 20
#: Pictures are scaled so that their longer side falls in this range (pixels).
MIN_SIDE, MAX_SIDE = 256, 1024
#: Enhancement panels: the longer side of each panel.
PANEL_MIN, PANEL_MAX = 256, 512
BACKGROUND = (32, 32, 32)
TEXT_RGB = (235, 235, 235)
LINE_HEIGHT = 14

Kind = Literal["png", "text"]


@dataclass(frozen=True)
class Picture:
    """One attachment: a PNG picture, or a text note saying why there is none."""

    name: str
    data: bytes
    kind: Kind


def note(name: str, text: str) -> Picture:
    return Picture(name, text.encode("utf-8"), "text")


def cell_pictures(task: TaskSpec, cell: Path, public_dir: Path, private_dir: Path) -> list[Picture]:
    """The pictures of a cell's track (none for report and VQA); never raises."""
    makers = {
        "segmentation": segmentation_overlays,
        "detection": detection_pictures,
        "enhancement": enhancement_pictures,
    }
    maker = makers.get(task.track)
    if maker is None:
        return []
    try:
        return maker(task, cell, public_dir, private_dir)
    except Exception as exc:  # a picture must never fail the report
        return [note(f"{task.track} pictures unavailable", f"{type(exc).__name__}: {exc}")]


# --------------------------------------------------------------------------- helpers


def _png(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def _font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default()


def _window(reference: NDArray[Any]) -> tuple[float, float]:
    """The grey window: the reference's 1st and 99th percentiles (finite values only)."""
    finite = reference[np.isfinite(reference)]
    if finite.size == 0:
        return 0.0, 1.0
    low, high = (float(v) for v in np.percentile(finite, (1, 99)))
    if high - low < 1e-6:
        low, high = float(finite.min()), float(finite.max())
    return low, max(high, low + 1e-6)


def _grey(image: NDArray[Any], window: tuple[float, float]) -> NDArray[np.uint8]:
    low, high = window
    values = np.nan_to_num(image.astype(np.float64), nan=low, posinf=high, neginf=low)
    return np.clip((values - low) / (high - low) * 255, 0, 255).astype(np.uint8)


def _plane(array: NDArray[Any]) -> NDArray[Any]:
    """A 2-D plane of an array: the middle slice of every leading axis, colour averaged."""
    array = np.squeeze(array)
    if np.iscomplexobj(array):
        array = np.abs(array)
    if array.ndim == 3 and array.shape[-1] in (3, 4):
        array = array[..., :3].astype(np.float64).mean(axis=-1)
    while array.ndim > 2:
        array = array[array.shape[0] // 2]
    if array.ndim != 2:
        raise ValueError(f"not an image: shape {array.shape}")
    return array


def _regular_file(path: Path, limit: int) -> str | None:
    """Why ``path`` is not read (missing, a link, not a file, too large), or None."""
    if path.is_symlink():
        return f"{path.name} is a symbolic link"
    if not path.exists():
        return f"no {path.name}"
    if not path.is_file():
        return f"{path.name} is not a regular file"
    size = path.stat().st_size
    if size > limit:
        return f"{path.name} is too large ({size} bytes)"
    return None


def _scale_for(width: int, height: int, low: int = MIN_SIDE, high: int = MAX_SIDE) -> float:
    longest = max(width, height, 1)
    if longest < low:
        return float(math.ceil(low / longest))
    if longest > high:
        return high / longest
    return 1.0


def _with_legend(
    picture: Image.Image, lines: list[tuple[str, tuple[int, int, int] | None]]
) -> Image.Image:
    """The picture with a dark strip below it: one line per entry, a colour swatch first
    when the entry has a colour."""
    font = _font()
    strip = LINE_HEIGHT * len(lines) + 6
    canvas = Image.new("RGB", (picture.width, picture.height + strip), BACKGROUND)
    canvas.paste(picture, (0, 0))
    draw = ImageDraw.Draw(canvas)
    y = picture.height + 3
    for text, colour in lines:
        x = 4
        if colour is not None:
            draw.rectangle([x, y + 2, x + 9, y + 11], fill=colour)
            x += 14
        draw.text((x, y + 1), text, fill=TEXT_RGB, font=font)
        y += LINE_HEIGHT
    return canvas


# --------------------------------------------------------------------------- segmentation


def segmentation_overlays(
    task: TaskSpec, cell: Path, public_dir: Path, private_dir: Path
) -> list[Picture]:
    """PNG overlays for the cases with the largest reference: the input slice (or image)
    in grey, the reference contour in green and the prediction contour in red."""
    import SimpleITK as sitk

    outputs = cell / "workspace" / "outputs"
    found = []
    for case_dir in sorted(p for p in private_dir.iterdir() if p.is_dir()):
        references = sorted(f for f in case_dir.iterdir() if f.is_file())
        inputs = [public_dir / case_dir.name / name for name in task.data.inputs]
        prediction = outputs / task.output_path(case_dir.name)
        if not references or not inputs or not inputs[0].is_file():
            continue
        try:
            reference = sitk.GetArrayFromImage(sitk.ReadImage(str(references[0])))
        except RuntimeError:
            continue
        found.append((int(np.count_nonzero(reference)), case_dir.name, inputs[0], reference,
                      prediction))  # fmt: skip
    pictures = []
    for _, case, image_path, reference, prediction in sorted(found, reverse=True)[:PICTURE_CASES]:
        try:
            png, missing = _overlay(sitk, image_path, reference, prediction)
        except (RuntimeError, ValueError, OSError) as exc:
            pictures.append(note(f"overlay {case} unavailable", str(exc)))
            continue
        suffix = f", {missing}" if missing else ""
        pictures.append(Picture(f"overlay {case} (green reference, red prediction{suffix})",
                                png, "png"))  # fmt: skip
    return pictures


def _overlay(
    sitk: Any, image_path: Path, reference: NDArray[Any], prediction: Path
) -> tuple[bytes, str | None]:
    from scipy import ndimage

    image = sitk.GetArrayFromImage(sitk.ReadImage(str(image_path))).astype(float)
    if image.ndim == 4 or (image.ndim == 3 and image.shape[-1] in (3, 4) and reference.ndim == 2):
        image = image[..., :3].mean(axis=-1)
    missing = _regular_file(prediction, max(SIZE_FACTOR * reference.nbytes, 1 << 20))
    if missing is None:
        predicted = sitk.GetArrayFromImage(sitk.ReadImage(str(prediction)))
    else:
        predicted = np.zeros_like(reference)
    if predicted.shape != reference.shape or image.shape != reference.shape:
        raise ValueError(
            f"shapes differ: image {image.shape}, reference {reference.shape}, "
            f"prediction {predicted.shape}"
        )
    if reference.ndim == 3:
        z = int(np.argmax(np.count_nonzero(reference.reshape(reference.shape[0], -1), axis=1)))
        image, reference, predicted = image[z], reference[z], predicted[z]
    low, high = np.percentile(image, (1, 99))
    grey = np.clip((image - low) / max(high - low, 1e-6) * 255, 0, 255).astype(np.uint8)
    rgb = np.stack([grey] * 3, axis=-1)
    for mask, colour in ((reference > 0, REFERENCE_RGB), (predicted > 0, PREDICTION_RGB)):
        edge = mask & ~ndimage.binary_erosion(mask)
        rgb[edge] = colour
    picture = Image.fromarray(rgb)
    if max(picture.size) < MIN_SIDE:
        scale = MIN_SIDE // max(picture.size) + 1
        picture = picture.resize(
            (picture.width * scale, picture.height * scale), Image.Resampling.NEAREST
        )
    return _png(picture), (f"prediction unavailable: {missing}" if missing else None)


# --------------------------------------------------------------------------- detection

Box = tuple[float, float, float, float]


@dataclass
class _Predictions:
    by_image: dict[int, list[tuple[int, Box, float]]]
    skipped: int = 0
    problem: str | None = None


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _box(value: Any) -> Box | None:
    if not isinstance(value, list) or len(value) != 4 or not all(map(_finite_number, value)):
        return None
    x, y, w, h = (float(v) for v in value)
    return (x, y, w, h) if w > 0 and h > 0 else None


def read_box_predictions(path: Path) -> _Predictions:
    """The agent's COCO results, by image id; unusable entries are skipped and counted,
    an unusable file is a problem (and no boxes)."""
    why = _regular_file(path, MAX_SUBMISSION_BYTES)
    if why is not None:
        return _Predictions({}, problem=why)
    try:
        raw = json.loads(path.read_bytes())
    except (ValueError, OSError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        return _Predictions({}, problem=f"{path.name} is not JSON ({type(exc).__name__})")
    if not isinstance(raw, list):
        return _Predictions({}, problem=f"{path.name} is not a JSON list")
    predictions = _Predictions({})
    for entry in raw:
        box = _box(entry.get("bbox")) if isinstance(entry, dict) else None
        if box is None:
            predictions.skipped += 1
            continue
        image_id, category, score = (entry.get(k) for k in ("image_id", "category_id", "score"))
        if not isinstance(image_id, int) or not _finite_number(score):
            predictions.skipped += 1
            continue
        category = category if isinstance(category, int) else -1
        predictions.by_image.setdefault(image_id, []).append((category, box, float(score)))
    return predictions


def _load_rgb(path: Path) -> NDArray[np.uint8]:
    """An image file as 8-bit RGB: 8-bit images as they are, others windowed to their
    own 1st-99th percentiles; what Pillow cannot read goes through SimpleITK (DICOM)."""
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode in ("1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "YCbCr"):
                return np.asarray(image.convert("RGB"))
            array = np.asarray(image)
    except (OSError, ValueError, Image.DecompressionBombError):
        import SimpleITK as sitk

        array = sitk.GetArrayFromImage(sitk.ReadImage(str(path)))
    plane = _plane(array)
    return np.stack([_grey(plane, _window(plane))] * 3, axis=-1)


def _reference_boxes(
    annotations: dict[str, Any],
) -> tuple[dict[int, list[tuple[int, Box]]], dict[int, str]]:
    boxes: dict[int, list[tuple[int, Box]]] = {}
    for ann in annotations.get("annotations", []):
        box = _box(ann.get("bbox"))
        if box is not None and isinstance(ann.get("image_id"), int):
            boxes.setdefault(ann["image_id"], []).append((int(ann.get("category_id", -1)), box))
    categories = {
        int(c["id"]): str(c.get("name", c["id"])) for c in annotations.get("categories", [])
    }
    return boxes, categories


def detection_pictures(
    task: TaskSpec, cell: Path, public_dir: Path, private_dir: Path
) -> list[Picture]:
    """Predicted (red) and reference (green) boxes on the images with the most reference
    boxes."""
    spec = task.evaluation.detection
    if spec is None:
        return []
    from pytest_automedbench.fixtures.staging import COCO_IMAGES_NAME

    images = json.loads((public_dir / COCO_IMAGES_NAME).read_text(encoding="utf-8"))["images"]
    annotations = json.loads((private_dir / spec.reference_filename).read_text(encoding="utf-8"))
    reference, categories = _reference_boxes(annotations)
    submission = cell / "workspace" / "outputs" / spec.submission_filename
    predictions = read_box_predictions(submission)
    chosen = sorted(images, key=lambda im: (-len(reference.get(im["id"], [])), im["file_name"]))
    pictures = []
    for image in chosen[:PICTURE_CASES]:
        case = Path(image["file_name"]).name.split(".")[0]
        try:
            png = _boxes_picture(
                public_dir / image["file_name"],
                reference.get(image["id"], []),
                predictions.by_image.get(image["id"], []),
                categories,
                predictions,
                case,
            )
        except (OSError, ValueError, RuntimeError) as exc:
            pictures.append(note(f"boxes {case} unavailable", f"{type(exc).__name__}: {exc}"))
            continue
        suffix = f", {predictions.problem}" if predictions.problem else ""
        name = f"boxes {case} (green reference, red prediction score >= {BOX_SCORE_MIN}{suffix})"
        pictures.append(Picture(name, png, "png"))
    return pictures


def _tag(
    draw: ImageDraw.ImageDraw,
    size: tuple[int, int],
    xy: tuple[float, float],
    text: str,
    colour: tuple[int, int, int],
) -> None:
    """A box's label on a dark patch, kept inside the picture."""
    font = _font()
    left, top, right, _ = draw.textbbox((0, 0), text, font=font)
    x = min(max(xy[0], 0), size[0] - (right - left) - 4)
    y = min(max(xy[1], 0), size[1] - LINE_HEIGHT)
    draw.rectangle([x, y, x + right - left + 3, y + LINE_HEIGHT - 1], fill=BACKGROUND)
    draw.text((x + 2 - left, y + 1 - top), text, fill=colour, font=font)


def _boxes_picture(
    image_path: Path,
    reference: list[tuple[int, Box]],
    predicted: list[tuple[int, Box, float]],
    categories: dict[int, str],
    predictions: _Predictions,
    case: str,
) -> bytes:
    rgb = _load_rgb(image_path)
    height, width = rgb.shape[:2]
    scale = _scale_for(width, height, low=512)
    picture = Image.fromarray(rgb)
    if scale != 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        picture = picture.resize(size, Image.Resampling.BILINEAR)
    draw = ImageDraw.Draw(picture)
    shown = sorted((p for p in predicted if p[2] >= BOX_SCORE_MIN), key=lambda p: p[2])
    labels = len(categories) > 1 and len(reference) + len(shown) <= MAX_LABELLED_BOXES

    def corners(box: Box) -> tuple[float, float, float, float]:
        x, y, w, h = (v * scale for v in box)
        return x, y, x + w - 1, y + h - 1

    # The reference is drawn wider and first: a prediction on top of it leaves a green rim.
    for category, box in reference:
        x0, y0, x1, y1 = corners(box)
        draw.rectangle([x0, y0, x1, y1], outline=REFERENCE_RGB, width=4)
        if labels:
            _tag(draw, picture.size, (x0, y1 + 2), categories.get(category, "?"), REFERENCE_RGB)
    for category, box, score in shown:
        x0, y0, x1, y1 = corners(box)
        draw.rectangle([x0, y0, x1, y1], outline=PREDICTION_RGB, width=2)
        if labels:
            text = f"{categories.get(category, '?')} {score:.2f}"
            _tag(draw, picture.size, (x0, y0 - LINE_HEIGHT), text, PREDICTION_RGB)
    if predictions.problem:
        prediction_line = f"prediction: none ({predictions.problem})"
    else:
        prediction_line = (
            f"prediction: {len(shown)} boxes with score >= {BOX_SCORE_MIN} "
            f"(of {len(predicted)} on this image)"
        )
        if predictions.skipped:
            prediction_line += f"; {predictions.skipped} malformed entries skipped"
    lines: list[tuple[str, tuple[int, int, int] | None]] = [
        (f"reference: {len(reference)} boxes   ({case}, {width}x{height})", REFERENCE_RGB),
        (prediction_line, PREDICTION_RGB),
    ]
    return _png(_with_legend(picture, lines))


# --------------------------------------------------------------------------- enhancement


def _load_npy(path: Path, limit: int) -> tuple[NDArray[Any] | None, str | None]:
    """A numeric array from a .npy file (never unpickled), or why there is none."""
    why = _regular_file(path, limit)
    if why is not None:
        return None, why
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        return None, f"{path.name} is not a .npy array ({type(exc).__name__})"
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biufc":
        return None, f"{path.name} holds no numbers"
    if array.size == 0:
        return None, f"{path.name} is empty"
    return array, None


def _degraded_input(case_dir: Path, names: list[str]) -> tuple[NDArray[Any], str] | None:
    """The degraded image among a case's inputs: the first real-valued, non-binary image
    (k-space and sampling masks are skipped), or None."""
    for name in names:
        path = case_dir / name
        if path.suffix != ".npy" or not path.is_file():
            continue
        array, _ = _load_npy(path, MAX_INPUT_BYTES)
        if array is None or np.iscomplexobj(array) or np.squeeze(array).ndim < 2:
            continue
        if array.dtype.kind == "b" or bool(np.all((array == 0) | (array == 1))):
            continue
        return array, name
    return None


def _case_metrics(cell: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """The evaluator's status and metrics per case, when it ran."""
    evaluation = cell / "evaluator" / "evaluation.json"
    if not evaluation.is_file():
        return {}
    data = json.loads(evaluation.read_text(encoding="utf-8"))
    return {
        str(c.get("case_id")): (str(c.get("status")), dict(c.get("metrics") or {}))
        for c in data.get("cases", [])
        if isinstance(c, dict)
    }


def _enhancement_cases(cases: list[str], psnr: dict[str, float]) -> list[str]:
    """The lowest- and the highest-PSNR case when the evaluator scored them, otherwise
    the first cases."""
    scored = sorted((value, case) for case, value in psnr.items() if case in cases)
    if len(scored) >= 2:
        return [scored[0][1], scored[-1][1]][:PICTURE_CASES]
    return ([c for _, c in scored] + [c for c in cases if c not in psnr])[:PICTURE_CASES]


def enhancement_pictures(
    task: TaskSpec, cell: Path, public_dir: Path, private_dir: Path
) -> list[Picture]:
    """Degraded input | output | reference, side by side in the reference's window."""
    spec = task.evaluation.enhancement
    if spec is None:
        return []
    metrics = _case_metrics(cell)
    psnr = {
        case: float(values["psnr"])
        for case, (status, values) in metrics.items()
        if status == "ok" and _finite_number(values.get("psnr"))
    }
    cases = sorted(p.name for p in private_dir.iterdir() if p.is_dir())
    outputs = cell / "workspace" / "outputs"
    pictures = []
    for case in _enhancement_cases(cases, psnr):
        reference = np.load(private_dir / case / spec.reference_filename, allow_pickle=False)
        limit = max(SIZE_FACTOR * reference.nbytes, 1 << 20)
        output_path = outputs / task.output_path(case)
        output, problem = _load_npy(output_path, limit)
        if output is not None:
            try:
                output = _plane(output)
            except ValueError as exc:
                output, problem = None, f"{output_path.name} is {exc}"
        degraded = _degraded_input(public_dir / case, task.data.inputs)
        try:
            quality = metrics.get(case, ("", {}))[1]
            png = _side_by_side(case, reference, degraded, output, problem, quality)
        except (ValueError, OSError) as exc:
            pictures.append(note(f"images {case} unavailable", f"{type(exc).__name__}: {exc}"))
            continue
        suffix = f", output unavailable: {problem}" if problem else ""
        pictures.append(Picture(f"images {case} (input | output | reference{suffix})", png,
                                "png"))  # fmt: skip
    return pictures


def _side_by_side(
    case: str,
    reference: NDArray[Any],
    degraded: tuple[NDArray[Any], str] | None,
    output: NDArray[Any] | None,
    problem: str | None,
    metrics: dict[str, Any],
) -> bytes:
    reference_plane = _plane(reference).astype(np.float64)
    window = _window(reference_plane)
    height, width = reference_plane.shape
    scale = _scale_for(width, height, low=PANEL_MIN, high=PANEL_MAX)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    panels: list[tuple[str, Image.Image | None, str | None]] = []
    if degraded is None:
        panels.append(("input", None, "no image input"))
    else:
        plane = _plane(degraded[0])
        panels.append((f"input ({degraded[1]}) {_shape(plane)}", _panel(plane, window, size), None))
    if output is None:
        panels.append(("output", None, problem or "no output"))
    else:
        plane = _plane(output)
        panels.append((f"output {_shape(plane)}", _panel(plane, window, size), None))
    panels.append((f"reference {_shape(reference_plane)}", _panel(reference_plane, window,
                                                                   size), None))  # fmt: skip
    gap, header = 4, LINE_HEIGHT + 6
    canvas = Image.new("RGB", (3 * size[0] + 2 * gap, size[1] + header), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = _font()
    for n, (title, panel, why) in enumerate(panels):
        x = n * (size[0] + gap)
        draw.text((x + 4, 4), title, fill=TEXT_RGB, font=font)
        if panel is not None:
            canvas.paste(panel, (x, header))
        else:
            draw.text((x + 8, header + size[1] // 2), why or "", fill=TEXT_RGB, font=font)
    window_text = f"window [{window[0]:.4g}, {window[1]:.4g}] (reference 1st-99th percentile)"
    quality = [f"{k.upper()} {metrics[k]:.4g}" for k in ("psnr", "ssim")
               if _finite_number(metrics.get(k))]  # fmt: skip
    line = ", ".join([case, *quality, window_text])
    return _png(_with_legend(canvas, [(line, None)]))


def _shape(plane: NDArray[Any]) -> str:
    return "x".join(str(n) for n in plane.shape)


def _panel(plane: NDArray[Any], window: tuple[float, float], size: tuple[int, int]) -> Image.Image:
    """One panel in the shared window, resized to the reference panel's size (nearest:
    low-resolution inputs keep their blocks)."""
    picture = Image.fromarray(_grey(plane, window))
    if picture.size != size:
        picture = picture.resize(size, Image.Resampling.NEAREST)
    return picture.convert("RGB")
