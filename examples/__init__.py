"""Runnable examples for autotune (a package so ``examples.custom_workload:build`` imports from the repo root)."""
