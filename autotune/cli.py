"""The `autotune` command: thin adapters over library calls.

Every user mistake surfaces as an ``AutotuneError`` and becomes one line on stderr and exit code 2; a trial
that was measured but failed (OOM, timeout...) exits 1; success exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ._malloc import MALLOC_MODES
from .errors import AutotuneError

EXIT_OK, EXIT_TRIAL_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line that points at --help (not a usage dump), an unknown option
    names the closest one the command has, and the help pointed at is the subcommand's."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        command = getattr(ns, "command", None)
        if extras and command and self._subparsers is not None:
            # argparse reports leftovers from the top-level parser; report them from the subcommand's
            sub = next(a for a in self._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
            sub.choices[command].unknown(extras)
        return ns, extras

    def unknown(self, extras: list[str]) -> None:
        import difflib

        first = extras[0]
        options = [o for o in self._option_string_actions if o.startswith("--")]
        close = difflib.get_close_matches(first.split("=", 1)[0], options, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        self.error(f"unrecognized argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}{hint}")


def _fmt() -> type[argparse.HelpFormatter]:
    return argparse.RawDescriptionHelpFormatter


# --- shared option groups ---------------------------------------------------------------------------------

def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (what is measured)")
    g.add_argument("--model", default="resnet18",
                   help="torchvision classification model (weights=None, nothing downloaded) or "
                        "package.module:callable returning (model, dataset, loss_fn); default: %(default)s")
    g.add_argument("--task", choices=("train", "infer"), default="train",
                   help="train = forward+backward+optimizer step; infer = inference_mode forward (default: %(default)s)")
    g.add_argument("--image-size", type=int, default=224, metavar="PX", help="square crop size (default: %(default)s)")
    g.add_argument("--data", metavar="DIR", default=None,
                   help="ImageFolder of real images (DIR/<class>/<img>); default: synthetic JPEGs decoded by PIL")
    g.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if a GPU is visible, else cpu)")


def _add_measure_args(p: argparse.ArgumentParser, *, windows: int = 5, window_s: float = 3.0,
                      timeout_help: str = "per-trial time limit") -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--windows", type=int, default=windows, help="measured windows per trial (default: %(default)s)")
    g.add_argument("--window-seconds", type=float, default=window_s, metavar="S",
                   help="minimum length of one window (default: %(default)s)")
    g.add_argument("--trial-timeout", default="10m", metavar="DURATION",
                   help=f"{timeout_help}, e.g. 90s, 10m (default: %(default)s)")
    g.add_argument("--memory-cap", default=None, metavar="SIZE",
                   help="kill a trial whose processes (with DataLoader workers) exceed this, e.g. 12GiB "
                        "(default: 85%% of the memory available now)")


def _workload(args: argparse.Namespace):
    from .config import Workload

    from .errors import ConfigError
    from .hardware import detect

    device = args.device
    gpus = detect(with_torch=False).gpus
    if device is None:
        device = "cuda" if gpus else "cpu"
    elif device.startswith("cuda") and not gpus:
        raise ConfigError(f"--device {device} but no NVIDIA GPU was detected (see `autotune env`); use --device cpu")
    return Workload(model=args.model, task=args.task, image_size=args.image_size, data_dir=args.data, device=device)


def _measure(args: argparse.Namespace, *, hardware=None):
    from ._units import parse_duration_s, parse_memory_mb
    from .config import MeasureSpec
    from .limits import default_memory_cap_mb, check_cap_against_machine

    if args.memory_cap is None:
        cap = default_memory_cap_mb(hardware)
    else:
        cap = parse_memory_mb(args.memory_cap, what="--memory-cap")
        check_cap_against_machine(cap, hardware)
    return MeasureSpec(windows=args.windows, window_s=args.window_seconds,
                       timeout_s=parse_duration_s(args.trial_timeout, what="--trial-timeout", require_unit=True), memory_cap_mb=cap)


# --- commands -----------------------------------------------------------------------------------------

def cmd_env(args: argparse.Namespace) -> int:
    from .hardware import detect

    hw = detect()
    if args.format == "json":
        print(json.dumps(hw.to_dict(), indent=2))
    else:
        print(hw.describe())
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from .workloads import list_models

    print("\n".join(list_models()))
    return EXIT_OK


def cmd_trial(args: argparse.Namespace) -> int:
    from .config import TrialConfig
    from .hardware import detect
    from .runner import run_trial
    from .workloads import check

    hw = detect(with_torch=False)
    workload = _workload(args)
    config = TrialConfig(
        batch_size=args.batch_size, num_workers=args.num_workers, prefetch_factor=args.prefetch_factor,
        pin_memory=args.pin_memory, persistent_workers=args.persistent_workers, amp=args.amp,
        compile_mode=args.compile, channels_last=args.channels_last, intra_op_threads=args.threads,
        inter_op_threads=args.interop_threads, cudnn_benchmark=workload.device != "cpu", malloc=args.malloc,
    )
    measure = _measure(args, hardware=hw)
    from ._device import autocast_dtype_name

    autocast_dtype_name("cpu" if workload.device == "cpu" else "cuda", config.amp)  # fp16 on CPU: refused here
    check(workload)
    quiet = args.format == "json"

    def on_event(ev: dict[str, Any]) -> None:
        if quiet:
            return
        kind = ev.get("event")
        if kind == "built":
            msg = f"built in {ev['startup_s']:.1f} s; warming up"
        elif kind == "warmup":
            msg = f"warm-up done: {ev['warmup_steps']} steps in {ev['warmup_s']:.1f} s"
        elif kind == "window":
            msg = f"window {ev['index'] + 1}/{measure.windows}: {ev['samples_per_s']:.1f} samples/s"
        else:
            return
        print(f"  {msg}", file=sys.stderr, flush=True)

    if not quiet:
        print(f"measuring {workload.label()} with {config.short()} in a child process", file=sys.stderr)
    result = run_trial(workload, config, measure, on_event=on_event, log_path=args.log)
    if result.user_error:  # the workload is wrong, not this config: a usage error
        from .errors import WorkloadError

        raise WorkloadError(result.reason.removeprefix("WorkloadError: "))
    if quiet:
        print(json.dumps({"workload": workload.to_dict(), "config": config.to_dict(), "result": result.to_dict(),
                          "figures": result.figures()}, indent=2))
    else:
        print(result.describe())
    return EXIT_OK if result.ok else EXIT_TRIAL_FAILED


# --- parser -------------------------------------------------------------------------------------------

EPILOG = """\
examples:
  autotune env                                   # what was detected (paste into bug reports)
  autotune trial --model resnet18 --batch-size 64 --num-workers 1 --amp bf16 --channels-last --threads 2
  autotune run --model resnet18 --timeout 8h     # tune overnight; re-run to resume the same study
  autotune show                                  # trials, best first
  autotune export -o best.yaml                   # the recommendation, with provenance

exit codes: 0 success, 1 a measured trial failed (oom, timeout, ...), 2 a usage error (the message says the fix)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autotune", description="Measure, don't guess: find the fastest batch size, DataLoader "
                     "workers, AMP, torch.compile, channels_last and thread settings for a PyTorch workload on "
                     "this machine. Every trial runs in its own child process.",
                     epilog=EPILOG, formatter_class=_fmt())
    from . import __version__

    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("env", help="print the detected hardware and software (for bug reports)",
                       description="Print what autotune detected: CPU model and flags, usable cores (affinity and "
                       "cgroup quota), memory (cgroup aware), NVIDIA GPUs via pynvml, torch/CUDA versions, and the "
                       "hardware fingerprint that names studies.", formatter_class=_fmt())
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("models", help="list the torchvision model names --model accepts")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "trial", help="measure ONE config in an isolated child process",
        description="Measure one configuration in a fresh child process: warm up until step times settle, then "
        "measure windows and report median throughput, spread, data-wait vs compute time and peak memory. The "
        "child is killed at the memory cap or time limit.",
        epilog="example:\n  autotune trial --model resnet18 --image-size 128 --batch-size 64 --num-workers 1 "
               "--amp bf16 --channels-last --threads 2", formatter_class=_fmt())
    _add_workload_args(p)
    g = p.add_argument_group("config (the knobs)")
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (default: %(default)s)")
    g.add_argument("--prefetch-factor", type=int, default=None, help="batches each worker loads ahead (default: torch's 2)")
    g.add_argument("--pin-memory", action="store_true", help="page-locked host memory for faster GPU copies")
    g.add_argument("--persistent-workers", action="store_true", help="keep workers alive across epochs")
    g.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off",
                   help="autocast dtype; fp16 (CUDA only) uses a GradScaler (default: %(default)s)")
    g.add_argument("--compile", choices=("none", "default", "reduce-overhead", "max-autotune"), default="none",
                   help="torch.compile mode; compile time is reported apart from throughput (default: %(default)s)")
    g.add_argument("--channels-last", action="store_true", help="NHWC memory format for model and inputs")
    g.add_argument("--threads", type=int, default=None, metavar="N", help="intra-op threads (OMP/MKL and torch)")
    g.add_argument("--interop-threads", type=int, default=None, metavar="N", help="inter-op threads")
    g.add_argument("--malloc", choices=MALLOC_MODES, default="default",
                   help="retain: glibc keeps freed memory for reuse instead of page-faulting it in again each "
                        "step; hugepages: retain, and PyTorch puts blocks >= 2 MiB on transparent huge pages "
                        "(THP_MEM_ALLOC_ENABLE=1) (default: %(default)s)")
    _add_measure_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="json prints the full result")
    p.add_argument("--log", default=None, metavar="FILE", help="keep the child's stdout/stderr in FILE")
    p.set_defaults(func=cmd_trial)

    from .cli_study import add_study_commands

    add_study_commands(sub, _add_workload_args, _add_measure_args)
    from .cli_report import add_report_commands

    add_report_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except AutotuneError as exc:
        print(f"autotune {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
