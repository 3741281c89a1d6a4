"""The Tune actor that runs one trial: the unchanged runner (a fresh child process, memory watched, killed
at the cap or the time limit) in a thread, one Tune result per measured window."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
from pathlib import Path

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial import events
from autotune.search.backends.ray.cluster import PLAN_KEY, this_node_cap_mb, trial_device

__all__ = ["make_trainable", "kill_trial_children", "METRIC"]

METRIC = "samples_per_s"


def make_trainable(tune):
    """The Tune trainable class that runs one trial (a class so that Tune's stop reaches ``cleanup``)."""

    class _TrialActor(tune.Trainable):
        """One trial in a Tune actor: the runner in a thread under its node's memory cap; a first Tune result
        with the node and cap, one per measured window, the whole TrialResult (JSON) in the last. ``cleanup``
        (Tune's stop: pruned, or the run ended) kills the trial's child process group so nothing outlives the
        actor."""

        def setup(self, config: dict, *, workload: dict, measure: dict, cap_mb: float | None = None) -> None:
            import ray

            self._events: queue.Queue = queue.Queue()
            self._stop = threading.Event()
            self._thread = None
            plan = config[PLAN_KEY]
            if plan.get("shortcut"):
                self._events.put(("shortcut", None))
                return
            # under this node's memory cap (nodes differ), no higher than the user's ``cap_mb``; both the node
            # and the cap go with every result, so the study shows where a running trial is
            self._node, self._cap_mb = this_node_cap_mb(ray, workload["device"], cap_mb)
            measure = {**measure, "memory_cap_mb": self._cap_mb}
            self._events.put(("started", None))
            # Ray sets OMP_NUM_THREADS to the actor's CPUs; the trial's child starts from a clean room anyway
            # (``launch_env.clean_env``), as locally: a CPU trial holds the whole node and sees what a local run
            # sees. GPU trials share a node: torch's default threads are bounded by the reservation (one core for
            # the main process, ``gpu_trial``), a placement under the config's own threads.
            self._placement = ({"OMP_NUM_THREADS": "1"} if workload["device"] != "cpu"
                               and not plan["config"].get("intra_op_threads") else None)
            args = (trial_device(Workload.from_dict(workload)), TrialConfig.from_dict(plan["config"]),
                    MeasureSpec.from_dict(measure))
            log = Path(self.logdir or ".") / f"trial-{plan.get('number')}.log"
            self._thread = threading.Thread(target=self._run, args=(*args, log), daemon=True)
            self._thread.start()

        def _run(self, workload, config, measure, log) -> None:
            try:
                from autotune.machine.hardware import detect
                from autotune.trial.runner import run_trial
                from autotune.search.record.storage import machine_lock

                def on_event(d: dict) -> None:  # windows go to Tune with their step-time split
                    ev = events.from_dict(d)
                    if isinstance(ev, events.Window):
                        self._events.put(("window", ev))

                # The trial's fork server is started by its pool's own thread (``trial.forkserver``), not this one,
                # so it does not die when this thread ends; but an actor runs one trial (``reuse_actors=False``), so
                # on Ray a server still serves one trial and goes with the actor's process.
                # A CPU trial holds the node, whoever started it; GPU trials share it, one per GPU (Ray's job)
                here = (machine_lock(f"a Ray trial ({log.name})") if workload.device == "cpu"
                        else contextlib.nullcontext())
                with here:
                    result = run_trial(workload, config, measure, on_window=lambda i, v: self._stop.is_set(),
                                       on_event=on_event, log_path=log, placement=self._placement)
                self._events.put(("done", (result, detect(with_torch=False).fingerprint)))
            except BaseException as exc:  # noqa: BLE001 - reported to Tune as this trial's error
                import traceback

                self._events.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))

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
            if kind == "done":
                result, fingerprint = payload
                return {METRIC: result.median_samples_per_s or 0.0, "trial_result": json.dumps(result.to_dict()),
                        "fingerprint": fingerprint, "node": self._node, "memory_cap_mb": self._cap_mb, "done": True}
            raise RuntimeError(payload)

        # A trial is not resumable mid-measurement: Tune's restart after a failure measures it afresh.
        def save_checkpoint(self, checkpoint_dir: str) -> None:
            return None

        def load_checkpoint(self, checkpoint) -> None:
            return None

        def cleanup(self) -> None:
            self._stop.set()
            if self._thread is not None and self._thread.is_alive():
                kill_trial_children()
                self._thread.join(timeout=30)

    return _TrialActor


def kill_trial_children() -> None:
    """SIGKILL the process group of each trial child of this actor (the child leads its own group)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for c in children:
        try:
            if "autotune.trial.worker" in " ".join(c.cmdline()):
                os.killpg(c.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
