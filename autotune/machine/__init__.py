"""What the machine is: hardware detection (CPU, cores, memory, GPUs, fingerprint), the device seam (every line
that differs between CPU and CUDA), whether this torch can use the GPU at all, the one out-of-memory predicate, the
host allocator and launch knobs, the memory limits, the environment stamp, and how a child is started and kept
with its parent (``launch``, ``proctree``: the parent-death signal, orphans adopted, a tree taken down).

May import: the records at the package's top (``config``, ``result``, ``measure``, ``errors`` and the private
helpers beside them). Nothing here knows about workloads, trials or searches.
"""
