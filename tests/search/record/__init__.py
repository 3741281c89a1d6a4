"""Tests of autotune/search/record/."""
