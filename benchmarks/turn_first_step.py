"""Is the first step after a turn's wait slower than the turn's later steps? (Why ``trial.windows`` leaves it untimed.)

Two live processes of one config (resnet18 at 32 px, autotune's own step: SGD with momentum) take turns of ``T``
seconds, each stopped (``SIGSTOP``) while the other runs, as a round by turns (``autotune.trial.lockstep``) runs its
children; every step is timed in the child. Printed per process: the median of the first step of each turn against
the median of the later ones.

    python benchmarks/turn_first_step.py 64 1.0 40      # batch 64, turns of 1 s, 40 turns each (~1.5 min)
    python benchmarks/turn_first_step.py 8 0.25 120

2026-11-29, 2-core Intel Xeon with AMX (``benchmarks/results/turn-first-step-2026-11-29-xeon-amx.txt``): the first
step ran x1.058-x1.066 at batch 64 and x1.023-x1.100 at batch 8, i.e. 3-9 ms more: the other process's data had
taken the caches. A round by turns charged with it would favour the config with fewer, longer turns.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics as st
import sys
import time


def child(conn, bs: int) -> None:
    import torch
    import torchvision

    torch.set_num_threads(2)
    m = torchvision.models.resnet18(weights=None, num_classes=10)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(bs, 3, 32, 32), torch.randint(0, 10, (bs,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    conn.send("ready")
    while (turn_s := conn.recv()) is not None:
        times, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < turn_s:
            a = time.perf_counter()
            step()
            times.append(time.perf_counter() - a)
        conn.send(times)


def main(argv: list[str]) -> int:
    bs, turn_s, turns = int(argv[1]), float(argv[2]), int(argv[3])
    ctx = mp.get_context("spawn")
    procs = []
    for _ in range(2):
        a, b = ctx.Pipe()
        p = ctx.Process(target=child, args=(b, bs))
        p.start()
        procs.append((a, p))
        a.recv()
        os.kill(p.pid, signal.SIGSTOP)
    first: list[list[float]] = [[], []]
    later: list[list[float]] = [[], []]
    for _ in range(turns):
        for i, (a, p) in enumerate(procs):
            os.kill(p.pid, signal.SIGCONT)
            a.send(turn_s)
            t = a.recv()
            os.kill(p.pid, signal.SIGSTOP)
            first[i].append(t[0])
            later[i] += t[1:]
    for a, p in procs:
        os.kill(p.pid, signal.SIGCONT)
        a.send(None)
        p.join()
    for i in range(2):
        f, rest = st.median(first[i]), st.median(later[i])
        print(f"proc {i}: first step after a wait median {1000 * f:.1f} ms ({len(first[i])}), later steps "
              f"{1000 * rest:.1f} ms ({len(later[i])}): x{f / rest:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
