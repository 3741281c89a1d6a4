"""The recommendation: the chosen config with the evidence to trust it, YAML in and out, and one-line use.

A plain value, made by the finalists (``finalists.choose``/``provisional``) or read back from YAML or a study
(``stored_recommendation``); it imports nothing of the tuner. ``recommend()`` is in ``api.py``.

>>> from autotune import recommend                                   # doctest: +SKIP
>>> rec = recommend("resnet18", budget="20m", memory_cap="12GiB")    # doctest: +SKIP
>>> loader = DataLoader(ds, **rec.dataloader_kwargs())               # doctest: +SKIP
>>> with rec.apply() as run:                                         # doctest: +SKIP
...     model = run.prepare_model(model)
...     with run.autocast():
...         loss = loss_fn(model(run.prepare_input(x)), y)
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune._redact import redact
from autotune._yaml import read_yaml
from autotune.applied import Applied
from autotune.config import TrialConfig, Workload, knob_summary
from autotune.distributed import backend_for, check_section, distributed_section, launch_command
from autotune.machine.launch_env import launch_env
from autotune.errors import ConfigError
from autotune.field import Claim, FieldRun, FieldSpec
from autotune.provenance import versions_of
from autotune.search.record import trials as keys
from autotune.search.record.ceilings import ceiling_lines
from autotune.search.record.loader_statement import loader_line
from autotune.search.record.run_phase import split_line

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["Recommendation", "Applied", "VersionMismatchWarning", "stored_recommendation"]

FORMAT_VERSION = 1


class VersionMismatchWarning(UserWarning):
    """The stored recommendation was measured with other torch/CUDA/driver versions than this process has."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class Recommendation:
    """The best feasible config for a workload on a machine, with the measurements behind it."""

    config: TrialConfig
    workload: Workload
    # the claim's figures (the confirmation's, ``search.choose.confirm``); None where it failed: no figure stated
    # that it did not measure (the selection's are in ``selection``)
    median_samples_per_s: float | None
    iqr_samples_per_s: float | None
    samples_per_s: tuple[float, ...]
    baseline_samples_per_s: float | None
    speedup_vs_baseline: float | None
    peak_host_mb: float | None
    memory_cap_mb: float | None
    margin_vs_runner_up: float | None
    noisy: bool
    hardware: dict[str, Any]
    fingerprint: str
    versions: dict[str, Any]
    study_name: str
    storage: str
    trial_number: int | None
    runners_up: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()
    reproduce: str = ""
    created: str = field(default_factory=_now)
    provisional: bool = False
    # 95% interval of margin_vs_runner_up, from the interleaved rounds (settle.ratio_interval)
    margin_interval: tuple[float, float] | None = None
    # the share of the cap a feasible config keeps free (MeasureSpec.memory_margin); None in older exports
    memory_margin: float | None = None
    # on a GPU: the device peak PyTorch reserved (its cache included), the most the tensors held, and the device
    # memory cap the allocator enforced in the trials
    peak_device_mb: float | None = None
    device_memory_cap_mb: float | None = None
    peak_device_allocated_mb: float | None = None
    # the numerics check of the chosen config against fp32 eager (parity.ParityResult.to_dict()), if it was run
    parity: dict | None = None
    # the interleaved finalist rounds the choice rests on, and whether each finalist's search trial was pooled
    # as a further round (only one finalist round fit); None / False in older exports and provisional ones
    finalist_rounds: int | None = None
    search_round_pooled: bool = False
    # which parts of the training the figures ran that were the user's own (autotune.workloads.contract.PARTS:
    # optimizer, collate_fn, sampler, step, count); empty: autotune's step, SGD and len(x) samples
    user_parts: tuple[str, ...] = ()
    # the facts `python -m torch.utils.collect_env` reports where it was measured (envstamp.collect_env_stamp)
    env_stamp: dict | None = None
    # torch.compile priced over the planned run (``payback.price``): the run length, each compiled finalist's
    # measured compile time, effective throughput and break-even, whether compile was dropped for not paying
    # back, where the study's inductor cache lives; None in older exports and provisional ones
    compile: dict | None = None
    # real tokens per sample as the workload counted them (text: autotune.workloads.text), over the finalists' search
    # trials (a property of the data, not of the config); None when it counts no tokens
    tokens_per_sample: float | None = None
    # inference: the step latency percentiles of the slowest finalist round (p50_ms, p95_ms, p99_ms, min_ms) and
    # the p99 bound it was chosen under (bound_p99_ms, None: none); None for training and older exports
    latency_ms: dict | None = None
    # the largest batch the data can produce and the config's peak on it against the usable memory
    # (search.choose.final_checks.check_worst_case); None in older exports and provisional ones (not checked)
    worst_case: dict | None = None
    # the model's and the data path's ceilings, each measured alone, and which binds this config (``verdict``), with
    # the levers beyond the knobs when no worker count fed the model (``record.ceilings``); None: not measured (the
    # baseline was not input-bound on a CPU), or an older export
    ceilings: dict | None = None
    # what chose the config (the finalists' figures) and the rounds that state the claim, which did not choose it
    # (``search.choose.confirm``): the samples/s and speedup above are the confirmation's; None in older exports
    selection: dict | None = None
    confirmation: dict | None = None
    loader_memory: dict | None = None  # its loader's batches in flight (search.record.loader_statement)
    # what the shell exported that the trials cleared (``machine.launch_env.inherited_env``: threads, allocator,
    # preloads): every trial ran without it, so the figures are against PyTorch's own defaults; None in older exports
    shell_env: dict | None = None
    budget_split: dict | None = None  # where the run's time went, per phase (``run_phase.RunPhases.split``)
    untried: dict | None = None  # knob values no trial ran, the YAML's ``try`` (``search.record.untried``)

    def __post_init__(self) -> None:  # its YAML, the HTML report and MLflow show the storage: never its password
        object.__setattr__(self, "storage", redact(self.storage))

    def claim(self) -> str:
        """The speedup over the baseline and how sure it is, in one line: the confirmation's (``choose.confirm``),
        or, for a recommendation without one, the selection's figure said unconfirmed."""
        if self.confirmation and self.confirmation.get("headline"):
            return self.confirmation["headline"]
        from autotune.search.choose.confirmation import unconfirmed_line

        return ((f"x{self.speedup_vs_baseline:.2f}, " if self.speedup_vs_baseline else "")
                + unconfirmed_line(provisional=self.provisional))

    @property
    def median_tokens_per_s(self) -> float | None:
        """Tokens/s at the median samples/s: the finalists' samples/s times ``tokens_per_sample``; None when the
        workload counts no tokens."""
        if self.tokens_per_sample is None or self.median_samples_per_s is None:
            return None
        return round(self.median_samples_per_s * self.tokens_per_sample, 1)

    # --- (de)serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "config": self.config.to_dict(),
            # what the workload is: its data as the first batch showed it, not defaults a callable ignored
            "workload": self.workload.described(),
            "user_parts": list(self.user_parts),
            "measured": {
                "median_samples_per_s": self.median_samples_per_s, "iqr_samples_per_s": self.iqr_samples_per_s,
                "samples_per_s": list(self.samples_per_s), "noisy": self.noisy,
                "baseline_samples_per_s": self.baseline_samples_per_s,
                "speedup_vs_baseline": self.speedup_vs_baseline,
                # derived (not read back): the claim in one line beside its figure, and why it is empty where it is
                "claim": self.claim(),
                "margin_vs_runner_up": self.margin_vs_runner_up,
                "margin_interval": None if self.margin_interval is None else list(self.margin_interval),
                "peak_host_mb": self.peak_host_mb, "memory_cap_mb": self.memory_cap_mb,
                "memory_margin": self.memory_margin,
                "peak_device_mb": self.peak_device_mb, "peak_device_allocated_mb": self.peak_device_allocated_mb,
                "device_memory_cap_mb": self.device_memory_cap_mb,
                "finalist_rounds": self.finalist_rounds, "search_round_pooled": self.search_round_pooled,
                "tokens_per_sample": self.tokens_per_sample,
                "median_tokens_per_s": self.median_tokens_per_s,  # derived (not read back)
                **self._latency_measured(),
                # derived (not read back): what the peak leaves free of the cap less the margin
                "headroom_mb": self.headroom_mb(),
            },
            "hardware": {**self.hardware, "fingerprint": self.fingerprint},
            "versions": self.versions,
            "collect_env": self.env_stamp,
            "provenance": {"study_name": self.study_name, "storage": self.storage, "trial": self.trial_number,
                           "created": self.created, "provisional": self.provisional,
                           "reproduce": self.reproduce, "shell_environment": self.shell_env,
                           **({"trials_environment": "clean: the shell's thread, allocator and preload variables "
                               "cleared for every trial (baseline included)"} if self.shell_env else {})},
            "runners_up": list(self.runners_up),
            "worst_case": self.worst_case,
            "ceilings": self.ceilings,
            "loader_memory": self.loader_memory,
            "selection": self.selection,
            "confirmation": self.confirmation,
            "parity": self.parity,
            "compile": self.compile,
            "budget_split": self.budget_split,
            "try": self.untried,
            "notes": list(self.notes),
            # derived from config (not read back): what to export before launching the training process
            "environment": self.launch_env(),
            # derived (not read back): the micro-batch and how many make one optimizer step; the global batch
            # itself is the workload's (workload.global_batch)
            "batch": {"micro_batch": self.config.batch_size, "accumulation_steps": self.accumulation_steps,
                      "global_batch": self.global_batch},
            # derived (not read back), N ranks only: how to launch them (autotune.distributed)
            **({"distributed": distributed_section(self)} if self.world_size > 1 else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "recommendation") -> "Recommendation":
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a mapping, got {type(d).__name__}")
        missing = [k for k in ("config", "workload", "measured", "hardware", "versions", "provenance") if k not in d]
        if missing:
            raise ConfigError(f"{source}: missing section(s) {', '.join(missing)}; export it again with "
                              "`autotune export`")
        if d.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
            raise ConfigError(f"{source}: format_version {d['format_version']} is newer than this autotune reads "
                              f"({FORMAT_VERSION}); upgrade autotune")
        for section in ("config", "workload", "measured", "hardware", "versions", "provenance"):
            if not isinstance(d[section], dict):
                raise ConfigError(f"{source}: section {section!r} must be a mapping, got "
                                  f"{type(d[section]).__name__}; export it again with `autotune export`")
        m, p, hw = d["measured"], d["provenance"], dict(d["hardware"])
        try:
            rec = cls(
                config=TrialConfig.from_dict(d["config"]), workload=Workload.from_dict(d["workload"]),
                median_samples_per_s=_number(m["median_samples_per_s"]),
                iqr_samples_per_s=_number(m["iqr_samples_per_s"]),
                samples_per_s=tuple(float(x) for x in m.get("samples_per_s", ())),
                baseline_samples_per_s=m.get("baseline_samples_per_s"),
                speedup_vs_baseline=m.get("speedup_vs_baseline"), peak_host_mb=m.get("peak_host_mb"),
                memory_cap_mb=m.get("memory_cap_mb"), margin_vs_runner_up=m.get("margin_vs_runner_up"),
                margin_interval=None if m.get("margin_interval") is None else tuple(m["margin_interval"]),
                memory_margin=m.get("memory_margin"), peak_device_mb=m.get("peak_device_mb"),
                peak_device_allocated_mb=m.get("peak_device_allocated_mb"),
                device_memory_cap_mb=m.get("device_memory_cap_mb", m.get("device_memory_mb")),
                parity=d.get("parity"), env_stamp=d.get("collect_env"), compile=d.get("compile"),
                finalist_rounds=m.get("finalist_rounds"), search_round_pooled=bool(m.get("search_round_pooled")),
                noisy=bool(m.get("noisy", False)), fingerprint=str(hw.pop("fingerprint", "")), hardware=hw,
                versions=dict(d["versions"]), study_name=str(p.get("study_name", "")),
                storage=str(p.get("storage", "")), trial_number=p.get("trial"),
                runners_up=tuple(d.get("runners_up") or ()), notes=tuple(d.get("notes") or ()),
                reproduce=str(p.get("reproduce", "")), created=str(p.get("created", "")),
                provisional=bool(p.get("provisional", False)),
                user_parts=tuple(str(x) for x in d.get("user_parts") or ()),
                tokens_per_sample=m.get("tokens_per_sample"), latency_ms=_latency_read(m),
                worst_case=d.get("worst_case"),
                ceilings=d.get("ceilings"), selection=d.get("selection"), confirmation=d.get("confirmation"),
                loader_memory=d.get("loader_memory"),
                shell_env=p.get("shell_environment"), budget_split=d.get("budget_split"), untried=d.get("try"),
            )
        except KeyError as exc:
            raise ConfigError(f"{source}: missing key {exc.args[0]!r} in 'measured'") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        check_section(d.get("distributed"), rec, source)
        return rec

    def _latency_measured(self) -> dict[str, Any]:
        """The ``measured`` section's latency keys (inference): latency_p50_ms ... latency_bound_p99_ms."""
        if not self.latency_ms:
            return {}
        lat = self.latency_ms
        return {"latency_p50_ms": lat.get("p50_ms"), "latency_p95_ms": lat.get("p95_ms"),
                "latency_p99_ms": lat.get("p99_ms"), "latency_min_ms": lat.get("min_ms"),
                "latency_bound_p99_ms": lat.get("bound_p99_ms")}

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text; with ``path``, also written atomically (temp file + rename: a reader never sees half)."""
        text = "# autotune recommendation: measured, not guessed. Reproduce with provenance.reproduce.\n"
        # width: the reproduce command stays on one line
        text += yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False, width=10**6)
        if path is not None:
            from autotune._atomic import atomic_write

            atomic_write(Path(path), text)
        return text

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Recommendation":
        doc = read_yaml(Path(path), ConfigError, label=str(path),
                        not_text="give the YAML that `autotune export` wrote")
        return cls.from_dict(doc, source=str(path))

    # --- use -----------------------------------------------------------------------------------------
    def launch_env(self) -> dict[str, str]:
        """Environment variables to set before the training process starts, as the measured child had them
        (``config.launch_env``): OpenMP/MKL/OpenBLAS read their thread counts and glibc its malloc settings at
        start-up. ``apply()`` sets what can still be set in a running process."""
        return launch_env(self.config)

    def launch_command(self, script: str = "train.py", *script_args: str) -> str:
        """The shell line that starts the training as measured: with N ranks ``torchrun --standalone --nnodes 1
        --nproc-per-node N script ...`` after the per-rank environment (``launch_env``), else ``python script``
        after it (``autotune.distributed.launch_command``)."""
        return launch_command(self, script, *script_args)

    def headroom_mb(self) -> float | None:
        """MiB the measured peak leaves free under the cap less the margin (None when either is unknown)."""
        if self.peak_host_mb is None or self.memory_cap_mb is None:
            return None
        return round(self.memory_cap_mb * (1 - (self.memory_margin or 0.0)) - self.peak_host_mb, 1)

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step the study kept fixed (``Workload.global_batch``); None: no accumulation."""
        return self.workload.global_batch

    @property
    def world_size(self) -> int:
        """DDP ranks per node the config was measured with (``Workload.nproc_per_node``); 1: one process."""
        return self.workload.nproc_per_node

    @property
    def ddp_backend(self) -> str:
        """The process group's backend the ranks were measured with: ``nccl`` on GPUs, ``gloo`` on the CPU."""
        return backend_for(self.workload.device)

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches (of ``config.batch_size``) per optimizer step on each rank: global batch / (batch size x
        world size), else 1."""
        from autotune.workloads.global_batch import accumulation_steps

        return accumulation_steps(self.global_batch, self.config.batch_size, world_size=self.world_size)

    def dataloader_kwargs(self, *, fit: bool = False) -> dict[str, Any]:
        """``DataLoader(dataset, **rec.dataloader_kwargs())``: batch size (the micro-batch with a global batch),
        workers, prefetch, pinning; refused in one line where its batches in flight do not fit this machine, or with
        ``fit=True`` the largest loader that fits here (``search.record.loader_statement.applied_kwargs``)."""
        from autotune.search.record.loader_statement import applied_kwargs

        return applied_kwargs(self, fit=fit)

    def apply(self, *, field: "bool | FieldSpec" = True) -> contextlib.AbstractContextManager[Applied]:
        """Set this config's process-wide torch state (threads, cudnn.benchmark) and restore it on exit.
        ``malloc: retain`` is applied through glibc's ``mallopt`` and stays for the process's life;
        ``malloc: hugepages`` also needs ``THP_MEM_ALLOC_ENABLE=1`` from the launch environment (warned if absent).

        Yields an ``Applied`` with the per-call helpers: ``prepare_model`` (channels_last, torch.compile),
        ``prepare_input`` (channels_last), ``autocast()`` and ``grad_scaler()``, and ``accumulation_steps``: the
        micro-batches per optimizer step (1 without a global batch).
        Measured as N DDP ranks, it is called in each rank of the script ``launch_command()`` starts: the threads
        are the rank's, ``prepare_model`` wraps the model in DDP with the recommended arguments (on GPU
        LOCAL_RANK), ``no_sync(model, micro_batch)`` skips the all-reduce on accumulation micro-batches.
        The inter-op thread count can only be set before torch's first parallel work; if that moment has passed it
        is left as is, with a note.

        ``field`` (on by default; a ``FieldSpec`` to set its windows, False: off): the run is measured as it
        trains (``autotune.field``): optimizer steps, the batches ``prepare_input`` sees, the data wait; a sustained
        slow-down is logged once with what changed; ``run.field()`` and the block's end say in one line how the run
        stands against what the trials measured for this config; the record is kept in the study (``autotune
        show`` lists it).
        """
        from autotune.applied import applying

        return applying(self, self.field_run(spec=None if field is True else field) if field else None)

    def field_claim(self) -> Claim:
        """What the trials measured for this config, as a field run compares with it (``applied.field_claim``)."""
        from autotune.applied import field_claim

        return field_claim(self)

    def field_run(self, *, spec: FieldSpec | None = None, source: str = "apply", steps: str = "optimizer",
                  accumulation: int | None = None) -> FieldRun:
        """A measurement of the user's run against this recommendation, not started (``FieldRun.start()``), its
        record kept in this recommendation's study (``applied.field_run``). ``steps``: ``optimizer`` (torch's step
        hook) or ``callback`` (a framework's batch hooks call ``batch_start``/``step_end``)."""
        from autotune.applied import field_run

        return field_run(self, spec=spec, source=source, steps=steps, accumulation=accumulation)

    def check_versions(self) -> list[str]:
        """Differences between the versions this was measured with and the running ones (empty if none):
        torch, torchvision, CUDA and the driver, then the other facts of its collect_env stamp that changed
        (compiler, OS, libc, cuDNN, the torch-related packages...; see ``envstamp.stamp_changes``)."""
        from autotune.machine.hardware import detect

        now = versions_of(detect(with_torch=False))
        changed = [f"{k} {self.versions.get(k)} -> {now.get(k)}" for k in ("torch", "torchvision", "cuda", "driver")
                   if self.versions.get(k) != now.get(k) and (self.versions.get(k) or now.get(k))]
        if self.env_stamp:
            from autotune.machine.envstamp import collect_env_stamp, stamp_changes

            changed += stamp_changes(self.env_stamp, collect_env_stamp())
        return changed

    # --- where users train ---------------------------------------------------------------------------
    def lightning(self):
        """What to pass to Lightning: ``.trainer_kwargs`` (precision, accumulation, device),
        ``.dataloader_kwargs`` for the DataModule and ``.callback`` (``AutotuneCallback``: threads,
        cudnn.benchmark, channels_last and compile for the fit). Needs ``pip install "autotune[lightning]"``.

        >>> lt = rec.lightning()                                                            # doctest: +SKIP
        >>> trainer = L.Trainer(max_epochs=3, **lt.trainer_kwargs, callbacks=[lt.callback])  # doctest: +SKIP
        """
        from autotune.integrations.lightning import settings

        return settings(self)

    def training_arguments(self, *, strict: bool = True, callback: bool = True) -> dict[str, Any]:
        """The Hugging Face ``TrainingArguments`` fields this maps to. ``callback`` (the default): you pass
        ``callbacks=[rec.hf_callback()]`` to ``Trainer``, which sets threads, channels_last, cudnn.benchmark and
        the allocator; ``callback=False``: those are yours to set. ``strict``: refuse (one line, with the fixes) a
        knob that neither sets, unless this process already runs with it; ``strict=False`` warns instead. Needs
        ``pip install "autotune[hf]"`` (``autotune.integrations.hf``).

        >>> args = TrainingArguments(output_dir="out", **rec.training_arguments())   # doctest: +SKIP
        >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[rec.hf_callback()])  # doctest: +SKIP
        """
        from autotune.integrations.hf import training_arguments

        return training_arguments(self, strict=strict, callback=callback)

    def hf_callback(self, *, field: "bool | FieldSpec" = True):
        """A ``transformers.TrainerCallback`` that applies what ``TrainingArguments`` has no field for (threads,
        channels_last, cudnn.benchmark, the allocator: ``apply()``) in ``on_train_begin`` and restores it in
        ``on_train_end`` (``restore()`` by hand when training raises), and measures the training (``field``, as
        ``apply``'s: its ``field()`` gives the line). Needs ``pip install "autotune[hf]"``."""
        from autotune.integrations.hf import trainer_callback

        return trainer_callback(self, field=field)

    def summary(self) -> str:
        figures = ("no samples/s stated (the confirmation measured none)" if self.median_samples_per_s is None else
                   f"{self.median_samples_per_s:.1f} samples/s median vs the PyTorch-defaults baseline's "
                   f"{self.baseline_samples_per_s or float('nan'):.1f}")
        lines = [f"recommended: {self.config.short()}", f"  {knob_summary(self.config)}",
                 f"  {figures}: {self.claim()}"]
        if self.global_batch:
            from autotune.workloads.global_batch import describe

            lines.append(f"  {describe(self.config.batch_size, self.global_batch, world_size=self.world_size)} "
                         "(an optimizer step every "
                         f"{self.global_batch} samples, as measured)")
        if self.world_size > 1:
            ddp = " ".join(f"{k}={v}" for k, v in self.config.ddp_kwargs().items())
            lines.append(f"  {self.world_size} DDP ranks, batch, threads and workers per rank, samples/s all ranks'; "
                         f"DDP {ddp}; launch: {self.launch_command()}")
        if self.tokens_per_sample is not None:
            lines.append(f"  {self.median_tokens_per_s:.0f} tokens/s median ({self.tokens_per_sample:.1f} real tokens "
                         "per sample, as the workload counts them)")
        if self.user_parts:
            lines.append(f"  measured with the workload's own {', '.join(self.user_parts)} "
                         "(autotune.workloads.contract)")
        if self.margin_vs_runner_up is not None:
            lines.append(f"  {100 * self.margin_vs_runner_up:+.1f}% vs the runner-up {self.runners_up[0]['short']}"
                         + (f" (95% interval {100 * self.margin_interval[0]:+.1f}% to "
                            f"{100 * self.margin_interval[1]:+.1f}%)" if self.margin_interval else "")
                         + (f", over {self.finalist_rounds} interleaved finalist round(s)"
                            + (" and the search trials" if self.search_round_pooled else "")
                            if self.finalist_rounds else ""))
        if self.headroom_mb() is not None:
            from autotune._units import format_mb

            lines.append(f"  peak memory {format_mb(self.peak_host_mb)} of the {format_mb(self.memory_cap_mb)} cap: "
                         f"{format_mb(self.headroom_mb())} to spare beyond the {100 * (self.memory_margin or 0):.0f}% "
                         "margin")
        if self.device_memory_cap_mb is not None and (self.peak_device_allocated_mb or self.peak_device_mb):
            from autotune._units import format_mb as mb
            lines.append(f"  device memory {mb(self.peak_device_allocated_mb or self.peak_device_mb)} in tensors, "
                         f"{mb(self.peak_device_mb)} reserved, under the {mb(self.device_memory_cap_mb)} device cap")
        if self.latency_ms:
            lat = self.latency_ms
            bound = f" (bound {lat['bound_p99_ms']:g} ms)" if lat.get("bound_p99_ms") else ""
            lines.append(f"  latency per step p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms, "
                         f"p99 {lat['p99_ms']:.2f} ms{bound}, the slowest finalist round's")
        if self.worst_case:
            from autotune._units import format_mb

            wc = self.worst_case
            peak = f": peak {format_mb(wc['peak_host_mb'])}" if wc.get("peak_host_mb") else ""
            lines.append(f"  worst case: {wc.get('what')}{peak}, checked by {wc.get('checked_by')}")
        lines += [f"  {line}" for line in loader_line(self.loader_memory) + ceiling_lines(self.ceilings)]
        if self.compile and self.compile.get("configs"):
            lines.append(f"  torch.compile priced over the planned run, {self.compile.get('planned_run_label')}"
                         + (": it did not pay back" if self.compile.get("dropped") else ""))
        lines += [f"  {ln}" for ln in (split_line(self.budget_split),) if ln] + [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _number(x: Any) -> float | None:
    """A figure of ``measured``: a float, or None (a claim the confirmation did not measure)."""
    return None if x is None else float(x)


def _latency_read(measured: dict[str, Any]) -> dict | None:
    """``latency_ms`` back from the ``measured`` section's flat keys; None when it has none."""
    if measured.get("latency_p99_ms") is None:
        return None
    return {"p50_ms": measured.get("latency_p50_ms"), "p95_ms": measured.get("latency_p95_ms"),
            "p99_ms": measured.get("latency_p99_ms"), "min_ms": measured.get("latency_min_ms"),
            "bound_p99_ms": measured.get("latency_bound_p99_ms")}


def stored_recommendation(study: Study) -> Recommendation | None:
    d = study.user_attrs.get(keys.STUDY_RECOMMENDATION)
    return Recommendation.from_dict(d) if d else None
