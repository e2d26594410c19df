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
* ``folder``: the image files of a folder, sorted by name; hidden files (names that
  start with ``.``, such as the ``._p1.png`` files a Mac leaves on other disks) and
  files of other kinds are left out.

Every file becomes upstream's canonical input (`read_canonical_rgb`, then upstream's
`CANONICAL_TRANSFORM`): EXIF orientation applied, 16-bit pixels scaled to 8 bits,
palette images expanded, transparency composited on mid-gray (the mean luminance, 0 in
[-1, 1]). A file is refused only when its pixels cannot be decoded; metadata that
Pillow cannot read (a malformed EXIF block, a PNG chunk cut short after the image
data) leaves the image as stored, with one notice line. The parse-time check
(`check_test_images`) and the jobs' loader (`load_test_image`) read a file through the
same function, so they accept and refuse the same files. Listing and
`check_test_image` import no torch (the Snakefile lists and checks at parse time);
`load_test_image` does.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ..settings.names import TINYIMAGENET_DIR

__all__ = [
    "IMAGE_SIDE",
    "check_test_images",
    "DEMO_TEST_PHOTOS",
    "DEMO_TRAIN_PHOTOS",
    "ALPHA_BACKGROUND",
    "IMAGE_SUFFIXES",
    "canonical_rgb",
    "check_test_image",
    "list_folder_images",
    "list_tinyimagenet_val",
    "tinyimagenet_val_files",
    "load_test_image",
    "package_photo",
    "read_canonical_rgb",
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
#: TinyImageNet's validation images: val_0.JPEG ... val_9999.JPEG in val/images.
TINYIMAGENET_VAL_COUNT = 10000
#: File name endings read as images by the ``folder`` source (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".pgm", ".bmp", ".tif", ".tiff")
#: Where an image is transparent, it is seen on this gray (8-bit RGB): the mean
#: luminance, 0 in the pipeline's [-1, 1].
ALPHA_BACKGROUND = (128, 128, 128)


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


def _in_upstream_order(paths) -> list[Path]:
    """
    Paths in the order of `multigeom.datasets.TinyImageNetDataset`: sorted sub-folders
    of ``val``, then their files sorted, which is the order of the paths compared part
    by part (`pathlib.Path` ordering). The one definition of TinyImageNet's order.
    """
    return sorted(Path(p) for p in paths)


def list_tinyimagenet_val(root: str | Path) -> list[Path]:
    """
    TinyImageNet's validation images found on disk, in upstream's order
    (`_in_upstream_order`): under ``<root>/val`` (or ``<root>/tiny-imagenet-200/val``),
    the ``*.JPEG`` files of its sub-folders. Empty if the folder has no ``val``.
    """
    root = Path(root)
    if not (root / "val").is_dir() and (root / TINYIMAGENET_DIR / "val").is_dir():
        root = root / TINYIMAGENET_DIR
    split_dir = root / "val"
    if not split_dir.is_dir():
        return []
    return _in_upstream_order(
        f
        for cls_dir in split_dir.iterdir()
        if cls_dir.is_dir()
        for f in cls_dir.rglob("*.JPEG")
    )


def tinyimagenet_val_files(
    root: str | Path, count: int = TINYIMAGENET_VAL_COUNT
) -> list[str]:
    """
    TinyImageNet's validation images under `root` (the folder that holds
    ``tiny-imagenet-200``) known before the download, ``val/images/val_<i>.JPEG`` for
    i < `count`, in upstream's order (`_in_upstream_order`): ``val_0.JPEG``,
    ``val_1.JPEG``, ``val_10.JPEG``, ...
    """
    images = Path(root) / TINYIMAGENET_DIR / "val" / "images"
    return [
        str(p)
        for p in _in_upstream_order(images / f"val_{i}.JPEG" for i in range(count))
    ]


def list_folder_images(folder: str | Path) -> list[Path]:
    """
    The image files directly inside `folder` (`IMAGE_SUFFIXES`), sorted by name;
    hidden files (names starting with ``.``: ``._p1.png``, ``.DS_Store``) left out.
    """
    return sorted(
        p
        for p in Path(folder).iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and p.suffix.lower() in IMAGE_SUFFIXES
    )


def canonical_rgb(img):
    """
    An image of any mode Pillow reads, already as displayed (`read_canonical_rgb`
    applies its EXIF orientation first), as the 8-bit RGB image that upstream's
    TinyImageNet loader hands to `CANONICAL_TRANSFORM` (``Image.convert("RGB")``).

    * 16-bit integer pixels (modes ``I;16*``, and ``I`` with values in 0..65535) are
      scaled to 8 bits, v * 255 / 65535 rounded (Pillow's own conversion clips them);
      float pixels (mode ``F``) must lie in [0, 1] and are scaled by 255.
    * Palette images are expanded; transparency (an alpha channel, or a palette's
      transparent colour) is composited on `ALPHA_BACKGROUND`, mid-gray.
    * 8-bit images (``L``, ``RGB``, ``1``, ``CMYK``, ``YCbCr``) are converted by
      Pillow as upstream does, so that their canonical image is upstream's, byte for
      byte.
    * Of a multi-frame file (GIF, TIFF), the first frame.

    Parameters
    ----------
    img : PIL.Image.Image

    Returns
    -------
    PIL.Image.Image
        Mode ``RGB``, same size as `img`.

    Raises
    ------
    ValueError
        For pixels with no known white level (32-bit integers above 65535, floats
        outside [0, 1]) or a mode Pillow cannot convert to RGB; the message says which.
    """
    import numpy as np
    from PIL import Image

    mode = img.mode
    if mode.startswith("I") or mode == "F":
        a = np.asarray(img, dtype=np.float64)
        lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
        if mode == "F":
            if lo < 0 or hi > 1:
                raise ValueError(
                    f"has float pixels in [{lo:g}, {hi:g}]; allowed: [0, 1]"
                )
            a = a * 255
        else:
            if lo < 0 or hi > 65535:
                raise ValueError(
                    f"has {mode} pixels in [{lo:g}, {hi:g}]; allowed: 16-bit, 0..65535"
                )
            a = a * (255 / 65535)
        img = Image.fromarray(np.rint(a).astype(np.uint8), "L")
        mode = "L"
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in ("L", "RGB") and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        background = Image.new("RGBA", img.size, (*ALPHA_BACKGROUND, 255))
        img = Image.alpha_composite(background, img.convert("RGBA"))
    try:
        return img.convert("RGB")
    except ValueError as err:
        raise ValueError(
            f"has mode {img.mode}, not convertible to RGB ({err})"
        ) from None


def _decoded(path: str | Path):
    """
    `path` opened with Pillow and its pixels decoded, and None; or, where Pillow
    decodes the pixels and then fails on the metadata that follows them, the image
    decoded without that metadata, and the error in a few words.

    A PNG's chunks after the image data (``tEXt``, ``eXIf``, ...) are read by
    `PIL.PngImagePlugin.PngImageFile.load_end`, which `PIL.ImageFile.ImageFile.load`
    calls after the decoding loop and before it reports a decoder error (Pillow 13.0,
    ImageFile.py): a PNG cut short inside such a chunk raises ``OSError: Truncated
    File Read`` with every pixel decoded. Such a file is decoded again with that
    method skipped: a pixel stream that is truncated or corrupt raises then too, and
    its first error is raised. (Other formats' ``load_end`` also finish the pixels,
    e.g. GIF's palette conversion: their errors are raised as they are.)

    Raises
    ------
    Exception
        Whatever Pillow raises for a file it cannot open or whose pixels it cannot
        decode (OSError, SyntaxError, ValueError, ...).
    """
    from PIL import Image, PngImagePlugin

    img = Image.open(path)
    try:
        img.load()
        return img, None
    except Exception as err:
        img.close()
        if not isinstance(img, PngImagePlugin.PngImageFile):
            raise
        first = err
    again = Image.open(path)
    again.load_end = lambda: None  # the pixels alone; the chunks after them unread
    try:
        again.load()
    except Exception:
        again.close()
        raise first from None
    return again, f"{type(first).__name__}: {first}, after the pixels"


def read_canonical_rgb(path: str | Path):
    """
    The canonical 8-bit RGB image of a file (`canonical_rgb`) as displayed: pixels
    decoded, then the EXIF orientation applied (`PIL.ImageOps.exif_transpose`), as
    every viewer shows the photograph (the encoders' neurons are orientation-tuned).

    An image whose pixels decode but whose metadata Pillow cannot read is used as
    stored, not refused: a malformed EXIF block (``SyntaxError: not a TIFF file``,
    Pillow #5528 and #8348, from `PIL.Image.Image.getexif`; or ``struct.error``,
    ``ValueError`` ... while `exif_transpose` rewrites it), or a PNG chunk after the
    image data that is cut short or malformed (`_decoded`). The parse-time check and
    the jobs' loader both read files here, so they agree.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    rgb : PIL.Image.Image
        Mode ``RGB``, of the size as displayed (EXIF orientations 5 to 8 turn it a
        quarter).
    problem : str or None
        None, or why the orientation was not applied: the error Pillow raised, e.g.
        ``SyntaxError: not a TIFF file (header b'garbage ' not valid)``.

    Raises
    ------
    Exception
        What Pillow raises for a file it cannot open or whose pixels it cannot
        decode (`_decoded`).
    ValueError
        From `canonical_rgb`.
    """
    from PIL import ImageOps

    img, problem = _decoded(path)
    with img:
        shown = img
        if problem is None:
            try:
                shown = ImageOps.exif_transpose(img)
            except MemoryError:
                raise
            except Exception as err:  # the pixels are decoded: the metadata is bad
                problem = f"{type(err).__name__}: {err}"
        return canonical_rgb(shown), problem


def check_test_image(path: str | Path) -> str | None:
    """
    None if `path` reads as an image and converts (`read_canonical_rgb`), else the
    problem in a few words (it completes "image ... "). Imports no torch.
    """
    bad, _ = check_test_images([path])
    return bad[1] if bad else None


#: The side of the images the encoders and diffusion models take (pixels).
IMAGE_SIDE = 64


def check_test_images(files) -> tuple[tuple[int, str] | None, str | None]:
    """
    Every test image of a run read once, as the jobs read it (`read_canonical_rgb`).

    Parameters
    ----------
    files : sequence of str or Path

    Returns
    -------
    bad : (int, str) or None
        The first file that does not read as an image or convert, as (its index in
        `files`, the problem), or None.
    notices : str or None
        None, or one line per case, joined by newlines: how many images are not
        64 x 64 (upstream's ``Resize((64, 64))`` in
        `multigeom.datasets.CANONICAL_TRANSFORM` scales them, and squeezes one that is
        not square) and the first of them (sizes as displayed); how many have
        metadata Pillow cannot read, and so are used as stored, and the first of them
        with the error. One opening per file: the run's parse-time check of 10,000
        images costs one pass.
    """
    sizes, unoriented = [], []
    for i, f in enumerate(files):
        try:
            rgb, problem = read_canonical_rgb(f)
        except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError, ...
            problem = f"cannot be read as an image ({type(err).__name__}: {err})"
            return (i, problem), None
        sizes.append((str(f), rgb.size))
        if problem is not None:
            unoriented.append((str(f), problem))
    lines = [_resize_line(sizes), _unoriented_line(unoriented)]
    return None, "\n".join(filter(None, lines)) or None


def _unoriented_line(unoriented: list[tuple[str, str]]) -> str | None:
    if not unoriented:
        return None
    first, problem = unoriented[0]
    return (
        f"notice: {len(unoriented)} test image(s) have metadata that cannot be read "
        f"and are used as stored, without their EXIF orientation (first: {first}: "
        f"{problem}); rotate them yourself if they look turned (docs/configuration.md)"
    )


def _resize_line(sizes: list[tuple[str, tuple[int, int]]]) -> str | None:
    odd = [(f, w, h) for f, (w, h) in sizes if (w, h) != (IMAGE_SIDE, IMAGE_SIDE)]
    if not odd:
        return None
    squeezed = sum(w != h for _, w, h in odd)
    first, w, h = odd[0]
    return (
        f"notice: {len(odd)} test image(s) are not {IMAGE_SIDE} x {IMAGE_SIDE} and are "
        f"resized to it as upstream does ({squeezed} of them not square, so squeezed; "
        f"first: {first}, {w} x {h}); crop them square first to keep their proportions "
        "(docs/configuration.md)"
    )


def load_test_image(path: str | Path):
    """
    The canonical image of a file, as upstream reads a TinyImageNet image: opened with
    PIL, converted to RGB (`read_canonical_rgb`: EXIF orientation, 16-bit, palette and
    transparency handled), then `multigeom.datasets.CANONICAL_TRANSFORM` (resize to
    64 x 64, grayscale, pixels in [-1, 1]). An image whose metadata cannot be read is
    used as stored, with one ``notice:`` line on standard error (the job's log).

    Returns
    -------
    torch.Tensor
        Of shape (1, 64, 64), float32, pixels in [-1, 1].

    Raises
    ------
    ValueError
        From `canonical_rgb`, naming the file.
    Exception
        What Pillow raises for a file it cannot open or whose pixels it cannot decode.
    """
    from multigeom.datasets import CANONICAL_TRANSFORM

    try:
        rgb, problem = read_canonical_rgb(path)
    except ValueError as err:
        raise ValueError(f"test image {str(path)!r} {err}") from None
    if problem is not None:
        print(
            f"notice: test image {str(path)!r} is used as stored, without its EXIF "
            f"orientation: its metadata cannot be read ({problem})",
            file=sys.stderr,
        )
    return CANONICAL_TRANSFORM(rgb)
