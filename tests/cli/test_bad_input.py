"""The bad-input table of docs/errors.md rows not covered elsewhere: real CLI, exit 2, one line naming the problem.

(Rows for `trial` flags live in test_cli.py, search-space and storage rows in test_cli_study.py.)
"""

from __future__ import annotations

import pytest

from tests.helpers import TINY, run_cli

TRIAL = ["trial", "--device", "cpu", "--image-size", "16", "--windows", "1", "--window-seconds", "0.1"]
RUN = ["run", "--device", "cpu", "--model", TINY, "--image-size", "16", "--trials", "1"]


_slow = pytest.mark.slow  # each row is a CLI process (~2 s): a few representative rows run by default

_ROWS = [
    pytest.param(TRIAL + ["--model", "tests.workloads_fixtures:wrong_return"], "must return (model, dataset, loss_fn)",
                 id="trial-wrong-return"),
    pytest.param(TRIAL + ["--batch-size", "3.5"], "invalid int value: '3.5'", marks=_slow),
    pytest.param(TRIAL + ["--memory-cap", "0"], "must be positive", marks=_slow),
    pytest.param(TRIAL + ["--memory-cap=-2GiB"], "does not parse", marks=_slow),
    pytest.param(TRIAL + ["--model", "transformer_tiny", "--seq-len", "0"],
                 "seq_len=0 is not allowed: an integer from 16 to 4096 (tokens, --seq-len)", id="seq-len"),
    pytest.param(TRIAL + ["--threads", "9999"],
                 "intra_op_threads=9999 is not allowed: None or a whole number from 1 to 1024 (--threads)",
                 marks=_slow),
    pytest.param(RUN + ["--model", "tests.workloads_fixtures:wrong_return", "--storage", "sqlite:///{tmp}/w.db"],
                 "must return (model, dataset, loss_fn)", id="run-wrong-return"),
    pytest.param(RUN + ["--storage", "sqlite:///{tmp}/plain-file/a.db"], "cannot create", marks=_slow),
    pytest.param(RUN + ["--backend", "spark"], "invalid choice: 'spark'", marks=_slow),
    pytest.param(RUN + ["--trials", "-1"], "--trials -1", marks=_slow),
    pytest.param(RUN + ["--memory-margin", "95%"], "must be from 0% to under 90%", id="memory-margin"),
    pytest.param(RUN + ["--memory-margin", "lots"], "does not parse", marks=_slow),
    pytest.param(RUN + ["--backend", "local", "--address", "auto"], "use it with --backend ray", marks=_slow),
]


@pytest.mark.parametrize("args, needle", _ROWS)
def test_bad_input_rows(tmp_path, args, needle):
    (tmp_path / "plain-file").write_text("x")  # a file where a folder is expected
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = run_cli(*args, timeout=180)
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    failed = out.returncode != 2 or "Traceback" in out.stderr or needle not in last or not last.startswith("autotune")
    assert not failed, (args, out.returncode, last or out.stderr[-300:])
