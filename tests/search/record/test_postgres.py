"""Several `autotune run` workers on one PostgreSQL study: real server (.ci/postgres.sh), real CLI processes.

The server comes from ``AUTOTUNE_TEST_POSTGRES_URL`` (``source .ci/postgres.sh`` starts a throwaway one);
without it the PostgreSQL tests skip and say so. Heartbeats are shortened through the environment so a dead
worker's trial goes stale in seconds.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import sys
import time
import uuid

import optuna
import pytest
import yaml

from autotune.config import TrialConfig

from tests.helpers import TINY, assert_queued_are_walk_steps_or_reruns, run_cli

URL = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
HEARTBEAT_S, GRACE_S = 1, 3
SPACE = {"name": "tiny", "device": "cpu",
         "parameters": {"batch_size": {"type": "int", "choices": [8, 16, 32]}, "channels_last": {"type": "bool"}},
         "baseline": {"batch_size": 8, "channels_last": False}}


@pytest.fixture(scope="module")
def pg_url() -> str:
    if not URL:
        pytest.skip("AUTOTUNE_TEST_POSTGRES_URL is not set: `source .ci/postgres.sh` starts a throwaway PostgreSQL "
                    "server (Debian's postgresql package) and sets it")
    from autotune.errors import StorageError
    from autotune.search.record.storage import open_storage

    try:
        storage = open_storage(URL)
        optuna.get_all_study_summaries(storage)
    except StorageError as exc:
        pytest.skip(f"PostgreSQL at {URL} is not usable: {exc}")
    return URL


@pytest.fixture
def space_file(tmp_path):
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(SPACE))
    return p


def _env() -> dict[str, str]:
    """A worker's environment: short heartbeats, and a machine lock of its own, as if it ran on its own machine
    (workers on one machine would take turns; these simulate several machines)."""
    return {**os.environ, "AUTOTUNE_HEARTBEAT_S": str(HEARTBEAT_S), "AUTOTUNE_GRACE_S": str(GRACE_S),
            "AUTOTUNE_MACHINE_LOCK": os.path.join(tempfile.mkdtemp(prefix="autotune-machine-"), "lock")}


def _cmd(url: str, name: str, space, *, model: str = TINY, window_s: float = 0.2,
         windows: int = 2) -> list[str]:
    return [sys.executable, "-m", "autotune.cli", "run", "--model", model, "--image-size", "16", "--device", "cpu",
            "--space", str(space), "--storage", url, "--study-name", name, "--windows", str(windows),
            "--window-seconds", str(window_s), "--finalists", "1", "--rounds", "1", "--no-progress",
            # the database holds the other tests' studies of this machine: no warm start from them, so each
            # test's first trials are the ones it counts on (test_warm_start.py tests the warm start)
            "--no-warm-start"]


def _study(url: str, name: str):
    from autotune.search.record.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(url))


def test_two_workers_share_one_study_and_count_every_trial_once(pg_url, space_file, tmp_path):
    name = f"two-workers-{uuid.uuid4().hex[:8]}"
    procs = [subprocess.Popen(_cmd(pg_url, name, space_file) + ["--trials", "3"], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    # both started at once, the baseline was queued (and measured) exactly once
    assert sum("new study" in err for _, err in outs) == 1

    every = _study(pg_url, name).trials
    assert [t.number for t in every] == list(range(len(every)))
    # what is still queued is the planned search's next step (a batch walk step, a one-knob step, a repeat), or
    # the re-run of a trial pruned far below its neighbours (a hiccup of this loaded machine:
    # study_queue.requeue_far_pruned), left for a later run
    assert_queued_are_walk_steps_or_reruns(every)
    trials = [t for t in every if t.state.name != "WAITING"]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in trials), [(t.number, t.state.name) for t in trials]
    assert sum(1 for t in trials if t.user_attrs.get("baseline")) == 1
    assert sum(1 for t in trials if t.user_attrs.get("likely_winner")) == 1
    # 3 + 3 measured: none lost, none counted twice. Repeats the sampler proposed were answered from the
    # study and do not use up --trials. A re-run of a trial pruned far below its neighbours is a measurement
    # (it uses up one of --trials) of a config already measured, once: the only config measured twice.
    ran = [t for t in trials if t.user_attrs.get("duplicate_of") is None]
    assert len(ran) == 6, [(t.number, t.user_attrs.get("duplicate_of"), t.user_attrs.get("requeue_of"))
                           for t in trials]
    reruns = [t for t in ran if t.user_attrs.get("requeue_of") is not None]
    for t in reruns:
        assert t.user_attrs["config"] == trials[t.user_attrs["requeue_of"]].user_attrs["config"]
        assert trials[t.user_attrs["requeue_of"]].state.name == "PRUNED"
    assert len({t.user_attrs["requeue_of"] for t in reruns}) == len(reruns), "a trial was re-run twice"
    keys = [TrialConfig.from_dict(t.user_attrs["config"]).key() for t in ran if t not in reruns]
    assert len(keys) == len(set(keys)), "a config was measured twice"
    for t in trials:  # a repeat reuses the measurement it repeats, and never ran alongside it
        twin = t.user_attrs.get("duplicate_of")
        if twin is not None:
            assert t.user_attrs["config"] == trials[twin].user_attrs["config"]
            assert t.user_attrs.get("samples_per_s") == trials[twin].user_attrs.get("samples_per_s")
            assert trials[twin].datetime_complete <= t.datetime_complete

    shown = run_cli("show", "--storage", pg_url, "--study-name", name, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-1500:]
    assert f"{len(every)} trials" in shown.stdout.splitlines()[0]


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def test_killed_worker_trial_is_failed_by_heartbeat_and_retried_by_another(pg_url, space_file, tmp_path):
    name = f"killed-worker-{uuid.uuid4().hex[:8]}"
    cmd = _cmd(pg_url, name, space_file, model="tests.study_fixtures:sleepy", windows=3, window_s=1.0)
    victim = subprocess.Popen(cmd + ["--trials", "2"], cwd=tmp_path, env=_env(), start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # until the worker measures trial 0 (the baseline)
            time.sleep(0.3)
            try:
                trials = _study(pg_url, name).trials
            except KeyError:
                continue
            if trials and trials[0].state.name == "RUNNING" and trials[0].system_attrs.get("autotune_measuring"):
                break
        else:
            pytest.fail("the first worker never started measuring trial 0")
        time.sleep(1.5)  # mid-trial: the child is building or measuring
        doomed = _descendants(victim.pid)  # the trial's child leads its own group: kill it too
        os.killpg(victim.pid, signal.SIGKILL)
        for p in doomed:
            p.kill()
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    assert _study(pg_url, name).trials[0].state.name == "RUNNING"  # nobody has noticed yet

    time.sleep(max(0.0, killed_at + GRACE_S + HEARTBEAT_S - time.time()))  # its heartbeat is now stale
    # three trials: the likely winner and the batch walk's first step, queued at the start (still waiting),
    # then the retry of the dead baseline, queued behind them when the heartbeat finds it stale
    out = subprocess.run(cmd + ["--trials", "3"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]

    trials = _study(pg_url, name).trials
    dead = trials[0]
    assert dead.state.name == "FAIL"
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert len(retries) == 1, [(t.number, t.state.name, t.system_attrs) for t in trials]
    retry = retries[0]
    assert retry.params == dead.params and retry.state.name == "COMPLETE"
    assert retry.user_attrs["status"] == "ok" and retry.value > 0
    assert retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["baseline"] is True  # the retried baseline is still the baseline
    assert TrialConfig.from_dict(retry.user_attrs["config"]) == TrialConfig.from_dict(dead.user_attrs["config"])
    assert not [t for t in trials if t.state.name == "RUNNING"]
    assert_queued_are_walk_steps_or_reruns(trials)


# --- machines of different kinds never mix (no server needed) -------------------------------------------

def test_a_study_refuses_a_worker_on_other_hardware(tmp_path):
    from autotune import MeasureSpec, Workload
    from autotune.errors import StorageError
    from autotune.machine.hardware import detect
    from autotune.search.space.search_space import space_from_dict
    from autotune.search.tuner import Tuner

    hw = detect()
    other = dataclasses.replace(hw, usable_cores=hw.usable_cores + 8)
    kw = dict(storage=f"sqlite:///{tmp_path}/s.db", study_name="shared", progress=False, log=lambda m: None,
              measure=MeasureSpec(windows=2, window_s=0.2))
    Tuner(Workload(model=TINY, image_size=16), hardware=hw, space=space_from_dict(SPACE, hardware=hw),
          **kw).study()
    with pytest.raises(StorageError, match="other hardware"):
        Tuner(Workload(model=TINY, image_size=16), hardware=other, space=space_from_dict(SPACE, hardware=other),
              **kw).study()


def test_recommendations_use_only_trials_of_the_study_hardware(tmp_path):
    from autotune.search.record.trials import feasible_by_config

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/f.db", study_name="mixed", direction="maximize")
    study.set_user_attr("fingerprint", "aaaaaaaaaa")
    for fingerprint, value, bs in (("aaaaaaaaaa", 100.0, 8), ("bbbbbbbbbb", 900.0, 16), (None, 50.0, 32)):
        t = study.ask()
        attrs = {"status": "ok", "config": TrialConfig(batch_size=bs).to_dict()}
        if fingerprint:
            attrs["fingerprint"] = fingerprint
        for k, v in attrs.items():
            t.set_user_attr(k, v)
        t.set_constraint("memory", -0.5)
        study.tell(t, value)
    chosen = {t.user_attrs["config"]["batch_size"] for t in feasible_by_config(study).values()}
    assert chosen == {8, 32}  # the faster trial from another kind of node is not evidence for this study


def test_show_never_prints_the_storage_password(pg_url, space_file, tmp_path):
    """A real server's URL with a password in it (the throwaway server trusts any): `show`'s header, a
    `run`'s messages and the exported recommendation mask it (issue 24.5)."""
    from sqlalchemy.engine import make_url

    url = make_url(pg_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    name = f"pw-{uuid.uuid4().hex[:8]}"
    run = subprocess.run([*_cmd(url, name, space_file), "--trials", "1"], env=_env(), capture_output=True,
                         text=True, timeout=400)
    assert run.returncode in (0, 1), run.stderr[-2000:]
    show = run_cli("show", "--storage", url, "--study-name", name)
    export = run_cli("export", "--storage", url, "--study-name", name)
    for out in (run, show, export):
        assert "s3cret-pw" not in out.stdout + out.stderr
    assert ":***@" in show.stdout.splitlines()[0] and ":***@" in export.stdout


def test_show_on_a_database_without_optuna_tables_creates_none(pg_url):
    """`show` on a server database that holds no study (a new, empty one): one line, exit 2, and no table is
    created in it (issue 24.7: commands that read never make a schema)."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    def engine_url(url):  # the driver autotune uses for a bare postgresql:// URL (psycopg 3, else psycopg2)
        import importlib.util

        u = make_url(url)
        plain = u.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None
        return u.set(drivername="postgresql+psycopg2") if plain else u

    name = f"empty_{uuid.uuid4().hex[:8]}"
    admin = sqlalchemy.create_engine(engine_url(pg_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    url = make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        out = run_cli("show", "--storage", url)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert "is not a study database" in out.stderr.strip().splitlines()[-1]
        engine = sqlalchemy.create_engine(engine_url(url))
        try:
            assert sqlalchemy.inspect(engine).get_table_names() == []
        finally:
            engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE {name}"))
        admin.dispose()
