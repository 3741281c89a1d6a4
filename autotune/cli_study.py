"""The study commands of the CLI (run, show, export): filled in with the tuner."""


def add_study_commands(sub, add_workload_args, add_measure_args) -> None:
    return None
