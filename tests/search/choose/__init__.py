"""Tests of autotune/search/choose/."""
