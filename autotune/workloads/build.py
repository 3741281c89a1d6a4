"""Build a workload by name: model, dataset and loss.

* any torchvision classification model (``resnet18``, ``mobilenet_v3_small``...), always ``weights=None``;
* the built-in text workload (``transformer``, ``transformer_tiny``: ``autotune.workloads.text``), synthetic token
  sequences;
* or a user's ``package.module:callable`` returning ``(model, dataset, loss_fn)`` or a dict with those keys and,
  optionally, its own ``optimizer``, ``collate_fn``, ``sampler``, ``step``, ``count`` and ``length``: the workload
  contract, documented in one place, ``autotune.workloads.contract``. It is called with the keyword arguments it
  accepts among ``image_size``, ``task``, ``num_classes``. This runs the user's code by design: only name callables
  you trust.

Data is either a folder of real images (``torchvision.datasets.ImageFolder``) or synthetic JPEGs that go through
a real PIL decode and the standard transforms, so data loading costs what it costs in real training.

``check(workload)`` runs in the parent: it catches user mistakes before a trial is started and returns the
workload with ``data``, what its first batch holds (``autotune.workloads.probe``), which the search space is fitted
to. A ``module:callable`` is imported, resolved, its signature checked, built and probed in a short-lived child of
its own (``autotune.workloads.check_child``), so the parent never runs the user's code and an import or build that
hangs is ended after ``AUTOTUNE_IMPORT_TIMEOUT_S`` seconds (default 120) with a one-line ``WorkloadError``. The
built-in workloads' data is probed in this process where it has torch already (a couple of synthetic images at
most), else in that child. The child also answers what ``hardware.detect()`` needs of torch and the environment
stamp (``machine.envstamp``), so `autotune run`'s parent never imports torch on the CPU.
``build(workload)`` runs in the child.
"""

from __future__ import annotations

import inspect
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autotune.config import Workload
from autotune.errors import WorkloadError

__all__ = ["check", "profile", "build", "probe_builtin", "Built", "SyntheticJPEGDataset", "list_models", "resolve",
           "check_signature", "IMPORT_TIMEOUT_ENV", "IMPORT_TIMEOUT_S", "import_timeout_s", "offered_to"]

# How long the parent waits for the check child to import the user's module: importing torch on a loaded machine
# takes seconds; one that takes minutes is stuck (a lock, a network mount, input()), and is reported, not waited on.
IMPORT_TIMEOUT_ENV = "AUTOTUNE_IMPORT_TIMEOUT_S"
IMPORT_TIMEOUT_S = 120.0
OFFERED = ("image_size", "task", "num_classes")  # the keyword arguments a workload callable may accept

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_models() -> list[str]:
    """torchvision's classification models and the built-in text ones (``autotune.workloads.text``): the names
    ``--model`` accepts besides ``module:callable``. Read from torchvision's source, not imported: a typo is said
    in a fraction of a second (``autotune.workloads.names``)."""
    from autotune.workloads.names import classification_models
    from autotune.workloads.text import TEXT_MODELS

    return sorted([*classification_models(), *TEXT_MODELS])


def resolve(spec: str) -> Callable[..., Any]:
    """Import ``package.module:callable`` in this process and return the callable, or a one-line WorkloadError."""
    return _load_callable(spec)


def _offered(params: Any, workload: Workload) -> dict[str, Any]:
    """The keyword arguments a workload callable with parameters ``params`` is called with."""
    offered = {"image_size": workload.image_size, "task": workload.task, "num_classes": workload.num_classes}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return offered
    return {k: v for k, v in offered.items() if k in params}


def offered_to(fn: Callable[..., Any], workload: Workload) -> tuple[str, ...]:
    """The keyword arguments ``fn`` is called with (all offered when it cannot be introspected)."""
    try:
        return tuple(_offered(inspect.signature(fn).parameters, workload))
    except (TypeError, ValueError):  # called with none then (_call_user)
        return ()


def check_signature(fn: Callable[..., Any], workload: Workload) -> None:
    """Refuse a callable that cannot be called as a workload: one that needs an argument autotune does not pass
    (``--model os:system`` needs ``command``) would fail every trial the same way."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # not introspectable (some builtins): the first trial tells
        return
    try:
        sig.bind(**_offered(sig.parameters, workload))
    except TypeError as exc:
        raise WorkloadError(f"{workload.model} cannot be called as a workload: {exc}; autotune calls it with only "
                            f"the keyword arguments it accepts among {', '.join(OFFERED)} "
                            "(see autotune.workloads.contract)") from None


def _check_in_child(workload: Workload, env_stamp: bool = False) -> dict[str, Any]:
    """Import, resolve, check, build and probe ``workload``'s callable in a child (``autotune.workloads.check_child``),
    bounded by ``AUTOTUNE_IMPORT_TIMEOUT_S``; the child's whole process group goes when it is done or out of time.
    Returns what its first batch holds (``probe.probe``)."""
    import json
    import signal
    import subprocess
    import tempfile

    from autotune.machine.launch import SAFE_PATH_ENV, python_command, with_package_path

    timeout_s = import_timeout_s()
    env = with_package_path(dict(os.environ))  # this autotune, when the parent runs from a source checkout
    env.update(SAFE_PATH_ENV)  # nothing planted in the working folder is imported (docs/security.md)
    mod_name = workload.model.partition(":")[0]
    with tempfile.TemporaryFile() as err:
        from autotune.machine.envstamp import have_stamp

        # the child collects it alongside, for a caller that will recommend, once per process
        stamp = ("--env-stamp",) if env_stamp and not have_stamp() else ()
        proc = subprocess.Popen(python_command(sys.executable, "autotune.workloads.check_child",
                                               json.dumps(workload.to_dict()), *stamp),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise WorkloadError(
                f"importing {mod_name!r} for --model {workload.model} and building its first batch did not finish in "
                f"{timeout_s:g} s: it hangs (a lock, a network mount, a prompt?); fix the module, or set "
                f"{IMPORT_TIMEOUT_ENV}=SECONDS if it is only slow") from None
        finally:  # threads or processes the user's import started go with it, gone when this returns
            from autotune.machine.proctree import kill_group

            kill_group(proc.pid)
            proc.wait()
        err.seek(0)
        last_err = ([ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()] or [""])[-1]
    try:
        answer = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        code = proc.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise WorkloadError(f"importing {mod_name!r} for --model {workload.model} ended the interpreter ({how})"
                            + (f": {last_err[:300]}" if last_err else "")) from None
    if "error" in answer:
        raise WorkloadError(answer["error"])
    from autotune.machine.envstamp import remember_env_stamp
    from autotune.machine.hardware import remember_torch_facts

    remember_torch_facts(answer.get("torch"))  # this process's detect() then need not import torch,
    remember_env_stamp(answer.get("env"))  # nor its recommendation start a collect_env child
    return answer["data"]


def import_timeout_s() -> float:
    raw = os.environ.get(IMPORT_TIMEOUT_ENV)
    if not raw:
        return IMPORT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise WorkloadError(f"{IMPORT_TIMEOUT_ENV}={raw!r} is not a positive number of seconds "
                            f"(e.g. {IMPORT_TIMEOUT_ENV}=300)")
    return value


def _load_callable(spec: str) -> Callable[..., Any]:
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise WorkloadError(f"model {spec!r} is not of the form package.module:callable")
    try:
        module = _import_workload_module(mod_name)
    except ImportError as exc:
        raise WorkloadError(
            f"cannot import {mod_name!r} for --model {spec}: {exc}; check the module path and that it is "
            "importable from the current folder (or on PYTHONPATH)"
        ) from None
    except Exception as exc:
        raise WorkloadError(f"importing {mod_name!r} for --model {spec} raised {type(exc).__name__}: {exc}") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise WorkloadError(f"module {mod_name!r} has no attribute {attr!r} (from --model {spec})")
    if not callable(fn):
        raise WorkloadError(f"{spec} is a {type(fn).__name__}, not a callable returning (model, dataset, loss_fn)")
    return fn  # type: ignore[return-value]


def _import_workload_module(mod_name: str):
    """Import the module a ``module:callable`` names, finding it in the working folder as ``python -m`` would,
    without letting anything else there shadow an installed module (docs/security.md).

    The folder goes to the end of ``sys.path``, so a ``json.py`` or ``queue.py`` there loses to the standard
    library's (and the user's own helpers beside their module still import); the named module itself is loaded
    from the folder first, as before, even where an installed package has the same name."""
    import importlib.machinery
    import importlib.util

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # "" (an interactive session): the user's own choice
        sys.path.append(cwd)
    top = mod_name.partition(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [cwd]) if top not in sys.modules else None
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(top, None)
            raise
    return importlib.import_module(mod_name)


def _image_files(root: Path) -> tuple[list[str], int, list[str]]:
    """(class folders, images seen, class folders without any image); stops counting at one per class."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    n, empty = 0, []
    for c in classes:
        found = 0
        for _dirpath, _dirs, files in os.walk(root / c):
            found += sum(1 for f in files if f.lower().endswith(IMAGE_EXTENSIONS))
            if found:
                break
        n += found
        if not found:
            empty.append(c)
    return classes, n, empty


def check(workload: Workload, *, env_stamp: bool = False) -> Workload:
    """Refuse a workload that cannot be built, with a one-line WorkloadError that names the fix; else return it
    with ``data``, what its first batch holds (``probe.probe``). ``env_stamp``: the caller will recommend, so a
    check child collects the environment stamp too (``machine.envstamp.remember_env_stamp``)."""
    from autotune.workloads import text

    if workload.is_callable:
        data = _check_in_child(workload, env_stamp)
    elif text.is_text(workload.model):
        text.check(workload)
    else:
        names = list_models()
        if workload.model not in names:
            import difflib

            close = difflib.get_close_matches(workload.model, names, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise WorkloadError(
                f"unknown model {workload.model!r}: {hint}use a torchvision classification model, transformer "
                "(text), or package.module:callable (`autotune models` lists the names)"
            )
    if workload.data_dir is not None:
        root = Path(workload.data_dir)
        if not root.is_dir():
            raise WorkloadError(f"data dir {workload.data_dir!r} does not exist or is not a folder")
        classes, n, empty = _image_files(root)
        if not classes or not n:
            raise WorkloadError(
                f"data dir {workload.data_dir!r} has no images in class sub-folders: expected "
                f"DIR/<class>/<image>{IMAGE_EXTENSIONS[0]} (ImageFolder layout)"
            )
        if empty:
            raise WorkloadError(f"data dir {workload.data_dir!r}: class folder(s) {', '.join(empty[:5])} hold no "
                                "images; remove them or add images (ImageFolder refuses empty classes)")
    if not workload.is_callable:
        # Where this process has torch (a training script, the tests), probing here costs milliseconds; where it
        # has not (`autotune run`'s parent), the check child pays the import, and answers detect()'s facts of
        # torch and the environment stamp on the way, so this process never imports torch.
        data = probe_builtin(workload) if "torch" in sys.modules else _check_in_child(workload, env_stamp)
    _PROFILES[_profile_key(workload)] = data
    return workload.replace(data=data)


# what check() found, by workload: a Tuner made without a checked workload (tests, the Python API) is fitted
# without a second check child
_PROFILES: dict[str, dict[str, Any]] = {}


def _profile_key(workload: Workload) -> str:
    import json

    return json.dumps([workload.replace(data=None).to_dict(), os.getcwd()], sort_keys=True, default=str)


def profile(workload: Workload) -> dict[str, Any]:
    """``workload.data``, else what ``check`` found for it in this process, else ``check(workload).data``."""
    if workload.data is not None:
        return workload.data
    found = _PROFILES.get(_profile_key(workload))
    return found if found is not None else check(workload).data  # type: ignore[return-value]


def probe_builtin(workload: Workload) -> dict[str, Any]:
    """The first batch of a built-in workload, from its data alone (no model is built): the text workload's own
    parts; two synthetic images through the same transform the trial uses (a folder's images go through it too)."""
    from autotune.workloads import text
    from autotune.workloads.probe import probe

    if text.is_text(workload.model):
        parts = text.data_parts(workload)
        return probe(Built(None, parts.pop("dataset"), None, **parts))
    dataset = SyntheticJPEGDataset(workload.image_size, 2, num_classes=workload.num_classes, pool_size=2,
                                   transform=_transforms(workload.image_size, workload.task))
    return probe(Built(None, dataset, None))


def _transforms(image_size: int, task: str):
    from torchvision import transforms as T

    normalize = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    if task == "train":
        return T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), T.ToTensor(), normalize])
    return T.Compose([T.Resize(int(image_size * 256 / 224)), T.CenterCrop(image_size), T.ToTensor(), normalize])


class SyntheticJPEGDataset:
    """JPEG bytes made once, decoded by PIL and transformed on every access, like a folder of photos.

    A pool of ``pool_size`` distinct images (smooth colour fields plus noise, so they compress like photos,
    about 1.15x the crop size with varied aspect ratios) is encoded at construction; item ``i`` decodes
    image ``i % pool_size``. Labels are ``i % num_classes``.
    """

    def __init__(self, image_size: int, length: int, *, num_classes: int = 1000, transform=None,
                 pool_size: int = 64, seed: int = 0) -> None:
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(seed)
        self.length = length
        self.num_classes = num_classes
        self.transform = transform
        self.pool: list[bytes] = []
        base = int(image_size * 1.15)
        for _ in range(pool_size):
            h = max(16, int(base * rng.uniform(0.9, 1.1)))
            w = max(16, int(base * rng.uniform(0.9, 1.3)))
            coarse = rng.integers(0, 256, size=(max(2, h // 32), max(2, w // 32), 3), dtype=np.uint8)
            img = Image.fromarray(coarse).resize((w, h), Image.BILINEAR)
            arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, size=(h, w, 3))
            buf = io.BytesIO()
            Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
            self.pool.append(buf.getvalue())

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        from PIL import Image

        img = Image.open(io.BytesIO(self.pool[index % len(self.pool)])).convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, index % self.num_classes


@dataclass
class Built:
    """A built workload: the model, data and loss, and the user's own parts (None: autotune's; see
    ``autotune.workloads.contract``)."""

    model: Any
    dataset: Any
    loss_fn: Callable[..., Any] | None
    optimizer: Callable[[Any], Any] | None = None
    collate_fn: Callable[[list], Any] | None = None
    sampler: Any = None
    step: Callable[..., Any] | None = None
    count: Callable[[Any], Any] | None = None
    length: Callable[[Any], Any] | None = None  # item -> its length (not a part of the step: see probe)
    # batch_size -> the largest batch the data can produce (autotune.workloads.worst_case); not a part of the step
    worst_case_batch: Callable[[int], Any] | None = None

    @property
    def user_parts(self) -> tuple[str, ...]:
        from autotune.workloads.contract import user_parts

        return user_parts(self)


_KEYS = ("model", "dataset", "loss_fn", "loss", "optimizer", "collate_fn", "sampler", "step", "count", "length",
         "worst_case_batch")


def _parts(out: dict, name: str) -> dict[str, Any]:
    """The optional parts of a workload's dict, checked: callables where callables are due, no misspelt keys."""
    import difflib

    for key in out:
        close = difflib.get_close_matches(str(key), _KEYS, n=1, cutoff=0.75)
        if key not in _KEYS and close:
            raise WorkloadError(f"{name} returned key {key!r}: did you mean {close[0]!r}? "
                                "(see autotune.workloads.contract)")
    parts = {k: out.get(k) for k in ("optimizer", "collate_fn", "step", "count", "length", "worst_case_batch")}
    for k, v in parts.items():
        if v is not None and not callable(v):
            raise WorkloadError(f"{name} returned a {k} of type {type(v).__name__}, not a callable "
                                "(see autotune.workloads.contract)")
    sampler = out.get("sampler")
    if sampler is not None and not hasattr(sampler, "__iter__"):
        raise WorkloadError(f"{name} returned a sampler of type {type(sampler).__name__}, not an iterable of indices")
    return {**parts, "sampler": sampler}


def _call_user(fn: Callable[..., Any], workload: Workload) -> Built:
    check_signature(fn, workload)
    try:
        kwargs = _offered(inspect.signature(fn).parameters, workload)
    except (TypeError, ValueError):
        kwargs = {}
    out = fn(**kwargs)
    parts: dict[str, Any] = {}
    if isinstance(out, dict):
        missing = {"model", "dataset"} - set(out)
        if missing:
            raise WorkloadError(f"{workload.model} returned a dict without {', '.join(sorted(missing))}")
        model, dataset, loss_fn = out["model"], out["dataset"], out.get("loss_fn", out.get("loss"))
        parts = _parts(out, workload.model)
    elif isinstance(out, (tuple, list)) and len(out) in (2, 3):
        model, dataset, loss_fn = (*out, None) if len(out) == 2 else out
    else:
        raise WorkloadError(
            f"{workload.model} returned {type(out).__name__}; it must return (model, dataset, loss_fn) "
            "or a dict with keys model, dataset, loss_fn"
        )
    import torch

    if not isinstance(model, torch.nn.Module):
        raise WorkloadError(f"{workload.model} returned a model of type {type(model).__name__}, not torch.nn.Module")
    if isinstance(dataset, torch.utils.data.IterableDataset):
        if parts.get("sampler") is not None:
            raise WorkloadError(f"{workload.model} returned a sampler with an IterableDataset; an IterableDataset "
                                "orders its own items: drop the sampler")
    elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")) or len(dataset) == 0:
        raise WorkloadError(f"{workload.model} returned a dataset that is empty or has no __len__/__getitem__ "
                            "(nor is it an IterableDataset)")
    if workload.task == "train" and not callable(loss_fn) and parts.get("step") is None:
        raise WorkloadError(f"{workload.model} returned no callable loss_fn; task=train needs one (or a step)")
    return Built(model, dataset, loss_fn, **parts)


def build(workload: Workload, *, seed: int = 0, config: Any = None) -> Built:
    """Build model, dataset and loss in this process (the trial's child); ``config`` (the trial's
    ``TrialConfig``) gives the text workload its batch size and length bucketing.

    Anything the build raises, short of running out of memory, is a ``WorkloadError``: the build takes no knob
    of the config that could make it fail, so every trial would fail the same way, and the search stops at the
    first (a callable that raises, or calls ``sys.exit()``). The cause stays chained, for the traceback."""
    from autotune.machine.oom import is_oom
    from autotune.workloads.probe import length_sampler

    try:
        built = _build(workload, seed=seed, config=config)
        if config is not None and config.bucket_by_length:  # any workload that gives length: one path
            built.sampler = length_sampler(built, config.batch_size, seed=seed)
        return built
    except WorkloadError:
        raise
    except (Exception, SystemExit) as exc:
        if is_oom(exc):
            raise
        raise WorkloadError(f"building the workload {workload.model} raised {type(exc).__name__}: {exc}") from exc


def _build(workload: Workload, *, seed: int, config: Any) -> Built:
    if workload.is_callable:
        return _call_user(_load_callable(workload.model), workload)
    from autotune.workloads import text

    if text.is_text(workload.model):
        return Built(**text.build(workload, seed=seed, config=config))
    import torch
    import torchvision

    if workload.data is None:  # checked by the parent (``data`` is what its check found): not again in each trial
        check(workload)
    model = torchvision.models.get_model(workload.model, weights=None, num_classes=workload.num_classes)
    transform = _transforms(workload.image_size, workload.task)
    if workload.data_dir is not None:
        dataset = torchvision.datasets.ImageFolder(workload.data_dir, transform=transform)
    else:
        dataset = SyntheticJPEGDataset(workload.image_size, workload.dataset_size,
                                       num_classes=workload.num_classes, transform=transform, seed=seed)
    return Built(model, dataset, torch.nn.CrossEntropyLoss())
