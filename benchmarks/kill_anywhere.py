#!/usr/bin/env python
"""Kill it anywhere: `autotune run` killed at every phase of a run, resumed with the same command, checked each time.

Runs the real CLI on a tiny workload (``kill_workload.py``: a run of it goes through every phase in ~2 min on 2
cores) and kills it (SIGKILL by default; ``--signal TERM`` or ``INT``) at a moment drawn inside a phase, for every
phase ``autotune.search.record.run_phase.PHASES`` names, in the order a run meets them; then runs the same command
again, which resumes, and kills that at the next phase, and so on. A cycle is one study (its own name), taken
through every phase, then to its end; the next cycle starts a fresh one, until ``--kills`` kills. After each kill:

- **nothing lost**: the study's finished trials are never fewer than before the kill, and each one's stored state,
  value and windows are unchanged;
- **integrity**: SQLite's ``pragma integrity_check`` says ok (another storage: not checked, said);
- **no orphans**: every process of the run's tree, recorded just before the kill (fork servers, trial children,
  DataLoader workers, the numerics and ceilings' children), is dead 1 s after the parent died (a zombie is dead:
  it waits for init to reap it, which here takes up to ~2 s; it holds no memory and runs nothing);
- **the locks are free**: the machine lock and the study's run lock can be taken at once;
- **the stop** (TERM, INT): exit code 130, one line that says how to resume, no traceback;
- **the resume**: the next run says in one line that it resumes the run killed during that phase, goes on from it
  (a kill after the search runs no trial and enters no search; the finalists' rounds finished before are kept,
  "(kept)" in its log), and at a cycle's end the YAML it wrote (``-o``) is the one ``autotune export`` gives.

Prints one line per kill and a table per phase; writes every kill's record (the tree, each check, the resume) to
``benchmarks/results/kill_anywhere-<date>-<signal>.json``, with the machine (CPU model from lscpu).

    python benchmarks/kill_anywhere.py                      # 100 SIGKILLs, ~1-2 h on 2 cores
    python benchmarks/kill_anywhere.py --signal TERM --kills 20
    python benchmarks/kill_anywhere.py --kills 10 --seed 3 --out /tmp/k.json
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing

import psutil  # noqa: E402

from autotune.search.record import trials as keys  # noqa: E402
from autotune.search.record.run_phase import AFTER_SEARCH, PHASES, STORED, describe  # noqa: E402
from autotune.search.record.run_phase import key as run_phase_key  # noqa: E402
from autotune.search.record.storage import folder_name, sqlite_path  # noqa: E402

SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}
# before the run records its first phase: the CLI's checks, the workload's check child, the environment stamp
START_UP = "(start-up)"
TARGETS = (START_UP, *PHASES)
SPACE = """name: kill-anywhere
device: cpu
oversubscribe: true
parameters:
  batch_size: {type: int, choices: [16, 32]}
  num_workers: {type: int, choices: [0, 1]}
  amp: {type: categorical, choices: ["off", "bf16"]}
  channels_last: {type: bool}
fixed:
  intra_op_threads: 1
baseline: {batch_size: 32, num_workers: 0, amp: "off", channels_last: false}
"""
# how long each phase lasts, before a cycle measured it (s): where in it a kill is drawn
GUESS_S = {START_UP: 15.0, "search": 20.0, "ceilings": 5.0, "finalists": 30.0, "extra rounds": 10.0,
           "numerics": 8.0, "worst case": 6.0, "confirmation": 12.0}
GONE_WITHIN_S = 1.0
RUN_TIMEOUT_S = 900.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=100, help="kills in all (default: %(default)s)")
    p.add_argument("--signal", choices=tuple(SIGNALS), default="KILL", help="what kills the run (default: KILL)")
    p.add_argument("--seed", type=int, default=0, help="seed of the moments drawn (default: %(default)s)")
    p.add_argument("--trials", type=int, default=5, help="--trials of each run (default: %(default)s)")
    p.add_argument("--hold", type=float, default=1.5,
                   help="seconds each phase lasts at least once recorded (kill_launch.py holds it), so the "
                        "recommendation and the dashboard note (milliseconds) can be killed in (default: %(default)s)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="the study's storage (default: SQLite in the work folder); integrity is checked on SQLite")
    p.add_argument("--workdir", type=Path, default=None, help="where the runs run (default: a fresh temp folder)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON of every kill (default: benchmarks/results/kill_anywhere-<date>-<signal>.json)")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error("--kills must be >= 1")
    return args


def machine() -> dict:
    """The machine, named: CPU model (lscpu), cores, memory, load, Python and torch versions."""
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
        flags = next((ln.split(":", 1)[1].split() for ln in out.splitlines() if ln.startswith("Flags")), [])
    except (OSError, subprocess.SubprocessError):
        flags = []
    import torch

    return {"cpu_model": model or platform.processor(), "cores": psutil.cpu_count(), "usable_cores":
            len(os.sched_getaffinity(0)), "avx512_bf16": "avx512_bf16" in flags,
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "load_at_start": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__, "kernel": platform.release()}


# --- the study, read from outside ---------------------------------------------------------------------------

class Study:
    """One cycle's study as the benchmark reads it: the run's phase record, the finished trials, the finalists'
    stored runs (through Optuna's storage, opened once: a poll is one query)."""

    def __init__(self, url: str, name: str) -> None:
        import optuna

        self.name = name
        self._storage = optuna.storages.RDBStorage(url, skip_compatibility_check=True)

    def _sid(self) -> int | None:
        try:
            return self._storage.get_study_id_from_name(self.name)
        except KeyError:  # not created yet
            return None

    def attrs(self) -> dict:
        sid = self._sid()
        return {} if sid is None else self._storage.get_study_user_attrs(sid)

    def phase(self) -> dict | None:
        rec = self.attrs().get(run_phase_key())
        return rec if isinstance(rec, dict) else None

    def _trials(self) -> list:
        sid = self._sid()
        return [] if sid is None else self._storage.get_all_trials(sid, deepcopy=False)

    def finished(self) -> dict[int, list]:
        """Finished trials that measured something: number -> [state, value, windows]."""
        return {t.number: [t.state.name, t.value, list(t.user_attrs.get(keys.SAMPLES) or ())] for t in self._trials()
                if t.state.is_finished() and t.user_attrs.get(keys.STATUS) not in keys.NOT_MEASURED}

    def count(self) -> int:
        return len(self._trials())

    def stored_rounds(self) -> dict[str, int]:
        """The finalists' runs stored, by tag ("0", "1", "extra-1", "numerics-10"...): how many configs each."""
        runs = (self.attrs().get(keys.FINALIST_ROUNDS) or {}).get("runs") or {}
        tags: dict[str, int] = {}
        for k in runs:
            tag = k.rsplit(":", 1)[0]
            tags[tag] = tags.get(tag, 0) + 1
        return tags


def integrity(url: str) -> str:
    db = sqlite_path(url)
    if db is None:
        return "not checked (not SQLite)"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=60)
    try:
        return con.execute("pragma integrity_check").fetchone()[0]
    finally:
        con.close()


def lock_free(path: Path) -> bool:
    """Whether the flock on ``path`` can be taken now (then it is let go)."""
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _describe_proc(p: psutil.Process) -> dict:
    try:
        cmd = " ".join(p.cmdline())
        return {"pid": p.pid, "ppid": p.ppid(), "age_s": round(time.time() - p.create_time(), 1),
                "cmd": cmd.split("\n")[-1][-100:]}
    except psutil.Error:
        return {"pid": p.pid, "cmd": "(gone before it was described)"}


# --- one `autotune run` process --------------------------------------------------------------------------------

class Run:
    """One `autotune run` process of a cycle: its output in a file, the phases it entered (seen in the study's
    record, its own pid's), and the study's trial count when it ended."""

    def __init__(self, cmd: list[str], env: dict, cwd: Path, log: Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self.phases: list[tuple[str, float]] = []  # (phase, when entered: time.monotonic())
        self.count_at_end: int | None = None

    def poll(self, study: Study) -> str | None:
        """The phase the run is in now (None: not one of its own yet); records a phase it just entered."""
        try:
            rec = study.phase()
        except Exception:  # noqa: BLE001 - the database busy for a moment, or not created yet
            return self.phases[-1][0] if self.phases else None
        if rec is None or rec.get("pid") != self.pid:
            return self.phases[-1][0] if self.phases else None
        if not self.phases or self.phases[-1][0] != rec["phase"]:
            self.phases.append((rec["phase"], time.monotonic()))
        return rec["phase"]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_end(self, study: Study, timeout: float = RUN_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.poll(study)
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait()
        self.count_at_end = study.count()
        return rc


def wait_for_phase(run: Run, study: Study, phase: str) -> str:
    """Until ``run`` is in ``phase`` ("in"), is past it ("passed": a later phase, or the run ended: "ended")."""
    order = PHASES.index(phase)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        now = run.poll(study)
        if now == phase:
            return "in"
        if now in PHASES and PHASES.index(now) > order:
            return "passed"
        if run.proc.poll() is not None:
            return "ended"
        time.sleep(0.05)
    return "ended"


def kill(run: Run, study: Study, sig: signal.Signals, *, lock_paths: list[Path], url: str) -> dict:
    """Signal the run, then the checks that need no resume: trials kept, integrity, orphans, locks, the stop."""
    before = study.finished()
    stored = study.stored_rounds()
    rec = study.phase() or {}
    tree = psutil.Process(run.pid).children(recursive=True)
    described = [_describe_proc(p) for p in tree]
    t_signal = time.monotonic()
    run.proc.send_signal(sig)
    try:
        rc = run.proc.wait(timeout=60 if sig != signal.SIGKILL else None)
    except subprocess.TimeoutExpired:  # the stop hung: a failure, and the run is killed
        run.proc.kill()
        rc = run.proc.wait()
    t_dead = time.monotonic()
    # the phase the run recorded last, read once it is dead: between the read above and the signal it may have
    # moved on (the listing of its tree takes a moment), and the resume goes on from where it died
    rec = study.phase() or {}
    time.sleep(max(0.0, t_dead + GONE_WITHIN_S - time.monotonic()))
    alive = [d for p, d in zip(tree, described) if not _dead(p)]
    zombies = sum(1 for p in tree if _zombie(p))
    run.count_at_end = study.count()
    after = study.finished()
    changed = [n for n, v in before.items() if after.get(n) != v]
    out = {"phase": rec.get("phase"), "phase_pid": rec.get("pid"), "in_phase_s": None, "signal": sig.name,
           "run_pid": run.pid, "run_s": round(t_signal - run.started, 1), "stop_s": round(t_dead - t_signal, 2),
           "rc": rc, "finished_before": len(before), "finished_after": len(after), "changed": changed,
           "lost": len(before) - len([n for n in before if n in after]), "integrity": integrity(url),
           "tree": described, "alive_after_1s": alive, "zombies_at_1s": zombies, "trials_at_kill": run.count_at_end,
           "locks_free": all(lock_free(p) for p in lock_paths), "stored_rounds": stored, "before": before}
    if sig != signal.SIGKILL:
        out.update(_stop_checks(run.text(), rc))
    return out


def _zombie(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop_checks(text: str, rc: int) -> dict:
    """A stopped (TERM, INT) run: exit 130, one line saying how to resume, no traceback."""
    lines = [ln for ln in text.splitlines() if "run the same command again to resume" in ln]
    return {"stop_lines": lines, "stop_ok": rc == 130 and len(lines) == 1 and "Traceback" not in text}


def resume_checks(k: dict, resumed: Run, study: Study) -> dict:
    """The run after kill ``k`` (ended): it said it resumes in one line, went on from the phase, ran no search
    trial after the search, kept the finalists' finished rounds, and lost or changed no finished trial."""
    import re

    text, phase = resumed.text(), k["phase"]
    lines = [ln for ln in text.splitlines() if ln.startswith(("resuming the run", "not resuming"))]
    line_ok = (len(lines) == 1 and lines[0].startswith(f"resuming the run (pid {k['phase_pid']})")
               and f"during {describe(phase)}" in lines[0]) if phase else len(lines) == 0
    seen = [p for p, _ in resumed.phases]
    if phase in STORED:
        from_ok = set(seen) <= set(STORED)
    elif phase in AFTER_SEARCH:
        from_ok = all(PHASES.index(p) >= PHASES.index(phase) for p in seen if p in PHASES)
        from_ok = from_ok and (phase != "confirmation" or not seen or seen[0] == "confirmation")
    else:
        from_ok = not seen or seen[0] in ("search", "ceilings")
    no_search = phase not in AFTER_SEARCH or resumed.count_at_end == k["trials_at_kill"]
    m = re.search(r"re-measuring (\d+) finalist", text)
    expected = kept = 0
    if m and phase in AFTER_SEARCH:
        n = int(m.group(1))
        expected = sum(c for tag, c in k["stored_rounds"].items() if tag.isdigit() and c == n)
        kept = len(re.findall(r"^  round \d+/\d+ .*\(kept\)$", text, flags=re.M))
    now = study.finished()
    lost = [n for n, v in k["before"].items() if now.get(n) != v]
    return {"line": lines, "line_ok": line_ok, "phases": seen, "from_ok": from_ok, "no_search_ok": no_search,
            "kept_expected": expected, "kept_seen": kept, "kept_ok": kept >= expected, "lost_later": lost,
            "ok": line_ok and from_ok and no_search and kept >= expected and not lost}


# --- cycles ---------------------------------------------------------------------------------------------------

class Bench:
    """The benchmark's state: where the runs run, the command, what it learnt of each phase's length, the kills."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sig = SIGNALS[args.signal]
        self.rng = random.Random(args.seed)
        self.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kill-anywhere-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "trials").mkdir(exist_ok=True)
        shutil.copy(HERE / "kill_workload.py", self.workdir / "kill_workload.py")
        (self.workdir / "space.yaml").write_text(SPACE)
        self.url = args.storage or f"sqlite:///{self.workdir / 'trials' / 'kill.db'}"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(ROOT) + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env["AUTOTUNE_MACHINE_LOCK"] = str(self.workdir / "machine.lock")  # not another engineer's runs'
        self.lengths: dict[str, list[float]] = {}
        self.kills: list[dict] = []
        self.cycles: list[dict] = []
        self.missed: dict[str, int] = {p: 0 for p in TARGETS}

    def cmd(self, c: int) -> list[str]:
        # autotune's own CLI, its phases held --hold s each (kill_launch.py: the benchmark's, not the product's)
        return [sys.executable, "-m", "benchmarks.kill_launch", "--hold", str(self.args.hold),
                "run", "--model", "kill_workload:build", "--image-size", "16",
                "--device", "cpu", "--space", "space.yaml", "--storage", self.url, "--study-name", f"kill-{c}",
                "--windows", "2", "--window-seconds", "0.5", "--parity-steps", "10", "--trials",
                str(self.args.trials), "--no-progress", "--no-warm-start", "-o", f"run-{c}.yaml"]

    def locks(self, c: int) -> list[Path]:
        paths = [self.workdir / "machine.lock"]
        db = sqlite_path(self.url)
        if db is not None:
            paths.append(db.parent / f".{db.name}.{folder_name(f'kill-{c}')}.lock")
        return paths

    def learn(self, run: Run) -> None:
        """Each phase's length in ``run`` (the search's first stretch only: the ceilings cut it), and its start-up's."""
        if run.phases:
            self.lengths.setdefault(START_UP, []).append(run.phases[0][1] - run.started)
        seen = set()
        for (phase, t0), (_, t1) in zip(run.phases, run.phases[1:]):
            if phase not in seen:
                self.lengths.setdefault(phase, []).append(t1 - t0)
                seen.add(phase)

    def length(self, phase: str) -> float:
        xs = sorted(self.lengths.get(phase) or ())
        if phase in STORED:
            return self.args.hold
        return xs[len(xs) // 2] if xs else GUESS_S.get(phase, 5.0)

    def covered(self, target: str) -> bool:
        """Whether ``target`` has its share of the kills (an even share each) while another has less."""
        share = -(-self.args.kills // len(TARGETS))
        counts = {t: sum(1 for k in self.kills if k["target"] == t) for t in TARGETS}
        return counts[target] >= share and min(counts.values()) < share

    def new_run(self, c: int, n: int) -> Run:
        return Run(self.cmd(c), self.env, self.workdir, self.workdir / f"run-{c}-{n}.log")


def run_cycle(b: Bench, c: int, left: int) -> None:
    """One study, killed once in each phase in turn, its start-up first (a phase the run does not reach, or leaves
    before the moment drawn in it, is skipped), then run to its end; each kill's resume checked on the run after."""
    study = Study(b.url, f"kill-{c}")
    runs = [b.new_run(c, 0)]
    pending: dict | None = None
    for target in TARGETS:
        run = runs[-1]
        if left <= 0:
            break
        if b.covered(target):  # its share of the kills is done: the rest go to phases a run meets less often
            continue
        k = attempt(b, run, study, target, c)
        if k == "ended":
            break
        if k is None:
            b.missed[target] += 1
            continue
        b.learn(run)
        if pending is not None:
            _resumed(pending, run, study)
        b.kills.append(k)
        k["index"] = len(b.kills)
        left -= 1
        print(kill_line(k, b.args.kills), flush=True)
        pending = k
        runs.append(b.new_run(c, len(runs)))
    final = runs[-1]
    rc = final.wait_end(study)
    b.learn(final)
    if pending is not None:
        _resumed(pending, final, study)
    b.cycles.append(end_of_cycle(b, c, rc, final))
    print(f"cycle {c}: {len(runs)} run(s), the last exit code {rc}, YAML = export: "
          f"{b.cycles[-1]['yaml_equal']}", flush=True)


def attempt(b: Bench, run: Run, study: Study, target: str, c: int) -> dict | str | None:
    """Kill ``run`` at a moment drawn inside ``target`` (its start-up: before it records a phase); the kill's
    record, None when the run left the phase before that moment or passed it (no kill), "ended" when it ended."""
    if target == START_UP:
        if run.phases:
            return None
    else:
        state = wait_for_phase(run, study, target)
        if state != "in":
            return "ended" if state == "ended" else None
    t_in = run.started if target == START_UP else time.monotonic()
    delay = b.rng.uniform(0.05, max(0.1, 0.8 * b.length(target)))
    while time.monotonic() < t_in + delay:
        now = run.poll(study)
        if run.proc.poll() is not None:
            return "ended"
        if now != (None if target == START_UP else target):
            return None  # it left the phase first: no kill here (the table counts it as not reached)
        time.sleep(0.05)
    in_phase = round(time.monotonic() - t_in, 2)
    k = kill(run, study, b.sig, lock_paths=b.locks(c), url=b.url)
    k.update(cycle=c, target=target, in_phase_s=in_phase, row=target if target == START_UP else k["phase"])
    return k


def _resumed(k: dict, run: Run, study: Study) -> None:
    if run.count_at_end is None:
        run.count_at_end = study.count()
    k["resume"] = resume_checks(k, run, study)
    r = k["resume"]
    print(f"  resume of kill {k['index']}: {'ok' if r['ok'] else 'FAILED'}; phases {' > '.join(r['phases']) or '-'}"
          + (f"; kept {r['kept_seen']}/{r['kept_expected']} finalist runs" if r["kept_expected"] else "")
          + ("" if r["line_ok"] else f"; line: {r['line']}"), flush=True)


def end_of_cycle(b: Bench, c: int, rc: int, final: Run) -> dict:
    """The cycle's last run ran to its end: its YAML is the one a fresh export of the study gives."""
    out = {"cycle": c, "rc": rc, "yaml_equal": None}
    run_yaml, fresh = b.workdir / f"run-{c}.yaml", b.workdir / f"fresh-{c}.yaml"
    if rc != 0:
        out["tail"] = final.text()[-3000:]
        return out
    exp = subprocess.run([sys.executable, "-m", "autotune.cli", "export", "--storage", b.url, "--study-name",
                          f"kill-{c}", "-o", str(fresh)], cwd=b.workdir, env=b.env, capture_output=True, text=True)
    out["yaml_equal"] = (exp.returncode == 0 and run_yaml.exists() and fresh.exists()
                         and run_yaml.read_text() == fresh.read_text())
    if not out["yaml_equal"]:
        out["export"] = exp.stderr[-2000:]
    return out


def kill_line(k: dict, total: int) -> str:
    alive = len(k["alive_after_1s"])
    stop = (f", stopped in {k['stop_s']:.1f} s, exit {k['rc']}, one line: {k.get('stop_ok')}"
            if k["signal"] != "SIGKILL" else "")
    return (f"kill {k['index']}/{total} in {k['row'] or '(ended)'} (+{k['in_phase_s']:.1f} s, {k['run_s']:.0f} s "
            f"into the run) {k['signal']}: trials {k['finished_after']} >= {k['finished_before']}"
            f"{' CHANGED ' + str(k['changed']) if k['changed'] else ''}, integrity {k['integrity']}, tree "
            f"{len(k['tree'])} -> {alive} alive 1 s after ({k['zombies_at_1s']} zombies), locks "
            f"{'free' if k['locks_free'] else 'HELD'}{stop}")


# --- the table --------------------------------------------------------------------------------------------------

def table(b: Bench) -> list[str]:
    """One row per phase: kills, and for each check the kills that failed it (0 everywhere is the goal)."""
    head = ["phase", "kills", "lost", "orphans>1s", "zombies@1s", "integrity", "locks held", "resume failed"]
    stop = b.sig != signal.SIGKILL
    head += ["stop failed"] if stop else []
    head += ["not reached"]
    rows = [head]
    for phase in (*TARGETS, None):
        ks = [k for k in b.kills if k["row"] == phase]
        if phase is None and not ks:
            continue
        row = [phase or "(run ended)", len(ks),
               sum(k["lost"] + len(k["changed"]) + len((k.get("resume") or {}).get("lost_later") or ()) for k in ks),
               sum(1 for k in ks if k["alive_after_1s"]), sum(k["zombies_at_1s"] for k in ks),
               sum(1 for k in ks if k["integrity"] not in ("ok", "not checked (not SQLite)")),
               sum(1 for k in ks if not k["locks_free"]),
               sum(1 for k in ks if "resume" in k and not k["resume"]["ok"])]  # (the last one, when stopped: none)
        row += [sum(1 for k in ks if not k.get("stop_ok"))] if stop else []
        row += [b.missed.get(phase, 0) if phase else ""]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = ["  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
             for r in rows]
    cyc = b.cycles
    lines.append(f"cycles: {len(cyc)}, each run to its end: {sum(1 for x in cyc if x['rc'] == 0)} exit 0, its YAML "
                 f"the export's: {sum(1 for x in cyc if x['yaml_equal'])} of {len(cyc)}")
    return lines


def save(b: Bench, out: Path, mach: dict, started: float, done: bool) -> None:
    from autotune._atomic import atomic_write

    doc = {"benchmark": "kill_anywhere", "date": date.today().isoformat(), "complete": done,
           "args": {k: str(v) for k, v in vars(b.args).items()}, "machine": mach, "workdir": str(b.workdir),
           "storage": b.url, "phases": list(PHASES), "wall_s": round(time.monotonic() - started, 1),
           "load_at_end": os.getloadavg(), "phase_lengths_s": b.lengths, "not_reached": b.missed,
           "cycles": b.cycles, "kills": [{k: v for k, v in x.items() if k != "before"} for x in b.kills],
           "table": table(b)}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(doc, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out or HERE / "results" / f"kill_anywhere-{date.today().isoformat()}-{args.signal.lower()}.json"
    b = Bench(args)
    mach = machine()
    started = time.monotonic()
    print(f"machine: {mach['cpu_model']}, {mach['usable_cores']} usable cores, {mach['memory_gib']} GiB, load "
          f"{mach['load_at_start'][0]:.1f}; torch {mach['torch']}\nruns in {b.workdir}, storage {b.url}; "
          f"{args.kills} x SIG{args.signal} over the phases: {', '.join(PHASES)}", flush=True)
    c = 0
    try:
        while len(b.kills) < args.kills:
            run_cycle(b, c, args.kills - len(b.kills))
            save(b, out, mach, started, done=False)
            c += 1
            if c >= 3 * -(-args.kills // len(TARGETS)) + 2:  # a phase the runs seldom meet is not chased forever
                print(f"stopped after {c} cycles: the kills left are in phases the runs did not reach", flush=True)
                break
    except KeyboardInterrupt:
        print("interrupted: the kills so far are kept", flush=True)
    finally:
        for p in psutil.Process().children(recursive=True):  # a run in flight when this stopped
            try:
                p.kill()
            except psutil.Error:
                pass
    save(b, out, mach, started, done=len(b.kills) >= args.kills)
    print("\n".join(table(b)))
    print(f"raw results: {out}")
    bad = [k for k in b.kills if k["alive_after_1s"] or k["lost"] or k["changed"] or not k["locks_free"]
           or k["integrity"] not in ("ok", "not checked (not SQLite)") or not (k.get("resume") or {}).get("ok", True)
           or (b.sig != signal.SIGKILL and not k.get("stop_ok"))]
    return 0 if not bad and all(x["rc"] == 0 and x["yaml_equal"] for x in b.cycles) else 1


if __name__ == "__main__":
    sys.exit(main())
