"""The result commands: `dashboard` (optuna-dashboard on the study storage) and `report` (one HTML file)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from autotune.cli.args import add_study_args, add_study_selector_args, select_study
from autotune.errors import AutotuneError
from autotune.cli.webguard import guard, is_loopback
from autotune.search.record import trials as keys

REPORT_EPILOG = """\
examples:
  autotune report                               # trials/<study>/report.html, with a profile of the recommendation
  autotune report -o trials/report.html --no-profile
  autotune report --storage sqlite:///runs/a.db --study-name NAME
  autotune report --study-name NAME --model mypkg.models:build   # profile a study of your own callable

The profiler run imports a study's workload; a module:callable named by the database is run only when --model
names it too (a database is data, and may be someone else's: docs/security.md).

The page is self-contained (plotly.js is embedded): open it offline, mail it, attach it to a bug report.
The profiler run writes a Chrome trace to trials/<study>/profile/ (open it at ui.perfetto.dev).
"""

DASHBOARD_EPILOG = """\
examples:
  autotune dashboard                            # http://127.0.0.1:8080/ on sqlite:///trials/autotune.db
  autotune dashboard --port 9000 --storage sqlite:///runs/a.db

The dashboard has no authentication: it binds to 127.0.0.1 unless --host says otherwise, and answers only
requests that name it by a loopback name (another site's page cannot reach it through its own name: DNS
rebinding). To look from another machine, prefer an SSH tunnel (ssh -L 8080:127.0.0.1:8080 HOST) over
--host 0.0.0.0, which answers to this machine's IP addresses and its own name only. See docs/security.md.
"""


# --- dashboard ----------------------------------------------------------------------------------------

def cmd_dashboard(args: argparse.Namespace) -> int:
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
    from socketserver import ThreadingMixIn

    try:
        import optuna_dashboard
    except ImportError:
        raise AutotuneError("the dashboard needs optuna-dashboard: pip install optuna-dashboard") from None
    if not 0 <= args.port <= 65535:
        raise AutotuneError(f"--port {args.port} is not a port number: use 1-65535 (0 picks a free one)")
    from autotune.search.record.storage import open_existing_storage

    storage, url = open_existing_storage(args.storage)

    class _Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a browser's open connections do not keep Ctrl-C waiting

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format, *a):  # noqa: A002 - the stdlib's name; one line per request is noise here
            pass

    # only requests naming this server by a name it is bound to, and writes only from its own page (webguard)
    app = guard(optuna_dashboard.wsgi(storage), args.host)
    try:
        server = make_server(args.host, args.port, app, server_class=_Server, handler_class=_Quiet)
    except OSError as exc:
        raise AutotuneError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                            "pick another --port (0 picks a free one)") from None
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    if not is_loopback(args.host):
        print(f"autotune dashboard: warning: listening on {args.host}, reachable from other machines; the dashboard "
              "has no authentication (anyone who can connect can read and edit the study)", file=sys.stderr)
    print(f"autotune dashboard: serving {url} at http://{shown}:{port}/dashboard (Ctrl-C to stop)",
          file=sys.stderr, flush=True)

    def on_term(signum, frame):  # SIGTERM (e.g. from a supervisor) stops like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (nohup, &)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        print("autotune dashboard: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


# --- report -------------------------------------------------------------------------------------------

def cmd_report(args: argparse.Namespace) -> int:
    from autotune.config import Workload
    from autotune.view.report import build_report, recommended, write_report
    from autotune.machine.safefs import private_dir
    from autotune.search.record.storage import artifacts_dir

    study, url = select_study(args)
    folder = artifacts_dir(url, study.study_name)
    if not args.output or not args.no_profile:  # the page or the profile goes there: 0700, no other user's
        private_dir(folder)
    out = Path(args.output) if args.output else folder / "report.html"
    profile, note = None, ""
    rec = recommended(study)
    stored = study.user_attrs.get(keys.STUDY_WORKLOAD)
    workload = None if rec is None else (Workload.from_dict(stored) if stored else rec.workload)
    if args.no_profile:
        note = "Not profiled (--no-profile)."
    elif rec is None:
        note = "Not profiled: the study has no measured feasible config yet."
    elif workload.is_callable and args.model != workload.model:
        # the database names the code the profiler run would import and call: it may be someone else's file
        note = (f"Not profiled: the study's workload is {_arg(workload.model)}, code named by the database; "
                f"autotune runs it only when you name it too: autotune report --study-name "
                f"{_arg(study.study_name)} --model {_arg(workload.model)}")
        print(f"autotune report: {note}", file=sys.stderr, flush=True)
    else:
        from autotune.trial.profile import profile_config

        prof_dir = folder / "profile"
        print(f"autotune report: profiling {rec.config.short()} for a few steps in a child process "
              f"(--no-profile skips this)", file=sys.stderr, flush=True)
        from autotune.search.record.storage import machine_lock

        with machine_lock(f"autotune report (profiling {rec.config.short()})"):  # a measuring child too
            profile = profile_config(workload, rec.config, prof_dir,
                                     memory_cap_mb=study.user_attrs.get(keys.STUDY_MEMORY_CAP))
        if profile.ok:
            print(f"autotune report: Chrome trace {profile.trace_path} (open it at ui.perfetto.dev)", file=sys.stderr)
        else:
            print(f"autotune report: the profiler run failed ({profile.reason}); the report says so",
                  file=sys.stderr)
    html = build_report(study, storage_url=url, profile=profile, profile_note=note, report_path=out)
    write_report(out, html)
    print(f"autotune report: wrote {out}", file=sys.stderr)
    print(out)
    return 0


def _arg(text: str) -> str:
    """``text`` (read from a database: anyone's) as a shell argument the terminal shows as it is."""
    import shlex

    return shlex.quote(text) if text.isprintable() else repr(text)


def add_report_commands(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("dashboard", help="browse the study in optuna-dashboard (on 127.0.0.1)",
                       description="Start optuna-dashboard on the study storage: every trial with its config, "
                       "throughput median/IQR, peak memory, data-wait share and status reason as user "
                       "attributes. Ctrl-C stops it.", epilog=DASHBOARD_EPILOG, formatter_class=fmt)
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL (default: sqlite:///trials/autotune.db)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; anything but loopback exposes an unauthenticated page (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, metavar="N", help="port (0: a free one; default: %(default)s)")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("report", help="write a self-contained HTML report of a study (plots, bottlenecks, profile)",
                       description="Write one HTML file, openable offline: optimisation history against the "
                       "baseline, throughput vs peak memory with the cap, parameter importances, the step-time "
                       "breakdown of baseline vs recommendation, the top configs with what limited each, and the "
                       "top operators of a short torch.profiler run of the recommended config.",
                       epilog=REPORT_EPILOG, formatter_class=fmt)
    add_study_args(p)  # the same study selection as show/export
    add_study_selector_args(p)
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="default: report.html in the study's folder beside the database (trials/<study>/)")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the short torch.profiler run of the recommended config")
    p.set_defaults(func=cmd_report)
