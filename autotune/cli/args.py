"""What the commands share: their argument groups, the adapters from parsed arguments to records, and the
choice of the study that `show`, `export` and `report` read.

Imports nothing from the ``cli*`` modules, which all import from here.
"""

from __future__ import annotations

import argparse

from autotune.config import KNOBS, MeasureSpec, TrialConfig, Workload
from autotune.errors import AutotuneError, ConfigError, StorageError

__all__ = ["add_workload_args", "add_ranks_args", "add_measure_args", "add_knob_args", "add_study_args",
           "add_study_selector_args", "workload_from_args", "measure_from_args", "config_from_args", "select_study"]


# --- argument groups --------------------------------------------------------------------------------------

def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (what is measured)")
    g.add_argument("--model", default="resnet18",
                   help="torchvision classification model (weights=None, nothing downloaded), transformer (the "
                        "built-in text workload, autotune.workloads.text) or package.module:callable returning (model, "
                        "dataset, loss_fn); default: %(default)s")
    g.add_argument("--task", choices=("train", "infer"), default="train",
                   help="train = forward+backward+optimizer step; infer = inference_mode forward "
                        "(default: %(default)s)")
    g.add_argument("--image-size", "--seq-len", type=int, default=224, metavar="SIZE",
                   help="square crop size; for a text model (transformer) the maximum sequence length in tokens, "
                        "for which --seq-len is the same flag (default: %(default)s)")
    g.add_argument("--data", metavar="DIR", default=None,
                   help="ImageFolder of real images (DIR/<class>/<img>); default: synthetic JPEGs decoded by PIL")
    g.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if a GPU is visible, else cpu)")
    _add_global_batch(g)


def add_ranks_args(p: argparse.ArgumentParser) -> None:
    """--nproc-per-node and --oversubscribe: a trial of N DDP ranks (autotune.trial.ddp)."""
    g = p.add_argument_group("DDP (several ranks, one trial)")
    g.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="run the trial as N DistributedDataParallel ranks of one process group (gloo on the CPU, "
                        "NCCL with one GPU per rank); batch size, threads and workers are per rank, throughput is "
                        "all ranks' (default: %(default)s, one process)")
    g.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than usable cores on the CPU (they then time each other)")


def _add_global_batch(g) -> None:
    g.add_argument("--global-batch", type=int, default=None, metavar="N",
                   help="keep N samples per optimizer step (training): the batch size is a micro-batch dividing "
                        "N, with N / batch size gradient accumulation steps (default: no accumulation)")


# On a GPU a step takes milliseconds and a quiet device repeats itself: shorter windows, and the windows stop once
# three of them agree within TIGHT_SPREAD (torch.utils.benchmark's adaptive_autorange idea); a noisy CPU VM keeps its
# windows (MeasureSpec.tight_spread).
GPU_WINDOW_S = 1.0
TIGHT_SPREAD = 0.02


def add_measure_args(p: argparse.ArgumentParser, *, windows: int = 5, window_s: float = 3.0,
                     timeout_help: str = "per-trial time limit") -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--windows", type=int, default=windows, help="measured windows per trial (default: %(default)s)")
    g.add_argument("--window-seconds", type=float, default=None, metavar="S",
                   help=f"minimum length of one window (default: {window_s:g} on the CPU, {GPU_WINDOW_S:g} on a GPU, "
                        f"where the windows also stop early, from the third, once they agree within "
                        f"{100 * TIGHT_SPREAD:.0f}%%)")
    g.set_defaults(cpu_window_seconds=window_s)
    g.add_argument("--trial-timeout", default="10m", metavar="DURATION",
                   help=f"{timeout_help}, e.g. 90s, 10m (default: %(default)s)")
    g.add_argument("--memory-cap", default=None, metavar="SIZE",
                   help="kill a trial whose processes (with DataLoader workers) exceed this, e.g. 12GiB "
                        "(default: 85%% of the memory available now)")
    g.add_argument("--device-memory-cap", default=None, metavar="SIZE",
                   help="on a GPU: the most PyTorch's allocator may hold in a trial, enforced while it runs (a "
                        "config past it fails as out of memory, so the search learns the boundary), e.g. 10GiB "
                        "(default: the GPU's free memory when the run starts, less 512MiB for the CUDA context)")
    g.add_argument("--memory-margin", default="10%", metavar="SHARE",
                   help="a config is feasible only if its peak leaves this share of the cap free, so it still "
                        "fits when the real run uses a little more than a short trial did, e.g. 10%%, 0.2 "
                        "(default: %(default)s)")
    g.add_argument("--latency-p99", default=None, metavar="DURATION",
                   help="--task infer: a config whose steps' 99th-percentile latency (each step synchronised) is over "
                        "this is infeasible, as one over the memory cap is, so the fastest config that meets it is "
                        "recommended, e.g. 50ms (default: no bound)")


def add_knob_args(p: argparse.ArgumentParser) -> None:
    """One flag per knob of ``config.KNOBS``, in its order, with its help and default."""
    g = p.add_argument_group("config (the knobs)")
    for knob in KNOBS:
        if knob.kind == "switch":
            g.add_argument(knob.flag, dest=knob.dest, action="store_true", help=knob.help)
        elif knob.kind == "int":
            g.add_argument(knob.flag, dest=knob.dest, type=int, default=knob.default, metavar=knob.metavar,
                           help=knob.help)
        else:
            g.add_argument(knob.flag, dest=knob.dest, choices=knob.choices, default=knob.default,
                           metavar=knob.metavar, help=knob.help)


def add_study_args(p: argparse.ArgumentParser, *, creates: bool = False) -> None:
    g = p.add_argument_group("study")
    g.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL (default: sqlite:///trials/autotune.db)")
    g.add_argument("--study-name", default=None, metavar="NAME",
                   help="default: derived from workload and hardware fingerprint" if creates else
                   "default: the study of --model if given, else the only study in the storage")


def add_study_selector_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("which study (default: the only one in the storage)")
    g.add_argument("--model", default=None, help="the study of this model (with --task/--image-size/--device)")
    g.add_argument("--task", default="train", choices=("train", "infer"))
    g.add_argument("--image-size", "--seq-len", type=int, default=224)
    g.add_argument("--data", default=None)
    g.add_argument("--device", default=None)
    _add_global_batch(g)
    g.add_argument("--nproc-per-node", type=int, default=1, metavar="N", help="the study of N DDP ranks")


# --- arguments -> records ---------------------------------------------------------------------------------

def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload of ``add_workload_args`` (or ``add_study_selector_args``); no --device means cuda if a GPU
    is visible, else cpu."""
    from autotune.machine.hardware import detect

    device = args.device
    gpus = detect(with_torch=False).gpus
    if device is None:
        device = "cuda" if gpus else "cpu"
    elif device.startswith("cuda") and not gpus:
        raise ConfigError(f"--device {device} but no NVIDIA GPU was detected (see `autotune env`); use --device cpu")
    return Workload(model=args.model, task=args.task, image_size=args.image_size, data_dir=args.data, device=device,
                    global_batch=getattr(args, "global_batch", None),
                    nproc_per_node=getattr(args, "nproc_per_node", 1))


def measure_from_args(args: argparse.Namespace, *, hardware=None, device: str = "cpu") -> MeasureSpec:
    """The measurement of ``add_measure_args``; no --memory-cap means 85% of the memory available now. A
    --device-memory-cap is checked against the GPU ``device`` runs on; without one it is left None (the Tuner,
    or ``autotune trial``, sets the default)."""
    from autotune._units import parse_duration_s, parse_memory_mb, parse_share
    from autotune.machine.limits import check_cap_against_machine, check_device_cap, default_memory_cap_mb

    device_cap = None
    if getattr(args, "device_memory_cap", None) is not None:
        device_cap = parse_memory_mb(args.device_memory_cap, what="--device-memory-cap")
        if hardware is None:
            from autotune.machine.hardware import detect

            hardware = detect(with_torch=False)
        check_device_cap(device_cap, hardware, device)

    if args.memory_cap is None:
        cap = default_memory_cap_mb(hardware)
    else:
        cap = parse_memory_mb(args.memory_cap, what="--memory-cap")
        check_cap_against_machine(cap, hardware, device)
    latency = getattr(args, "latency_p99", None)
    latency_ms = None if latency is None else 1000 * parse_duration_s(latency, what="--latency-p99", require_unit=True)
    if latency_ms is not None:
        from autotune.trial.latency import check_bound

        check_bound(getattr(args, "task", "train"), latency_ms)
    gpu = device.startswith("cuda")
    window_s = args.window_seconds if args.window_seconds is not None else \
        GPU_WINDOW_S if gpu else args.cpu_window_seconds
    return MeasureSpec(windows=args.windows, window_s=window_s, latency_p99_ms=latency_ms,
                       tight_spread=TIGHT_SPREAD if gpu else 0.0,
                       timeout_s=parse_duration_s(args.trial_timeout, what="--trial-timeout", require_unit=True),
                       memory_cap_mb=cap,
                       memory_margin=parse_share(args.memory_margin, what="--memory-margin", upto=0.9),
                       device_memory_cap_mb=device_cap)


def config_from_args(args: argparse.Namespace, device: str) -> TrialConfig:
    """The config of ``add_knob_args``; cudnn.benchmark is on for a GPU ``device``."""
    knobs = {knob.field: getattr(args, knob.dest) for knob in KNOBS}
    return TrialConfig(**knobs, cudnn_benchmark=device != "cpu")


# --- study selection --------------------------------------------------------------------------------------

def select_study(args: argparse.Namespace):
    """``(study, url)``: the study to show/export/report: by --study-name, else derived from --model, else the
    only one stored."""
    import optuna

    from autotune.search.record.storage import open_existing_storage, study_name_for

    storage, url = open_existing_storage(args.storage)
    name = args.study_name
    if name is None and getattr(args, "model", None):
        from autotune.machine.hardware import detect

        name = study_name_for(workload_from_args(args), detect(with_torch=False).fingerprint)
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    names = [s.study_name for s in summaries]
    if name is None:
        if not names:
            raise StorageError(f"{url} holds no study yet: run `autotune run --model ...` first")
        # a run stopped before its first trial leaves an empty study behind: it does not make the choice ambiguous
        with_trials = [s.study_name for s in summaries if s.n_trials > 0] if len(names) > 1 else names
        if len(with_trials) != 1:
            raise AutotuneError(f"{url} holds {len(names)} studies ({', '.join(names)}); pick one with --study-name")
        name = with_trials[0]
    if name not in names:
        raise AutotuneError(f"no study {name!r} in {url}; stored: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=name, storage=storage), url
