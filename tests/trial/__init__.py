"""Tests of autotune/trial/ (a package, so test files may share a basename with another folder's)."""
