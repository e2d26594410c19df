"""
The test images: where they come from, in which order, and how a file becomes the
canonical image of the pipeline (64 x 64 grayscale, pixels in [-1, 1]).

Three sources, all ordered once and for all, so that image i is the same file whatever
the run:

* ``demo``: real photographs shipped inside installed packages (scikit-image's and
  plenoptic's data folders), in the order of `DEMO_TEST_PHOTOS`;
* ``tinyimagenet``: the TinyImageNet validation images in sorted path order, the order
  of upstream's `multigeom.datasets.TinyImageNetDataset("val")` (the paper's test set is
  its first 200 images);
* ``folder``: the image files of a folder, sorted by name.

Listing imports no torch (the Snakefile lists at parse time); `load_test_image` does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = [
    "DEMO_TEST_PHOTOS",
    "DEMO_TRAIN_PHOTOS",
    "IMAGE_SUFFIXES",
    "list_folder_images",
    "list_tinyimagenet_val",
    "load_test_image",
    "package_photo",
]

#: Test photographs of the demo, (package, file in its ``data`` folder), in test order.
DEMO_TEST_PHOTOS: tuple[tuple[str, str], ...] = (
    ("skimage", "astronaut.png"),
    ("skimage", "camera.png"),
    ("skimage", "chelsea.png"),
    ("skimage", "coffee.png"),
    ("skimage", "rocket.jpg"),
    ("skimage", "motorcycle_left.png"),
    ("skimage", "coins.png"),
    ("skimage", "moon.png"),
    ("skimage", "text.png"),
    ("skimage", "page.png"),
    ("skimage", "clock_motion.png"),
    ("skimage", "hubble_deep_field.jpg"),
    ("skimage", "microaneurysms.png"),
    ("skimage", "brick.png"),
    ("skimage", "grass.png"),
    ("skimage", "gravel.png"),
)
#: Photographs the demo cuts its training crops from: none of them is a test image.
#: (``motorcycle_right.png``, the other half of a stereo pair of a test image, is used
#: nowhere.)
DEMO_TRAIN_PHOTOS: tuple[tuple[str, str], ...] = (
    ("plenoptic", "einstein.pgm"),
    ("plenoptic", "curie.pgm"),
    ("plenoptic", "parrot.png"),
    ("plenoptic", "reptile_skin.pgm"),
    ("skimage", "cell.png"),
    ("skimage", "ihc.png"),
    ("skimage", "retina.jpg"),
)
#: File name endings read as images by the ``folder`` source (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".pgm", ".bmp", ".tif", ".tiff")


def package_photo(package: str, name: str) -> Path:
    """
    The path of a photograph in the ``data`` folder of an installed package, found
    without importing the package.

    Raises
    ------
    FileNotFoundError
        If the package is not installed or does not ship the file.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {package!r} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"{package} does not ship data/{name} ({path})")
    return path


def list_tinyimagenet_val(root: str | Path) -> list[Path]:
    """
    TinyImageNet's validation images in upstream's order: under ``<root>/val`` (or
    ``<root>/tiny-imagenet-200/val``), sorted sub-folders, then their ``*.JPEG`` files
    sorted, as `multigeom.datasets.TinyImageNetDataset("val")` lists them. Empty if the
    folder has no ``val``.
    """
    root = Path(root)
    if not (root / "val").is_dir() and (root / "tiny-imagenet-200" / "val").is_dir():
        root = root / "tiny-imagenet-200"
    split_dir = root / "val"
    if not split_dir.is_dir():
        return []
    files: list[Path] = []
    for cls_dir in sorted(split_dir.iterdir()):
        if cls_dir.is_dir():
            files.extend(sorted(cls_dir.rglob("*.JPEG")))
    return files


def list_folder_images(folder: str | Path) -> list[Path]:
    """The image files directly inside `folder` (`IMAGE_SUFFIXES`), sorted by name."""
    return sorted(
        p
        for p in Path(folder).iterdir()
        if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    )


def load_test_image(path: str | Path):
    """
    The canonical image of a file, as upstream reads a TinyImageNet image: opened with
    PIL, converted to RGB, then `multigeom.datasets.CANONICAL_TRANSFORM` (resize to
    64 x 64, grayscale, pixels in [-1, 1]).

    Returns
    -------
    torch.Tensor
        Of shape (1, 64, 64), float32, pixels in [-1, 1].
    """
    from multigeom.datasets import CANONICAL_TRANSFORM
    from PIL import Image

    with Image.open(path) as img:
        return CANONICAL_TRANSFORM(img.convert("RGB"))
