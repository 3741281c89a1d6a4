"""The Ray backend: the same study, run by Ray Tune (``Tuner`` + ``OptunaSearch``) over a cluster.

Design (why it looks like this):

* **One study, one storage.** ``OptunaSearch`` accepts an Optuna storage and a study name and loads the study
  with ``load_if_exists``, so it asks and tells *in the tuner's own study*: ``show``, ``export``,
  ``recommend()`` and optuna-dashboard see Ray's trials exactly like local ones. The searcher (``search.py``)
  records each trial the way the local backend does, through the same trial protocol (``search.backends.protocol``):
  ``ctx.space.suggest`` (the tuner's space, as the define-by-run space), ``answer_from_study`` (configs known to
  run out of memory or measured before are recorded without running), ``record`` (figures as user attrs, memory
  constraint, and ``search.record.trials.outcome``). The sampler is the tuner's TPE with the constant liar, which
  spreads concurrent trials apart. The searcher runs in the driver, so only the driver needs to reach the storage.
  The tuner's own ``run`` opens, locks and seeds the study and re-measures the finalists, as for every backend.
* **Honest timings.** Each trial runs the unchanged runner (``autotune.trial.runner.run_trial``: a fresh child
  process, memory watched, killed at the cap or the time limit) inside a Tune actor that asks for a whole
  node's CPUs on CPU workloads (so one trial per node: two would share cores and spoil both timings), or for
  one GPU plus one core per DataLoader worker and one for the main process on CUDA workloads. Ray's
  ``OMP_NUM_THREADS`` default is undone in the actor, so "PyTorch defaults" mean the same as locally.
* **One pruning mechanism: Tune's scheduler.** ``OptunaSearch`` uses Optuna's ``NopPruner``; ``PruneScheduler``
  (a FIFO scheduler) applies the tuner's ``NoHopePruner`` rule to each window a trial reports and returns
  ``STOP``, and with it calls the trial's actor (``actor.py``, a class ``Trainable``) to kill the trial's child
  process group at once (``end_trial``: Tune calls nothing on an actor it keeps for the next trial, and a function
  trainable's thread would be abandoned with the child still running and stealing cores from the next trial);
  ``cleanup`` does the same at the run's end. Tune reuses an actor for the next trial of the same resources
  (``reuse_actors=True``): its ``reset_config`` ends the trial before and keeps the actor's fork servers, so a
  trial in a kept actor skips torch's import, as locally (docs/cluster.md says when an actor is not kept).
* **Hardware.** A probe task with a trial's resources reports what the trial nodes are. When they differ
  from this machine (a laptop driving a cluster), the study is the nodes' (named after their fingerprint,
  space trimmed to their cores) and the finalists are re-measured on one such node
  (``cluster.remote_runner``; if that node left the cluster during the search, another one of the kind);
  otherwise here. Each trial records its node's fingerprint and its Ray node id (``node``, from its first
  result on, so a running trial shows it too), and recommendations only use trials of the study's fingerprint.
* **Memory.** Each trial runs under its own node's cap (``cluster.this_node_cap_mb``: 85% of that node's
  available memory, at most the ``memory`` resource the node gives Ray, shared among the trials it runs at once,
  never above ``--memory-cap``) and records it; the study's cap, which feasibility and the finalists use, is the
  probed node's.
* **Faults.** A trial whose actor or node dies is retried by Tune (``FailureConfig(max_failures=2)``) under
  the same Optuna trial, measured afresh (its ``ray_retries`` counts the restarts); on a heartbeat-enabled
  storage (PostgreSQL/MySQL) the driver keeps each running trial's heartbeat, so if the *driver* dies another
  worker fails and re-queues its trials.
  A config another trial is measuring right now is not measured again at the same time: the later trial
  waits (deferred in the driver, no node held) and copies the result.

>>> Tuner(Workload(model="resnet18")).run(trials=40, backend="ray", address="auto")   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Iterator

from autotune.machine.safefs import private_dir
from autotune.errors import WorkloadError
from autotune.machine.limits import default_device_memory_cap_mb
from autotune.search.backends.base import SearchBackend
from autotune.search.backends.ray.actor import make_trainable
from autotune.search.backends.ray.cluster import (connect, import_ray, node_memory_cap_mb, probe, ray_memory_mb,
                                                  remote_runner, resources_for, trial_shape)
from autotune.search.backends.ray.search import make_scheduler, make_search
from autotune.search.plan.context import ConnectContext, Placement, SearchContext, SearchOutcome

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["RayBackend"]


class RayBackend(SearchBackend):
    """Search trials as Ray Tune trials, spread over the cluster at ``address`` (None: a local Ray)."""

    def __init__(self, *, address: str | None = None) -> None:
        super().__init__(address=address)
        self._base: dict[str, float] = {}
        self._capacity = 1
        self._cap_given: float | None = None  # the user's --memory-cap: each node's own cap is no higher

    @contextlib.contextmanager
    def connect(self, ctx: ConnectContext) -> Iterator[Placement]:
        """Join (or start) Ray; find out what the trial nodes are, and make the study theirs if they are not
        this machine (then the finalists run on one of them)."""
        ray, _ = import_ray()
        started = connect(ray, self.address, ctx.hardware.usable_cores)
        try:
            self._base, self._capacity = trial_shape(ray, ctx.workload)
            hw, node = probe(ray, self._base)
            measure = ctx.measure
            self._cap_given = measure.memory_cap_mb if ctx.cap_given else None
            # the study's cap (the finalists', and what feasibility is judged by) is the probed node's; each
            # trial runs under its own node's (``cluster.this_node_cap_mb``) and records it
            cap, per_node = node_memory_cap_mb(hw, ctx.workload.device, self._cap_given,
                                               ray_memory_mb=ray_memory_mb(ray, node))
            if cap != measure.memory_cap_mb:
                ctx.log(f"memory cap per trial {cap:.0f} MiB: a node's memory (each trial: its own node's)"
                        + (f", shared by the {per_node} trials it runs at once" if per_node > 1 else ""))
                measure = measure.replace(memory_cap_mb=cap)
            if ctx.workload.device != "cpu" and not ctx.device_cap_given:
                # Ray gives each trial one GPU of its choosing (CUDA_VISIBLE_DEVICES): "cuda" there, whatever N
                # the workload names (``trial_device``); its free memory is the node's, not this machine's
                measure = measure.replace(device_memory_cap_mb=default_device_memory_cap_mb(hw, "cuda"))
            if hw.fingerprint == ctx.hardware.fingerprint:
                yield Placement(measure=measure)
                return
            yield Placement(measure=measure, hardware=hw, where="Ray nodes",
                            runner=remote_runner(ray, self._base, node, ctx.workload.device))
        finally:
            if started:
                ray.shutdown()

    def search(self, ctx: SearchContext, study: Study, *, trials: int | None) -> SearchOutcome:
        if not self._base:
            raise RuntimeError("RayBackend.search runs inside RayBackend.connect (Tuner.run enters it)")
        if trials == 0:
            return SearchOutcome(0)
        _, tune = import_ray()
        from ray.tune.search.optuna import OptunaSearch

        search = make_search(OptunaSearch)(ctx)
        trainable = tune.with_resources(
            tune.with_parameters(make_trainable(tune), workload=ctx.workload.to_dict(),
                                 measure=ctx.measure.to_dict(), cap_mb=self._cap_given),
            resources_for(self._base, ctx.workload.device))
        root = (private_dir(ctx.artifacts_dir) / "ray").resolve()
        root.mkdir(parents=True, exist_ok=True)
        per_trial = ", ".join(f"{v:g} {k}" for k, v in self._base.items()) if ctx.workload.device == "cpu" else \
            "1 GPU + 1 CPU per DataLoader worker and one for the main process"
        ctx.log(f"Ray Tune: {per_trial} per trial, up to {self._capacity} at once; Tune's files in {root}")
        runner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=search, scheduler=make_scheduler(search),
                                        num_samples=trials if trials is not None else -1,
                                        max_concurrent_trials=self._capacity, reuse_actors=True,
                                        trial_dirname_creator=lambda t: f"trial-{t.trial_id}"),
            run_config=tune.RunConfig(name=f"{ctx.study_name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                      storage_path=str(root), verbose=0,
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
                                      failure_config=tune.FailureConfig(max_failures=2)),
        )
        # Tune's new console output prints tables even at verbose=0; the tuner logs one line per trial instead.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        # Ctrl-C/SIGTERM stop the run like the local backend's (KeyboardInterrupt: finished trials are kept, a
        # re-run resumes the study), not Tune's way (end gracefully, then go on to the finalists).
        os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
        try:
            runner.fit()
        except BaseException:
            search.close(wait=False)
            raise
        search.close()
        if search.abort is not None:
            raise WorkloadError(search.abort.removeprefix("WorkloadError: "))
        return SearchOutcome(search.told, search.stop_reason)
