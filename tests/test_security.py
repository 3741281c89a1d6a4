"""What another local user (or a file someone else wrote) must not be able to do to an autotune user: issue 24's
security items, each on the real mechanism (a real symbolic link, a real ``json.py`` in the working folder, a
real HTTP request, a real SQLite file). The threat model: docs/security.md.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autotune.errors import StorageError
from autotune.search.record.storage import MACHINE_LOCK_ENV, machine_lock

from tests.helpers import TINY, run_cli

ROOT = os.geteuid() == 0


@pytest.fixture
def shared_dir():
    """A sticky folder every user may write, as /tmp is (tmp_path's parents are 0700: no other user gets in)."""
    d = tempfile.mkdtemp(prefix="autotune-shared-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def lock_env(monkeypatch, tmp_path, shared_dir):
    """The machine lock at ``shared_dir/autotune-machine.lock``; the per-user fallback under ``tmp_path``."""
    monkeypatch.setenv(MACHINE_LOCK_ENV, str(shared_dir / "autotune-machine.lock"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    return shared_dir / "autotune-machine.lock"


def _flocked_by(path: Path, pid: int) -> bool:
    ino = os.stat(path).st_ino
    return any(f" {pid} " in line and line.split()[5].endswith(f":{ino}") for line in open("/proc/locks")
               if len(line.split()) > 5 and line.split()[1] == "FLOCK")


# --- 1. the machine lock ----------------------------------------------------------------------------------

def test_machine_lock_does_not_follow_a_symlink_planted_at_its_path(lock_env, tmp_path, capfd):
    """A link at the shared lock's path to a 0600 file of the victim's: the file keeps its bytes and mode (the
    lock used to chmod it 0666 and truncate it), and the lock is taken on the user's own file instead."""
    victim = tmp_path / "secret"
    victim.write_text("do not touch\n")
    victim.chmod(0o600)
    lock_env.symlink_to(victim)
    with machine_lock("the test"):
        own = tmp_path / "run" / "autotune" / "machine.lock"
        assert _flocked_by(own, os.getpid())
    assert victim.read_text() == "do not touch\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert lock_env.is_symlink()
    err = capfd.readouterr().err
    assert "symbolic link" in err and str(own) in err
    assert stat.S_IMODE((tmp_path / "run" / "autotune").stat().st_mode) == 0o700


def test_machine_lock_never_writes_a_hard_link_to_another_file(lock_env):
    """A hard link at the lock's path to a file of the victim's (no O_NOFOLLOW stops that): flocked, as any
    plain file may be, but neither truncated nor chmodded nor written."""
    victim = lock_env.parent / "notes.txt"  # beside the lock: a hard link cannot cross file systems
    victim.write_text("precious\n")
    victim.chmod(0o600)
    os.link(victim, lock_env)
    with machine_lock("the test"):
        assert _flocked_by(lock_env, os.getpid())
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_a_lock_held_by_another_user_is_reported_with_the_holder_at_once(lock_env):
    """Another user's process made the shared lock file and holds it without writing a word: the refusal comes
    at once, names that process from the kernel's lock table, and changes nothing in the file."""
    # as root, the holder becomes user nobody (whose file it then is) once it has started: nobody may not be
    # able to run this interpreter
    become = "os.fchown(fd, 65534, 65534); os.setgid(65534); os.setuid(65534)\n" if ROOT else ""
    holder = ("import fcntl, os, sys, time\n"
              f"fd = os.open({str(lock_env)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n{become}"
              "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert child.stdout.readline().strip() == "held"
        before = (lock_env.stat().st_mode, lock_env.read_bytes())
        t0 = time.monotonic()
        with pytest.raises(StorageError) as err:
            with machine_lock("the test"):
                pass
        assert time.monotonic() - t0 < 2
        msg = str(err.value)
        assert "\n" not in msg and f"pid {child.pid}" in msg and MACHINE_LOCK_ENV in msg
        if ROOT:
            assert "user nobody" in msg
        assert (lock_env.stat().st_mode, lock_env.read_bytes()) == before
    finally:
        child.kill()
        child.wait()


def test_the_run_lock_beside_a_database_refuses_a_planted_symlink(shared_dir, tmp_path):
    """The per-study run lock sits beside the database (in /tmp for a database there): a link planted at its
    predictable name is refused in one line, and the file it points to is not truncated (it used to be)."""
    from autotune.search.record.storage import run_lock

    victim = tmp_path / "secret"
    victim.write_text("do not touch\n")
    (shared_dir / ".a.db.s1.lock").symlink_to(victim)
    with pytest.raises(StorageError, match="symbolic link"):
        with run_lock(f"sqlite:///{shared_dir}/a.db", "s1"):
            pass
    assert victim.read_text() == "do not touch\n"
    with run_lock(f"sqlite:///{shared_dir}/a.db", "s2"):  # an ordinary one still works
        assert _flocked_by(shared_dir / ".a.db.s2.lock", os.getpid())


# --- 2. the working folder is not on a trial's sys.path -----------------------------------------------------

# `autotune` as its console script runs it: nothing of the working folder on sys.path (`python -m` would add it)
CONSOLE = [sys.executable, "-c", "import sys; del sys.path[0]; from autotune.cli import main; sys.exit(main())"]
PLANTED = ("json", "random", "queue")


@pytest.fixture
def project(tmp_path):
    """A user's project folder: their workload ``mymod:build`` with a helper module beside it, and a ``json.py``,
    ``random.py`` and ``queue.py`` that leave a mark when imported (and then fail, as a stray one would)."""
    (tmp_path / "helpers.py").write_text("CHANNELS = 4\n")
    (tmp_path / "mymod.py").write_text(
        "import torch\nfrom torch import nn\nfrom helpers import CHANNELS\n\n"
        "def build(image_size):\n"
        "    x, y = torch.randn(64, 3, image_size, image_size), torch.randint(0, 10, (64,))\n"
        "    model = nn.Sequential(nn.Conv2d(3, CHANNELS, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                          nn.Linear(CHANNELS, 10))\n"
        "    return model, torch.utils.data.TensorDataset(x, y), nn.CrossEntropyLoss()\n")
    for name in PLANTED:
        (tmp_path / f"{name}.py").write_text(
            f"open({str(tmp_path / ('imported-' + name))!r}, 'w').close()\nraise ImportError('planted {name}.py')\n")
    return tmp_path


def _marks(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("imported-*"))


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29: the suite at 317-342 s)
def test_a_trial_does_not_import_modules_planted_in_the_working_folder(project):
    """`autotune trial --model mymod:build` from the project folder: the trial runs the user's module (and its
    helper beside it) and imports none of the json.py, random.py, queue.py there (every child used to)."""
    env = {**os.environ, "AUTOTUNE_FORK_SERVER": "0"}
    r = subprocess.run([*CONSOLE, "trial", "--model", "mymod:build", "--image-size", "16", "--batch-size", "8",
                        "--windows", "2", "--window-seconds", "0.2", "--device", "cpu", "--format", "json"],
                       cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert _marks(project) == []
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)  # and it measured: the CLI trial's JSON, as the slow CLI tests read it too
    assert out["result"]["status"] == "ok" and len(out["result"]["samples_per_s"]) == 2
    assert out["workload"]["model"] == "mymod:build" and out["result"]["final_loss"] is not None


@pytest.mark.slow
def test_no_child_imports_modules_planted_in_the_working_folder(project):
    """Every child autotune starts, from the project folder: a trial forked by the fork server, the numerics
    check and ``collect_env``. Each runs and none imports the planted modules."""
    script = (
        "import sys; del sys.path[0]\n"
        "from autotune import MeasureSpec, TrialConfig, Workload\n"
        "from autotune.machine.envstamp import collect_env_stamp\nfrom autotune.trial.parity import parity_check\n"
        "from autotune.trial.runner import run_trial\n"
        "wl = Workload(model='mymod:build', image_size=16, device='cpu')\n"
        "import os, psutil\nparents = []\n"
        "def seen(ev):\n    if ev.get('event') == 'started':\n"
        "        parents.append(psutil.Process(ev['pid']).ppid())\n"
        "r = run_trial(wl, TrialConfig(batch_size=8), MeasureSpec(windows=2, window_s=0.2, timeout_s=120),\n"
        "              on_event=seen)\n"
        "assert parents and parents[0] != os.getpid(), 'not forked by the fork server'\n"
        "p = parity_check(wl, TrialConfig(batch_size=8, channels_last=True), steps=2)\n"
        "s = collect_env_stamp()\n"
        "print(r.status, r.reason, '|', p.ok, p.reason, '|', s.get('error'))\n")
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_FORK_SERVER"}  # the fork server on
    r = subprocess.run([sys.executable, "-c", script], cwd=project, env=env, capture_output=True, text=True,
                       timeout=400)
    assert _marks(project) == []
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("|")[0].split()[0] == "ok" and r.stdout.split("|")[1].split()[0] == "True", r.stdout
    assert r.stdout.split("|")[2].strip() == "None", r.stdout


# --- 3. a study database is data: it names no code to run and no path to write --------------------------------

def test_report_does_not_run_a_callable_the_database_names(report_study, tmp_path):
    """A database whose study says its workload is ``evilmod:build`` (a module that is there to be imported):
    `autotune report` writes the report without the profiler run, which would import and call it, and says
    how to name it to have it profiled."""
    import optuna

    db = tmp_path / "theirs.db"
    db.write_bytes(report_study.db.read_bytes())
    study = optuna.load_study(study_name=report_study.study_name, storage=f"sqlite:///{db}")
    study.set_user_attr("workload", {**study.user_attrs["workload"], "model": "evilmod:build"})
    (tmp_path / "evilmod.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                                         "from tests.workloads_fixtures import tiny as build\n")
    out = run_cli("report", "--storage", f"sqlite:///{db}", "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (tmp_path / "ran").exists()
    assert "Not profiled: the study's workload is evilmod:build" in html.unescape((tmp_path / "r.html").read_text())
    assert f"--study-name {report_study.study_name} --model evilmod:build" in out.stderr


def test_a_study_name_that_is_a_path_is_refused_in_one_line(tmp_path):
    """`autotune run --study-name a/b` (a traceback before): one line, exit 2, nothing written."""
    out = run_cli("run", "--model", TINY, "--image-size", "16", "--device", "cpu", "--trials", "1",
                  "--storage", f"sqlite:///{tmp_path}/s.db", "--study-name", "a/b", "--no-progress")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("autotune run: error: study name 'a/b' is not allowed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../../escaped", "a/b", ".."])
def test_a_stored_study_name_never_leaves_the_folder_beside_the_database(tmp_path, name):
    """A study another tool (or user) named ``../../escaped`` in the database: its report goes to a folder
    beside the database whose name is made from it, not to the path the name spells."""
    import optuna

    db = tmp_path / "a" / "b" / "c.db"
    db.parent.mkdir(parents=True)
    optuna.create_study(study_name=name, storage=f"sqlite:///{db}")
    out = run_cli("report", "--storage", f"sqlite:///{db}", "--study-name", name, "--no-profile")
    assert out.returncode == 0, out.stderr[-2000:]
    page = Path(out.stdout.strip())
    assert page.name == "report.html" and page.parent.parent == db.parent, page
    assert stat.S_IMODE(page.parent.stat().st_mode) == 0o700  # a study's folder is its user's alone (item 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]


# --- 4. a study's folder and logs in shared places ---------------------------------------------------------------

@pytest.mark.parametrize("planted", ["another user's folder", "a link to a folder"])
def test_a_run_refuses_a_study_folder_someone_else_made(shared_dir, tmp_path, planted):
    """A database in a shared folder puts the study's folder (trial logs, inductor's cache) at a predictable path
    beside it. Made first by another user (or a link to a folder of theirs), it is refused in one line, before
    anything is written into it (trials used to log there, and load what it holds)."""
    if planted == "another user's folder" and not ROOT:
        pytest.skip("needs root to make a folder owned by another user")
    folder = shared_dir / "s1"
    if planted == "a link to a folder":
        (tmp_path / "theirs").mkdir(mode=0o777)
        folder.symlink_to(tmp_path / "theirs")
    else:
        folder.mkdir(mode=0o777)
        os.chown(folder, 65534, 65534)
    out = run_cli("run", "--model", TINY, "--image-size", "16", "--device", "cpu", "--trials", "1", "--windows", "2",
                  "--window-seconds", "0.2", "--finalists", "1", "--rounds", "1", "--storage",
                  f"sqlite:///{shared_dir}/a.db", "--study-name", "s1", "--no-progress")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(f"autotune run: error: refusing {folder}")
    assert list(folder.iterdir()) == []


def test_a_trial_log_at_a_planted_link_is_refused_not_written_through(tmp_path):
    """`autotune trial --log FILE` where FILE is a link to another file: one line, exit 2, the file unchanged
    (the log used to be appended to it)."""
    victim = tmp_path / "victim"
    victim.write_text("unchanged\n")
    (tmp_path / "trial.log").symlink_to(victim)
    out = run_cli("trial", "--model", TINY, "--image-size", "16", "--device", "cpu", "--batch-size", "8",
                  "--windows", "2", "--window-seconds", "0.2", "--log", str(tmp_path / "trial.log"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (f"autotune trial: error: cannot write the trial log "
                                                   f"{tmp_path / 'trial.log'}: it is a symbolic link")
    assert victim.read_text() == "unchanged\n"


# --- 5. a storage URL's password is never shown, logged or stored ------------------------------------------------

SECRET_URL = "postgresql://tuner:s3cret@127.0.0.1:1/runs"  # nothing listens on port 1: refused at once


@pytest.mark.parametrize("command", [["show"], ["export"], ["report", "--no-profile"], ["dashboard", "--port", "0"]])
def test_an_unreachable_storage_error_masks_the_password(command):
    out = run_cli(*command, "--storage", SECRET_URL)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "s3cret" not in out.stderr + out.stdout
    assert "tuner:***@127.0.0.1:1/runs" in out.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # 5-7 s of a 2-core VM (--durations, 2026-11-29: the suite at 317-342 s)
def test_a_recommendation_keeps_no_password_in_its_yaml_report_or_mlflow(report_study, tmp_path):
    """A recommendation stored with a password in its storage URL (as every earlier autotune stored it): the
    exported YAML, the HTML report and what MLflow receives hold ``tuner:***@``, never the password."""
    import optuna

    from autotune.recommendation import stored_recommendation

    db = tmp_path / "copy.db"
    db.write_bytes(report_study.db.read_bytes())
    study = optuna.load_study(study_name=report_study.study_name, storage=f"sqlite:///{db}")
    stored = study.user_attrs["recommendation"]
    study.set_user_attr("recommendation", {**stored, "provenance": {**stored["provenance"], "storage": SECRET_URL}})
    yaml_out = run_cli("export", "--storage", f"sqlite:///{db}")
    assert yaml_out.returncode == 0, yaml_out.stderr[-2000:]
    assert "s3cret" not in yaml_out.stdout and "storage: postgresql://tuner:***@127.0.0.1:1/runs" in yaml_out.stdout
    page = run_cli("report", "--storage", f"sqlite:///{db}", "--no-profile", "-o", str(tmp_path / "r.html"))
    assert page.returncode == 0 and "s3cret" not in (tmp_path / "r.html").read_text()

    pytest.importorskip("mlflow")
    from autotune.integrations.mlflow import MLflowLogger

    rec = stored_recommendation(study)
    assert rec.storage == "postgresql://tuner:***@127.0.0.1:1/runs"
    MLflowLogger(f"sqlite:///{tmp_path}/mlflow/mlflow.db").finish(study, rec, report_path=tmp_path / "r.html")
    sent = [p for p in (tmp_path / "mlflow").rglob("*") if p.is_file()]
    assert any(p.name == "recommendation.yaml" for p in sent)
    assert not [p for p in sent if b"s3cret" in p.read_bytes()]


# --- 6. the dashboard answers only to its own names ------------------------------------------------------------

@pytest.fixture
def dashboard(tmp_path):
    """`autotune dashboard --port 0` on a one-study database (a copy of nothing: its own), and its port."""
    import optuna
    import re
    import threading

    storage = f"sqlite:///{tmp_path}/d.db"
    study = optuna.create_study(study_name="victim", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "dashboard", "--storage", storage, "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    deadline = time.monotonic() + 60
    port = None
    while port is None and time.monotonic() < deadline and proc.poll() is None:
        port = next((int(m.group(1)) for ln in list(lines) if (m := re.search(r"127\.0\.0\.1:(\d+)/", ln))), None)
        time.sleep(0.1)
    assert port, lines
    yield storage, port
    proc.terminate()
    proc.wait(timeout=20)


def _http(port: int, method: str, path: str, host: str, **headers) -> tuple[int, bytes]:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"study_name": "renamed"}) if method == "POST" else None
    conn.request(method, path, body=body, headers={"Host": host, "Content-Type": "application/json",
                                                   **{k.replace("_", "-"): v for k, v in headers.items()}})
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def test_the_dashboard_refuses_a_foreign_host_and_a_write_from_another_site(dashboard):
    """Over real HTTP: a request naming the server ``evil.example`` (what a DNS-rebinding page sends) is
    refused, reads and writes alike, and so is a write whose Origin is another site; the dashboard's own page
    still reads and renames. The study is renamed only by that last request (HTTP 201 before the guard)."""
    import json

    import optuna

    storage, port = dashboard
    own = f"127.0.0.1:{port}"
    status, body = _http(port, "GET", "/api/studies", own)
    assert status == 200, body
    [summary] = json.loads(body)["study_summaries"]
    rename = f"/api/studies/{summary['study_id']}/rename"
    assert _http(port, "GET", "/api/studies", f"evil.example:{port}")[0] == 403
    assert _http(port, "GET", "/dashboard", "evil.example")[0] == 403
    assert _http(port, "POST", rename, f"evil.example:{port}", Origin=f"http://evil.example:{port}")[0] == 403
    assert _http(port, "POST", rename, own, Origin="http://evil.example")[0] == 403
    assert _http(port, "POST", rename, own, Sec_Fetch_Site="cross-site")[0] == 403
    assert optuna.get_all_study_names(storage) == ["victim"]
    assert _http(port, "GET", "/api/studies", f"localhost:{port}")[0] == 200
    assert _http(port, "POST", rename, own, Origin=f"http://{own}", Sec_Fetch_Site="same-origin")[0] == 201
    assert optuna.get_all_study_names(storage) == ["renamed"]


# --- 7. commands that read never write --------------------------------------------------------------------------

def _foreign_db(path: Path) -> None:
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('Ada')")
    con.commit()
    con.close()


@pytest.mark.parametrize("command", [["show"], ["export"], ["report", "--no-profile"], ["dashboard", "--port", "0"]])
@pytest.mark.parametrize("kind", ["empty file", "another program's database", "not a database"])
def test_a_reading_command_leaves_a_file_that_is_not_a_study_database_as_it_was(tmp_path, command, kind):
    """`show` (and export, report, dashboard) on an empty file, another program's SQLite database, or a text
    file: one line, exit 2, and the file's bytes unchanged (`show` used to create Optuna's tables in it)."""
    import hashlib

    db = tmp_path / "data.db"
    if kind == "empty file":
        db.write_bytes(b"")
    elif kind == "not a database":
        db.write_text("name,email\nAda,ada@example.org\n")
    else:
        _foreign_db(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    out = run_cli(*command, "--storage", f"sqlite:///{db}", timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith(f"autotune {command[0]}: error: {db} is not a study database"), last
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.db"]  # no journal, no study folder left behind
