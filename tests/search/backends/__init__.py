"""Tests of autotune/search/backends/."""
