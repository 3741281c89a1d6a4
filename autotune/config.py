"""The frozen records that cross every boundary: what is run, how it is measured, and what came out.

``Workload`` (what to train or infer), ``TrialConfig`` (one point of the search space, each of its knobs
declared once in ``KNOBS``), ``MeasureSpec`` (how long to warm up and measure) and ``TrialResult`` (what was
measured; it lives in ``result.py`` and is re-exported here). Each validates itself on construction and has
``to_dict``/``from_dict``; nothing else is pickled across processes, Ray or storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune._records import Record, check, finite_or_none, is_int, is_num
from autotune.result import MEMORY_STATUSES, STATUSES, TrialResult

__all__ = ["TEXT_MODELS", "Workload", "TrialConfig", "MeasureSpec", "TrialResult", "STATUSES", "MEMORY_STATUSES",
           "AMP_MODES", "COMPILE_MODES", "finite_or_none",
           "Knob", "KNOBS", "knob_args", "knob_summary", "device_family", "MALLOC_MODES", "AFFINITY_MODES",
           "DDP_KNOBS"]

AMP_MODES = ("off", "bf16", "fp16")
TEXT_MODELS = ("transformer", "transformer_tiny")  # the built-in text workload's names (sizes: autotune.workloads.text)
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
# The host allocator (autotune.machine.malloc) and OpenMP thread placement (autotune.machine.affinity): the
# knobs' words are declared here with the knobs; what each does to a process is the machine's.
MALLOC_MODES = ("default", "retain", "hugepages", "jemalloc", "tcmalloc")
AFFINITY_MODES = ("default", "close", "spread")
TASKS = ("train", "infer")


def device_family(device: str) -> str:
    """``"cpu"`` or ``"cuda"``: the kind of device a device string (``cpu``, ``cuda``, ``cuda:N``) names."""
    return "cpu" if device == "cpu" else "cuda"


@dataclass(frozen=True)
class Workload(Record):
    """What is measured: a model by name, its data, the task and the device.

    ``model`` is a torchvision classification model name (``resnet18``), the built-in text workload
    (``transformer``, ``autotune.workloads.text``: ``image_size`` is then the maximum sequence length) or
    ``package.module:callable``. ``data_dir`` is an ImageFolder of real images; ``None`` means synthetic JPEGs
    decoded by PIL (synthetic token sequences for text).
    ``global_batch`` (training only) keeps the user's samples per optimizer step: the batch size is then a
    micro-batch that divides it, with gradient accumulation (``autotune.workloads.global_batch``); None: no
    accumulation.
    ``data`` is what the workload's first batch held, read by ``workloads.build.check`` (``workloads.probe``): its
    tensors' shapes and dtypes, the lengths its ``length`` gave, the keyword arguments a callable took. The search
    space is fitted to it (``space.search_space.fit_workload``); None until checked. It is what was seen, not what was
    asked for, so two workloads compare equal without it.
    ``nproc_per_node`` > 1 runs each trial as that many DDP ranks of one process group (``autotune.trial.ddp``):
    the batch size and the config's threads and workers are per rank.
    """

    _kind: ClassVar[str] = "workload"

    model: str = "resnet18"
    task: str = "train"
    image_size: int = 224
    data_dir: str | None = None
    device: str = "cpu"
    num_classes: int = 1000
    dataset_size: int = 50_000
    global_batch: int | None = None
    data: dict | None = field(default=None, compare=False)
    nproc_per_node: int = 1  # ranks of one DDP process group per trial (autotune.trial.ddp); 1: one process

    def __post_init__(self) -> None:
        check(isinstance(self.model, str) and bool(self.model.strip()), "model", self.model,
               "a torchvision model name or package.module:callable")
        check(self.task in TASKS, "task", self.task, f"one of {', '.join(TASKS)}")
        text = self.model in TEXT_MODELS  # its image_size is the sequence length: named as the user named it
        check(is_int(self.image_size) and 16 <= self.image_size <= 4096, "seq_len" if text else "image_size",
              self.image_size, "an integer from 16 to 4096 (tokens, --seq-len)" if text else
              "an integer from 16 to 4096 (pixels, --image-size; tokens for a text model's --seq-len)")
        check(isinstance(self.device, str) and (self.device == "cpu" or self.device.startswith("cuda")), "device",
              self.device, "cpu, cuda or cuda:N")
        check(is_int(self.num_classes) and self.num_classes >= 2, "num_classes", self.num_classes,
               "an integer >= 2")
        check(is_int(self.dataset_size) and self.dataset_size >= 1, "dataset_size", self.dataset_size,
               "an integer >= 1")
        check(self.global_batch is None or (is_int(self.global_batch) and self.global_batch >= 1), "global_batch",
              self.global_batch, "None or a whole number of samples per optimizer step >= 1")
        check(self.global_batch is None or self.task == "train", "global_batch", self.global_batch,
              "only with task=train (inference has no optimizer step to accumulate for)", "drop --global-batch")
        check(self.data is None or isinstance(self.data, dict), "data", self.data,
              "None or a mapping (what the first batch held, as workloads.probe writes it)")
        check(is_int(self.nproc_per_node) and self.nproc_per_node >= 1, "nproc_per_node", self.nproc_per_node,
              "a whole number of ranks >= 1 (--nproc-per-node; 1: one process, no DDP)")

    def to_dict(self) -> dict[str, Any]:
        # one process is written as before DDP existed: stored studies, payloads and YAMLs read the same
        out = super().to_dict()
        if self.nproc_per_node == 1:
            del out["nproc_per_node"]
        return out

    def described(self) -> dict[str, Any]:
        """The workload as a recommendation's YAML records it: what it is, not defaults it ignored. A
        ``module:callable`` is never given ``dataset_size``, and ``image_size``/``num_classes`` only when it takes
        them (``data["takes"]``), so those it did not take are left out; ``from_dict`` reads the rest back."""
        out = self.to_dict()
        if self.data is None:
            del out["data"]
        if self.is_callable:
            out.pop("dataset_size", None)
            if self.data is not None:
                for name in ("image_size", "num_classes"):
                    if name not in self.data.get("takes", ()):
                        out.pop(name, None)
        return out

    @property
    def is_callable(self) -> bool:
        return ":" in self.model

    @property
    def device_family(self) -> str:
        """``"cpu"`` or ``"cuda"`` (for ``cuda`` and ``cuda:N``)."""
        return device_family(self.device)

    @property
    def size_label(self) -> str:
        """``224px``; for the built-in text workload (``autotune.workloads.text``, where image_size is the maximum
        sequence length) ``len128``."""
        return f"len{self.image_size}" if self.model in TEXT_MODELS else f"{self.image_size}px"

    def label(self) -> str:
        data = "folder/" if self.data_dir else "" if self.is_callable else "synthetic/"
        gb = f"/gb{self.global_batch}" if self.global_batch else ""
        ranks = f"/x{self.nproc_per_node}" if self.nproc_per_node > 1 else ""
        return f"{self.model}/{self.task}/{self.size_label}/{data}{self.device}{gb}{ranks}"


@dataclass(frozen=True)
class TrialConfig(Record):
    """One point of the search space: the knobs a user would otherwise set by hand.

    ``None`` thread counts mean "leave torch's default". ``prefetch_factor`` and ``persistent_workers``
    only mean something when ``num_workers > 0`` and are normalised to ``None``/``False`` otherwise, so two
    configs that behave the same compare equal.

    >>> TrialConfig(batch_size=64, num_workers=0, prefetch_factor=4).prefetch_factor is None
    True
    """

    _kind: ClassVar[str] = "config"

    batch_size: int = 64
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    amp: str = "off"
    compile_mode: str = "none"
    channels_last: bool = False
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    cudnn_benchmark: bool = False
    malloc: str = "default"
    bucket_by_length: bool = False  # text workloads: batches of similar lengths (autotune.workloads.text)
    affinity: str = "default"  # OpenMP threads pinned to cores (autotune.machine.affinity)
    # DistributedDataParallel's own arguments (several ranks only, ``Workload.nproc_per_node`` > 1), at DDP's
    # defaults: a one-process config leaves them there, and its dict (so its stored key) does not carry them
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    def __post_init__(self) -> None:
        check(is_int(self.batch_size) and self.batch_size >= 1, "batch_size", self.batch_size,
               "a whole number >= 1", "try 32 or 64")
        check(is_int(self.num_workers) and self.num_workers >= 0, "num_workers", self.num_workers,
               "a whole number >= 0 (0 loads data in the training process)")
        check(self.prefetch_factor is None or (is_int(self.prefetch_factor) and self.prefetch_factor >= 1),
               "prefetch_factor", self.prefetch_factor, "None or a whole number >= 1")
        for name in ("pin_memory", "persistent_workers", "channels_last", "cudnn_benchmark", "bucket_by_length",
                     "gradient_as_bucket_view", "static_graph"):
            check(isinstance(getattr(self, name), bool), name, getattr(self, name), "true or false")
        check(self.amp in AMP_MODES, "amp", self.amp, f"one of {', '.join(AMP_MODES)}")
        check(self.compile_mode in COMPILE_MODES, "compile_mode", self.compile_mode,
               f"one of {', '.join(COMPILE_MODES)}")
        check(self.malloc in MALLOC_MODES, "malloc", self.malloc,
               f"one of {', '.join(MALLOC_MODES)} (retain: glibc keeps freed memory for reuse; hugepages: "
               "retain, on 2 MiB pages; jemalloc/tcmalloc: preloaded instead of glibc's)")
        check(self.affinity in AFFINITY_MODES, "affinity", self.affinity,
              f"one of {', '.join(AFFINITY_MODES)} (close/spread: OpenMP threads pinned to cores)")
        for name in ("intra_op_threads", "inter_op_threads"):
            v = getattr(self, name)
            check(v is None or (is_int(v) and 1 <= v <= 1024), name, v, "None or a whole number from 1 to 1024 "
                  f"({'--threads' if name == 'intra_op_threads' else '--interop-threads'})")
        check(is_int(self.bucket_cap_mb) and 1 <= self.bucket_cap_mb <= 1024, "bucket_cap_mb", self.bucket_cap_mb,
              "a whole number of MiB from 1 to 1024 (DDP's gradient buckets; its default is 25)")
        if self.num_workers == 0:
            # Meaningless without workers (and DataLoader refuses prefetch_factor then): normalise.
            object.__setattr__(self, "prefetch_factor", None)
            object.__setattr__(self, "persistent_workers", False)

    def to_dict(self) -> dict[str, Any]:
        # DDP's knobs only where they differ from DDP's defaults: one-process configs are stored and exported
        # as before they existed, and their keys (``key``) stay the same
        out = super().to_dict()
        for name in DDP_KNOBS:
            if out[name] == TrialConfig.__dataclass_fields__[name].default:
                del out[name]
        return out

    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments this config gives ``DistributedDataParallel`` (its defaults unless searched)."""
        return {name: getattr(self, name) for name in DDP_KNOBS}

    def dataloader_kwargs(self) -> dict[str, Any]:
        """The keyword arguments this config gives ``torch.utils.data.DataLoader``."""
        kw: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers,
                              "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kw["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kw["prefetch_factor"] = self.prefetch_factor
        return kw

    def key(self) -> tuple:
        """A hashable identity: two configs with equal keys run the same code."""
        return tuple(sorted(self.to_dict().items()))

    def short(self) -> str:
        """One line a person can read: ``bs=64 w=2 pf=2 bf16 cl t=2/1``, from the knobs' labels (see ``KNOBS``)."""
        parts = []
        for knob in _SHORT_KNOBS:
            value = getattr(self, knob.field)
            if knob.field == "prefetch_factor":
                if self.num_workers:  # only with workers; unset means torch's default, 2
                    parts.append(f"{knob.label}={value or 2}")
            elif knob.field in _THREADS:  # both counts in one part, t=intra/inter; - is torch's default
                if self.intra_op_threads or self.inter_op_threads:
                    parts.append(f"{knob.label}={self.intra_op_threads or '-'}/{self.inter_op_threads or '-'}")
            elif knob.kind == "int" and knob.field not in DDP_KNOBS:
                parts.append(f"{knob.label}={value}")
            elif knob.kind == "switch":
                if value:
                    parts.append(knob.label)
            elif value != knob.default:  # a choice: shown when not the default, as label=value or the value alone
                parts.append(f"{knob.label}={value}" if knob.label else value)
        return " ".join(parts)


# --- the knobs, declared once ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Knob:
    """One TrialConfig field a user sets, and how it is spelled: the `autotune trial` flag, its help, its label
    in ``TrialConfig.short()``.

    ``kind`` is ``"int"`` (takes a whole number), ``"switch"`` (a flag that turns it on) or ``"choice"`` (one of
    ``choices``). ``help`` is an argparse help string (``%(default)s`` is the default). ``always``: ``knob_args``
    writes the flag even at its default, so a reproduce command reads completely. The default is the field's
    default in TrialConfig, which is also the flag's.
    """

    field: str
    flag: str
    kind: str
    help: str | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    label: str = ""
    always: bool = False

    @property
    def default(self) -> Any:
        return TrialConfig.__dataclass_fields__[self.field].default

    @property
    def dest(self) -> str:
        """The argparse attribute the flag sets: ``--interop-threads`` -> ``interop_threads``."""
        return self.flag.removeprefix("--").replace("-", "_")


# In the order `autotune trial --help` lists them. cudnn_benchmark is not here: it follows the device.
KNOBS: tuple[Knob, ...] = (
    Knob("batch_size", "--batch-size", "int", label="bs", always=True),
    Knob("num_workers", "--num-workers", "int", "DataLoader worker processes (default: %(default)s)",
         label="w", always=True),
    Knob("prefetch_factor", "--prefetch-factor", "int", "batches each worker loads ahead (default: torch's 2)",
         label="pf"),
    Knob("pin_memory", "--pin-memory", "switch", "page-locked host memory for faster GPU copies", label="pin"),
    Knob("persistent_workers", "--persistent-workers", "switch", "keep workers alive across epochs",
         label="persist"),
    Knob("amp", "--amp", "choice", "autocast dtype; fp16 (CUDA only) uses a GradScaler (default: %(default)s)",
         choices=AMP_MODES, label="", always=True),
    Knob("compile_mode", "--compile", "choice",
         "torch.compile mode; compile time is reported apart from throughput (default: %(default)s)",
         choices=COMPILE_MODES, label="compile", always=True),
    Knob("channels_last", "--channels-last", "switch", "NHWC memory format for model and inputs", label="cl"),
    Knob("intra_op_threads", "--threads", "int", "intra-op threads (OMP/MKL and torch)", metavar="N", label="t"),
    Knob("inter_op_threads", "--interop-threads", "int", "inter-op threads", metavar="N", label="t"),
    Knob("malloc", "--malloc", "choice",
         "retain: glibc keeps freed memory for reuse instead of page-faulting it in again each step; hugepages: "
         "retain, and PyTorch puts blocks >= 2 MiB on transparent huge pages (THP_MEM_ALLOC_ENABLE=1); "
         "jemalloc/tcmalloc: that allocator preloaded instead of glibc's (LD_PRELOAD) "
         "(default: %(default)s)", choices=MALLOC_MODES, label="malloc"),
    Knob("affinity", "--affinity", "choice",
         "OpenMP threads pinned to neighbouring cores (close) or spread over them (spread): OMP_PROC_BIND and "
         "OMP_PLACES, and KMP_AFFINITY/KMP_BLOCKTIME for Intel's OpenMP (default: %(default)s)",
         choices=AFFINITY_MODES, label="affinity"),
    Knob("bucket_by_length", "--bucket-by-length", "switch",
         "text workloads: batches of sequences of similar length, so less padding (autotune.workloads.text)",
         label="bucket"),
    Knob("bucket_cap_mb", "--bucket-cap-mb", "int", "DDP (--nproc-per-node > 1): MiB of gradients all-reduced "
         "together (default: %(default)s, DDP's)", metavar="MB", label="ddp_bucket"),
    Knob("gradient_as_bucket_view", "--gradient-as-bucket-view", "switch",
         "DDP: gradients are views into the all-reduce buckets (no copy, less memory)", label="ddp_view"),
    Knob("static_graph", "--static-graph", "switch",
         "DDP: the set of used parameters is the same every step (DDP can then skip its per-step search)",
         label="ddp_static"),
)
# DistributedDataParallel's arguments: searched, and shown, only for several ranks (see TrialConfig)
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
_KNOB = {k.field: k for k in KNOBS}
_THREADS = ("intra_op_threads", "inter_op_threads")
# short() and knob_summary() list the knobs in their own (older) orders, kept so the lines stay as they were
# (short lines are stored in recommendations); short() writes both thread counts as one part, t=intra/inter.
_SHORT_KNOBS = tuple(_KNOB[f] for f in ("batch_size", "num_workers", "prefetch_factor", "persistent_workers",
                                        "pin_memory", "amp", "channels_last", "compile_mode", "malloc",
                                        "intra_op_threads", "bucket_by_length", "affinity", *DDP_KNOBS))
_SUMMARY_KNOBS = tuple(_KNOB[f] for f in ("batch_size", "num_workers", "prefetch_factor", "persistent_workers",
                                          "pin_memory", "amp", "channels_last", "compile_mode", "intra_op_threads",
                                          "inter_op_threads", "malloc", "affinity"))


def knob_args(config: TrialConfig) -> list[str]:
    """The `autotune trial` flags that set ``config``'s knobs, e.g. ``['--batch-size', '32', '--num-workers',
    '2', '--amp', 'bf16', '--compile', 'none', '--prefetch-factor', '4', '--channels-last', '--threads', '2']``.

    First the knobs written even at their default (``--batch-size N --num-workers N --amp X --compile X``,
    always these 8 items), then the others in ``KNOBS`` order, each only when it differs from its default
    (a switch as the bare flag). Parsed by ``autotune trial`` (with the config's device) they give ``config``
    back. Other flags may go anywhere among them: argparse does not care about order.
    """
    always: list[str] = []
    changed: list[str] = []
    for knob in KNOBS:
        value = getattr(config, knob.field)
        if knob.always:
            always += [knob.flag, str(value)]
        elif knob.kind == "switch":
            if value:
                changed.append(knob.flag)
        elif value != knob.default:
            changed += [knob.flag, str(value)]
    return always + changed


def knob_summary(config: TrialConfig) -> str:
    """Every knob by its field name on one line: ``batch_size=64 num_workers=0 prefetch_factor=None ...``;
    an unset thread count reads ``default``."""
    parts = []
    for knob in _SUMMARY_KNOBS:
        value = getattr(config, knob.field)
        if knob.field in _THREADS and value is None:
            value = "default"
        parts.append(f"{knob.field}={value}")
    return " ".join(parts)


@dataclass(frozen=True)
class MeasureSpec(Record):
    """How a trial is warmed up and measured, and the limits the parent enforces.

    The first step (start-up, and compilation with ``torch.compile``) is timed on its own and is warm-up.
    With ``warmup_min_steps`` > 1, warm-up then runs at least that many steps and ``warmup_min_s`` seconds, and
    until the median of the last step times moves by less than ``settle_tolerance`` (or ``warmup_max_s``
    passes, counted from after the first step). Then ``windows`` windows of at least ``window_s`` seconds each
    (and at least ``min_window_steps`` steps) are measured and streamed; the first is kept only if it lies
    within ``settle_tolerance`` of the range of the ``settle_windows`` after it (``measure.window_settled``), else it is
    re-labelled warm-up and one more window is measured (two at most, and within ``warmup_max_s``). By default
    no step beyond the first is spent on a per-step warm-up: the windows tell when the warm-up ended.
    The parent kills a trial over ``memory_cap_mb``; a config counts as feasible only with ``memory_margin``
    of the cap to spare (its peak under cap x (1 - margin)), so it still fits when the real run's memory
    wanders above what a short trial saw.
    """

    _kind: ClassVar[str] = "measure"

    windows: int = 5
    window_s: float = 3.0
    min_window_steps: int = 2
    warmup_min_steps: int = 1
    warmup_min_s: float = 0.0
    warmup_max_s: float = 120.0
    settle_tolerance: float = 0.10
    settle_windows: int = 2  # later windows that confirm the first (measure.window_settled); 0: none
    timeout_s: float = 600.0
    memory_cap_mb: float | None = None
    seed: int = 0
    memory_margin: float = 0.10
    # On CUDA: the most PyTorch's caching allocator may hold, enforced in the trial (an allocation past it is an
    # out-of-memory error there); None: no limit in the trial. The Tuner sets it (``--device-memory-cap``, by
    # default the GPU's free memory when the run starts less the CUDA context's share).
    device_memory_cap_mb: float | None = None
    # Inference: the most a step's p99 latency may be for the config to count as feasible, as memory is
    # (``--latency-p99``; autotune.trial.latency); None: no bound.
    latency_p99_ms: float | None = None
    # The trial runs the largest batch the data can produce, over and over (autotune.workloads.worst_case): the
    # check a config passes before it is recommended; the search's trials run the data as it comes.
    worst_case: bool = False
    # What the child measures: "full" (a trial: the loader feeding the model), or one ceiling alone
    # (``autotune.trial.parts``): "model" (the step on one batch already on the device) or "data" (the loader and
    # the copy to the device, no model). The search's trials are "full".
    part: str = "full"
    # Stop measuring, from the third measured window on, once the measured windows' range is within this share of
    # their median (torch.utils.benchmark's adaptive_autorange idea: a quiet GPU needs no 5 x 3 s); 0: every window.
    tight_spread: float = 0.0

    def __post_init__(self) -> None:
        check(is_int(self.windows) and self.windows >= 1, "windows", self.windows, "a whole number >= 1")
        check(is_num(self.window_s) and self.window_s > 0, "window_s", self.window_s, "a positive number of seconds")
        check(is_int(self.min_window_steps) and self.min_window_steps >= 1, "min_window_steps",
               self.min_window_steps, "a whole number >= 1")
        check(is_int(self.warmup_min_steps) and self.warmup_min_steps >= 1, "warmup_min_steps",
               self.warmup_min_steps, "a whole number >= 1")
        check(is_num(self.warmup_min_s) and self.warmup_min_s >= 0, "warmup_min_s", self.warmup_min_s,
              "a number of seconds >= 0")
        check(is_num(self.warmup_max_s) and self.warmup_max_s > 0, "warmup_max_s", self.warmup_max_s,
              "a positive number of seconds")
        check(is_int(self.settle_windows) and self.settle_windows >= 0, "settle_windows", self.settle_windows,
              "a whole number >= 0 (0: the first window is not checked)")
        check(is_num(self.settle_tolerance) and 0 < self.settle_tolerance < 1, "settle_tolerance",
              self.settle_tolerance, "between 0 and 1")
        check(is_num(self.timeout_s) and self.timeout_s > 0, "timeout_s", self.timeout_s,
              "a positive number of seconds")
        check(self.memory_cap_mb is None or (is_num(self.memory_cap_mb) and self.memory_cap_mb > 0), "memory_cap_mb",
              self.memory_cap_mb, "None or a positive number of MiB")
        check(is_num(self.memory_margin) and 0 <= self.memory_margin < 0.9, "memory_margin", self.memory_margin,
               "a share of the cap from 0 to 0.9 (0.1 keeps 10% of the cap free)")
        check(self.device_memory_cap_mb is None
              or (is_num(self.device_memory_cap_mb) and self.device_memory_cap_mb > 0),
              "device_memory_cap_mb", self.device_memory_cap_mb, "None or a positive number of MiB")
        check(self.latency_p99_ms is None or (is_num(self.latency_p99_ms) and self.latency_p99_ms > 0),
              "latency_p99_ms", self.latency_p99_ms, "None or a positive number of milliseconds (--latency-p99)")
        check(isinstance(self.worst_case, bool), "worst_case", self.worst_case, "true or false")
        check(is_num(self.tight_spread) and 0 <= self.tight_spread < 1, "tight_spread", self.tight_spread,
              "a share from 0 (measure every window) to 1")
        check(self.part in ("full", "model", "data"), "part", self.part,
              "full (a trial), model (the model alone) or data (the data path alone)")
