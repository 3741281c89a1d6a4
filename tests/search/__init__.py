"""Tests of autotune/search/: the tuner at the door here, each room's own tests in its folder (record/, space/, choose/,
plan/, backends/). A package, so test files may share a basename with another folder's."""
