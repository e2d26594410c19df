"""
Images from a folder: every Pillow mode and bit depth becomes upstream's canonical
input faithfully (16-bit scaled, EXIF orientation applied, palette and alpha on the
documented mid-gray), hidden and non-image files are left out, and an unreadable image
is named at the configuration check, before any job. An image whose pixels decode but
whose metadata does not (a malformed ``eXIf`` chunk, a chunk cut short after the image
data) is used as stored, with one notice, by the check and the jobs' loader alike.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG, run_snakemake, said_lines
from multigeom.datasets import CANONICAL_TRANSFORM
from PIL import Image

from multigeom_workflow.inputs.images import (
    ALPHA_BACKGROUND,
    check_test_images,
    list_folder_images,
    load_test_image,
)
from multigeom_workflow.scenario import ConfigError, validated_scenario


def canonical_of_8bit(rgb: np.ndarray) -> torch.Tensor:
    """Upstream's canonical image of an 8-bit RGB (or gray) array."""
    mode = "RGB" if rgb.ndim == 3 else "L"
    return CANONICAL_TRANSFORM(
        Image.fromarray(rgb.astype(np.uint8), mode).convert("RGB")
    )


def gradient(h=80, w=96) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return (x * 3 + y * 2).astype(np.float64) / (3 * (w - 1) + 2 * (h - 1))


def test_16bit_grayscale_is_scaled_not_clipped(tmp_path):
    a16 = np.rint(gradient() * 65535).astype(np.uint16)
    Image.fromarray(a16).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    x = load_test_image(tmp_path / "g16.png")
    want = canonical_of_8bit(np.rint(a16 * (255 / 65535)))
    assert torch.equal(x, want)
    assert -0.1 < float(x.mean()) < 0.1  # a gradient's mean, not nearly white (~1)


def test_exif_orientation_is_applied(tmp_path):
    # An asymmetric picture stored as the camera took it, with orientation 6: viewers
    # rotate it 90 degrees clockwise.
    stored = np.zeros((64, 96), np.uint8)
    stored[:16, :48] = 255  # bright block at the top left as stored
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(tmp_path / "phone.png", exif=exif)
    x = load_test_image(tmp_path / "phone.png")
    shown = np.rot90(stored, k=-1)  # 90 degrees clockwise: (96, 64), block top right
    assert torch.equal(x, canonical_of_8bit(np.ascontiguousarray(shown)))
    assert not torch.equal(x, canonical_of_8bit(stored))


def test_alpha_is_composited_on_mid_gray(tmp_path):
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 0
    rgba[:, 32:, 3] = 255  # right half opaque red, left half transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    want = np.zeros((64, 64, 3), np.uint8)
    want[:, :32] = ALPHA_BACKGROUND
    want[:, 32:] = (200, 0, 0)
    x = load_test_image(tmp_path / "a.png")
    assert torch.equal(x, canonical_of_8bit(want))
    assert ALPHA_BACKGROUND == (128, 128, 128)  # the documented background


def test_palette_transparency_is_composited_on_mid_gray(tmp_path):
    p = Image.new("P", (64, 64), 0)
    p.putpalette([255, 255, 255, 10, 20, 30] + [0] * 762)
    p.paste(1, (0, 0, 64, 32))  # top half colour 1, bottom half colour 0
    p.info["transparency"] = 0  # colour 0 is transparent
    p.save(tmp_path / "p.png", transparency=0)
    want = np.zeros((64, 64, 3), np.uint8)
    want[:32] = (10, 20, 30)
    want[32:] = ALPHA_BACKGROUND
    assert torch.equal(load_test_image(tmp_path / "p.png"), canonical_of_8bit(want))


@pytest.mark.parametrize("mode", ["L", "RGB", "1", "CMYK"])
def test_8bit_modes_are_upstreams_conversion(tmp_path, mode):
    img = Image.fromarray(np.rint(gradient() * 255).astype(np.uint8)).convert(mode)
    f = tmp_path / ("x.tif" if mode == "CMYK" else "x.png")
    img.save(f)
    with Image.open(f) as im:
        assert torch.equal(load_test_image(f), CANONICAL_TRANSFORM(im.convert("RGB")))


def folder_config(folder, n_images=2):
    return {
        **yaml.safe_load(TINY_CONFIG.read_text()),
        "n_images": n_images,
        "test_images": {"source": "folder", "path": str(folder)},
    }


def write_png(path, value):
    Image.fromarray(np.full((64, 64), value, np.uint8)).save(path)


def test_hidden_and_other_files_are_left_out(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    write_png(folder / "p0.png", 10)
    write_png(folder / "p1.png", 20)
    (folder / "._p1.png").write_bytes(b"\x00\x05\x16\x07AppleDouble")  # a Mac's
    (folder / ".DS_Store").write_bytes(b"Bud1")
    (folder / "notes.txt").write_text("not an image")
    assert list_folder_images(folder) == [folder / "p0.png", folder / "p1.png"]
    s = validated_scenario(folder_config(folder), REPO)
    assert s.test_image_files == (str(folder / "p0.png"), str(folder / "p1.png"))


@pytest.mark.parametrize(
    "content",
    [b"not a png at all", "truncated"],
    ids=["garbage", "truncated"],
)
def test_unreadable_image_is_named_at_the_check(tmp_path, content):
    folder = tmp_path / "photos"
    folder.mkdir()
    write_png(folder / "p0.png", 10)
    if content == "truncated":
        buf = io.BytesIO()
        Image.fromarray(np.rint(gradient() * 255).astype(np.uint8)).save(buf, "PNG")
        content = buf.getvalue()[: len(buf.getvalue()) // 2]
    (folder / "p1.png").write_bytes(content)
    with pytest.raises(
        ConfigError, match=r"test image 1 '.*p1\.png' cannot be read as an image"
    ):
        validated_scenario(folder_config(folder), REPO)


@pytest.mark.workflow
def test_unreadable_image_stops_snakemake_before_any_job(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    write_png(folder / "p0.png", 10)
    (folder / "p1.png").write_bytes(b"GIF89a broken")
    configfile = tmp_path / "c.yaml"
    configfile.write_text(yaml.safe_dump(folder_config(folder)))
    work = tmp_path / "work"
    work.mkdir()
    result = run_snakemake(work, "-n", configfile=configfile)
    assert result.returncode == 1
    lines = said_lines(result.stderr)
    assert len(lines) == 1 and "p1.png" in lines[0], result.stderr
    assert lines[0].startswith("config error: config key 'test_images.path'")


def test_resized_and_squeezed_images_are_named(tmp_path):
    from multigeom_workflow.inputs.images import check_test_images

    def resize_notice(files):  # the notice of the parse-time check of the images
        bad, notice = check_test_images(files)
        assert bad is None
        return notice

    folder = tmp_path / "photos"
    folder.mkdir()
    write_png(folder / "p0.png", 10)  # 64 x 64: nothing to say
    Image.fromarray(np.zeros((100, 300), np.uint8)).save(folder / "p1.png")
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(folder / "p2.png")
    files = sorted(folder.iterdir())
    assert resize_notice(files[:1]) is None
    line = resize_notice(files)
    assert line.startswith("notice: 2 test image(s) are not 64 x 64")
    assert "1 of them not square" in line
    assert f"first: {folder / 'p1.png'}, 300 x 100" in line


@pytest.mark.workflow
def test_the_notices_are_said_once_by_a_dry_run(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    write_png(folder / "p0.png", 10)
    Image.fromarray(np.zeros((100, 300), np.uint8)).save(folder / "p1.png")
    (folder / "p2.png").write_bytes(png_with_chunk_before_iend(b"eXIf", GARBAGE))
    configfile = tmp_path / "c.yaml"
    configfile.write_text(yaml.safe_dump(folder_config(folder, n_images=3)))
    work = tmp_path / "work"
    work.mkdir()
    result = run_snakemake(work, "-n", configfile=configfile)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("notice: 1 test image(s) are not 64 x 64") == 1
    unoriented = "notice: 1 test image(s) have metadata that cannot be read"
    assert result.stderr.count(unoriented) == 1, result.stderr[-2000:]
    assert f"first: {folder / 'p2.png'}: SyntaxError: not a TIFF file" in result.stderr


# A PNG whose pixels decode and whose metadata does not.
GARBAGE = b"garbage exif bytes!"  # no TIFF header ("II*\0" or "MM\0*")


def stored_pixels() -> np.ndarray:
    """An asymmetric 64 x 64 picture: any rotation or flip of it is another."""
    a = np.rint(gradient(64, 64) * 200).astype(np.uint8)
    a[:16, :40] = 255
    return a


def png_with_chunk_before_iend(cid: bytes, payload: bytes, cut: int = 0) -> bytes:
    """
    A PNG of `stored_pixels` written by Pillow, with a raw chunk inserted before
    ``IEND`` (length, type, data, CRC-32 of type and data: PNG spec 5.3); `cut` bytes
    left off the end of the file.
    """
    buf = io.BytesIO()
    Image.fromarray(stored_pixels()).save(buf, "PNG")
    data = buf.getvalue()
    iend = data.rindex(b"IEND") - 4  # the IEND chunk starts with its length
    crc = struct.pack(">I", zlib.crc32(cid + payload))
    chunk = struct.pack(">I", len(payload)) + cid + payload + crc
    out = data[:iend] + chunk + data[iend:]
    return out[: len(out) - cut]


BROKEN_METADATA = {
    # name: (file bytes, what Pillow raises after decoding the pixels, the problem)
    # Pillow #5528, #8348: getexif() parses the eXIf chunk as TIFF
    "malformed eXIf": (
        png_with_chunk_before_iend(b"eXIf", GARBAGE),
        (SyntaxError, "not a TIFF file (header b'garbage ' not valid)"),
        "SyntaxError: not a TIFF file (header b'garbage ' not valid)",
    ),
    # PngImageFile.load_end reads the text chunk after IDAT and runs out of file
    "tEXt cut short": (
        png_with_chunk_before_iend(b"tEXt", b"Comment\x00" + b"x" * 200, cut=120),
        (OSError, "Truncated File Read"),
        "OSError: Truncated File Read, after the pixels",
    ),
}


@pytest.mark.parametrize("case", BROKEN_METADATA)
def test_broken_metadata_leaves_the_image_as_stored_with_a_notice(
    tmp_path, capsys, case
):
    data, (pillow_error, message), problem = BROKEN_METADATA[case]
    f = tmp_path / "cam.png"
    f.write_bytes(data)
    with Image.open(f) as img, pytest.raises(pillow_error) as raised:
        # Pillow's own behaviour, on which the workflow used to stop
        img.load()
        img.getexif()
    assert str(raised.value) == message
    capsys.readouterr()
    x = load_test_image(f)
    assert torch.equal(x, canonical_of_8bit(stored_pixels()))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"notice: test image {str(f)!r} is used as stored, without its EXIF "
        f"orientation: its metadata cannot be read ({problem})"
    ]


@pytest.mark.parametrize("case", BROKEN_METADATA)
def test_the_check_and_the_jobs_loader_both_accept_broken_metadata(
    tmp_path, capsys, case
):
    data, _, problem = BROKEN_METADATA[case]
    folder = tmp_path / "photos"
    folder.mkdir()
    write_png(folder / "p0.png", 10)
    (folder / "p1.png").write_bytes(data)
    files = list_folder_images(folder)
    bad, notice = check_test_images(files)
    assert bad is None
    assert notice == (
        "notice: 1 test image(s) have metadata that cannot be read and are used as "
        f"stored, without their EXIF orientation (first: {folder / 'p1.png'}: "
        f"{problem}); rotate them yourself if they look turned (docs/configuration.md)"
    )
    s = validated_scenario(folder_config(folder), REPO)
    assert notice in s.notes
    # the job's loader reads the same pixels as the check
    x = load_test_image(s.test_image_files[1])
    assert torch.equal(x, canonical_of_8bit(stored_pixels()))
    assert "notice: test image" in capsys.readouterr().err


@pytest.mark.parametrize("short", [8, 200])
def test_pixels_cut_short_are_still_refused_by_the_check_and_the_loader(
    tmp_path, short
):
    data = png_with_chunk_before_iend(b"eXIf", GARBAGE)
    pixels_end = data.index(b"eXIf") - 8  # before IDAT's CRC and eXIf's length
    f = tmp_path / "p.png"
    f.write_bytes(data[: pixels_end - short])  # the last `short` bytes of IDAT gone
    bad, _ = check_test_images([f])
    assert bad == (0, "cannot be read as an image (OSError: image file is truncated)")
    with pytest.raises(OSError, match="image file is truncated"):
        load_test_image(f)
