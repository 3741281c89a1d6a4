"""The user's runs as kept in the study (``autotune.field``): one study user attribute per run, keyed
``field_run:<run id>``, beside the trials and never among them: Optuna's samplers read trials, not study
attributes, so a field run steers no search. Written at intervals by the run itself, so a killed run keeps what
it measured up to its last write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["PREFIX", "stored", "study_sink", "study_records", "trial_data_wait"]

PREFIX = "field_run:"


def stored(study: Study) -> list[dict]:
    """The study's field runs, oldest first."""
    runs = [v for k, v in study.user_attrs.items() if k.startswith(PREFIX) and isinstance(v, dict)]
    return sorted(runs, key=lambda r: (str(r.get("started", "")), str(r.get("run_id", ""))))


def study_sink(storage_url: str, study_name: str) -> Callable[[dict], None]:
    """A callable that writes a field run's record into the study (opened at the first write, in the field run's
    own thread); the study must exist (raises ``StorageError`` or Optuna's ``KeyError`` otherwise)."""
    held: dict[str, Any] = {}

    def write(record: dict) -> None:
        if "study" not in held:
            import optuna

            from autotune.search.record.storage import open_existing_storage

            storage, _ = open_existing_storage(storage_url)
            held["study"] = optuna.load_study(study_name=study_name, storage=storage)
        held["study"].set_user_attr(PREFIX + record["run_id"], record)

    return write


def study_records(storage_url: str, study_name: str) -> Callable[[], list[dict]]:
    """A callable that reads the study's field runs afresh (``stored``): rank 0 reads the other ranks' records."""

    def read() -> list[dict]:
        import optuna

        from autotune.search.record.storage import open_existing_storage

        storage, _ = open_existing_storage(storage_url)
        return stored(optuna.load_study(study_name=study_name, storage=storage))

    return read


def trial_data_wait(storage_url: str, study_name: str, number: int | None) -> float | None:
    """The data wait (share of a step) the recommended trial measured; None where it cannot be read."""
    if number is None:
        return None
    import optuna

    from autotune.search.record.storage import open_existing_storage
    from autotune.search.record.trials import DATA_WAIT_SHARE

    storage, _ = open_existing_storage(storage_url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            v = t.user_attrs.get(DATA_WAIT_SHARE)
            return None if v is None else float(v)
    return None
