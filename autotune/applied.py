"""``Applied``: the per-call helpers ``Recommendation.apply()`` yields to a training loop (model and input
preparation, autocast, the grad scaler, the accumulation steps), and ``applying``, the context manager behind it.
Re-exported by ``recommendation``."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator

from autotune.config import TrialConfig
from autotune.field import Claim, FieldRun, FieldSpec
from autotune.machine.affinity import env_for as affinity_env
from autotune.machine.malloc import apply_in_process, env_for

__all__ = ["Applied", "applying", "field_claim", "field_run", "mlflow_log"]


class Applied:
    """Per-call helpers of an applied recommendation (see ``Recommendation.apply``)."""

    def __init__(self, config: TrialConfig, device: str, *, accumulation_steps: int = 1, world_size: int = 1,
                 field_run: FieldRun | None = None) -> None:
        from autotune.machine.device import CPUDevice, CUDADevice

        self.config = config
        # micro-batches per optimizer step (on each rank): backward each (the loss divided by this), step and
        # zero_grad after the last one
        self.accumulation_steps = accumulation_steps
        self.world_size = world_size  # DDP ranks measured; > 1: prepare_model wraps the model in DDP
        self._dev = CPUDevice() if device == "cpu" else CUDADevice(device)
        self._field = field_run  # measures the run (autotune.field); None: off

    def field(self) -> str:
        """How the run stands against what the trials measured for this config, in one line (``autotune.field``)."""
        return self._field.line() if self._field is not None else "autotune field: off (rec.apply(field=False))"

    def prepare_model(self, model):
        """The model on the device, channels_last, in DDP with the recommended arguments (with several ranks:
        inside the process group ``torchrun`` started), then compiled: the order the trials ran."""
        import torch

        from autotune.machine.device import channels_last_model

        model = model.to(self._dev.torch_device())
        if self.config.channels_last:
            model = channels_last_model(model)  # lazy modules too
        if self.world_size > 1:
            model = self._ddp(model)
        if self.config.compile_mode != "none":
            model = torch.compile(model, mode=self.config.compile_mode)
        return model

    def prepare_input(self, x, *, non_blocking: bool | None = None):
        if self._field is not None:  # the batch reached the loop: the end of its data wait
            self._field.batch(x)
        nb = self.config.pin_memory if non_blocking is None else non_blocking
        return self._dev.to_device(x, non_blocking=nb, channels_last=self.config.channels_last)

    def autocast(self):
        return self._dev.autocast(self.config.amp)

    def grad_scaler(self):
        return self._dev.grad_scaler(self.config.amp)

    def no_sync(self, model, micro_batch: int):
        """Around micro-batch ``micro_batch`` (0 .. accumulation_steps - 1) of an optimizer step: DDP's
        ``no_sync`` on all but the last, so the ranks all-reduce once per optimizer step, as measured; nothing
        otherwise (one process, no accumulation, the last micro-batch). ``model``: what ``prepare_model`` gave."""
        import contextlib

        ddp = getattr(model, "_orig_mod", model)  # torch.compile's wrapper keeps the DDP module
        if self.world_size <= 1 or micro_batch >= self.accumulation_steps - 1 or not hasattr(ddp, "no_sync"):
            return contextlib.nullcontext()
        return ddp.no_sync()

    def _ddp(self, model):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from autotune.errors import ConfigError

        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError(f"this recommendation was measured as {self.world_size} DDP ranks: launch the script "
                              "with rec.launch_command() (torchrun) and call torch.distributed.init_process_group() "
                              "before prepare_model")
        ids = None if self._dev.type == "cpu" else [self._dev.index]
        return DistributedDataParallel(model, device_ids=ids, **self.config.ddp_kwargs())


@contextlib.contextmanager
def applying(rec: Any, field_run: FieldRun | None = None) -> Iterator[Applied]:
    """``Recommendation.apply``: the config's process-wide torch state set, restored on exit. ``field_run``: the
    run's measurement (``autotune.field``), started here and stopped, with its line, at the end. ``rec``: a
    ``Recommendation`` (not imported here, even for the type: ``recommendation`` imports this module)."""
    import torch

    old_threads = torch.get_num_threads()
    old_bench = torch.backends.cudnn.benchmark
    if rec.config.intra_op_threads:
        torch.set_num_threads(rec.config.intra_op_threads)
    if rec.config.inter_op_threads and torch.get_num_interop_threads() != rec.config.inter_op_threads:
        try:
            torch.set_num_interop_threads(rec.config.inter_op_threads)
        except RuntimeError:
            warnings.warn(f"inter-op threads stay at {torch.get_num_interop_threads()}: torch allows setting "
                          "them only before its first parallel work; call apply() earlier", stacklevel=3)
    if rec.workload.device != "cpu":
        torch.backends.cudnn.benchmark = rec.config.cudnn_benchmark
    why = apply_in_process(rec.config.malloc)
    unpinned = {k: v for k, v in affinity_env(rec.config.affinity).items() if os.environ.get(k) != v}
    for knob, env in (("malloc", env_for(rec.config.malloc) if why else {}), ("affinity", unpinned)):
        if env:  # read when the process starts: only its launch environment can give them
            warnings.warn(f"{knob}={getattr(rec.config, knob)} not fully applied: {why or 'read at start'}; "
                          f"start the training process with {' '.join(f'{k}={v}' for k, v in env.items())} in "
                          "its environment (`autotune export` lists it)", stacklevel=3)
    if field_run is not None:
        field_run.start()
    try:
        yield Applied(rec.config, _rank_device(rec), accumulation_steps=rec.accumulation_steps,
                      world_size=rec.world_size, field_run=field_run)
    finally:
        if field_run is not None:
            field_run.stop()  # the one line; never raises
        torch.set_num_threads(old_threads)
        torch.backends.cudnn.benchmark = old_bench


def _rank_device(rec) -> str:
    """The device this process trains on: under torchrun, a rank of several on a GPU takes GPU LOCAL_RANK, as
    the trials' rank r took GPU r; warned when the running world size is not the measured one."""
    if rec.world_size <= 1:
        return rec.workload.device
    running = os.environ.get("WORLD_SIZE")
    if running is not None and running != str(rec.world_size):
        warnings.warn(f"this recommendation was measured as {rec.world_size} ranks; this process is one of "
                      f"{running}: its per-rank threads, workers and batch were not tuned for that",
                      stacklevel=4)
    if rec.workload.device == "cpu":
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def field_claim(rec: Any) -> Claim:
    """``Recommendation.field_claim``: what the trials measured for the config (``autotune.field.judge.Claim``): the
    confirmation rounds' medians (one fresh process each) and Student's t for their count."""
    import statistics

    from autotune.search.choose.settle import t_quantile

    rounds = tuple(statistics.median(r["winner"]) for r in (rec.confirmation or {}).get("rounds") or ()
                   if r.get("winner"))
    return Claim(median_samples_per_s=rec.median_samples_per_s, round_medians=rounds,
                 t975=t_quantile(0.975, len(rounds) - 1) if len(rounds) >= 2 else None,
                 peak_host_mb=rec.peak_host_mb, samples_per_step=rec.config.batch_size * rec.accumulation_steps,
                 fingerprint=rec.fingerprint, headline=rec.claim(), task=rec.workload.task)


def field_run(rec: Any, *, spec: FieldSpec | None = None, source: str = "apply", steps: str = "optimizer",
              accumulation: int | None = None) -> FieldRun:
    """``Recommendation.field_run``: a ``FieldRun`` against ``rec``, its record written to the recommendation's
    study (``search.record.field_runs``) where the study can be opened, the trials' data wait read from it; the
    rank and world size from torchrun's environment, and the launch's group (``launch_group``): rank 0 reads the
    other ranks' records of it from the study at the end."""
    from autotune.search.record.field_runs import study_records, study_sink, trial_data_wait

    sink = wait = peers = None
    if rec.storage and rec.study_name:
        sink = study_sink(rec.storage, rec.study_name)
        peers = study_records(rec.storage, rec.study_name)

        def wait() -> float | None:
            return trial_data_wait(rec.storage, rec.study_name, rec.trial_number)

    return FieldRun(field_claim(rec), spec=spec, sink=sink, source=source, steps=steps, trial_wait=wait,
                    on_end=mlflow_log, group=launch_group(), peers=peers,
                    rank=int(os.environ.get("RANK", "0") or 0), world_size=int(os.environ.get("WORLD_SIZE", "1") or 1),
                    accumulation=rec.accumulation_steps if accumulation is None else accumulation)


def launch_group(env: Any = None) -> str | None:
    """What the ranks of one distributed launch share (torchrun's rendezvous: the master's address and port, the
    run id, the restart count); None outside a launch of more than one rank.

    >>> launch_group({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    ...               "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"})
    '127.0.0.1:29500/none/0'
    >>> launch_group({"WORLD_SIZE": "1"}) is None
    True
    """
    env = os.environ if env is None else env
    if int(env.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    return (f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}/{env.get('TORCHELASTIC_RUN_ID', '-')}/"
            f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")


def mlflow_log(record: dict) -> None:
    """Where the user runs under MLflow (an active run in this thread, mlflow already imported by them), the field
    run's figures as metrics, its verdict as a tag and its record as an artifact; nothing otherwise."""
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return
    metrics = {f"autotune_field_{k}": record[k] for k in ("median_samples_per_s", "iqr_samples_per_s",
                                                          "data_wait_share", "steps", "settled_windows")
               if isinstance(record.get(k), (int, float))}
    mlflow.log_metrics(metrics)
    mlflow.set_tag("autotune_field_verdict", str(record.get("verdict")))
    mlflow.log_dict(record, f"autotune_field/{record['run_id']}.json")
