"""Search spaces: load a YAML file, validate it, trim it to the hardware, and turn an Optuna trial into a config.

A space file (see ``search_spaces/cpu.yaml``) lists parameters, each with a type (``int``, ``bool``,
``categorical``) and either ``choices`` or ``low``/``high``; ``when: "num_workers > 0"`` makes a parameter
conditional on an earlier one. ``fixed`` pins knobs that are not searched; ``baseline`` is the first trial.
The value ``cores`` stands for the cores this process may use.

With N DDP ranks (``Workload.nproc_per_node``, ``for_ranks``) the threads and DataLoader workers are per rank and
share the usable cores, each rank its share (usable cores // N) unless the space says ``oversubscribe``: its
workers at most the share, its intra-op threads what the workers leave, at least one (``effective``), so the ranks'
threads together stay within the cores; DDP's own arguments (``config.DDP_KNOBS``) are searched then, and only then
(``search.space.rank_space``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any


from autotune.machine.malloc import PRELOAD_LIBS, install_hint, preload_path
from autotune.config import KNOBS, TrialConfig, device_family
from autotune.search.space.likely import LIKELY_WINNERS, likely_params
from autotune.search.space.param import Param
from autotune._yaml import read_yaml
from autotune.errors import SpaceError

if TYPE_CHECKING:
    from optuna import Trial

__all__ = ["Param", "SearchSpace", "load_space", "default_space_path", "fit_workload", "space_for"]

_KNOBS = {f.name for f in dataclasses.fields(TrialConfig)}
_TYPES = ("int", "bool", "categorical")
_WHEN = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")
_TOP_KEYS = {"name", "device", "oversubscribe", "parameters", "fixed", "baseline", "description"}


@dataclass
class SearchSpace:
    """A validated space. ``params`` are in sampling order; ``notes`` say what trimming removed and why."""

    name: str
    device: str
    params: list[Param]
    fixed: dict[str, Any]
    baseline: dict[str, Any]
    oversubscribe: bool = False
    usable_cores: int = 1
    source: str = "<memory>"
    notes: list[str] = field(default_factory=list)
    ranks: int = 1  # DDP ranks per trial sharing the usable cores (``for_ranks``)
    # the loader's memory held to this machine's limits (``search.space.loader_fit.LoaderFit``); None: not checked
    loader: Any = None
    # the CPU's kind (``Hardware.cpu_kind``) the likely winners are read for (``search.space.likely``); None: a GPU
    # space or an unknown machine (the default's)
    cpu_kind: str | None = None

    @property
    def rank_cores(self) -> int:
        """The usable cores each rank has for its threads and workers: all of them for one process."""
        return max(1, self.usable_cores // self.ranks)

    # --- sampling ---------------------------------------------------------------------------------------
    def suggest(self, trial: Trial) -> TrialConfig:
        """Ask an Optuna trial for one point and return the config that will really run (see ``effective``)."""
        values: dict[str, Any] = {}
        for p in self.params:
            if not p.holds(values):
                continue
            if p.type == "int" and _is_range(p.choices):
                values[p.name] = trial.suggest_int(p.name, p.choices[0], p.choices[-1])
            else:
                values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        return self.effective(values)

    def effective(self, params: dict[str, Any]) -> TrialConfig:
        """The config that runs for sampled ``params``: fixed knobs added, threads clamped to the cores, the loader
        to what the machine's shared memory holds in flight (``loader``: a smaller prefetch, then fewer workers).

        Clamping (rather than sampling threads from a range that depends on the workers) keeps every
        parameter's distribution fixed, which Optuna's samplers need; the clamped config is what is stored.
        """
        values = {**self.fixed, **{k: v for k, v in params.items() if k in _KNOBS}}
        cores = self.rank_cores
        if not self.oversubscribe:
            values["num_workers"] = min(int(values.get("num_workers", 0)), cores)
        if self.loader is not None:  # the loader's batches in flight fit this machine (search.space.loader_fit)
            values = self.loader.clamp(values)
        if not self.oversubscribe:
            # Workers may take every core (a GPU's training process, or a small model's, needs little CPU: the
            # ceilings measure it, search.record.ceilings); the threads get what the workers leave, at least one.
            workers = int(values["num_workers"])
            if self.ranks > 1 and not values.get("intra_op_threads"):
                values["intra_op_threads"] = cores  # torch's default would give every rank all the cores
            if values.get("intra_op_threads"):
                values["intra_op_threads"] = max(1, min(int(values["intra_op_threads"]), cores - workers))
            if values.get("inter_op_threads"):
                values["inter_op_threads"] = max(1, min(int(values["inter_op_threads"]), cores))
        return TrialConfig(**values)

    def baseline_params(self) -> dict[str, Any]:
        """The baseline as Optuna params (only searched names), for ``study.enqueue_trial``."""
        names = {p.name for p in self.params}
        return {k: v for k, v in self.baseline.items() if k in names}

    def baseline_config(self) -> TrialConfig:
        return self.effective(self.baseline)

    LIKELY_WINNERS = LIKELY_WINNERS  # search.space.likely: the knob values that usually win

    def likely_params(self) -> dict[str, Any] | None:
        """The baseline with the usual winners this space offers switched on (Optuna params), or None when
        that is the baseline itself (``search.space.likely``). The tuner runs it right after the baseline."""
        return likely_params(self)

    def batch_step(self, params: dict[str, Any], direction: int) -> dict[str, Any] | None:
        """``params`` with the batch size one choice up (``direction`` +1) or down (-1), or None at the end of
        the choices or when the batch size is not searched (a ``low``/``high`` range is doubled or halved
        inside it). The tuner walks it from the likely winner.

        >>> sp = space_from_dict({"parameters": {"batch_size": {"type": "int", "choices": [16, 32, 64]}},
        ...                       "baseline": {"batch_size": 32}})
        >>> sp.batch_step({"batch_size": 32}, +1), sp.batch_step({"batch_size": 64}, +1)
        ({'batch_size': 64}, None)
        """
        p = next((p for p in self.params if p.name == "batch_size"), None)
        if p is None or params.get("batch_size") not in p.choices:
            return None
        if _is_range(p.choices):  # low..high: double or halve inside it, as batch sizes usually go
            b = params["batch_size"]
            nxt = b * 2 if direction > 0 else b // 2
            return {**params, "batch_size": nxt} if p.choices[0] <= nxt <= p.choices[-1] and nxt != b else None
        ordered = sorted(p.choices)
        i = ordered.index(params["batch_size"]) + (1 if direction > 0 else -1)
        return {**params, "batch_size": ordered[i]} if 0 <= i < len(ordered) else None

    def size(self) -> int:
        """How many distinct raw points the space has (conditions ignored; an upper bound)."""
        n = 1
        for p in self.params:
            n *= len(p.choices) + (1 if p.when else 0)
        return n

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "device": self.device, "oversubscribe": self.oversubscribe,
            "usable_cores": self.usable_cores, "source": self.source,
            "parameters": {p.name: {"type": p.type, "choices": list(p.choices),
                                    **({"when": " ".join(map(str, p.when))} if p.when else {})}
                           for p in self.params},
            "fixed": self.fixed, "baseline": self.baseline, "notes": self.notes,
            **({"ranks": self.ranks} if self.ranks > 1 else {}),
            **({"loader_memory": self.loader.to_dict()} if self.loader is not None else {}),
        }

    def describe(self) -> str:
        ranks = f", {self.ranks} ranks x {self.rank_cores} each" if self.ranks > 1 else ""
        lines = [f"search space {self.name} ({self.source}), {self.usable_cores} usable cores{ranks}"]
        for p in self.params:
            cond = f"  when {' '.join(map(str, p.when))}" if p.when else ""
            lines.append(f"  {p.name:<20} {list(p.choices)}{cond}")
        for k, v in self.fixed.items():
            lines.append(f"  {k:<20} fixed {v!r}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _is_range(choices: tuple) -> bool:
    return len(choices) > 2 and all(isinstance(c, int) for c in choices) and \
        list(choices) == list(range(choices[0], choices[-1] + 1))


def default_space_path(device: str) -> Path:
    family = device_family(device)
    try:
        return Path(str(resources.files("autotune.search_spaces").joinpath(f"{family}.yaml")))
    except ModuleNotFoundError:  # a source checkout never installed, or an editable install whose checkout moved
        return Path(__file__).resolve().parents[3] / "search_spaces" / f"{family}.yaml"


def _parse_scalar(raw: Any, cores: int, knob: str | None = None) -> Any:
    """A value from the YAML: ``cores`` is this machine's usable cores; a knob that takes words gets back the
    word YAML 1.1 read as a boolean (an unquoted ``off`` is false: ``amp: [off, bf16]`` means amp off)."""
    if raw == "cores":
        return cores
    words = _WORDS.get(knob or "", ())
    if isinstance(raw, bool) and ("on" if raw else "off") in words:
        return "on" if raw else "off"
    return raw


_WORDS = {k.field: k.choices for k in KNOBS if k.kind == "choice"}
_YAML_BOOL = " (YAML reads an unquoted yes/no/on/off as true/false: write the word in quotes)"


def load_space(path: str | Path | None = None, *, hardware=None, device: str = "cpu") -> SearchSpace:
    """Load, validate and trim a space. Errors name the file, the key and the fix.

    ``hardware`` (from ``autotune.machine.hardware.detect``) drives the trimming; without it the file is only validated
    (``cores`` then means this machine's usable cores).
    """
    if hardware is None:
        from autotune.machine.hardware import detect

        hardware = detect(with_torch=False)
    path = Path(path) if path is not None else default_space_path(device)
    src = str(path)
    doc = read_yaml(path, SpaceError, label=f"search space {src}",
                    not_text="a search space is YAML (see search_spaces/cpu.yaml)")
    return space_from_dict(doc, hardware=hardware, source=src, device=device)


def space_from_dict(doc: Any, *, hardware, source: str = "<memory>", device: str = "cpu") -> SearchSpace:
    src = source
    if not isinstance(doc, dict):
        raise SpaceError(f"{src}: a search space is a mapping with a 'parameters' key, got {type(doc).__name__}")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise SpaceError(f"{src}: unknown top-level key(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(_TOP_KEYS))}")
    params_doc = doc.get("parameters")
    if not isinstance(params_doc, dict) or not params_doc:
        raise SpaceError(f"{src}: 'parameters' must be a non-empty mapping of knob name to definition")
    cores = max(1, int(hardware.usable_cores))
    space_device = str(doc.get("device", device))
    is_cpu = space_device == "cpu"
    # bf16 is kept where the GPU the trials will run on has it: cuda:N names it, a plain cuda space means cuda
    trial_device = "cpu" if is_cpu else device if device.startswith("cuda") else "cuda"
    notes: list[str] = []

    def trim(name: str, choices: list) -> list:
        return _trim(name, choices, hardware=hardware, is_cpu=is_cpu, cores=cores, notes=notes,
                     oversubscribe=bool(doc.get("oversubscribe", False)), device=trial_device)

    params: list[Param] = []
    seen: dict[str, Param] = {}
    for name, spec in params_doc.items():
        where = f"{src}: parameters.{name}"
        ptype, choices = _param_choices(name, spec, where, cores)
        when = _param_when(spec, where, seen)
        for c in choices:  # every choice must make a valid config on its own
            try:
                TrialConfig(**{name: c})
            except Exception as exc:  # ConfigError
                raise SpaceError(f"{where}: choice {c!r} is invalid: {exc}"
                                 f"{_YAML_BOOL if isinstance(c, bool) else ''}") from None
        choices = trim(name, choices)
        if not choices:
            raise SpaceError(f"{where}: no choice is usable on this machine ({'; '.join(notes[-1:])})")
        seen[name] = Param(name, ptype, tuple(choices), when)
        params.append(seen[name])
    fixed = _fixed(doc, src, seen, cores, trim, notes)
    baseline = _baseline(doc, src, params, cores, notes)
    oversubscribe = doc.get("oversubscribe", False)
    if not isinstance(oversubscribe, bool):
        raise SpaceError(f"{src}: oversubscribe must be true or false")
    space = SearchSpace(name=str(doc.get("name", Path(src).stem)), device=space_device, params=params,
                        fixed=fixed, baseline=baseline, oversubscribe=oversubscribe, usable_cores=cores,
                        source=src, notes=notes, cpu_kind=getattr(hardware, "cpu_kind", None) if is_cpu else None)
    try:
        space.baseline_config()
    except Exception as exc:
        raise SpaceError(f"{src}: baseline: {exc}") from None
    return space


def _param_choices(name: str, spec: Any, where: str, cores: int) -> tuple[str, list]:
    """A parameter's type and its choices as written (bool, a list, or a low/high range), checked."""
    if name not in _KNOBS:
        raise SpaceError(f"{where}: unknown parameter; allowed: {', '.join(sorted(_KNOBS))}")
    if not isinstance(spec, dict):
        raise SpaceError(f"{where}: must be a mapping like {{type: int, choices: [32, 64]}}")
    extra = set(spec) - {"type", "choices", "low", "high", "when"}
    if extra:
        raise SpaceError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; use type, choices, low/high, when")
    ptype = spec.get("type")
    if ptype not in _TYPES:
        raise SpaceError(f"{where}: type {ptype!r} is not one of {', '.join(_TYPES)}")
    if ptype == "bool":
        if "choices" in spec or "low" in spec:
            raise SpaceError(f"{where}: a bool takes no choices or range; remove them")
        choices: list = [False, True]
    elif "choices" in spec:
        if "low" in spec or "high" in spec:
            raise SpaceError(f"{where}: give either choices or low/high, not both")
        raw = spec["choices"]
        if not isinstance(raw, list) or not raw:
            raise SpaceError(f"{where}: choices must be a non-empty list")
        choices = [_parse_scalar(c, cores, name) for c in raw]
    elif "low" in spec and "high" in spec:
        if ptype != "int":
            raise SpaceError(f"{where}: low/high need type int; use choices for {ptype}")
        low, high = _parse_scalar(spec["low"], cores), _parse_scalar(spec["high"], cores)
        if not (isinstance(low, int) and isinstance(high, int)):
            raise SpaceError(f"{where}: low and high must be whole numbers (or 'cores')")
        if low > high:
            raise SpaceError(f"{where}: low {low} > high {high}; swap them")
        choices = list(range(low, high + 1))
    else:
        raise SpaceError(f"{where}: needs choices: [...] or low: and high:")
    if ptype == "int" and not all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        raise SpaceError(f"{where}: every choice of an int parameter must be a whole number, got {choices}")
    raw_choices = spec.get("choices")
    if isinstance(raw_choices, list) and len(set(map(repr, raw_choices))) != len(raw_choices):
        raise SpaceError(f"{where}: choices repeat a value: {raw_choices}")
    return ptype, list(dict.fromkeys(choices))  # 'cores' may equal a listed number on this machine


def _param_when(spec: dict, where: str, seen: dict[str, Param]) -> tuple | None:
    """A parameter's condition on one listed before it (``when: num_workers > 0``), or None."""
    if "when" not in spec:
        return None
    m = _WHEN.match(str(spec["when"]))
    if not m:
        raise SpaceError(f"{where}: when {spec['when']!r} is not of the form 'other_param > 0'")
    ref, op, raw_value = m.group(1), m.group(2), m.group(3).strip("'\"")
    if ref not in seen:
        raise SpaceError(f"{where}: when refers to {ref!r}, which must be a parameter listed before it")
    # Compare with the referenced choices by their text: YAML 1.1 would read `off` as false.
    by_text = {str(c).lower(): c for c in seen[ref].choices}
    if raw_value.lower() in by_text:
        value = by_text[raw_value.lower()]
    else:
        try:
            value = int(raw_value)
        except ValueError:
            raise SpaceError(f"{where}: when compares {ref} with {raw_value!r}, which is not one of its "
                             f"choices {list(seen[ref].choices)}") from None
    if op not in ("==", "!=") and not isinstance(value, int):
        raise SpaceError(f"{where}: when uses {op} on a non-numeric value {raw_value!r}; use == or !=")
    return (ref, op, value)


def _fixed(doc: dict, src: str, seen: dict[str, Param], cores: int, trim: Any, notes: list[str]) -> dict:
    """The space's fixed knobs, trimmed to the machine (pin_memory on a CPU becomes false, with a note)."""
    fixed = dict(doc.get("fixed") or {})
    for k, v in list(fixed.items()):
        if k not in _KNOBS:
            raise SpaceError(f"{src}: fixed.{k}: unknown parameter; allowed: {', '.join(sorted(_KNOBS))}")
        if k in seen:
            raise SpaceError(f"{src}: {k} is both searched and fixed; remove it from one of them")
        v = _parse_scalar(v, cores, k)
        kept = trim(k, [v])
        if not kept:
            raise SpaceError(f"{src}: fixed.{k}={v!r} cannot run on this machine: {notes[-1]}")
        fixed[k] = kept[0]
    try:
        TrialConfig(**fixed)
    except Exception as exc:
        raise SpaceError(f"{src}: fixed: {exc}") from None
    return fixed


def _baseline(doc: dict, src: str, params: list[Param], cores: int, notes: list[str]) -> dict:
    """The baseline (PyTorch's defaults by convention): an omitted knob takes its plainest choice, thread and
    worker counts are clamped to the usable cores."""
    baseline = {k: _parse_scalar(v, cores, k) for k, v in (doc.get("baseline") or {}).items()}
    for k in baseline:
        if k not in _KNOBS:
            raise SpaceError(f"{src}: baseline.{k}: unknown parameter; allowed: {', '.join(sorted(_KNOBS))}")
    for p in params:  # an omitted baseline knob takes the first choice: the plainest setting by convention
        if p.name not in baseline and p.when is None:
            baseline[p.name] = p.choices[0] if p.type != "bool" else False
        bv = baseline.get(p.name)
        if (p.name in ("intra_op_threads", "inter_op_threads", "num_workers") and isinstance(bv, int)
                and bv not in p.choices):
            clamped = max([c for c in p.choices if c <= bv] or [min(p.choices)])
            notes.append(f"baseline {p.name} {bv} -> {clamped}: this machine has {cores} usable cores")
            baseline[p.name] = clamped
        if p.name in baseline and baseline[p.name] not in p.choices:
            raise SpaceError(f"{src}: baseline.{p.name}={baseline[p.name]!r} is not among the usable choices "
                             f"{list(p.choices)}; pick one of them")
    return baseline


def _trim(name: str, choices: list, *, hardware, is_cpu: bool, cores: int, notes: list[str],
          oversubscribe: bool, device: str = "cpu") -> list:
    kept = list(choices)
    if name == "amp":
        if is_cpu and "fp16" in kept:
            kept.remove("fp16")
            notes.append("amp=fp16 dropped: fp16 autocast is slower than fp32 on CPUs and needs a GPU's GradScaler")
        if "bf16" in kept and not (hardware.cpu_has_bf16 if is_cpu else hardware.gpu_bf16(device)):
            kept.remove("bf16")
            notes.append("amp=bf16 dropped: no native bf16 on this hardware (AVX512-BF16/AMX or GPU compute >= 8.0)"
                         + ("" if is_cpu else f" on {device}, {_gpu_label(hardware, device)}"))
    elif name == "compile_mode":
        if not hardware.can_compile:
            dropped = [c for c in kept if c != "none"]
            kept = [c for c in kept if c == "none"]
            if dropped:
                notes.append(f"compile modes {', '.join(dropped)} dropped: torch.compile needs a C++ compiler "
                             "(g++) and Python's headers (Python.h)")
        if is_cpu and "reduce-overhead" in kept:
            kept.remove("reduce-overhead")
            notes.append("compile_mode=reduce-overhead dropped: it relies on CUDA graphs")
    elif name == "malloc":
        tuned = [c for c in kept if c != "default"]
        if tuned and not (hardware.libc or "").startswith("glibc"):
            kept = [c for c in kept if c == "default"]
            notes.append(f"malloc={'/'.join(tuned)} dropped: it tunes glibc's malloc, and this system has "
                         f"{hardware.libc or 'another C library'}")
        preloads = [c for c in kept if c in PRELOAD_LIBS and preload_path(c) is None]
        if preloads:
            kept = [c for c in kept if c not in preloads]
            notes.append("malloc=" + "/".join(preloads) + " dropped: not installed here ("
                         + "; ".join(install_hint(c) for c in preloads) + ")")
        if "hugepages" in kept and hardware.thp not in ("always", "madvise"):
            kept.remove("hugepages")
            notes.append(f"malloc=hugepages dropped: the kernel's transparent huge pages are "
                         f"{hardware.thp or 'not available'} "
                         "(/sys/kernel/mm/transparent_hugepage/enabled)")
    elif name == "pin_memory" and is_cpu:
        if True in kept:
            notes.append("pin_memory=true dropped: page-locked memory only helps copies to a GPU")
        kept = [False]
    elif name in ("intra_op_threads", "inter_op_threads", "num_workers"):
        # Without oversubscription threads, and workers, stay within the usable cores (a worker may take every
        # core: the training process then keeps one thread; the ceilings measure whether that feeds it).
        over = [c for c in kept if c > cores]
        if over:
            kept = [c for c in kept if c <= cores]
            notes.append(f"{name} {over} dropped: more than the {cores} usable cores")
    return kept


def _gpu_label(hardware, device: str) -> str:
    gpus = hardware.gpus_for(device)
    if not gpus:
        return "which names no visible GPU (CUDA_VISIBLE_DEVICES)"
    return " or ".join(f"gpu {g['index']} ({g['name']}, compute {g['compute_capability']})" for g in gpus)


def fit_workload(space: SearchSpace, workload: Any) -> SearchSpace:
    """``space`` for this workload's data (``workload.data``, read from its first batch by ``workloads.probe``;
    probed here when the workload was not checked): ``channels_last`` is searched only where a batch holds a 4-D
    floating-point tensor, ``bucket_by_length`` only where the workload returns ``length`` (and no sampler of its
    own), and then it is added, off in the baseline, unless the space lists or fixes it. The built-in text workload
    takes the same path (it returns ``length``). A knob taken out is fixed false, with a note; a space with nothing
    to change is returned as is."""
    from autotune.workloads.build import profile
    from autotune.workloads.probe import searches_bucketing, searches_channels_last

    data = workload.data if workload.data is not None else profile(workload)
    params, fixed, baseline, notes = list(space.params), dict(space.fixed), dict(space.baseline), list(space.notes)
    why_not = {"channels_last": None if searches_channels_last(data) else
               f"the batches of {workload.model} hold no 4-D floating-point (image) tensor",
               "bucket_by_length": None if searches_bucketing(data) else
               f"{workload.model} " + ("brings its own sampler" if data.get("sampler") else
                                       "returns no length (item -> int) to group its items by")}
    for drop, why in why_not.items():
        if why and (any(p.name == drop for p in params) or fixed.get(drop) or baseline.get(drop)):
            params = [p for p in params if p.name != drop]
            fixed[drop] = baseline[drop] = False
            notes.append(f"{drop} dropped: {why}")
    if (not why_not["bucket_by_length"] and "bucket_by_length" not in fixed
            and all(p.name != "bucket_by_length" for p in params)):
        params.append(Param("bucket_by_length", "bool", (False, True)))
        baseline["bucket_by_length"] = False
        notes.append(f"bucket_by_length added: {workload.model} returns length, and batches of similar lengths pad "
                     "less (autotune.workloads.probe)")
    if params == space.params and fixed == space.fixed:
        return space
    return dataclasses.replace(space, params=params, fixed=fixed, baseline=baseline, notes=notes)


def space_for(workload: Any, hardware: Any, *, space: SearchSpace | None = None) -> SearchSpace:
    """The space a study of ``workload`` searches: ``space`` (default: the shipped one for its device, trimmed
    to ``hardware``), fitted to the workload's data (``fit_workload``: channels_last only for 4-D image tensors,
    length bucketing only for a workload that returns length), to its ranks (``for_ranks``: threads and workers
    per rank within the cores, DDP's arguments searched), with a global batch, to the batch sizes whose ranks'
    micro-batches divide it (and without CUDA graphs on a GPU: ``workloads.global_batch.restrict_space``), and to
    the loader's memory (``loader_fit.fit_loader_memory``). The one chain every caller uses."""
    from autotune.search.space.rank_space import for_ranks
    from autotune.workloads.global_batch import restrict_space

    from autotune.search.space.loader_fit import fit_loader_memory

    base = space or load_space(hardware=hardware, device=workload.device)
    ranked = for_ranks(base, workload.nproc_per_node)
    restricted = restrict_space(fit_workload(ranked, workload), workload.global_batch, device=workload.device,
                                world_size=workload.nproc_per_node)
    # the loader's batches in flight within the shared memory, descriptors and pinned share (loader_fit)
    return fit_loader_memory(restricted, workload, hardware)
