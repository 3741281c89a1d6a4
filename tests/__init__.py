"""autotune's test suite (a package so child processes can import ``tests.workloads_fixtures``)."""
