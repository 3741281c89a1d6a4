"""A plain training loop that pauses, as a real one does at a checkpoint or an evaluation: does its loader survive?

While the loop waits for data, a DataLoader holds one batch at a time in flight; while the loop pauses (a checkpoint
save, an evaluation), the workers keep loading until ``num_workers x prefetch_factor`` batches wait in shared memory
(``/dev/shm``), plus the one the loop holds. A default Docker container has 64 MB of it: a loader that passed every
trial can die at the user's first checkpoint (issue 41, docs/loader-memory.md). This script runs that loop on a
data-bound workload (a tiny convnet over JPEGs decoded and cropped by PIL; 1280x960 sources and 224 px crops give
38.5 MB a batch of 64) and says whether the loader survived, with the shared memory it saw.

The loader comes from a recommendation (``--recommendation best.yaml``: ``Recommendation.dataloader_kwargs()``, which
refuses a loader that does not fit this machine, as a user's script would get it) or from the flags::

    python benchmarks/paused_loader.py --num-workers 2 --prefetch-factor 2 --batch-size 64
    python benchmarks/paused_loader.py --recommendation best.yaml
    unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && python benchmarks/paused_loader.py ...'

``workload`` is the same data as a ``module:callable`` for ``autotune run --model benchmarks.paused_loader:workload``.
Exit code 0: the loop ran every batch; 1: the loader died (its one-line error printed); 2: a refusal or bad input.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import threading
import time

SOURCE = (1280, 960)  # the JPEG every item decodes: a phone photo's size, as in issue 41's measurement


def _jpeg(size: tuple[int, int] = SOURCE) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (size[1] // 16, size[0] // 16, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize(size, Image.BILINEAR).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class Photos:
    """``n`` items, each the JPEG decoded, randomly resized and cropped to ``image_size``, flipped, to a tensor."""

    def __init__(self, image_size: int = 224, n: int = 2048, source: tuple[int, int] = SOURCE) -> None:
        from torchvision import transforms

        self.blob, self.n = _jpeg(source), n
        self.tf = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                                      transforms.ToTensor()])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        from PIL import Image

        return self.tf(Image.open(io.BytesIO(self.blob)).convert("RGB")), i % 4


def workload(image_size: int = 224):
    """The same data as a ``module:callable`` for ``autotune run``: a model of a few hundred parameters (the data path
    binds), the photos, cross-entropy."""
    from torch import nn

    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 4))
    return model, Photos(image_size), nn.CrossEntropyLoss()


def _shm_used_mb(path: str = "/dev/shm") -> float | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20


class _ShmPeak(threading.Thread):
    """Samples /dev/shm's used space every 50 ms: the most the loader's queue filled it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base, self.peak, self.stop = _shm_used_mb(), 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            used = _shm_used_mb()
            if used is not None and self.base is not None:
                self.peak = max(self.peak, used - self.base)


def _loader_kwargs(args: argparse.Namespace) -> dict:
    if args.recommendation:
        from autotune.errors import AutotuneError
        from autotune.recommendation import Recommendation

        try:
            return Recommendation.from_yaml(args.recommendation).dataloader_kwargs()
        except AutotuneError as exc:
            print(f"paused_loader: refused: {exc}", file=sys.stderr)
            sys.exit(2)
    kw = {"batch_size": args.batch_size, "num_workers": args.num_workers, "pin_memory": False}
    if args.num_workers:
        kw.update(prefetch_factor=args.prefetch_factor, persistent_workers=True)
    return kw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recommendation", default=None, metavar="YAML", help="the loader of an exported recommendation")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batches", type=int, default=None,
                   help="batches the loop trains on (default: past the pause, every batch the loader held in flight "
                        "and two more, so a worker that failed while the loop paused is seen)")
    p.add_argument("--pause-after", type=int, default=2, help="pause after this many batches (default: %(default)s)")
    p.add_argument("--pause", type=float, default=8.0, help="seconds the loop pauses (default: %(default)s)")
    args = p.parse_args(argv)
    import torch

    kw = _loader_kwargs(args)
    if args.batches is None:
        args.batches = args.pause_after + kw["num_workers"] * (kw.get("prefetch_factor") or 2) + 3
    model, data, loss_fn = workload(args.image_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(data, shuffle=True, drop_last=True, **kw)
    print(f"loader: {' '.join(f'{k}={v}' for k, v in kw.items())}; /dev/shm used before: "
          f"{_shm_used_mb() or 0:.1f} MiB", flush=True)
    watch = _ShmPeak()
    watch.start()
    done = 0
    try:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            done += 1
            if done == args.pause_after:
                print(f"batch {done}: {x.numel() * x.element_size() / 1e6:.1f} MB; pausing {args.pause:g} s "
                      "(a checkpoint, an evaluation)", flush=True)
                time.sleep(args.pause)
            if done >= args.batches:
                break
    except Exception as exc:  # noqa: BLE001 - the loader's death is the result, said in one line
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        last = lines[-1] if lines else ""  # a worker's error comes wrapped; its own line is the last
        said = last if last.startswith(f"{type(exc).__name__}:") else f"{type(exc).__name__}: {last}"
        print(f"DIED after {done} batch(es), /dev/shm peak {watch.peak:.1f} MiB: {said}", flush=True)
        return 1
    finally:
        watch.stop.set()
    print(f"SURVIVED: {done} batches, the pause and every batch queued during it included; the loader's /dev/shm peak "
          f"{watch.peak:.1f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
