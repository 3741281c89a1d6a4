"""The one place that reaches past Optuna's public API, so an Optuna upgrade that moves a private changes this file.

Optuna (checked against 5.0) has no public way to get from a ``Study`` to its storage, nor from a trial to its
storage trial id without two storage round trips (``storage.get_study_id_from_name(study.study_name)`` then
``get_trial_id_from_study_id_trial_number``); the tuner needs both on every trial (claims, heartbeats, the
twin a worker waits for), so it reads the attributes Optuna itself uses. A live ``optuna.Trial`` has a public
``storage``; ``fail_stale_trials`` is public (experimental); the heartbeat thread is not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

__all__ = ["trial_id", "storage_of", "heartbeat_enabled", "heartbeat"]


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of ``trial`` (unique across the storage's studies; ``trial.number`` is the study's)."""
    return trial._trial_id


def storage_of(study: Study) -> BaseStorage:
    """The storage ``study`` reads and writes (Optuna keeps it private; a live trial's is ``trial.storage``)."""
    return study._storage


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """Whether ``storage`` keeps heartbeats (an RDB storage with ``heartbeat_interval``)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(storage)


def heartbeat(trial: Trial | FrozenTrial, storage: BaseStorage) -> Any:
    """Start ``trial``'s heartbeat thread, as ``Study.optimize`` does (a no-op without heartbeats); end it with
    ``.__exit__(None, None, None)``."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    hb = get_heartbeat_thread(trial_id(trial), storage)
    hb.__enter__()
    return hb
