"""The `autotune` command: thin adapters over library calls.

Every user mistake surfaces as an ``AutotuneError`` and becomes one line on stderr and exit code 2; a trial
that was measured but failed (OOM, timeout...) exits 1; success exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from autotune.cli.args import (add_knob_args, add_measure_args, add_ranks_args, add_workload_args,
                               config_from_args, measure_from_args, workload_from_args)
from autotune.cli.report import add_report_commands
from autotune.cli.study import add_study_commands
from autotune._redact import redact
from autotune.errors import AutotuneError

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


# --- commands -----------------------------------------------------------------------------------------

def cmd_env(args: argparse.Namespace) -> int:
    from autotune.machine.hardware import detect

    from autotune.machine.envstamp import collect_env_stamp, describe_stamp

    # what `python -m torch.utils.collect_env` says (a recommendation keeps it too), from a child that also tells
    # detect() what it needs of torch: torch is imported once, there
    stamp = collect_env_stamp()
    hw = detect()
    if args.format == "json":
        print(json.dumps({**hw.to_dict(), "collect_env": stamp}, indent=2))
    else:
        print(hw.describe())
        print(describe_stamp(stamp))
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from autotune.workloads.build import list_models

    print("\n".join(list_models()))
    return EXIT_OK


def cmd_trial(args: argparse.Namespace) -> int:
    from autotune.machine.hardware import detect
    from autotune.trial import events
    from autotune.trial.runner import run_trial
    from autotune.search.record.storage import machine_lock
    from autotune.workloads.probe import check_knobs
    from autotune.workloads.build import check

    hw = detect(with_torch=False)
    workload = workload_from_args(args)
    config = config_from_args(args, workload.device)
    measure = measure_from_args(args, hardware=hw, device=workload.device)
    if measure.device_memory_cap_mb is None and workload.device != "cpu":
        from autotune.machine.limits import default_device_memory_cap_mb

        measure = measure.replace(device_memory_cap_mb=default_device_memory_cap_mb(hw, workload.device))
    from autotune.machine.device import autocast_dtype_name
    from autotune.machine.gpu_check import check_cuda_usable

    autocast_dtype_name(workload.device_family, config.amp)  # fp16 on CPU: refused here
    check_cuda_usable(workload.device, hw, amp=config.amp)  # a GPU this torch cannot use: refused here
    from autotune.trial.ddp import check_ranks

    check_ranks(workload, usable_cores=hw.usable_cores, gpus=len(hw.visible_gpus()), oversubscribe=args.oversubscribe)
    from autotune.workloads.global_batch import accumulation_steps, check_cudagraphs

    # a micro-batch (x the ranks) must divide the global batch
    accumulation_steps(workload.global_batch, config.batch_size, world_size=workload.nproc_per_node)
    check_cudagraphs(workload.device, workload.global_batch, config, world_size=workload.nproc_per_node)
    workload = check(workload)
    check_knobs(workload, config)  # --channels-last without image tensors, --bucket-by-length without length
    quiet = args.format == "json"

    def on_event(d: dict[str, Any]) -> None:
        if quiet:
            return
        ev = events.from_dict(d)
        if isinstance(ev, events.Built):
            msg = f"built in {ev.startup_s:.1f} s; warming up"
        elif isinstance(ev, events.Warmup):
            msg = f"warm-up done: {ev.warmup_steps} steps in {ev.warmup_s:.1f} s"
            if ev.warmup_windows:
                msg += (f", of which {len(ev.warmup_windows)} window(s) outside the later windows' range "
                        f"({', '.join(f'{x:.1f}' for x in ev.warmup_windows)} samples/s)")
        elif isinstance(ev, events.Window):
            msg = f"window {ev.index + 1}/{measure.windows}: {ev.samples_per_s:.1f} samples/s"
        else:
            return
        print(f"  {msg}", file=sys.stderr, flush=True)

    if not quiet:
        print(f"measuring {workload.label()} with {config.short()} in a child process", file=sys.stderr)
    with machine_lock(f"autotune trial {config.short()}"):  # not beside a run: they would share the cores
        result = run_trial(workload, config, measure, on_event=on_event, log_path=args.log)
    if result.user_error:  # the workload is wrong, not this config: a usage error
        from autotune.errors import WorkloadError

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
    from autotune import __version__

    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("env", help="print the detected hardware and software (for bug reports)",
                       description="Print what autotune detected: CPU model and flags, usable cores (affinity and "
                       "cgroup quota), memory (cgroup aware), NVIDIA GPUs via pynvml, torch/CUDA versions, the "
                       "hardware fingerprint that names studies, and what `python -m torch.utils.collect_env` "
                       "reports (compiler, OS, libc, cuDNN, torch-related packages).", formatter_class=_fmt())
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("models", help="list the torchvision model names --model accepts")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "trial", help="measure ONE config in an isolated child process",
        description="Measure one configuration in a fresh child process: warm up (the first step; a first window "
        "that the next two do not confirm is warm-up too), then measure windows and report median throughput, "
        "spread, data-wait vs compute time and peak memory. The child is killed at the memory cap or time limit.",
        epilog="example:\n  autotune trial --model resnet18 --image-size 128 --batch-size 64 --num-workers 1 "
               "--amp bf16 --channels-last --threads 2", formatter_class=_fmt())
    add_workload_args(p)
    add_ranks_args(p)
    add_knob_args(p)
    add_measure_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="json prints the full result")
    p.add_argument("--log", default=None, metavar="FILE", help="keep the child's stdout/stderr in FILE")
    p.set_defaults(func=cmd_trial)

    add_study_commands(sub)
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
        print(f"autotune {args.command}: error: {redact(str(exc))}", file=sys.stderr)  # no URL's password
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `autotune env | head`: the reader has gone; say nothing more to it
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        # a full disk, a damaged database: one line (autotune.cli.errors); a bug keeps its traceback
        from autotune.cli.errors import environment_error

        message = environment_error(exc, storage=getattr(args, "storage", None))
        if message is None:
            raise
        print(f"autotune {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
