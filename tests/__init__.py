"""autotune's test suite, laid out as the package is (machine/, workloads/, trial/, search/, view/, cli/,
integrations/; the door's and the cross-cutting tests at the top).

A package so that child processes can import the workload modules by name (``tests.workloads_fixtures:tiny``,
``tests.study_fixtures``, ``tests.report_fixtures``) and ``tests.helpers``; fixtures are in conftest.py."""
