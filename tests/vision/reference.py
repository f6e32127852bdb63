#!/usr/bin/env python3
"""Reference image token counts: the real HF image processors on real pixels, as SGLang runs them.

Usage:
    reference.py images     # (re)writes the test images into images/ (deterministic)
    reference.py generate   # writes fixtures.json from images/ and config/vision/
    reference.py check      # regenerates in memory and compares with fixtures.json
    reference.py counts OUT # writes the fixtures to OUT (e.g. under another transformers)

For every image and every setting it does what SGLang does with an image part:
  1. `PIL.Image.open(BytesIO(data))`, `.load()`, `.convert("RGB")` when the mode is not RGB
     (SGLang 0.5.23 `python/sglang/srt/utils/common.py` `_load_image` and
     `multimodal/processors/base_processor.py` `_load_single_item` with
     `discard_alpha_channel=True`; no EXIF transpose: `smart_rgb_conversion` is False for the
     Qwen-VL and Gemma 3 processors);
  2. for the legacy settings, old SGLang's pre-resize (`resize_image` in
     `multimodal/processors/qwen_vl.py`, SGLang 0.5.4 to 0.5.5.post1), re-implemented here from
     that source (`legacy_smart_resize` below) and applied with `Image.resize`;
  3. the model's HF image processor, built from `config/vision/<model>/preprocessor_config.json`
     (the PIL backend of transformers 5.19.0, no torch), and the token count from its output:
     `prod(image_grid_thw) / merge_size**2` for Qwen, `image_seq_length * (1 + num_crops)` for
     Gemma 3 (`processing_gemma3.py` `replace_image_token`).
Images over REAL_PIXELS are too big to push through numpy here: for those the count comes from
the same transformers module's own `smart_resize` (Qwen) or `pan_and_scan` on a zero-copy
array of the image's shape (Gemma 3), on the size Pillow reports; the case says
`"method": "size"` instead of `"processor"`.
"""
import io
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
import PIL
import transformers
from PIL import Image

try:  # transformers 5: the PIL/numpy backend has its own module
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil as GemmaProcessor
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as qwen_module
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as QwenProcessor
except ImportError:  # transformers 4 (SGLang 0.5.4's pin, 4.57.1): the slow classes are numpy
    from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor as GemmaProcessor
    from transformers.models.qwen2_vl import image_processing_qwen2_vl as qwen_module
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor as QwenProcessor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
IMAGES = os.path.join(HERE, "images")
FIXTURES = os.path.join(HERE, "fixtures.json")
REAL_PIXELS = 25_000_000

# SGLang 0.5.4 `qwen_vl.py`: IMAGE_FACTOR, MIN_PIXELS, MAX_RATIO; `environ.py`:
# SGLANG_IMAGE_MAX_PIXELS default.
LEGACY_FACTOR = 28
LEGACY_MIN_PIXELS = 4 * 28 * 28
LEGACY_DEFAULT_CAP = 16384 * 28 * 28

SETTINGS = {
    # name: (family, model dir, pre-resize cap, preprocessor overrides)
    "qwen2_5_vl/sglang": ("qwen2_vl", "Qwen2.5-VL-7B-Instruct", None, {}),
    "qwen2_5_vl/legacy_default_cap": ("qwen2_vl", "Qwen2.5-VL-7B-Instruct", LEGACY_DEFAULT_CAP, {}),
    "qwen2_5_vl/legacy_cap_1003520": ("qwen2_vl", "Qwen2.5-VL-7B-Instruct", 1_003_520, {}),
    "qwen3_vl/sglang": ("qwen3_vl", "Qwen3-VL-8B-Instruct", None, {}),
    "qwen3_vl/legacy_default_cap": ("qwen3_vl", "Qwen3-VL-8B-Instruct", LEGACY_DEFAULT_CAP, {}),
    "gemma3/sglang": ("gemma3", "gemma-3-4b-it", None, {}),
    # Gemma3ProcessorKwargs' pan-and-scan defaults (256, 4, 1.2), switched on.
    "gemma3/pan_and_scan": ("gemma3", "gemma-3-4b-it", None, {"do_pan_and_scan": True}),
}


# --------------------------------------------------------------------------- test images

def solid(mode, size, colour):
    return Image.new(mode, size, colour)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width, height):
    """A PNG whose IHDR declares a size and whose pixel data is a stub: Pillow refuses or sizes
    it from the header alone, which is all these cases need."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(b"\0")) + png_chunk(b"IEND", b""))


def save(image, fmt, **kwargs):
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def gif_overflowing_frame():
    """A GIF whose 20x30 first frame sits at (5, 5) on a 10x10 logical screen: Pillow's .size
    grows to (25, 35)."""
    data = bytearray(save(solid("P", (20, 30), 1), "GIF"))
    struct.pack_into("<HH", data, 6, 10, 10)
    at = data.index(b",", 13)
    struct.pack_into("<HH", data, at + 1, 5, 5)
    return bytes(data)


def webp_vp8x_header_only(width, height):
    body = b"WEBP" + b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def gif_header_only(width, height):
    """A GIF declaring a huge logical screen, with one 1x1 frame so that Pillow gets as far as
    its size check."""
    frame = b"," + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + frame + b";"


def jpeg_with_orientation(size, orientation):
    image = solid("RGB", size, (200, 30, 40))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return save(image, "JPEG", quality=50, exif=exif)


def test_images():
    """name -> bytes. Solid colours, so the files stay small."""
    rgb = (30, 120, 200)
    images = {
        "png_1x1.png": save(solid("RGB", (1, 1), rgb), "PNG"),
        "png_28x28.png": save(solid("RGB", (28, 28), rgb), "PNG"),
        "png_10x2000.png": save(solid("RGB", (10, 2000), rgb), "PNG"),
        "png_2000x10.png": save(solid("RGB", (2000, 10), rgb), "PNG"),
        "png_1920x1080.png": save(solid("RGB", (1920, 1080), rgb), "PNG"),
        "png_1x201.png": save(solid("RGB", (1, 201), rgb), "PNG"),
        "png_201x1.png": save(solid("RGB", (201, 1), rgb), "PNG"),
        "png_200x1.png": save(solid("RGB", (200, 1), rgb), "PNG"),
        "png_1x200.png": save(solid("RGB", (1, 200), rgb), "PNG"),
        "png_333x517.png": save(solid("RGB", (333, 517), rgb), "PNG"),
        "png_57x43.png": save(solid("RGB", (57, 43), rgb), "PNG"),
        # Sides at exact halves of the factor: Python rounds 2.5 -> 2, 3.5 -> 4, 4.5 -> 4,
        # 42.5 -> 42 (factor 28) and 2.5 -> 2, 4.5 -> 4 (factor 32).
        "png_half_70x98.png": save(solid("RGB", (70, 98), rgb), "PNG"),
        "png_half_126x1190.png": save(solid("RGB", (126, 1190), rgb), "PNG"),
        "png_half_80x144.png": save(solid("RGB", (80, 144), rgb), "PNG"),
        "png_half_1008x720.png": save(solid("RGB", (1008, 720), rgb), "PNG"),
        "png_rgba_640x480.png": save(solid("RGBA", (640, 480), (10, 20, 30, 128)), "PNG"),
        "png_palette_300x7.png": save(solid("P", (300, 7), 3), "PNG"),
        "png_gray16_100x100.png": save(solid("I;16", (100, 100), 1000), "PNG"),
        "png_interlaced_99x101.png": save(solid("RGB", (99, 101), rgb), "PNG", interlace=1),
        "png_4096x3072.png": save(solid("1", (4096, 3072), 1), "PNG"),
        "png_10000x8000.png": save(solid("1", (10000, 8000), 1), "PNG"),
        "png_header_13377x13377.png": png_header_only(13377, 13377),
        "png_bomb_13378x13378.png": png_header_only(13378, 13378),
        "png_bomb_30000x30000.png": png_header_only(30000, 30000),
        "jpeg_1920x1080.jpg": save(solid("RGB", (1920, 1080), rgb), "JPEG", quality=50),
        "jpeg_progressive_1001x999.jpg": save(solid("RGB", (1001, 999), rgb), "JPEG", quality=50, progressive=True),
        "jpeg_exif6_300x200.jpg": jpeg_with_orientation((300, 200), 6),
        "jpeg_exif8_10x2000.jpg": jpeg_with_orientation((10, 2000), 8),
        "jpeg_gray_57x43.jpg": save(solid("L", (57, 43), 90), "JPEG", quality=50),
        "jpeg_cmyk_64x48.jpg": save(solid("CMYK", (64, 48), (10, 20, 30, 40)), "JPEG", quality=50),
        "jpeg_1x1.jpg": save(solid("RGB", (1, 1), rgb), "JPEG"),
        "jpeg_2000x10.jpg": save(solid("RGB", (2000, 10), rgb), "JPEG", quality=50),
        "jpeg_gray_4000x3000.jpg": save(solid("L", (4000, 3000), 90), "JPEG", quality=10),
        "webp_lossy_640x480.webp": save(solid("RGB", (640, 480), rgb), "WEBP", quality=50),
        "webp_lossy_1920x1080.webp": save(solid("RGB", (1920, 1080), rgb), "WEBP", quality=50),
        "webp_lossless_1x1.webp": save(solid("RGB", (1, 1), rgb), "WEBP", lossless=True),
        "webp_lossless_300x7.webp": save(solid("RGB", (300, 7), rgb), "WEBP", lossless=True),
        "webp_lossless_16383x16383.webp": save(solid("RGB", (16383, 16383), rgb), "WEBP", lossless=True),
        "webp_alpha_333x517.webp": save(solid("RGBA", (333, 517), (1, 2, 3, 100)), "WEBP", quality=50),
        "webp_anim_64x32.webp": save(solid("RGB", (64, 32), rgb), "WEBP", save_all=True,
                                     append_images=[solid("RGB", (64, 32), (0, 0, 0))], duration=100),
        "webp_bomb_16384x16384.webp": webp_vp8x_header_only(16384, 16384),
        "gif_1x1.gif": save(solid("P", (1, 1), 2), "GIF"),
        "gif_500x300.gif": save(solid("P", (500, 300), 2), "GIF"),
        "gif_anim_64x32.gif": save(solid("P", (64, 32), 2), "GIF", save_all=True,
                                   append_images=[solid("P", (64, 32), 5)], duration=100),
        "gif_overflow_frame_25x35.gif": gif_overflowing_frame(),
        "gif_bomb_65535x65535.gif": gif_header_only(65535, 65535),
    }
    return images


def write_images():
    os.makedirs(IMAGES, exist_ok=True)
    images = test_images()
    for name in os.listdir(IMAGES):
        if name not in images:
            os.remove(os.path.join(IMAGES, name))
    for name, data in images.items():
        with open(os.path.join(IMAGES, name), "wb") as f:
            f.write(data)
    total = sum(len(d) for d in images.values())
    print(f"{len(images)} images, {total} bytes")


# --------------------------------------------------------------------------- the reference

def legacy_smart_resize(height, width, factor, min_pixels, max_pixels):
    """Old SGLang's smart_resize (0.5.4 `qwen_vl.py`): each side rounded half-to-even to the
    factor and raised to at least the factor; over the cap it floors without that floor."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def load_config(model, overrides):
    with open(os.path.join(ROOT, "config", "vision", model, "preprocessor_config.json")) as f:
        config = json.load(f)
    config.update(overrides)
    return config


def build_processor(family, config):
    kwargs = {k: v for k, v in config.items()
              if k not in ("image_processor_type", "processor_class") and v is not None}
    if family == "gemma3":
        return GemmaProcessor(**kwargs)
    return QwenProcessor(**kwargs)


def gemma_call_kwargs(config):
    # Gemma3Processor passes its `_defaults` to the image processor; the model's config, where
    # not null, wins over them.
    defaults = {"do_pan_and_scan": False, "pan_and_scan_min_crop_size": 256,
                "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_ratio_to_activate": 1.2}
    return {k: (config.get(k) if config.get(k) is not None else v) for k, v in defaults.items()}


def count(image_or_size, family, config, cap):
    """Token count for a PIL image (processor path) or a (width, height) (size path)."""
    is_size = isinstance(image_or_size, tuple)
    width, height = image_or_size if is_size else image_or_size.size
    if family == "gemma3":
        seq = config.get("image_seq_length") or 256
        call = gemma_call_kwargs(config)
        processor = build_processor(family, config)
        if is_size:
            if not call["do_pan_and_scan"]:
                return seq
            shape_only = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, height, width))
            crops = processor.pan_and_scan(
                shape_only, call["pan_and_scan_min_crop_size"], call["pan_and_scan_max_num_crops"],
                call["pan_and_scan_min_ratio_to_activate"])
            return seq * (1 + len(crops))
        out = processor(images=[image_or_size], **call)
        return seq * (1 + int(out["num_crops"][0]))
    if cap is not None:
        h, w = legacy_smart_resize(height, width, LEGACY_FACTOR, LEGACY_MIN_PIXELS, cap)
        if is_size:
            width, height = w, h
        else:
            image_or_size = image_or_size.resize((w, h))
    processor = build_processor(family, config)
    merge = processor.merge_size
    if is_size:
        size = processor.size
        h, w = qwen_module.smart_resize(height, width, processor.patch_size * merge,
                                     size["shortest_edge"], size["longest_edge"])
        return (h // processor.patch_size) * (w // processor.patch_size) // merge**2
    out = processor(images=[image_or_size])
    t, gh, gw = (int(x) for x in out["image_grid_thw"][0])
    return t * gh * gw // merge**2


def open_like_sglang(data):
    image = Image.open(io.BytesIO(data))
    return image


def case_for(name, data):
    case = {"file": name}
    try:
        image = open_like_sglang(data)
    except Image.DecompressionBombError:
        case["probe_error"] = "too_large"
        return case
    except Exception as e:  # noqa: BLE001 - any refusal by Pillow
        case["probe_error"] = f"invalid: {type(e).__name__}"
        return case
    case["format"] = image.format
    case["width"], case["height"] = image.size
    real = image.size[0] * image.size[1] <= REAL_PIXELS
    if real:
        image.load()
        if image.mode != "RGB":
            image = image.convert("RGB")
    case["method"] = "processor" if real else "size"
    counts = {}
    for setting, (family, model, cap, overrides) in SETTINGS.items():
        config = load_config(model, overrides)
        try:
            counts[setting] = {"tokens": count(image if real else image.size, family, config, cap)}
        except ValueError as e:
            counts[setting] = {"error": str(e)}
    case["counts"] = counts
    return case


def issue_checks():
    """The numbers quoted in issue 41, recomputed with the reference."""
    qwen25 = load_config("Qwen2.5-VL-7B-Instruct", {})
    out = {}
    for label, (w, h), cap in [
        ("1920x1080 Qwen2.5-VL, old SGLang default cap (issue: 2691)", (1920, 1080), LEGACY_DEFAULT_CAP),
        ("1920x1080 Qwen2.5-VL, cap 1003520 (issue: 1222)", (1920, 1080), 1_003_520),
        ("1920x1080 Qwen2.5-VL, current SGLang", (1920, 1080), None),
        ("10x2000 Qwen2.5-VL, current SGLang (issue: 29)", (10, 2000), None),
        ("10x2000 Qwen2.5-VL, old SGLang default cap (issue: 71)", (10, 2000), LEGACY_DEFAULT_CAP),
    ]:
        out[label] = count(Image.new("RGB", (w, h)), "qwen2_vl", qwen25, cap)
    return out


def fixtures():
    cases = []
    for name in sorted(os.listdir(IMAGES)):
        with open(os.path.join(IMAGES, name), "rb") as f:
            cases.append(case_for(name, f.read()))
    settings = {name: {"family": family, "model": model, "pre_resize_cap": cap, "overrides": overrides}
                for name, (family, model, cap, overrides) in SETTINGS.items()}
    meta = {"generator": "tests/vision/reference.py", "python": sys.version.split()[0],
            "transformers": transformers.__version__, "pillow": PIL.__version__, "numpy": np.__version__,
            "sglang_modelled": "0.5.23 (current: no pre-resize); 0.5.4-0.5.5.post1 for the legacy_* settings"}
    return {"_meta": meta, "settings": settings, "issue_checks": issue_checks(), "cases": cases}


def dump(obj):
    return json.dumps(obj, ensure_ascii=False, indent=1) + "\n"


def main():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    command = sys.argv[1] if len(sys.argv) > 1 else "generate"
    if command == "images":
        write_images()
    elif command == "generate":
        with open(FIXTURES, "w") as f:
            f.write(dump(fixtures()))
        print(f"wrote {FIXTURES}")
    elif command == "counts":
        with open(sys.argv[2], "w") as f:
            f.write(dump(fixtures()))
    elif command == "check":
        with open(FIXTURES) as f:
            same = f.read() == dump(fixtures())
        print("fixtures.json is up to date" if same else "fixtures.json differs")
        sys.exit(0 if same else 1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
