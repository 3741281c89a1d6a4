"""Under DDP (gloo, two ranks started by torchrun, as ``rec.launch_command()`` starts them) each rank measures its
own steps and keeps its own record (rank r of N) in the study; only rank 0 logs the line, and one more with every
rank's figures, read from the ranks' records."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.test_ddp_launch import _rec

_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from autotune.field import FieldSpec
from autotune.recommendation import Recommendation

rec = Recommendation.from_yaml(sys.argv[1])
dist.init_process_group("gloo")
with rec.apply(field=FieldSpec(window_s=0.05)) as run:
    model = run.prepare_model(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = 8 + 4 * dist.get_rank()  # rank 1's batches are larger: its record must say its own samples
    for step in range(40):
        for micro in range(run.accumulation_steps):
            with run.no_sync(model, micro):
                model(run.prepare_input(torch.randn(batch, 16))).sum().backward()
        opt.step()
        opt.zero_grad()
    field = run._field
field.stop(log=True)
with open(os.path.join(sys.argv[2], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(field.to_dict(), f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_each_rank_measures_itself_and_rank_0_logs_the_line(tmp_path):
    import optuna

    rec = _rec()  # its study: sqlite:///t.db, relative to the launch's working folder
    optuna.create_study(study_name=rec.study_name, storage=f"sqlite:///{tmp_path / 't.db'}")
    rec.to_yaml(tmp_path / "best.yaml")
    (tmp_path / "train.py").write_text(_SCRIPT)
    line = rec.launch_command(str(tmp_path / "train.py"), str(tmp_path / "best.yaml"), str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run(line.replace(" torchrun ", f" {shlex.quote(torchrun)} ", 1), shell=True, env=env,
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["steps"]) for r in ranks] == [(0, 2, 40), (1, 2, 40)]
    # samples per step: the rank's own micro-batch (8, 12) x the accumulation steps
    acc = rec.accumulation_steps
    for r, batch in zip(ranks, (8, 12)):
        assert r["window_list"] and all(w["samples_per_s"] * w["s"] == pytest.approx(batch * acc * w["steps"], rel=1e-3)
                                        for w in r["window_list"])
    said = [x for x in out.stderr.splitlines() if x.startswith("autotune field: ")]
    assert len([x for x in said if x.startswith(("autotune field: your run", "autotune field: too short"))]) == 1, said
    both = [x for x in said if " ranks: " in x]
    assert len(both) == 1 and both[0].startswith("autotune field: 2 of 2 ranks: rank 0 "), said
    assert ", rank 1 " in both[0] and "did not report" not in both[0], both
