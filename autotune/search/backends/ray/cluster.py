"""The Ray cluster as the backend sees it: joining it, what a trial asks of it, what its nodes are, and
running one trial on a chosen node (the finalists)."""

from __future__ import annotations

import contextlib
from typing import Any

from autotune.config import MeasureSpec, TrialConfig, TrialResult, Workload
from autotune.errors import AutotuneError

__all__ = ["import_ray", "connect", "trial_shape", "resources_for", "probe", "remote_runner", "node_memory_cap_mb",
           "ray_memory_mb", "this_node_cap_mb", "gpu_trial", "PLAN_KEY", "trial_device"]

INSTALL = 'pip install "ray[tune]"'
# The one key of a Tune trial's config: {"config": {...}, "number": n, "shortcut": bool}
PLAN_KEY = "autotune"


def import_ray():
    """``(ray, ray.tune)``, or an AutotuneError with the install command."""
    try:
        import ray
        from ray import tune
        from ray.tune.search.optuna import OptunaSearch  # noqa: F401 - checked here, used by search.py
    except ImportError as exc:
        raise AutotuneError(f"--backend ray needs Ray Tune ({exc}): {INSTALL}") from None
    return ray, tune


def connect(ray, address: str | None, usable_cores: int) -> bool:
    """Join the cluster at ``address`` (else at ``RAY_ADDRESS``, as Ray's own tools read it), or start a local Ray
    of this run's own with this machine's usable cores (also for ``local``, Ray's word for it). Returns True when
    this call started or joined Ray (and so shuts its connection down).

    Without an address ``ray.init()`` joins the latest Ray started on this machine by ``ray start --head``
    (``/tmp/ray``'s ``ray_current_cluster``: yours for another job, or another user's), and then refuses
    ``num_cpus`` ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided"): a run that
    asked for no cluster ran its trials in someone else's, or not at all. ``address="local"`` starts one of its
    own."""
    import logging
    import os

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    address = address or os.environ.get("RAY_ADDRESS", "").strip() or None
    if address == "local":  # Ray's word for a new local Ray: this run's own, on its usable cores
        address = None
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(address="local", num_cpus=usable_cores, include_dashboard=False, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise AutotuneError(f"cannot start or join {where}: {first}") from None
    return True


def _nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def trial_shape(ray, workload: Workload) -> tuple[dict[str, float], int]:
    """(resources of a measured trial without its DataLoader share, how many run at once on the cluster)."""
    nodes = _nodes(ray)
    if workload.device == "cpu":
        cpus = max((n["Resources"].get("CPU", 0) for n in nodes), default=0)
        if cpus < 1:
            raise AutotuneError("the Ray cluster has no node with a CPU to run trials on")
        # a whole node per trial: the largest nodes' core count, so one trial per node and only that kind
        return {"CPU": float(cpus)}, max(1, sum(int(n["Resources"].get("CPU", 0) // cpus) for n in nodes))
    gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
    if gpus < 1:
        raise AutotuneError(f"--device {workload.device} but the Ray cluster has no GPU")
    return {"CPU": 1.0, "GPU": 1.0}, gpus


def trial_device(workload: Workload) -> Workload:
    """The workload as a Ray worker runs it. Ray hands each GPU trial one GPU by setting CUDA_VISIBLE_DEVICES
    to it, so inside the worker that GPU is ``cuda:0`` and ``cuda:1`` names no device at all: any CUDA device
    becomes plain ``cuda`` (the study keeps the name the user gave)."""
    if workload.device == "cpu":
        return workload
    return workload.replace(device="cuda")


def gpu_trial(config: dict) -> dict[str, float]:
    """A CUDA trial's reservation (trials share a node): one GPU, the main process's intra-op threads (one
    when torch's default is left: the actor then sets OMP_NUM_THREADS=1) and one core per DataLoader
    worker."""
    threads = int(config.get("intra_op_threads") or 1)
    return {"CPU": float(threads + int(config.get("num_workers") or 0)), "GPU": 1.0}


def node_memory_cap_mb(hardware, device: str, requested_mb: float | None, *,
                       ray_memory_mb: float | None = None) -> tuple[float, int]:
    """``(cap per trial, trials at once on one node)`` for trials on a node of ``hardware``: the node's default
    cap (a share of its available memory), no more than the memory the node gives Ray's tasks
    (``ray_memory_mb``: its ``memory`` resource, declared with ``ray start --memory`` or what Ray left beside
    the object store), divided among the trials it runs at once (one per node on the CPU, one per GPU), and no
    more than ``requested_mb`` (the driver's cap, which knows nothing of the node)."""
    from autotune.machine.limits import default_memory_cap_mb, min_memory_cap_mb

    per_node = 1 if device == "cpu" else max(1, len(hardware.gpus))
    node_mb = default_memory_cap_mb(hardware)
    if ray_memory_mb:
        node_mb = min(node_mb, ray_memory_mb)
    cap = max(min_memory_cap_mb(device), node_mb / per_node)  # below it no trial even starts
    return (min(cap, requested_mb) if requested_mb else cap), per_node


def ray_memory_mb(ray, node_id: str) -> float | None:
    """The ``memory`` resource (MiB) the node ``node_id`` gives Ray's tasks, or None if Ray does not say."""
    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            mem = n.get("Resources", {}).get("memory")
            return float(mem) / 2**20 if mem else None
    return None


def this_node_cap_mb(ray, device: str, requested_mb: float | None) -> tuple[str, float]:
    """``(node id, memory cap)`` of a trial in this Ray worker: its own node's (``node_memory_cap_mb``), not the
    driver's figure, which came from whichever node the probe found (nodes differ in memory, and in what they
    give Ray)."""
    from autotune.machine.hardware import detect

    node = ray.get_runtime_context().get_node_id()
    cap, _ = node_memory_cap_mb(detect(with_torch=False), device, requested_mb, ray_memory_mb=ray_memory_mb(ray, node))
    return node, cap


def resources_for(base: dict[str, float], device: str):
    """The per-trial resource request (a callable of the trial's config, for ``tune.with_resources``)."""
    from ray.tune import PlacementGroupFactory

    def resources(config: dict) -> PlacementGroupFactory:
        plan = config.get(PLAN_KEY) or {}
        if plan.get("shortcut"):  # recorded by the driver without running: hold no node
            return PlacementGroupFactory([{"CPU": 0.01}])
        if device == "cpu":
            return PlacementGroupFactory([dict(base)])
        return PlacementGroupFactory([gpu_trial(plan.get("config") or {})])

    return resources


def probe(ray, base: dict[str, float]):
    """(Hardware, node id) of a node of the kind trials run on, asked with a trial's resources."""
    from autotune.machine.hardware import Hardware

    @ray.remote(max_retries=0)
    def node_hardware():
        from autotune.machine.hardware import detect

        return detect().to_dict(), ray.get_runtime_context().get_node_id()

    opts = {"num_cpus": base.get("CPU", 1.0), "num_gpus": base.get("GPU", 0.0)}
    try:
        hw, node = ray.get(node_hardware.options(**opts).remote(), timeout=600)
    except ray.exceptions.GetTimeoutError:
        raise AutotuneError(f"no Ray node could take a trial ({opts}) within 10 minutes: is the cluster busy, "
                            "or are its nodes smaller than that?") from None
    return Hardware.from_dict(hw), node


def remote_runner(ray, base: dict[str, float], node: str, device: str):
    """A trial runner (as ``Tuner.runner``) that runs on ``node`` with a trial's resources: every finalist
    on the same node, so they are compared on one machine. A node that left the cluster during the search
    (killed, scaled down) is replaced once, by another node of the kind (``probe``), before the first finalist.
    Each run is under the lower of the run's cap and that node's own (``this_node_cap_mb``); its log comes back
    to ``log_path`` here, headed by the node that ran it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(max_retries=0)
    def remote(workload: dict, config: dict, measure: dict) -> tuple[dict, str, str]:
        import tempfile
        from pathlib import Path

        from autotune.trial.runner import run_trial
        from autotune.search.record.storage import machine_lock

        cpu = workload["device"] == "cpu"
        # a whole node on the CPU: a clean room, as locally (``launch_env.clean_env``); a shared GPU node: one
        # thread unless the config says (the one core gpu_trial reserved for the main process)
        placement = None if cpu or config.get("intra_op_threads") else {"OMP_NUM_THREADS": "1"}
        spec = MeasureSpec.from_dict(measure)
        here, cap = this_node_cap_mb(ray, workload["device"], spec.memory_cap_mb)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "trial.log"
            with machine_lock("a Ray finalist") if cpu else contextlib.nullcontext():
                result = run_trial(trial_device(Workload.from_dict(workload)), TrialConfig.from_dict(config),
                                   spec.replace(memory_cap_mb=cap), log_path=log, placement=placement)
            return result.to_dict(), here, log.read_text(errors="replace") if log.exists() else ""

    pinned = [node]

    def run(workload, config, measure, *, on_window=None, log_path=None) -> TrialResult:
        res = base if device == "cpu" else gpu_trial(config.to_dict())
        if not any(n["NodeID"] == pinned[0] for n in _nodes(ray)):
            pinned[0] = probe(ray, res)[1]
        ref = remote.options(num_cpus=res.get("CPU", 1.0), num_gpus=res.get("GPU", 0.0),
                             scheduling_strategy=NodeAffinitySchedulingStrategy(pinned[0], soft=False)
                             ).remote(workload.to_dict(), config.to_dict(), measure.to_dict())
        result, where, text = ray.get(ref)
        if log_path is not None:
            with open(log_path, "w") as f:
                f.write(f"# ran on Ray node {where}\n{text}")
        return TrialResult.from_dict(result)

    return run
