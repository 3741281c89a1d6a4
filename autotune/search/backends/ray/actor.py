"""The Tune actor that runs a trial: the unchanged runner (a fresh child process, memory watched, killed at the cap or
the time limit) in a thread, one Tune result per measured window. Tune reuses the actor for the next trial of the
same resources (``reuse_actors=True``, ``reset_config``), so the actor's fork servers (``trial.forkserver``: torch
imported once) serve the trials after the first, as they do in a local run."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
import time
from pathlib import Path

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial import events
from autotune.search.backends.ray.cluster import PLAN_KEY, this_node_cap_mb, trial_device

__all__ = ["make_trainable", "kill_trial_children", "METRIC"]

METRIC = "samples_per_s"


def make_trainable(tune):
    """The Tune trainable class that runs one trial (a class so that Tune's stop reaches ``cleanup``)."""

    class _TrialActor(tune.Trainable):
        """Trials in a Tune actor, one at a time: the runner in a thread under its node's memory cap; a first Tune
        result with the node and cap, one per measured window, the whole TrialResult (JSON) in the last. A trial
        Tune stops ends at once: pruned, through ``end_trial`` (the scheduler calls it with its STOP, since Tune
        calls nothing on an actor it keeps for the next trial); at the run's end, through ``cleanup``. The next
        trial in a kept actor (``reset_config``) ends the one before first too, so no two trials share the node."""

        def setup(self, config: dict, *, workload: dict, measure: dict, cap_mb: float | None = None) -> None:
            self._given = (workload, measure, cap_mb)
            self._thread = None
            self._node_cap: tuple[str, float] | None = None
            self._begin(config)

        def reset_config(self, new_config: dict) -> bool:
            """The next trial in this actor (``reuse_actors``): the trial before ends first, then this one begins;
            its fork servers stay. Raises where the trial before would not end (Tune then counts a failure of this
            trial and retries it in a fresh actor; a False would leave it pending for good)."""
            if not self._end():
                raise RuntimeError("the trial before in this actor did not end within 30 s of its kill")
            self._begin(new_config)
            return True

        def end_trial(self) -> None:  # the scheduler's STOP (a pruned trial): its child killed now
            self._end()

        def node_cap(self, device: str, cap_mb: float | None) -> tuple[str, float]:
            """``(node id, memory cap)`` of a trial here (``cluster.this_node_cap_mb``)."""
            import ray

            return this_node_cap_mb(ray, device, cap_mb)

        def _begin(self, config: dict) -> None:
            workload, measure, cap_mb = self._given
            # the queue and the stop flag are this trial's: a trial before it that is still ending writes to its own
            self._events, self._stop = queue.Queue(), threading.Event()
            self._thread = None
            plan = config[PLAN_KEY]
            if plan.get("shortcut"):
                self._events.put(("shortcut", None))
                return
            # under this node's memory cap (nodes differ), no higher than the user's ``cap_mb``; both the node
            # and the cap go with every result, so the study shows where a running trial is. Read at the actor's
            # first trial and kept: later, its own idle fork servers (~0.7 GiB each) would count against the next
            if self._node_cap is None:
                self._node_cap = self.node_cap(workload["device"], cap_mb)
            self._node, self._cap_mb = self._node_cap
            measure = {**measure, "memory_cap_mb": self._cap_mb}
            self._events.put(("started", None))
            # Ray sets OMP_NUM_THREADS to the actor's CPUs; the trial's child starts from a clean room anyway
            # (``launch_env.clean_env``), as locally. GPU trials share a node: torch's default threads are bounded by
            # the reservation (one core for the main process, ``gpu_trial``), under the config's own threads.
            self._placement = ({"OMP_NUM_THREADS": "1"} if workload["device"] != "cpu"
                               and not plan["config"].get("intra_op_threads") else None)
            args = (trial_device(Workload.from_dict(workload)), TrialConfig.from_dict(plan["config"]),
                    MeasureSpec.from_dict(measure))
            log = Path(self.logdir or ".") / f"trial-{plan.get('number')}.log"
            self._thread = threading.Thread(target=_run, args=(*args, log, self._placement, self._events, self._stop),
                                            daemon=True)
            self._thread.start()

        def step(self) -> dict:
            kind, payload = self._events.get()
            if kind == "window":
                return {METRIC: payload.samples_per_s, "window": payload.index, "steps": payload.steps,
                        "data_wait_s": payload.data_wait_s, "compute_s": payload.compute_s, "node": self._node,
                        "memory_cap_mb": self._cap_mb}
            if kind == "started":  # no figure yet: the node and cap, before the child's first window
                return {METRIC: 0.0, "node": self._node, "memory_cap_mb": self._cap_mb}
            if kind == "shortcut":
                return {METRIC: 0.0, "shortcut": True, "done": True}
            if kind == "done":  # with this actor's fork servers (``fork_servers``: one pid on, where reused)
                result, fingerprint, servers = payload
                return {METRIC: result.median_samples_per_s or 0.0, "trial_result": json.dumps(result.to_dict()),
                        "fingerprint": fingerprint, "node": self._node, "memory_cap_mb": self._cap_mb,
                        "fork_servers": servers, "done": True}
            raise RuntimeError(payload)

        # A trial is not resumable mid-measurement: Tune's restart after a failure measures it afresh.
        def save_checkpoint(self, checkpoint_dir: str) -> None:
            return None

        def load_checkpoint(self, checkpoint) -> None:
            return None

        def cleanup(self) -> None:
            self._end()

        def _end(self, within_s: float = 30.0) -> bool:
            """This actor's trial stopped and its child killed; whether its thread ended within ``within_s``."""
            self._stop.set()
            deadline = time.monotonic() + within_s
            while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
                kill_trial_children()  # again each second: a child forked just now was not a session leader yet
                self._thread.join(timeout=1.0)
            return self._thread is None or not self._thread.is_alive()

    return _TrialActor


def _run(workload, config, measure, log, placement, events_out: queue.Queue, stop: threading.Event) -> None:
    """One trial, in the actor's thread: its windows and its end (or its error) to ``events_out``; it stops at its
    next window once ``stop`` is set."""
    try:
        from autotune.machine.hardware import detect
        from autotune.trial.forkserver import default_servers
        from autotune.trial.runner import run_trial
        from autotune.search.record.storage import machine_lock

        def on_event(d: dict) -> None:  # windows go to Tune with their step-time split
            ev = events.from_dict(d)
            if isinstance(ev, events.Window):
                events_out.put(("window", ev))

        # The trial's fork server is started by its pool's own thread (``trial.forkserver``), not this one,
        # so it outlives this thread and serves this actor's next trial of the same launch environment.
        # A CPU trial holds the node, whoever started it; GPU trials share it, one per GPU (Ray's job)
        here = (machine_lock(f"a Ray trial ({log.name})") if workload.device == "cpu"
                else contextlib.nullcontext())
        with here:
            result = run_trial(workload, config, measure, on_window=lambda i, v: stop.is_set(),
                               on_event=on_event, log_path=log, placement=placement)
        events_out.put(("done", (result, detect(with_torch=False).fingerprint, default_servers().pids())))
    except BaseException as exc:  # noqa: BLE001 - reported to Tune as this trial's error
        import traceback

        events_out.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def kill_trial_children() -> None:
    """SIGKILL the process group of each trial child of this actor (a child leads its own group), started cold (a
    child of the actor) or forked by one of its fork servers (a child of the server). The servers stay: they run no
    trial code, and they serve the actor's next trial (they die with the actor's process)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for c in children:
        try:
            line = " ".join(c.cmdline())
            if "autotune.trial.worker_forkserver" in line:
                trials = [g.pid for g in c.children()]
            elif "autotune.trial.worker" in line:
                trials = [c.pid]
            else:
                continue
        except psutil.Error:
            continue
        for pid in trials:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
