"""What the machine does to a command, said in one line and exit 2, with nothing stored lost: a SQLite file with a
valid header and damaged pages, an output path that is a folder, a full disk under `export`, `show --csv` and
`run` (a real tmpfs, mounted here where this user may: else a fake ENOSPC at the write), and a database server
that does not answer (said before anything else)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import optuna
import pytest

from autotune.cli import main as cli
from autotune.config import TrialResult

from tests.helpers import run_cli
from tests.helpers import make_tuner

WORKLOAD = ["--model", "tests.workloads_fixtures:tiny", "--image-size", "16", "--device", "cpu"]


def _fake(workload, config, measure, **kw):
    v = 10.0 * config.batch_size
    return TrialResult(status="ok", samples_per_s=(v, v, v), wall_s=1.0, peak_host_mb=10.0,
                       batch_size=config.batch_size)


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A real SQLite study (``tests.workloads_fixtures:tiny`` at 16 px on this machine): 3 finished trials and a
    recommendation. Its trials' figures are scripted: what is under test here is the files, not the figures."""
    root = tmp_path_factory.mktemp("stored")
    tuner = make_tuner(root, finalists=1, runner=_fake, parity_steps=0)
    tuner.run(trials=3)
    assert tuner.study().user_attrs.get("recommendation")
    return root / "t.db"


def _trials(db: Path) -> list[tuple]:
    storage = f"sqlite:///{db}"
    name = optuna.get_all_study_summaries(storage)[0].study_name
    return [(t.number, t.state.name, t.value) for t in optuna.load_study(study_name=name, storage=storage).trials]


def _one_line(out: subprocess.CompletedProcess, needle: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("autotune ") and needle in lines[0], lines[0]
    return lines[0]


# --- a damaged database -----------------------------------------------------------------------------------------

def _damage(src: Path, dst: Path) -> Path:
    """A copy of ``src`` with its header and first pages intact and random bytes over pages 3-5."""
    shutil.copy(src, dst)
    size = int.from_bytes(dst.read_bytes()[16:18], "big")
    with open(dst, "r+b") as f:
        f.seek(size * 2)
        f.write(os.urandom(size * 3))
    assert dst.read_bytes()[:16] == b"SQLite format 3\x00"
    return dst


def test_a_damaged_database_is_one_line_for_show_export_and_run(stored, tmp_path):
    db = _damage(stored, tmp_path / "damaged.db")
    for args in (["show"], ["export"], ["run", *WORKLOAD, "--trials", "1", "--no-progress"]):
        out = run_cli(*args, "--storage", f"sqlite:///{db}", timeout=120)
        _one_line(out, "is damaged")
        assert str(db) in out.stderr and "Traceback" not in out.stderr


# --- an output that is a folder ---------------------------------------------------------------------------------

def test_export_and_show_csv_onto_a_folder_are_one_line(stored, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    _one_line(run_cli("export", "--storage", f"sqlite:///{stored}", "-o", str(folder)),
              f"-o {folder} is a folder: name a file, e.g. -o {folder / 'best.yaml'}")
    _one_line(run_cli("show", "--storage", f"sqlite:///{stored}", "--csv", str(folder)), f"--csv {folder} is a folder")
    assert os.listdir(folder) == []


# --- a full disk ------------------------------------------------------------------------------------------------

@pytest.fixture
def full_disk(tmp_path):
    """A real 2 MiB tmpfs at ``tmp_path/full``, mounted here (root, or a user namespace that allows it)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", f"autotune-test-{uuid.uuid4().hex[:8]}", str(mnt)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({out.stderr.strip() or out.returncode}); "
                    "test_a_full_disk_under_export_faked_at_the_write covers the message")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> None:
    """Write a file in ``folder`` until its filesystem is full."""
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_full_disk_under_export_and_show_csv_keeps_the_old_files(stored, full_disk):
    old_yaml, old_csv = full_disk / "best.yaml", full_disk / "trials.csv"
    old_yaml.write_text("an earlier export\n")
    old_csv.write_text("an,earlier,csv\n")
    _fill(full_disk)
    line = _one_line(run_cli("export", "--storage", f"sqlite:///{stored}", "-o", str(old_yaml)), "no space left")
    assert str(old_yaml) in line and "what was stored before is intact" in line
    out = run_cli("show", "--storage", f"sqlite:///{stored}", "--csv", str(old_csv))
    assert out.returncode == 2 and "no space left on the device for " + str(old_csv) in out.stderr.strip()
    assert "Traceback" not in out.stderr
    assert old_yaml.read_text() == "an earlier export\n" and old_csv.read_text() == "an,earlier,csv\n"
    assert sorted(os.listdir(full_disk)) == ["best.yaml", "filler", "trials.csv"]  # no temporary left


@pytest.mark.slow  # 5-7 s of a 2-core VM (--durations, 2026-11-29: the suite at 317-342 s)
def test_a_full_disk_under_run_loses_no_stored_trial(stored, full_disk):
    """The run's lock file and folders are there from an earlier run, so the first write to fail is SQLite's."""
    db = full_disk / "t.db"
    shutil.copy(stored, db)
    before = _trials(db)
    name = optuna.get_all_study_summaries(f"sqlite:///{db}")[0].study_name
    (full_disk / f".t.db.{name}.lock").write_text("pid of an earlier run")
    (full_disk / name / "inductor-cache").mkdir(parents=True)
    _fill(full_disk)
    out = run_cli("run", *WORKLOAD, "--storage", f"sqlite:///{db}", "--trials", "1", "--no-progress", timeout=180)
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert last.startswith(f"autotune run: error: the disk holding the study database {db} is full (database or "
                           "disk is full)") and "what was stored before is intact" in last, last
    os.unlink(full_disk / "filler")
    assert _trials(db) == before  # every stored trial as it was


def test_a_full_disk_under_export_faked_at_the_write(stored, tmp_path, monkeypatch, capsys):
    """Where no tmpfs can be mounted: the same ENOSPC, raised by the file's fsync in this process."""
    target = tmp_path / "best.yaml"
    target.write_text("an earlier export\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert cli(["export", "--storage", f"sqlite:///{stored}", "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"autotune export: error: no space left on the device for {target}: free some space and run the "
                   "command again (what was stored before is intact)")
    assert target.read_text() == "an earlier export\n" and os.listdir(tmp_path) == ["best.yaml"]


# --- a database server that does not answer ---------------------------------------------------------------------

def test_an_unreachable_database_is_said_first_in_one_line():
    out = run_cli("run", *WORKLOAD, "--trials", "1", "--storage", "postgresql://u@127.0.0.1:1/x", timeout=120)
    _one_line(out, "postgresql://u@127.0.0.1:1/x")


def test_a_study_name_with_a_slash_is_no_traceback(tmp_path):
    """(Study names themselves are validated elsewhere; here only: whatever refuses it, it is one line.)"""
    out = run_cli("run", *WORKLOAD, "--trials", "1", "--no-progress", "--storage", f"sqlite:///{tmp_path}/n.db",
                  "--study-name", "a/b", timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1].startswith("autotune run: error: ")
