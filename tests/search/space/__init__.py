"""Tests of autotune/search/space/."""
