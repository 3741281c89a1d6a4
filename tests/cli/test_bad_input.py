"""The bad-input table of docs/errors.md rows not covered elsewhere: real CLI, exit 2, one line naming the problem.

(Rows for `trial` flags live in test_cli.py, search-space and storage rows in test_cli_study.py.)
"""

from __future__ import annotations

from tests.helpers import TINY, run_cli

TRIAL = ["trial", "--device", "cpu", "--image-size", "16", "--windows", "1", "--window-seconds", "0.1"]
RUN = ["run", "--device", "cpu", "--model", TINY, "--image-size", "16", "--trials", "1"]


def _rows(tmp_path):
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    return [
        (TRIAL + ["--model", "tests.workloads_fixtures:wrong_return"], "must return (model, dataset, loss_fn)"),
        (TRIAL + ["--batch-size", "3.5"], "invalid int value: '3.5'"),
        (TRIAL + ["--memory-cap", "0"], "must be positive"),
        (TRIAL + ["--memory-cap=-2GiB"], "does not parse"),
        (TRIAL + ["--model", "transformer_tiny", "--seq-len", "0"],
         "seq_len=0 is not allowed: an integer from 16 to 4096 (tokens, --seq-len)"),
        (TRIAL + ["--threads", "9999"], "intra_op_threads=9999 is not allowed: None or a whole number from 1 to 1024 "
                                        "(--threads)"),
        (RUN + ["--model", "tests.workloads_fixtures:wrong_return", "--storage", f"sqlite:///{tmp_path}/w.db"],
         "must return (model, dataset, loss_fn)"),
        (RUN + ["--storage", f"sqlite:///{not_a_dir}/a.db"], "cannot create"),
        (RUN + ["--backend", "spark"], "invalid choice: 'spark'"),
        (RUN + ["--trials", "-1"], "--trials -1"),
        (RUN + ["--memory-margin", "95%"], "must be from 0% to under 90%"),
        (RUN + ["--memory-margin", "lots"], "does not parse"),
        (RUN + ["--backend", "local", "--address", "auto"], "use it with --backend ray"),
    ]


def test_bad_input_rows(tmp_path):
    failures = []
    for args, needle in _rows(tmp_path):
        out = run_cli(*args, timeout=180)
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
        if out.returncode != 2 or "Traceback" in out.stderr or needle not in last or not last.startswith("autotune"):
            failures.append((args, out.returncode, last or out.stderr[-300:]))
    assert not failures, failures
