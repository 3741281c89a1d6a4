"""Search spaces: the shipped files load and are trimmed to a (fake) machine, bad files are refused with a
message that names the file and the key, and sampling/clamping give the configs that really run.

Pure unit tests: no child processes. The hardware is the real ``Hardware`` dataclass with chosen fields.
"""

from __future__ import annotations

import dataclasses
import itertools
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.config import TrialConfig
from autotune.errors import AutotuneError, SpaceError
from autotune.machine.hardware import detect
from autotune.search.space.search_space import SearchSpace, default_space_path, load_space, space_from_dict
from tests.helpers import REPO_ROOT, fake_hw

CPU_YAML = REPO_ROOT / "search_spaces" / "cpu.yaml"
CUDA_YAML = REPO_ROOT / "search_spaces" / "cuda.yaml"
_REAL = detect(with_torch=False)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def gpu(cc: str, index: int = 0) -> dict:
    return {"index": index, "name": f"Fake GPU cc{cc}", "memory_total_mb": 16384.0, "driver": "550.54",
            "compute_capability": cc, "uuid": f"GPU-{index:08x}-fake", "pci_bus_id": f"00000000:{index + 1:02X}:00.0"}


def choices(space: SearchSpace, name: str) -> tuple:
    return next(p.choices for p in space.params if p.name == name)


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def small_doc(**over) -> dict:
    doc = {"name": "small", "device": "cpu",
           "parameters": {"batch_size": {"type": "int", "choices": [16, 32]},
                          "num_workers": {"type": "int", "low": 0, "high": "cores"},
                          "prefetch_factor": {"type": "int", "choices": [2, 4], "when": "num_workers > 0"},
                          "intra_op_threads": {"type": "int", "low": 1, "high": "cores"}},
           "baseline": {"batch_size": 16, "num_workers": 0, "intra_op_threads": "cores"}}
    doc.update(over)
    return doc


# --- the shipped spaces --------------------------------------------------------------------------------------

def test_default_space_path_finds_the_shipped_files():
    shipped = default_space_path("cpu").parent
    assert default_space_path("cuda:1") == default_space_path("cuda") == shipped / "cuda.yaml"
    if shipped.resolve() != CPU_YAML.parent.resolve():
        # autotune.search_spaces comes from the editable install's checkout, whatever autotune/ is imported from
        pytest.skip(f"autotune.search_spaces is installed from {shipped}, another checkout than this one")
    assert default_space_path("cpu").read_text() == CPU_YAML.read_text()
    assert default_space_path("cuda:1").read_text() == CUDA_YAML.read_text()


_FIND_SPACE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.path.insert(0, {root!r})
from autotune.search.space.search_space import default_space_path
print(default_space_path("cpu"))
"""


def test_a_source_checkout_that_is_not_installed_finds_its_own_shipped_spaces():
    """Run from a checkout that pip does not know (never installed, or an editable install made from a checkout
    since moved: its finder then finds nothing): the spaces are the checkout's ``search_spaces/``. Before the fix
    it looked under ``autotune/``, where the files never were."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FIND_SPACE.format(root=str(REPO_ROOT))],
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert Path(out) == CPU_YAML


def test_shipped_cpu_space_loads_on_a_plain_cpu():
    from autotune.machine.malloc import preload_path

    # glibc with transparent huge pages: the malloc knob keeps default/retain/hugepages whatever this machine is;
    # tcmalloc stays only where its library is installed (the product's own check), else one note more
    hw = dataclasses.replace(fake_hw(cores=4, flags=("avx2",), compiler=None), libc="glibc 2.36", thp="madvise")
    tcmalloc = preload_path("tcmalloc") is not None
    sp = load_space(hardware=hw, device="cpu")
    assert sp.name == "cpu" and sp.device == "cpu" and sp.usable_cores == 4 and not sp.oversubscribe
    assert sp.source.endswith("cpu.yaml")
    assert choices(sp, "amp") == ("off",)                         # no bf16 without avx512_bf16/amx_bf16
    assert choices(sp, "compile_mode") == ("none",)               # no compiler: only eager
    assert choices(sp, "num_workers") == (0, 1, 2, 3, 4)          # workers may take every core (search.record.ceilings)
    assert choices(sp, "intra_op_threads") == (1, 2, 3, 4)
    assert "fp16" not in choices(sp, "amp")
    assert sp.fixed == {"pin_memory": False, "cudnn_benchmark": False}
    notes = " | ".join(sp.notes)
    assert "amp=bf16 dropped" in notes and "bf16" in notes
    assert "compile modes default, max-autotune dropped" in notes and "compiler" in notes
    assert "num_workers" not in notes
    assert choices(sp, "malloc") == ("default", "retain", "hugepages") + (("tcmalloc",) if tcmalloc else ())
    assert ("malloc=tcmalloc dropped: not installed here (apt-get install libtcmalloc-minimal4" in notes) \
        is not tcmalloc
    assert len(sp.notes) == 2 + (not tcmalloc), sp.notes  # one note per drop, nothing unexplained
    # conditional knobs keep their condition
    pf = next(p for p in sp.params if p.name == "prefetch_factor")
    assert pf.when == ("num_workers", ">", 0) and pf.choices == (2, 4)
    assert "note:" in sp.describe() and "prefetch_factor" in sp.describe()


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_shipped_cpu_space_keeps_bf16_and_compile_where_supported(flag):
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=8, flags=("avx2", flag), compiler="/usr/bin/g++"))
    assert choices(sp, "amp") == ("off", "bf16")
    assert choices(sp, "compile_mode") == ("none", "default", "max-autotune")
    assert not any("bf16" in n or "compile" in n for n in sp.notes)


def test_cpu_trimming_drops_fp16_and_reduce_overhead_with_notes(tmp_path):
    path = write(tmp_path, """\
        device: cpu
        parameters:
          amp: {type: categorical, choices: ["off", "bf16", "fp16"]}
          compile_mode: {type: categorical, choices: ["none", "default", "reduce-overhead", "max-autotune"]}
          pin_memory: {type: bool}
        """)
    sp = load_space(path, hardware=fake_hw(flags=("amx_bf16",), compiler="/usr/bin/g++"))
    assert choices(sp, "amp") == ("off", "bf16")
    assert choices(sp, "compile_mode") == ("none", "default", "max-autotune")
    assert choices(sp, "pin_memory") == (False,)
    notes = " | ".join(sp.notes)
    assert "amp=fp16 dropped" in notes
    assert "reduce-overhead dropped" in notes and "CUDA graphs" in notes
    assert "pin_memory=true dropped" in notes


def test_an_unquoted_off_is_amp_off_and_an_unquoted_on_says_to_quote_it(tmp_path):
    """YAML 1.1 reads an unquoted ``off`` as false: for amp, whose values are words, it means "off" (it was
    refused as "choice False"); a boolean no word stands for is refused with how to write it."""
    path = write(tmp_path, """\
        device: cpu
        parameters:
          amp: {type: categorical, choices: [off, bf16]}
        baseline: {amp: off}
        """)
    sp = load_space(path, hardware=fake_hw(flags=("amx_bf16",), compiler="/usr/bin/g++"))
    assert choices(sp, "amp") == ("off", "bf16") and sp.baseline["amp"] == "off"
    fixed = write(tmp_path, """\
        device: cpu
        parameters:
          batch_size: {type: int, choices: [16, 32]}
        fixed: {amp: off}
        """, name="fixed.yaml")
    assert load_space(fixed, hardware=fake_hw()).fixed["amp"] == "off"
    yes = write(tmp_path, """\
        device: cpu
        parameters:
          amp: {type: categorical, choices: [yes, bf16]}
        """, name="yes.yaml")
    with pytest.raises(SpaceError) as info:
        load_space(yes, hardware=fake_hw())
    assert "choice True is invalid" in str(info.value) and "write the word in quotes" in str(info.value)


def test_reduce_overhead_never_on_cpu_even_when_it_is_the_only_compile_mode(tmp_path):
    path = write(tmp_path, """\
        parameters:
          compile_mode: {type: categorical, choices: ["reduce-overhead"]}
        """)
    with pytest.raises(SpaceError, match=r"space\.yaml: parameters\.compile_mode: no choice is usable"):
        load_space(path, hardware=fake_hw(compiler="/usr/bin/g++"))


@pytest.mark.parametrize("cores", [1, 2, 3, 8])
def test_workers_and_threads_never_exceed_the_cores(tmp_path, cores):
    path = write(tmp_path, """\
        parameters:
          num_workers: {type: int, choices: [0, 1, 2, 4, 8, 16]}
          intra_op_threads: {type: int, choices: [1, 2, 4, 8, 16]}
          inter_op_threads: {type: int, choices: [1, 2, 4, 8, 16]}
        """)
    sp = load_space(path, hardware=fake_hw(cores=cores))
    assert max(choices(sp, "num_workers")) <= cores  # a worker may take every core; the threads then keep one
    assert sp.effective({"num_workers": cores, "intra_op_threads": cores}).intra_op_threads == 1
    assert max(choices(sp, "intra_op_threads")) <= cores
    assert max(choices(sp, "inter_op_threads")) <= cores
    for name in ("num_workers", "intra_op_threads", "inter_op_threads"):
        dropped = [c for c in (0, 1, 2, 4, 8, 16) if c not in choices(sp, name) and (name != "num_workers" or c)]
        if dropped:
            assert any(n.startswith(f"{name} ") and str(dropped[-1]) in n for n in sp.notes), (name, sp.notes)


def test_oversubscribe_true_allows_a_worker_per_core():
    hw = fake_hw(cores=4)
    strict = space_from_dict(small_doc(), hardware=hw)
    loose = space_from_dict(small_doc(oversubscribe=True), hardware=hw)
    assert choices(strict, "num_workers") == choices(loose, "num_workers") == (0, 1, 2, 3, 4)
    # without oversubscription the training process's threads get what the workers leave (at least one)
    assert strict.effective({"num_workers": 3, "intra_op_threads": 4}).intra_op_threads == 1
    assert loose.effective({"num_workers": 3, "intra_op_threads": 4}).intra_op_threads == 4
    assert choices(loose, "intra_op_threads") == (1, 2, 3, 4)
    assert loose.oversubscribe and not strict.oversubscribe


def test_shipped_cpu_space_on_one_core_still_loads():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=1))
    assert choices(sp, "num_workers") == (0, 1)  # the one worker takes the core, the training process one thread
    assert choices(sp, "intra_op_threads") == (1,)
    assert choices(sp, "inter_op_threads") == (1,)
    base = sp.baseline_config()
    assert base.num_workers == 0 and base.intra_op_threads == 1 and base.inter_op_threads == 1


@pytest.mark.parametrize("cc, has_bf16", [("7.5", False), ("8.0", True), ("9.0", True)])
def test_shipped_cuda_space_keeps_fp16_and_bf16_only_from_ampere(cc, has_bf16):
    sp = load_space(CUDA_YAML, hardware=fake_hw(cores=8, gpus=(gpu(cc),)), device="cuda")
    assert sp.device == "cuda"
    amp = choices(sp, "amp")
    assert "fp16" in amp and "off" in amp
    assert ("bf16" in amp) is has_bf16
    assert any("amp=bf16 dropped" in n for n in sp.notes) is (not has_bf16)
    assert "reduce-overhead" in choices(sp, "compile_mode")  # CUDA graphs exist on a GPU
    assert choices(sp, "pin_memory") == (False, True)
    assert choices(sp, "cudnn_benchmark") == (False, True)  # searched: a fixed knob would bind the baseline too
    assert sp.fixed == {}
    base = sp.baseline_config()
    assert base.amp == "off" and base.pin_memory is False and base.intra_op_threads == 8


def test_shipped_cuda_baseline_is_pytorchs_defaults():
    """"Speedup vs defaults" means vs PyTorch's: every knob of the CUDA baseline but the batch size is
    TrialConfig's default, which is PyTorch's (cudnn.benchmark off, inter-op threads left to torch), except
    intra_op_threads: the space searches it from 1 to the usable cores, so the baseline takes "cores"."""
    sp = load_space(CUDA_YAML, hardware=fake_hw(cores=8, gpus=(gpu("8.0"),)), device="cuda")
    base = sp.baseline_config()
    assert base == TrialConfig(batch_size=base.batch_size, intra_op_threads=8)
    assert base.cudnn_benchmark is False and base.inter_op_threads is None
    # the baseline trial is queued as Optuna params and runs what effective() makes of them: the same config
    assert sp.effective(sp.baseline_params()) == base
    # searched configs still get cudnn.benchmark where the sampler picks it
    assert sp.effective({**sp.baseline_params(), "cudnn_benchmark": True}).cudnn_benchmark is True


VOLTA_AMPERE = (gpu("7.0"), gpu("8.6", index=1))


@pytest.mark.parametrize("device, visible, order, has_bf16", [
    ("cuda", None, "PCI_BUS_ID", False),                  # cuda is gpu 0, the Volta: an Ampere beside it is no help
    ("cuda:1", None, "PCI_BUS_ID", True),
    ("cuda", "1", "PCI_BUS_ID", True),                    # the Ampere is the only GPU the trial sees
    ("cuda", "1,0", "PCI_BUS_ID", True),                  # reordered
    ("cuda:1", "1,0", "PCI_BUS_ID", False),
    ("cuda", "GPU-00000001", None, True),                 # by UUID prefix: exact whatever CUDA_DEVICE_ORDER says
    ("cuda", "GPU-00000000-fake,GPU-00000001-fake", None, False),
    ("cuda", "1", None, False),                           # fastest first on mixed GPUs: either one; both must have it
    ("cuda:1", "0", "PCI_BUS_ID", False),                 # no such device
    ("cuda", "", None, False),                            # no GPU visible at all
])
def test_cuda_space_keeps_bf16_by_the_gpu_the_trial_runs_on(device, visible, order, has_bf16):
    hw = fake_hw(gpus=VOLTA_AMPERE, visible=visible, order=order)
    sp = load_space(CUDA_YAML, hardware=hw, device=device)
    assert ("bf16" in choices(sp, "amp")) is has_bf16
    if not has_bf16:
        note = next(n for n in sp.notes if "amp=bf16 dropped" in n)
        assert f"on {device}" in note


def test_cuda_space_bf16_note_names_the_gpu():
    sp = load_space(CUDA_YAML, hardware=fake_hw(gpus=VOLTA_AMPERE, order="PCI_BUS_ID"), device="cuda")
    assert any("on cuda, gpu 0 (Fake GPU cc7.0, compute 7.0)" in n for n in sp.notes), sp.notes


def test_cuda_space_without_compiler_keeps_only_eager():
    sp = load_space(CUDA_YAML, hardware=fake_hw(gpus=(gpu("8.0"),), compiler=None), device="cuda")
    assert choices(sp, "compile_mode") == ("none",)


def test_to_dict_is_yaml_safe_and_describes_the_trimmed_space():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=4, compiler=None))
    d = yaml.safe_load(yaml.safe_dump(sp.to_dict()))
    assert d["parameters"]["compile_mode"]["choices"] == ["none"]
    assert d["parameters"]["prefetch_factor"]["when"] == "num_workers > 0"
    assert d["usable_cores"] == 4 and d["notes"] == sp.notes
    assert sp.size() >= 2


# --- validation: every error names the file and the key ------------------------------------------------------

BAD = {
    "unknown_top_key": ("""\
        parameters:
          batch_size: {type: int, choices: [32]}
        sampler: tpe
        """, ["unknown top-level key", "sampler"]),
    "unknown_param": ("""\
        parameters:
          batch_sise: {type: int, choices: [32]}
        """, ["parameters.batch_sise", "unknown parameter"]),
    "empty_choices": ("""\
        parameters:
          batch_size: {type: int, choices: []}
        """, ["parameters.batch_size", "non-empty list"]),
    "low_above_high": ("""\
        parameters:
          num_workers: {type: int, low: 3, high: 1}
        """, ["parameters.num_workers", "low 3 > high 1"]),
    "non_integer_int_choice": ("""\
        parameters:
          batch_size: {type: int, choices: [32, big]}
        """, ["parameters.batch_size", "whole number", "big"]),
    "float_int_choice": ("""\
        parameters:
          batch_size: {type: int, choices: [32, 64.5]}
        """, ["parameters.batch_size", "whole number"]),
    "bool_with_choices": ("""\
        parameters:
          channels_last: {type: bool, choices: [true]}
        """, ["parameters.channels_last", "bool takes no choices"]),
    "bool_with_range": ("""\
        parameters:
          channels_last: {type: bool, low: 0, high: 1}
        """, ["parameters.channels_last", "bool takes no choices"]),
    "when_refers_to_later_param": ("""\
        parameters:
          prefetch_factor: {type: int, choices: [2, 4], when: "num_workers > 0"}
          num_workers: {type: int, low: 0, high: 1}
        """, ["parameters.prefetch_factor", "'num_workers'", "listed before"]),
    "when_refers_to_unknown_param": ("""\
        parameters:
          prefetch_factor: {type: int, choices: [2, 4], when: "workers > 0"}
        """, ["parameters.prefetch_factor", "'workers'"]),
    "when_malformed": ("""\
        parameters:
          num_workers: {type: int, low: 0, high: 1}
          prefetch_factor: {type: int, choices: [2, 4], when: "num_workers is positive"}
        """, ["parameters.prefetch_factor", "not of the form"]),
    "searched_and_fixed": ("""\
        parameters:
          batch_size: {type: int, choices: [32, 64]}
        fixed:
          batch_size: 32
        """, ["batch_size is both searched and fixed"]),
    "baseline_not_a_choice": ("""\
        parameters:
          batch_size: {type: int, choices: [32, 64]}
        baseline:
          batch_size: 48
        """, ["baseline.batch_size=48", "not among the usable choices"]),
    "invalid_choice_value": ("""\
        parameters:
          batch_size: {type: int, choices: [0, 32]}
        """, ["parameters.batch_size", "choice 0 is invalid", "batch_size=0"]),
    "invalid_categorical_value": ("""\
        parameters:
          amp: {type: categorical, choices: ["off", "fp8"]}
        """, ["parameters.amp", "choice 'fp8' is invalid"]),
    "unknown_type": ("""\
        parameters:
          batch_size: {type: float, choices: [32]}
        """, ["parameters.batch_size", "type 'float'"]),
    "unknown_param_key": ("""\
        parameters:
          batch_size: {type: int, choices: [32], step: 2}
        """, ["parameters.batch_size", "unknown key(s) step"]),
    "choices_and_range": ("""\
        parameters:
          batch_size: {type: int, choices: [32], low: 1, high: 2}
        """, ["parameters.batch_size", "not both"]),
    "range_on_categorical": ("""\
        parameters:
          amp: {type: categorical, low: 1, high: 2}
        """, ["parameters.amp", "low/high need type int"]),
    "no_choices_no_range": ("""\
        parameters:
          batch_size: {type: int}
        """, ["parameters.batch_size", "needs choices"]),
    "repeated_choice": ("""\
        parameters:
          batch_size: {type: int, choices: [32, 32]}
        """, ["parameters.batch_size", "repeat"]),
    "fixed_unknown": ("""\
        parameters:
          batch_size: {type: int, choices: [32]}
        fixed:
          pin_memroy: false
        """, ["fixed.pin_memroy", "unknown parameter"]),
    "fixed_invalid": ("""\
        parameters:
          batch_size: {type: int, choices: [32]}
        fixed:
          compile_mode: fastest
        """, ["fixed", "compile_mode='fastest'"]),
    "baseline_unknown": ("""\
        parameters:
          batch_size: {type: int, choices: [32]}
        baseline:
          workers: 0
        """, ["baseline.workers", "unknown parameter"]),
    "oversubscribe_not_bool": ("""\
        oversubscribe: sometimes
        parameters:
          batch_size: {type: int, choices: [32]}
        """, ["oversubscribe must be true or false"]),
    "no_parameters": ("""\
        name: empty
        """, ["'parameters' must be a non-empty mapping"]),
    "not_a_mapping": ("""\
        - batch_size
        - num_workers
        """, ["a search space is a mapping"]),
    "param_not_a_mapping": ("""\
        parameters:
          batch_size: [32, 64]
        """, ["parameters.batch_size", "must be a mapping"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_space_is_refused_naming_file_and_key(tmp_path, case):
    text, fragments = BAD[case]
    path = write(tmp_path, text, name=f"{case}.yaml")
    with pytest.raises(SpaceError) as info:
        load_space(path, hardware=fake_hw())
    msg = str(info.value)
    assert str(path) in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert "\n" not in msg
    assert isinstance(info.value, AutotuneError)


def test_malformed_yaml_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, """\
        name: broken
        parameters:
          batch_size: {type: int, choices: [32, 64}
          amp: {type: categorical, choices: ["off"]}
        """)
    with pytest.raises(SpaceError) as info:
        load_space(path, hardware=fake_hw())
    msg = str(info.value)
    assert str(path) in msg and "not valid YAML" in msg
    assert "line 3" in msg, msg


def test_missing_file_is_a_space_error(tmp_path):
    with pytest.raises(SpaceError, match=r"cannot read search space .*nope\.yaml"):
        load_space(tmp_path / "nope.yaml", hardware=fake_hw())


def test_binary_file_is_a_space_error(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\xff\xfe")
    with pytest.raises(SpaceError, match="model.pt"):
        load_space(path, hardware=fake_hw())


def test_cores_equal_to_a_listed_choice_is_not_a_repeat(tmp_path):
    path = write(tmp_path, """\
        parameters:
          intra_op_threads: {type: int, choices: [1, 2, cores]}
        """)
    assert choices(load_space(path, hardware=fake_hw(cores=8)), "intra_op_threads") == (1, 2, 8)
    assert choices(load_space(path, hardware=fake_hw(cores=2)), "intra_op_threads") == (1, 2)


def test_when_compares_with_a_categorical_value():
    doc = {"parameters": {"amp": {"type": "categorical", "choices": ["off", "bf16"]},
                          "channels_last": {"type": "bool", "when": "amp == off"}}}
    sp = space_from_dict(doc, hardware=fake_hw(flags=("amx_bf16",)))
    cfg = sp.suggest(optuna.trial.FixedTrial({"amp": "off", "channels_last": True}))
    assert cfg.channels_last is True


def test_fixed_fp16_on_cpu_is_refused_or_dropped(tmp_path):
    path = write(tmp_path, """\
        parameters:
          batch_size: {type: int, choices: [32]}
        fixed:
          amp: fp16
        """)
    try:
        sp = load_space(path, hardware=fake_hw())
    except SpaceError as exc:
        assert "fixed.amp" in str(exc)
    else:
        assert sp.baseline_config().amp != "fp16"


# --- sampling ------------------------------------------------------------------------------------------------

def test_suggest_with_fixed_trial_gives_the_trial_config():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=4, flags=("avx512_bf16",)))
    params = {"batch_size": 32, "num_workers": 2, "prefetch_factor": 4, "persistent_workers": True,
              "amp": "bf16", "channels_last": True, "compile_mode": "default", "intra_op_threads": 2,
              "inter_op_threads": 1, "malloc": "retain"}
    cfg = sp.suggest(optuna.trial.FixedTrial(params))
    assert cfg == TrialConfig(batch_size=32, num_workers=2, prefetch_factor=4, persistent_workers=True,
                              amp="bf16", channels_last=True, compile_mode="default", intra_op_threads=2,
                              inter_op_threads=1, pin_memory=False, cudnn_benchmark=False, malloc="retain")


def test_suggest_without_workers_does_not_ask_for_worker_knobs():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=4))
    # FixedTrial raises if a name it was not given is suggested: the conditional knobs must not be asked
    cfg = sp.suggest(optuna.trial.FixedTrial({"batch_size": 16, "num_workers": 0, "amp": "off",
                                              "channels_last": False, "compile_mode": "none",
                                              "intra_op_threads": 4, "inter_op_threads": 2,
                                              "malloc": "default"}))
    assert cfg.num_workers == 0 and cfg.prefetch_factor is None and cfg.persistent_workers is False
    assert cfg.intra_op_threads == 4


def test_conditional_params_are_suggested_only_when_their_condition_holds():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=4, flags=("avx512_bf16",)))
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    seen_workers = set()
    for _ in range(60):
        trial = study.ask()
        cfg = sp.suggest(trial)
        assert isinstance(cfg, TrialConfig)
        w = trial.params["num_workers"]
        seen_workers.add(w)
        if w > 0:
            assert {"prefetch_factor", "persistent_workers"} <= set(trial.params)
            assert cfg.prefetch_factor == trial.params["prefetch_factor"]
        else:
            assert "prefetch_factor" not in trial.params and "persistent_workers" not in trial.params
            assert cfg.prefetch_factor is None
        # every sampled point is a config that respects the cores
        assert cfg.num_workers <= 4 and cfg.intra_op_threads <= max(1, 4 - cfg.num_workers)
        assert cfg.inter_op_threads <= 4
        study.tell(trial, 1.0)
    assert 0 in seen_workers and len(seen_workers) > 1


def test_suggest_uses_int_ranges_and_categoricals_as_optuna_distributions():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=8))
    study = optuna.create_study()
    trial = study.ask()
    sp.suggest(trial)
    dists = trial.distributions
    assert isinstance(dists["num_workers"], optuna.distributions.IntDistribution)
    assert (dists["num_workers"].low, dists["num_workers"].high) == (0, 8)
    assert isinstance(dists["intra_op_threads"], optuna.distributions.IntDistribution)
    assert isinstance(dists["batch_size"], optuna.distributions.CategoricalDistribution)
    assert dists["batch_size"].choices == (16, 32, 64, 128, 256)


def test_baseline_params_can_be_enqueued():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=4))
    study = optuna.create_study()
    study.enqueue_trial(sp.baseline_params())
    trial = study.ask()
    assert sp.suggest(trial) == sp.baseline_config()


# --- effective: the config that really runs ------------------------------------------------------------------

def test_effective_clamps_threads_to_the_cores_without_oversubscription():
    sp = space_from_dict(small_doc(), hardware=fake_hw(cores=4))
    cfg = sp.effective({"batch_size": 16, "num_workers": 3, "prefetch_factor": 2, "intra_op_threads": 4})
    assert (cfg.num_workers, cfg.intra_op_threads) == (3, 1)
    cfg = sp.effective({"batch_size": 16, "num_workers": 9, "intra_op_threads": 9, "inter_op_threads": 9})
    assert (cfg.num_workers, cfg.intra_op_threads, cfg.inter_op_threads) == (4, 1, 4)
    for w, t in itertools.product(range(0, 6), range(1, 6)):
        cfg = sp.effective({"num_workers": w, "intra_op_threads": t})
        assert cfg.num_workers <= 4 and cfg.intra_op_threads <= max(1, 4 - cfg.num_workers), (w, t, cfg)
        assert cfg.intra_op_threads >= 1


def test_effective_keeps_threads_with_oversubscription():
    sp = space_from_dict(small_doc(oversubscribe=True), hardware=fake_hw(cores=4))
    cfg = sp.effective({"batch_size": 16, "num_workers": 3, "prefetch_factor": 2, "intra_op_threads": 4})
    assert (cfg.num_workers, cfg.intra_op_threads) == (3, 4)


def test_effective_adds_fixed_knobs_and_ignores_non_knobs():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=4))
    cfg = sp.effective({"batch_size": 32, "not_a_knob": 1})
    assert cfg.batch_size == 32 and cfg.pin_memory is False and cfg.cudnn_benchmark is False


def test_shipped_cpu_baseline_is_pytorch_like():
    sp = load_space(CPU_YAML, hardware=fake_hw(cores=6, flags=("amx_bf16",), compiler="/usr/bin/g++"))
    base = sp.baseline_config()
    assert base.num_workers == 0
    assert base.amp == "off"
    assert base.compile_mode == "none"
    assert base.channels_last is False
    assert base.pin_memory is False
    assert base.intra_op_threads == 6  # torch's default: one thread per usable core
    assert base.batch_size == 64
    assert sp.baseline_params() == {"batch_size": 64, "num_workers": 0, "amp": "off", "channels_last": False,
                                    "compile_mode": "none", "intra_op_threads": 6, "inter_op_threads": 2,
                                    "malloc": "default"}


def test_omitted_baseline_knob_takes_the_first_choice():
    doc = {"parameters": {"batch_size": {"type": "int", "choices": [8, 16]}, "channels_last": {"type": "bool"},
                          "amp": {"type": "categorical", "choices": ["off", "bf16"]}}}
    sp = space_from_dict(doc, hardware=fake_hw(flags=("amx_bf16",)))
    assert sp.baseline == {"batch_size": 8, "channels_last": False, "amp": "off"}


def test_malloc_knob_needs_glibc_and_hugepages_needs_the_kernels_thp():
    from autotune.machine.malloc import preload_path

    # tcmalloc is in the shipped space where its library is installed (.ci/run installs it), trimmed elsewhere
    tc = ("tcmalloc",) if preload_path("tcmalloc") else ()
    glibc = load_space(CPU_YAML, hardware=dataclasses.replace(fake_hw(), libc="glibc 2.36", thp="madvise"))
    assert choices(glibc, "malloc") == ("default", "retain", "hugepages") + tc
    assert tc or any("malloc=tcmalloc dropped: not installed here" in n for n in glibc.notes)
    musl = load_space(CPU_YAML, hardware=dataclasses.replace(fake_hw(), libc=None, thp="madvise"))
    assert choices(musl, "malloc") == ("default",)
    assert any("malloc=retain/hugepages/tcmalloc dropped" in n for n in musl.notes)
    assert musl.baseline_config().malloc == "default"
    for thp in ("never", None):
        no_thp = load_space(CPU_YAML, hardware=dataclasses.replace(fake_hw(), libc="glibc 2.36", thp=thp))
        assert choices(no_thp, "malloc") == ("default", "retain") + tc
        assert any("malloc=hugepages dropped" in n and "transparent huge pages" in n for n in no_thp.notes)


def test_likely_winners_switch_on_only_what_the_trimmed_space_offers():
    bf16 = load_space(CPU_YAML, hardware=dataclasses.replace(fake_hw(flags=("avx512_bf16",)), libc="glibc 2.36",
                                                             thp="always"))
    likely = bf16.likely_params()
    # on this CPU kind tcmalloc won where installed (search_spaces/likely.yaml), else retain
    first = "tcmalloc" if "tcmalloc" in choices(bf16, "malloc") else "retain"
    assert likely == {**bf16.baseline_params(), "amp": "bf16", "channels_last": True, "malloc": first}
    only_huge = space_from_dict({"parameters": {"batch_size": {"type": "int", "choices": [8, 16]},
                                                "malloc": {"type": "categorical", "choices": ["default", "hugepages"]}},
                                 "baseline": {"batch_size": 8, "malloc": "default"}},
                                hardware=dataclasses.replace(fake_hw(), libc="glibc 2.36", thp="madvise"))
    assert only_huge.likely_params()["malloc"] == "hugepages"  # the next preference the space offers
    no_bf16 = load_space(CPU_YAML, hardware=dataclasses.replace(fake_hw(flags=("avx2",)), libc=None))
    assert no_bf16.likely_params() == {**no_bf16.baseline_params(), "channels_last": True}  # amp stays off
    only_batch = space_from_dict({"parameters": {"batch_size": {"type": "int", "choices": [8, 16]}},
                                  "baseline": {"batch_size": 8}}, hardware=fake_hw())
    assert only_batch.likely_params() is None  # nothing to switch on: no extra trial


def test_the_likely_winners_are_read_per_cpu_kind_from_measured_data():
    """Issue 50: the bundle is data per CPU kind (search_spaces/likely.yaml), each kind's entry naming the machine,
    the date and the benchmark result it came from (a file in the repository); a kind without one takes the
    default's. The kind is detected from the CPU's flags."""
    from pathlib import Path

    from autotune.search.space.likely import _data, winners_for

    root = Path(__file__).resolve().parents[3]
    for kind, entry in _data()["kinds"].items():
        assert kind in ("amx", "avx512_bf16", "avx2", "arm", "other"), kind
        for run in entry["measured"]:
            assert run["machine"] and str(run["date"]).startswith("2026-") and run["what"], run
            assert (root / run["source"]).is_file(), run["source"]
    kinds = {flags: dataclasses.replace(fake_hw(flags=flags), libc="glibc 2.36", thp="always").cpu_kind
             for flags in (("amx_bf16", "avx512_bf16", "avx2"), ("avx512_bf16", "avx2"), ("avx2",), ())}
    assert list(kinds.values()) == ["amx", "avx512_bf16", "avx2", "other"]
    for flags, kind in kinds.items():
        hw = dataclasses.replace(fake_hw(flags=flags), libc="glibc 2.36", thp="always")
        space = load_space(CPU_YAML, hardware=hw)
        assert space.cpu_kind == kind
        offered = choices(space, "malloc")
        want = next(v for v in winners_for(kind)["malloc"] if v in offered)
        assert space.likely_params()["malloc"] == want, (kind, offered)
    assert winners_for("no such kind") == winners_for(None)


def test_on_a_gpu_the_likely_winners_feed_the_loader_as_every_recipe_does():
    """The shipped cuda space on a 16-core host: trial 1 has 15 workers (Lightning's hint, a core for the training
    process), pinned memory and persistent workers beside the model's usual winners; with 4 DDP ranks, 3 each."""
    from autotune.search.space.rank_space import for_ranks

    a100 = {"index": 0, "name": "NVIDIA A100", "compute_capability": "8.0", "memory_total_mb": 40960.0,
            "memory_free_mb": 40000.0, "driver": "580.82.07", "uuid": "GPU-0", "pci_bus_id": "0000:01:00.0"}
    hw = dataclasses.replace(fake_hw(cores=16, gpus=(a100,)), libc="glibc 2.36", thp="madvise")
    sp = load_space(hardware=hw, device="cuda")
    likely = sp.likely_params()
    assert (likely["num_workers"], likely["pin_memory"], likely["persistent_workers"]) == (15, True, True)
    assert likely["amp"] == "bf16" and likely["channels_last"] is True and likely["cudnn_benchmark"] is True
    assert sp.baseline_params()["num_workers"] == 0  # the baseline stays PyTorch's defaults
    assert for_ranks(sp, 4).likely_params()["num_workers"] == 3
    cpu = load_space(CPU_YAML, hardware=fake_hw(cores=16))
    assert cpu.likely_params() is None or cpu.likely_params().get("num_workers", 0) == 0  # the CPU measures first


def test_the_coordinate_step_tries_a_cpu_kinds_widest_lever_first_and_the_space_order_elsewhere():
    """On the AMX Xeon bf16 left the bundle yet was tiny_vit's largest gain: the stock space's coordinate step there
    tries amp before the loader and the threads (``likely.yaml`` sweep_first); on other kinds, the space's order."""
    from autotune.search.space.likely import sweep_order

    amx = load_space(hardware=fake_hw(cores=2, flags=("avx2", "avx512_bf16", "amx_bf16")))
    avx2 = load_space(hardware=fake_hw(cores=2, flags=("avx2", "fma")))
    assert amx.cpu_kind == "amx" and avx2.cpu_kind == "avx2"
    names = [p.name for p in sweep_order(amx)]
    assert names[0] == "amp" and sorted(names) == sorted(p.name for p in amx.params)
    assert names.index("amp") < names.index("num_workers") < names.index("intra_op_threads")
    assert [p.name for p in sweep_order(avx2)] == [p.name for p in avx2.params]
    assert [p.name for p in amx.params].index("amp") > [p.name for p in amx.params].index("num_workers")


def test_a_step_to_workers_comes_with_persistent_workers_and_a_step_can_still_turn_them_off():
    """The coordinate step's loader move (``num_workers=1``) on the stock space: persistent workers come with it
    (``complete.COMES_ON``; without them every epoch's start forks the workers anew), PyTorch's prefetch of 2 too;
    a config that says otherwise keeps what it says, and without workers neither knob is set."""
    import doctest

    from autotune.search.space import complete as complete_module, param as param_module
    from autotune.search.space.complete import complete

    sp = load_space(CPU_YAML, hardware=fake_hw(cores=2, flags=("avx2", "fma")))
    base = sp.baseline_params()
    on = complete(sp, {**base, "num_workers": 1})
    assert on["persistent_workers"] is True and on["prefetch_factor"] == 2, on
    assert sp.effective(on).persistent_workers is True
    assert complete(sp, {**base, "num_workers": 1, "persistent_workers": False})["persistent_workers"] is False
    # a separation's revert to a baseline that has no value for it (a GPU's likely loader has them on): off
    assert complete(sp, {**base, "num_workers": 1, "persistent_workers": None})["persistent_workers"] is False
    off = complete(sp, {**base, "num_workers": 0, "persistent_workers": True})
    assert "persistent_workers" not in off and "prefetch_factor" not in off
    from autotune.search.record import untried as untried_module  # its example reads conditions by Param.holds

    for module in (complete_module, param_module, untried_module):
        assert doctest.testmod(module).failed == 0, module.__name__
