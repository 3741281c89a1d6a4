"""Tests of autotune/search/plan/."""
