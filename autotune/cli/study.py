"""The study commands: `run` (search, resume), `show` (table of trials), `export` (the recommendation)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from autotune.cli.args import (add_measure_args, add_ranks_args, add_study_args, add_study_selector_args,
                               add_workload_args, measure_from_args, select_study, workload_from_args)
from autotune._redact import redact
from autotune.errors import AutotuneError
from autotune.search.record import trials as keys
from autotune.search.record.ceilings import ceiling_lines
from autotune.search.record.run_phase import split_line
from autotune.search.budget import SEARCH_WINDOWS

if TYPE_CHECKING:
    from autotune.search.tuner import Tuner

RUN_EPILOG = """\
examples:
  autotune run --model resnet18                                   # until the search converges (at most 8h)
  autotune run --model resnet18 --timeout 8h --memory-cap 12GiB   # overnight; Ctrl-C or a kill loses nothing
  autotune run --model resnet18 --timeout 8h                      # next night: resumes the same study
  autotune run --model resnet18 --run-length 6h                   # compile must pay back within a 6h run
  autotune run --model mypkg.models:build --image-size 128 --trials 30

How it works: trial 0 measures PyTorch's defaults (the baseline), trial 1 the usual winners together; then each
of those apart, the batch size walked from the best config so far, the other knobs one at a time; then Optuna's
TPE sampler proposes configs from the search space (search_spaces/cpu.yaml or cuda.yaml, trimmed to this
machine; --space for your own); torch.compile is tried last, on the best eager config (docs/search.md).
Each trial runs in a fresh child process; one that ran out of memory teaches the sampler the memory boundary;
one that cannot beat the best is stopped early. At the end the top configs and the baseline are re-measured,
interleaved, with longer windows, and the winner by median is stored in the study (see `autotune export`).
The study is named after the workload and this machine's hardware fingerprint, so re-running resumes it.
A new study also measures, right after trial 1, the winners of up to 3 earlier studies in the same storage on
this hardware (another model, image size or task), mapped to its space (--no-warm-start: not).

When it stops: after --trials N trials, when --timeout leaves only the finalists' time, or when the search has
settled, whichever comes first. Settled means the sampler's last --patience trials did not improve the best
config by more than the measured noise (at least 5%), or it keeps proposing configs already measured, and
compile was then tried on the best eager config. The default patience is where one more trial is expected to
cost more than it saves over the planned run (--run-length, an hour if not given): 6 trials at ~25 s each, 34
at ~5 s (3 to 40; the progress bar counts them). With no budget, --ceiling (default 8h) is the time budget for
a search that never settles.
"""


def _budget_args(args: argparse.Namespace) -> tuple:
    """``(timeout_s, ceiling_s, run_length)`` from the budget flags, each mistake one line."""
    from autotune._units import parse_duration_s
    from autotune.search.choose.payback import RunLength

    timeout_s = parse_duration_s(args.timeout, what="--timeout", require_unit=True) if args.timeout else None
    if args.trials is not None and args.trials < 0:
        raise AutotuneError(f"--trials {args.trials} must be 0 or more")
    if args.parity_steps < 0:
        raise AutotuneError(f"--parity-steps {args.parity_steps} must be 0 (no check) or more")
    ceiling_s = parse_duration_s(args.ceiling, what="--ceiling", require_unit=True)
    run_length = RunLength.parse(args.run_length, args.planned_steps, what=("--run-length", "--planned-steps"),
                                 require_unit=True)
    if args.patience is not None and args.patience < 0:
        raise AutotuneError(f"--patience {args.patience} must be 0 (never stop on convergence) or more")
    if args.trials is None and timeout_s is None and args.patience == 0:
        raise AutotuneError("--patience 0 never stops on convergence: give a budget, --trials N and/or "
                            "--timeout DURATION (e.g. --timeout 8h)")
    return timeout_s, ceiling_s, run_length


def cmd_run(args: argparse.Namespace) -> int:
    """`autotune run`. From its first line, Ctrl-C or SIGTERM stops it cleanly: the child in flight is ended, what
    finished is kept, one line says how to resume; a second one ends the process at once, after that line
    (``cli.interrupt``)."""
    from autotune.cli.interrupt import EXIT_INTERRUPTED, interruptible

    held: dict = {}  # the tuner and the MLflow logger, once made
    with interruptible(lambda: stopped_line(held.get("tuner"))) as stop:
        try:
            return _run(args, held)
        except KeyboardInterrupt:
            stop.say()
            _close_mlflow(held.get("logger"), held.get("tuner"), "KILLED")
            return EXIT_INTERRUPTED


def _run(args: argparse.Namespace, held: dict) -> int:
    """``cmd_run`` within its signal handling; ``held`` gets the tuner and the logger as they are made."""
    from autotune.machine.hardware import detect
    from autotune.search.space.search_space import load_space
    from autotune.search.record.storage import check_storage
    from autotune.search.tuner import Tuner
    from autotune.workloads.build import check

    import time

    started = time.monotonic()  # --timeout counts from here: the workload's check is inside the budget
    timeout_s, ceiling_s, run_length = _budget_args(args)  # said before torch loads: a typo costs no seconds
    workload = workload_from_args(args)
    # The user's numbers, space file and storage are checked against the machine first (cores, memory, GPUs, CPU
    # flags: no torch needed), so a mistake costs a fraction of a second, not the workload check's child.
    machine = detect(with_torch=False)
    measure = measure_from_args(args, hardware=machine, device=workload.device)
    from autotune.machine.gpu_check import check_cuda_usable

    check_cuda_usable(workload.device, machine)  # a GPU this torch cannot use: one line now, not a failed trial each
    space = load_space(args.space, hardware=machine, device=workload.device)
    if args.oversubscribe:  # as a space that says so: ranks may outnumber the cores, threads and workers untrimmed
        space = dataclasses.replace(space, oversubscribe=True)
    check_storage(args.storage)  # an unreachable server or a damaged file is said first, not after the banner
    if args.output:
        _a_file(args.output, "-o", "best.yaml")
    # With what its first batch holds (the space is fitted to it, the YAML records it). A module:callable is checked
    # in a child, which also answers what detect() needs of torch: this process never imports torch for it.
    workload = check(workload, env_stamp=True)
    hw = detect()
    logger = None
    if args.mlflow:  # reached now, not after hours of trials
        from autotune.integrations.mlflow import MLflowLogger

        logger = MLflowLogger(args.mlflow, experiment=args.mlflow_experiment,
                              log=lambda msg: print(f"autotune run: {msg}", file=sys.stderr, flush=True))
        logger.check()
    held["logger"] = logger
    tuner = Tuner(workload, space=space, measure=measure, storage=args.storage, study_name=args.study_name,
                  hardware=hw, finalists=args.finalists, finalist_rounds=args.rounds, seed=args.seed,
                  parity_steps=args.parity_steps, cap_given=args.memory_cap is not None,
                  progress=not args.no_progress, patience=args.patience, on_trial=[logger] if logger else (),
                  run_length=run_length, warm_start=not args.no_warm_start, output=args.output)
    held["tuner"] = tuner

    from autotune.search.choose.latency_floor import check_floor

    check_floor(tuner)  # --latency-p99 under one step's measured floor: one line now, not an empty search later

    print(f"{hw.summary_line()}\n{tuner.space.describe()}\nmemory cap {measure.memory_cap_mb:.0f} MiB per trial",
          file=sys.stderr)
    from autotune.machine.launch_env import inherited_line

    if inherited_line():  # what the shell exports that every trial runs without (a clean room), in one line
        print(inherited_line(), file=sys.stderr)
    try:
        rec = tuner.run(trials=args.trials, timeout_s=timeout_s, backend=args.backend, address=args.address,
                        ceiling_s=ceiling_s, started=started)
    except AutotuneError:  # e.g. the workload fails in every trial: the parent run does not stay RUNNING
        _close_mlflow(logger, tuner, "FAILED")
        raise
    if rec is None:
        print("no feasible config: see `autotune show` for why the trials failed", file=sys.stderr)
    else:
        print(rec.summary())
        print(f"export it with: {export_hint(tuner.study_name, args.storage)}")
    if logger is not None:
        _finish_mlflow(logger, tuner, rec)
    return 0 if rec is not None else 1


def stopped_line(tuner: Tuner | None) -> str:
    """The one line a stopped run says: where it was, where what finished is kept, and how to resume."""
    from autotune.search.record.run_phase import describe

    if tuner is None:
        return ("autotune run: stopped before its first trial: nothing was measured yet; run the same command again "
                "to resume")
    during = f" during {describe(tuner.phases.current)}" if tuner.phases.current else ""
    return (f"autotune run: stopped{during}; what finished is kept in {redact(tuner.storage_url)} (study "
            f"{tuner.study_name}); run the same command again to resume from there")


def export_hint(study_name: str, storage: str | None) -> str:
    """The command that exports this study: with the ``--storage`` the run used (its password, if any, as ***),
    quoted for a shell.

    >>> export_hint("s1", "postgresql://u:secret@db/x")
    "autotune export --storage 'postgresql://u:***@db/x' --study-name s1 -o best.yaml"
    """
    import shlex

    from autotune._redact import redact

    where = ["--storage", redact(storage)] if storage else []
    return shlex.join(["autotune", "export", *where, "--study-name", study_name, "-o", "best.yaml"])


def _close_mlflow(logger, tuner: Tuner, status: str) -> None:
    """Close the study's parent run, if this run opened one (a trial finished), with ``status``."""
    if logger is not None and logger.opened(tuner.study_name):
        try:
            logger.finish(tuner.study(), None, status=status)
        except AutotuneError as exc:
            print(f"autotune run: {exc}", file=sys.stderr)


def _finish_mlflow(logger, tuner: Tuner, rec) -> None:
    """The study's parent run gets the recommendation YAML and the HTML report (without the profiler run that
    `autotune report` adds) as artifacts, and is closed."""
    from autotune.view.report import build_report, write_report

    study = tuner.study()
    out = tuner.artifacts_dir / "report.html"
    html = build_report(study, storage_url=tuner.storage_url,
                        profile_note="Not profiled: `autotune run --mlflow` logs the report without a profiler run; "
                                     "`autotune report` adds one.", report_path=out)
    write_report(out, html)
    logger.finish(study, rec, report_path=out)
    print(f"autotune run: logged to MLflow at {redact(logger.tracking_uri)} (experiment {logger.experiment}, run "
          f"{study.study_name})", file=sys.stderr)


def cmd_show(args: argparse.Namespace) -> int:
    import pandas as pd

    from autotune.search.record.trials import baseline_value, trial_rows

    study, url = select_study(args)
    rows = trial_rows(study)
    if not rows:
        print(f"study {study.study_name} has no trials yet")
        return 0
    df = pd.DataFrame(rows)
    base = baseline_value(study)
    df["speedup"] = df["samples_per_s"].map(lambda v: round(v / base, 2) if (base and v) else None)
    # best first: measured trials that fit the memory limit by throughput, then the rest by trial number
    df["_rank"] = df.apply(lambda r: -(r["samples_per_s"] or 0) if r["status"] == "ok" and r["feasible"] is not False
                           else float("inf"), axis=1)
    df = df.sort_values(["_rank", "trial"]).drop(columns=["_rank"])
    if args.csv:
        from pathlib import Path

        from autotune._atomic import atomic_write

        _a_file(args.csv, "--csv", "trials.csv")
        atomic_write(Path(args.csv), df.to_csv(index=False))
        print(f"wrote {len(df)} trials to {args.csv}", file=sys.stderr)
    tokens = ["tokens_per_s"] if df["tokens_per_s"].notna().any() else []  # a text workload's real tokens/s
    p99 = ["latency_p99_ms"] if df["latency_p99_ms"].notna().any() else []  # inference: each step's p99 latency
    view = df[["trial", "status", "samples_per_s", *tokens, *p99, "speedup", "rel_iqr", "peak_host_mb",
               "data_wait_share", "config", "role", "reason"]].copy()
    if p99:
        view["latency_p99_ms"] = view["latency_p99_ms"].map(lambda v: f"{v:.2f}" if v is not None and v == v else "")
    if tokens:
        view["tokens_per_s"] = view["tokens_per_s"].map(lambda v: f"{v:.0f}" if v is not None and v == v else "")
    for col in ("samples_per_s", "speedup"):  # a trial that measured nothing shows nothing (not "None")
        view[col] = view[col].map(lambda v: "" if v is None or v != v else v)
    view["rel_iqr"] = view["rel_iqr"].map(lambda v: f"{100 * v:.1f}%" if v is not None and v == v else "")
    view["data_wait_share"] = view["data_wait_share"].map(
        lambda v: f"{100 * v:.0f}%" if v is not None and v == v else "")
    view["peak_host_mb"] = view["peak_host_mb"].map(lambda v: f"{v:.0f}" if v is not None and v == v else "")
    view["reason"] = view["reason"].fillna("").map(lambda s: s if len(s) <= 60 else s[:57] + "...")
    view = view.rename(columns={"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "latency_p99_ms": "p99 ms",
                                "rel_iqr": "IQR",
                                "peak_host_mb": "peak MiB", "data_wait_share": "data wait"})
    if args.limit:
        view = view.head(args.limit)
    print(f"study {study.study_name} ({url}): {len(df)} trials, baseline "
          + (f"{base:.1f} samples/s in the search (speedups below are against it)" if base else "not measured"))
    rec = study.user_attrs.get(keys.STUDY_RECOMMENDATION)
    if rec:
        m = rec["measured"]
        from autotune.search.choose.confirmation import unconfirmed_line

        sel = m.get("speedup_vs_baseline")
        claim = (rec.get("confirmation") or {}).get("headline") or (f"x{sel:.2f}, " if sel else "") + \
            unconfirmed_line(provisional=bool((rec.get("provenance") or {}).get("provisional")))
        rate = ("no samples/s stated" if m.get("median_samples_per_s") is None else
                f"{m['median_samples_per_s']:.1f} samples/s vs the baseline's "
                f"{m.get('baseline_samples_per_s') or float('nan'):.1f}")
        print(f"recommendation: {rate}: {claim}; trial {rec['provenance'].get('trial')}"
              + (f"; {m['median_tokens_per_s']:.0f} tokens/s" if m.get("median_tokens_per_s") else ""))
        for line in _limits_lines(rec) + ceiling_lines(rec.get("ceilings")):
            print(line)
        never = [n for n in rec.get("notes") or () if n.startswith(("never measured", "decided on one trial"))]
        for line in [split_line(rec.get("budget_split"))] + never:
            if line:  # where the run's time went; what it never measured, or decided on one trial (issue 50)
                print(line)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60, "display.max_rows", 500):
        print(view.to_string(index=False, na_rep=""))
    _field_lines(study)
    if args.explain:  # what limited each trial, one line each, in the table's order
        from autotune.search.record import ceilings
        from autotune.search.record.diagnose import explain_study

        measured = ceilings.load(study)
        if measured is not None:  # each ceiling alone, as measured (search.record.ceilings)
            print("\n" + "\n".join(measured.lines()))

        print("\nwhat limited each trial (thresholds: docs/diagnosis.md):")
        print("\n".join(explain_study(study, view["trial"].tolist())))
    return 0


def _field_lines(study) -> None:
    """The user's runs measured under the recommendation (``autotune.field``), kept beside the trials."""
    from autotune.field.judge import stored_line
    from autotune.search.record.field_runs import stored

    runs = stored(study)
    if runs:
        print(f"\nyour runs, measured ({len(runs)}; kept beside the trials, never read by the sampler):")
        for r in runs:
            print(f"  {stored_line(r)}")


def _limits_lines(rec: dict) -> list[str]:
    """What `show` says of the recommendation's latency (inference), worst-case batch and loader memory, from its
    stored dict."""
    from autotune._units import format_mb

    m, wc, out = rec["measured"], rec.get("worst_case"), []
    if m.get("latency_p99_ms") is not None:
        bound = m.get("latency_bound_p99_ms")
        out.append(f"latency per step: p50 {m['latency_p50_ms']:.2f} ms, p95 {m['latency_p95_ms']:.2f} ms, p99 "
                   f"{m['latency_p99_ms']:.2f} ms" + (f" (bound {bound:g} ms)" if bound else ""))
    if wc:
        peak = (f": peak {format_mb(wc['peak_host_mb'])} of the {format_mb(wc['usable_mb'])} usable"
                if wc.get("peak_host_mb") and wc.get("usable_mb") else "")
        out.append(f"worst case: {wc.get('what')}{peak}, checked by {wc.get('checked_by')}")
    if (rec.get("loader_memory") or {}).get("line"):  # what its loader holds in /dev/shm (loader_statement)
        out.append(rec["loader_memory"]["line"])
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune._atomic import atomic_write
    from autotune.search.choose.finalists import provisional
    from autotune.recommendation import stored_recommendation

    study, url = select_study(args)
    rec = stored_recommendation(study) or provisional(study, storage=url)
    if rec.provisional:
        print("autotune export: note: the run was stopped before its finalists were re-measured; this is the "
              "best search trial (marked provisional)", file=sys.stderr)
    text = _exported(rec, study, args.format)
    if args.output and args.output != "-":
        _a_file(args.output, "-o", "best.yaml")
        atomic_write(Path(args.output), text)
        print(f"wrote {args.output}: {rec.config.short()}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _exported(rec, study, fmt: str) -> str:
    """The recommendation's YAML (or JSON), with the user's runs measured under it (``field_runs``: each run's
    figures and line, not its windows; read back by nothing: a record of what happened)."""
    import yaml

    from autotune.search.record.field_runs import stored

    runs = [{k: v for k, v in r.items() if k != "window_list"} for r in stored(study)]
    if fmt != "yaml":
        return json.dumps({**rec.to_dict(), **({"field_runs": runs} if runs else {})}, indent=2) + "\n"
    text = rec.to_yaml()
    if runs:
        text += yaml.safe_dump({"field_runs": runs}, sort_keys=False, default_flow_style=False, width=10**6)
    return text


def _a_file(path: str, flag: str, example: str) -> None:
    """Refuse an output path that is a folder, naming a file in it instead."""
    from pathlib import Path

    if Path(path).is_dir():
        raise AutotuneError(f"{flag} {path} is a folder: name a file, e.g. {flag} {Path(path) / example}")


def add_study_commands(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("run", help="tune: run (or resume) a study and recommend a config",
                       description="Tune a workload on this machine: an Optuna study of isolated trials, then a "
                       "re-measurement of the finalists.", epilog=RUN_EPILOG, formatter_class=fmt)
    add_workload_args(p)
    add_ranks_args(p)
    g = p.add_argument_group("budget")
    g.add_argument("--trials", type=int, default=None, metavar="N", help="run N more trials")
    g.add_argument("--timeout", default=None, metavar="DURATION",
                   help="stop searching in time for the finalists to finish by then, e.g. 20m, 8h")
    g.add_argument("--patience", type=int, default=None, metavar="K",
                   help="stop the search once K of the sampler's trials in a row did not beat the best by more than "
                        "the noise (default: from the measured cost of a trial and what a gain saves over the "
                        "planned run, 3 to 40; 0: never, then a budget is needed)")
    g.add_argument("--ceiling", default="8h", metavar="DURATION",
                   help="with neither --trials nor --timeout: the time budget of a search that does not converge "
                        "(default: %(default)s)")
    g.add_argument("--finalists", type=int, default=3, metavar="K",
                   help="top configs re-measured (with the baseline) before recommending (default: %(default)s)")
    g.add_argument("--rounds", type=int, default=2, help="interleaved finalist rounds (default: %(default)s)")
    g.add_argument("--parity-steps", type=int, default=30, metavar="N",
                   help="before recommending bf16/fp16, channels_last or compile, train N steps with it and with "
                        "fp32 eager from the same weights and batches; a config whose loss diverges is not "
                        "recommended (0: no check; default: %(default)s)"),
    g = p.add_argument_group("the real run (torch.compile must pay back its compile time over it)")
    r = g.add_mutually_exclusive_group()
    r.add_argument("--run-length", default=None, metavar="DURATION",
                   help="how long the training you tune for runs, e.g. 6h: a compile mode wins only if its "
                        "steady-state gain over that run exceeds its measured compile time (default: 1h, assumed; "
                        "the YAML's `compile` section says so and records the break-even)")
    r.add_argument("--planned-steps", type=int, default=None, metavar="N",
                   help="the same as a number of training steps (each config's own batch size)")
    add_measure_args(p, windows=SEARCH_WINDOWS)  # the search's (search.budget.SEARCH_WINDOWS)
    add_study_args(p, creates=True)
    p.add_argument("--space", default=None, metavar="FILE", help="search space YAML (default: the shipped one "
                   "for the device, trimmed to this machine)")
    p.add_argument("--seed", type=int, default=None, help="sampler seed, for a repeatable sequence of configs")
    p.add_argument("--no-warm-start", action="store_true",
                   help="a new study does not measure the winners of earlier studies in the storage on this "
                        "hardware (another model, size or task) among its first trials")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local: trials one at a time on this machine; ray: trials spread over a Ray cluster "
                        "through Ray Tune (default: %(default)s)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="with --backend ray: the cluster to join (auto: the latest started on this machine; "
                        "default: RAY_ADDRESS where set, else a local Ray of this run's own, never one another "
                        "run or user started)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="also write the recommendation's YAML to FILE when the run ends (what `autotune export` "
                        "writes; a run stopped before is resumed by the same command, which writes it)")
    g = p.add_argument_group("MLflow (pip install \"autotune[mlflow]\")")
    g.add_argument("--mlflow", default=None, metavar="URI",
                   help="log each finished trial as a run nested under one parent run per study (resumed with "
                        "it), and the recommendation YAML and the HTML report as its artifacts, e.g. "
                        "sqlite:///mlflow.db or http://host:5000")
    g.add_argument("--mlflow-experiment", default="autotune", metavar="NAME",
                   help="the MLflow experiment (default: %(default)s)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("show", help="table of a study's trials, best first (--csv FILE too)",
                       description="Show a study's trials, best first: status, median throughput, speedup over "
                       "the baseline, spread, peak memory, share of step time waiting for data, config, reason.",
                       formatter_class=fmt)
    add_study_args(p)
    add_study_selector_args(p)
    p.add_argument("--csv", default=None, metavar="FILE", help="also write every trial to a CSV file")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="show only the first N rows")
    p.add_argument("--explain", action="store_true",
                   help="also say, per trial, what limited it (input, compute, memory, compile) and the lever")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("export", help="write the recommendation (YAML/JSON) with its provenance",
                       description="Write the study's recommendation: config, measured throughput and spread, "
                       "speedup over the baseline, peak memory vs cap, hardware and fingerprint, versions, "
                       "runner-ups and the command that reproduces the measurement.", formatter_class=fmt)
    add_study_args(p)
    add_study_selector_args(p)
    p.add_argument("--format", choices=("yaml", "json"), default="yaml")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="default: standard output")
    p.set_defaults(func=cmd_export)
