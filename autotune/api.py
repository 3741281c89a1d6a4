"""The library's front door: ``recommend()``, the recommended config for a workload on this machine, and
``tune()``, the same for the user's own training (a workload function: ``autotune.workloads.contract``).

>>> from autotune import recommend, tune                             # doctest: +SKIP
>>> rec = recommend("resnet18", budget="20m", memory_cap="12GiB")    # doctest: +SKIP
>>> rec = tune(mymodule.build, image_size=64, budget="10m")          # doctest: +SKIP
>>> loader = DataLoader(ds, **rec.dataloader_kwargs())               # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from autotune.search.record import trials as keys
from autotune.config import MeasureSpec, Workload
from autotune.errors import AutotuneError, WorkloadError
from autotune.recommendation import Recommendation, VersionMismatchWarning, stored_recommendation
from autotune.search.record.storage import open_storage, study_name_for
from autotune.search.budget import SEARCH_WINDOWS

__all__ = ["recommend", "tune"]


def recommend(model: str | Callable[..., Any] = "resnet18", *, task: str = "train", image_size: int = 224,
              data_dir: str | None = None, device: str | None = None, budget: str | float | None = "20m",
              trials: int | None = None, memory_cap: str | float | None = None, storage: str | None = None,
              space: str | None = None, study_name: str | None = None, measure=None, rerun: bool = False,
              progress: bool = True, run_length: str | float | None = None, planned_steps: int | None = None,
              global_batch: int | None = None, device_memory_cap: str | float | None = None,
              latency_p99: str | float | None = None, nproc_per_node: int = 1) -> Recommendation:
    """The recommended config for a workload on this machine.

    ``model`` is a torchvision model name, ``"package.module:function"``, or the workload function itself (see
    ``autotune.workloads.contract``: it may return its own optimizer, step, collate_fn, sampler and count); a function
    must be importable by reference: a lambda or a nested function is refused with a ``WorkloadError``.

    Answers from the study storage when this hardware and workload were tuned before (no trial is run);
    warns with ``VersionMismatchWarning`` naming what changed since: torch/CUDA/driver versions, and the other
    facts of the recommendation's collect_env stamp (compiler, OS, cuDNN, torch-related packages). Otherwise (or with
    ``rerun=True``) runs a study within ``budget`` (a duration like "20m") and/or ``trials``; with both None,
    until the search converges (``autotune.search.plan.convergence``; at most 8 h).

    ``run_length`` (a duration like "6h") or ``planned_steps`` says how long the training this is for runs
    (default: an hour, assumed): a ``torch.compile`` config wins only if its gain over that run pays back its
    compile time (``search.choose.payback``). A stored recommendation priced for another run length is not reused.

    ``global_batch`` keeps N samples per optimizer step: only the batch sizes that divide N are searched, as
    micro-batches with N / micro-batch gradient accumulation steps (``autotune.workloads.global_batch``); the
    recommendation's ``accumulation_steps`` and ``apply().accumulation_steps`` say how many.

    ``nproc_per_node`` > 1 tunes N DistributedDataParallel ranks on this machine, each trial one process group
    (``autotune.trial.ddp``): batch size, threads and workers are per rank (each rank's workers within its share
    of the usable cores, its threads what they leave, at least one), DDP's own arguments are searched, the global
    batch is micro-batch x accumulation x N, and the recommendation carries a ``distributed`` section and a
    ``torchrun`` launch line (``launch_command()``). More ranks than usable cores (or GPUs) is a ``ConfigError``.

    ``device_memory_cap`` (on a GPU, e.g. "10GiB") is the most PyTorch's allocator may hold in a trial, enforced
    while it runs; by default the GPU's free memory when the run starts, less the CUDA context's share.

    ``latency_p99`` (``task="infer"`` only; a duration like "50ms", or seconds) bounds the 99th-percentile latency
    of one inference step: a config over it is infeasible, as one over the memory cap is, so the fastest config
    that meets it is recommended (``autotune.trial.latency``); a bound under one step's measured floor is a
    ``ConfigError`` before the search (``autotune.search.choose.latency_floor``).
    """
    from autotune._units import parse_duration_s, parse_memory_mb
    from autotune.machine.hardware import detect
    from autotune.machine.gpu_check import check_cuda_usable
    from autotune.machine.limits import check_cap_against_machine
    from autotune.search.choose.payback import RunLength
    from autotune.search.space.search_space import load_space
    from autotune.search.tuner import Tuner
    from autotune.workloads.contract import reference
    from autotune.workloads.build import check

    run = RunLength.parse(run_length, planned_steps)
    model = reference(model)
    hw = detect()
    if device is None:
        device = "cuda" if hw.gpus else "cpu"
    workload = Workload(model=model, task=task, image_size=image_size, data_dir=data_dir, device=device,
                        global_batch=global_batch, nproc_per_node=nproc_per_node)
    cap = parse_memory_mb(memory_cap, what="memory_cap") if memory_cap is not None else None
    check_cap_against_machine(cap, hw, device)
    measure = (measure or MeasureSpec(windows=SEARCH_WINDOWS)).replace(**({"memory_cap_mb": cap} if cap else {}))
    if latency_p99 is not None:
        from autotune.trial.latency import check_bound

        check_bound(task, 1.0, flag="latency_p99")
        measure = measure.replace(latency_p99_ms=1000 * parse_duration_s(latency_p99, what="latency_p99"))
    if device_memory_cap is not None:
        from autotune.machine.limits import check_device_cap

        device_cap = parse_memory_mb(device_memory_cap, what="device_memory_cap")
        check_device_cap(device_cap, hw, device)
        measure = measure.replace(device_memory_cap_mb=device_cap)
    check_cuda_usable(device, hw)
    sp = load_space(space, hardware=hw, device=workload.device)

    def make_tuner(w: Workload) -> Tuner:
        return Tuner(w, space=sp, measure=measure, storage=storage, study_name=study_name, hardware=hw,
                     progress=progress, run_length=run)

    existing = None if rerun else _existing_study(storage, study_name or study_name_for(workload, hw.fingerprint))
    # the space is fitted to what the workload's data holds: a stored study says what it was fitted to (its answer
    # costs no run of the user's code); otherwise check reads the first batch, refusing a bad workload in one line
    stored = ((existing.user_attrs.get(keys.STUDY_WORKLOAD) or {}).get("data") if existing is not None else None)
    tuner = make_tuner(workload.replace(data=stored) if stored else check(workload, env_stamp=True))
    rec = _stored_answer(existing, tuner, run) if existing is not None else None
    if rec is not None:
        return rec
    if stored:  # a search follows: check the workload as it is now, and fit the space to that
        checked = check(workload, env_stamp=True)
        tuner = tuner if checked.data == stored else make_tuner(checked)
    timeout_s = parse_duration_s(budget, what="budget") if budget is not None else None
    from autotune.search.choose.latency_floor import check_floor

    check_floor(tuner)
    rec = tuner.run(trials=trials, timeout_s=timeout_s)
    if rec is None:
        raise AutotuneError(f"no feasible config found for {workload.label()} within the budget; give a larger "
                            "budget or memory cap, and see `autotune show` for why trials failed")
    return rec


def _existing_study(storage: str | None, name: str):
    """The study of that name in ``storage``, or None."""
    import optuna

    from autotune.search.record.storage import DEFAULT_STORAGE, check_study_name

    try:
        return optuna.load_study(study_name=check_study_name(name), storage=open_storage(storage or DEFAULT_STORAGE))
    except KeyError:
        return None


def _stored_answer(existing, tuner, run) -> Recommendation | None:
    """The study's stored recommendation if it answers this call (fits its cap, the same space, priced over the
    same run length), warning when versions changed since; else None."""
    rec = stored_recommendation(existing)
    if rec is not None and rec.provisional:
        rec = None  # its finalists were not re-measured (a short budget): not an answer, search on
    stored_space = (existing.user_attrs.get(keys.STUDY_SPACE) or {}).get("parameters")
    if rec is not None and not tuner.limit.fits(rec.peak_host_mb, rec.peak_device_mb, rec.peak_device_allocated_mb):
        rec = None  # no room under the cap of this call (less the margin): not an answer to this question
    if rec is not None and not tuner.limit.meets_latency((rec.latency_ms or {}).get("p99_ms")):
        rec = None  # over this call's latency bound (or not measured against one): search under it
    if rec is not None and stored_space is not None and stored_space != tuner.space.to_dict()["parameters"]:
        rec = None  # tuned over another search space: search this one
    priced = (rec.compile or {}) if rec is not None else {}
    if priced.get("configs") and priced.get("planned_run") != run.to_dict():
        rec = None  # a compile config was priced over another run length: choose again for this one
    if rec is not None:
        changed = rec.check_versions()
        if changed:
            warnings.warn(f"the stored recommendation was measured with other versions ({'; '.join(changed)}); "
                          "pass rerun=True to measure again", VersionMismatchWarning, stacklevel=3)
    return rec


def tune(workload: str | Callable[..., Any], **kwargs: Any) -> Recommendation:
    """The recommended config for the user's own training: ``workload`` is a function at a module's top level
    (or its ``"package.module:function"`` name) that returns the model, the data and, as it likes, its own
    optimizer, step, collate_fn, sampler and count (the workload contract: ``autotune.workloads.contract``). The keyword
    arguments are ``recommend()``'s.

    >>> rec = tune(mymodule.build, image_size=64, budget="10m")     # doctest: +SKIP
    >>> rec.user_parts                                               # doctest: +SKIP
    ('optimizer', 'collate_fn', 'step', 'count')
    """
    from autotune.workloads.contract import reference

    ref = reference(workload)
    if ":" not in ref:
        raise WorkloadError(f"tune() takes your workload function (or 'package.module:function'), not {ref!r}; "
                            "for a torchvision model by name use recommend()")
    return recommend(ref, **kwargs)
