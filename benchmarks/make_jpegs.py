"""Make a folder of JPEGs in torchvision's ImageFolder layout (DIR/<class>/<image>.jpg), with PIL and numpy only.

Each image is smooth noise (a small random field resized bilinearly, plus a little per-pixel noise), which
compresses and decodes like a photo rather than like a flat colour or white noise. The H200 run of 2026-11-26
(../shared/measurements/h200-2026-11-26/) used 512 of 320x240 in 10 classes, the defaults here. Nothing is
downloaded; the same arguments give the same bytes.

    python benchmarks/make_jpegs.py /tmp/jpegs                       # 512 JPEGs, 320x240, 10 classes
    python benchmarks/make_jpegs.py /tmp/jpegs --count 20 --classes 2 --size 64x48
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, e.g. 320x240") from None
    if w < 8 or h < 8:
        raise argparse.ArgumentTypeError(f"{text!r}: each side must be at least 8 pixels")
    return w, h


def make(root: str | Path, *, count: int = 512, classes: int = 10, size: tuple[int, int] = (320, 240),
         seed: int = 0, quality: int = 90) -> int:
    """Write ``count`` JPEGs under ``root``, image ``i`` in class ``i % classes``; returns how many were written.
    An existing image of the same name is overwritten (the folder may be made again)."""
    import numpy as np
    from PIL import Image

    if count < classes:
        raise ValueError(f"count {count} < classes {classes}: ImageFolder refuses an empty class")
    rng = np.random.default_rng(seed)
    w, h = size
    root = Path(root)
    for c in range(classes):
        (root / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        field = rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(field).resize((w, h), Image.BILINEAR), dtype=np.int16)
        noisy = np.clip(smooth + rng.integers(-8, 9, smooth.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(root / f"class_{i % classes:02d}" / f"img_{i:05d}.jpg", format="JPEG",
                                    quality=quality)
    return count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="the folder to fill (made if missing)")
    p.add_argument("--count", type=int, default=512, help="how many images (default: %(default)s)")
    p.add_argument("--classes", type=int, default=10, help="class sub-folders (default: %(default)s)")
    p.add_argument("--size", type=_size, default=(320, 240), metavar="WxH", help="image size (default: 320x240)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.count < 1 or args.classes < 1:
        p.error("--count and --classes must be at least 1")
    if args.count < args.classes:
        p.error(f"--count {args.count} < --classes {args.classes}: ImageFolder refuses an empty class")
    t0 = time.perf_counter()
    n = make(args.root, count=args.count, classes=args.classes, size=args.size, seed=args.seed)
    print(f"wrote {n} JPEGs of {args.size[0]}x{args.size[1]} in {args.classes} classes to {args.root} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
