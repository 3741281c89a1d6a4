"""MLflow: a study as one parent run, each finished trial as a run nested under it, and the recommendation
YAML and the HTML report as the parent's artifacts (``autotune run --mlflow URI``).

Needs MLflow's client (``mlflow-skinny`` is enough): ``pip install "autotune[mlflow]"``.

Why not Optuna's ``optuna_integration.MLflowCallback``: it nests a trial's run only under a parent run the
caller keeps active in MLflow's fluent, thread-local state (optuna/optuna#5148), sets the tracking URI
process-wide, and logs trial user attributes only as string tags (optuna/optuna#2016) and ``trial.params``
(Optuna's encoding of the space) as params, so a trial's peak memory could not be plotted or compared. Here
``MlflowClient`` writes to the given URI without global state, the params are the ``TrialConfig`` that ran,
and the figures are metrics.

The parent run (and only it) is tagged ``autotune.study`` with the study's name and found again by it, so a resumed run
(the same ``autotune run`` again) logs into the same parent; trials already logged under it (tag
``autotune.trial``) are not logged twice, and finished trials not yet logged (a run without ``--mlflow``
before) are logged when the parent is opened.

>>> logger = MLflowLogger("sqlite:///mlflow.db")          # doctest: +SKIP
>>> tuner = Tuner(workload, on_trial=[logger])              # doctest: +SKIP
>>> rec = tuner.run(trials=30)                              # doctest: +SKIP
>>> logger.finish(tuner.study(), rec, report_path="report.html")   # doctest: +SKIP
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from autotune.errors import AutotuneError
from autotune.integrations import require
from autotune.search.record import trials as keys

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

__all__ = ["MLflowLogger", "STUDY_TAG", "TRIAL_TAG", "EXPERIMENT"]

EXPERIMENT = "autotune"
STUDY_TAG = "autotune.study"
TRIAL_TAG = "autotune.trial"
_PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag: the UI nests a run under the run it names
# trial figures (TrialResult.figures() keys, stored as user attributes) logged as metrics
_METRICS = ("median_samples_per_s", "iqr_samples_per_s", "rel_iqr", "peak_host_mb", "peak_device_mb",
            "data_wait_share", "compile_s", "startup_s", "warmup_s", "wall_s", "memory_cap_mb")
_MAX_TAG = 5000


class MLflowLogger:
    """An ``on_trial`` callback for ``Tuner``: logs each finished trial to MLflow as a nested run.

    ``tracking_uri``: any MLflow tracking URI (``sqlite:///mlflow.db``, ``http://host:5000``; a ``file:``
    store only where the installed MLflow still accepts one). Runs go to the experiment ``experiment``; for a
    ``sqlite:`` store it is created with its artifacts beside the database file (``mlflow-artifacts/``)
    rather than in ``./mlruns`` of whatever directory the command ran in.

    A tracking server that fails during a run does not stop the tuning: the failure is reported once through
    ``log`` and later trials are still tried.
    """

    def __init__(self, tracking_uri: str, *, experiment: str = EXPERIMENT,
                 log: Callable[[str], None] | None = None) -> None:
        require("mlflow", "mlflow", what="mlflow")
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.log = log or (lambda msg: warnings.warn(msg, stacklevel=2))
        self.client = self._guard(MlflowClient, tracking_uri)  # a sqlite: store is opened (and made) here
        self._experiment_id: str | None = None
        self._parents: dict[str, str] = {}       # study name -> parent run id
        self._logged: dict[str, set[int]] = {}   # study name -> trial numbers logged under it
        self._failed = False

    # --- the experiment and the parent run --------------------------------------------------------------
    def check(self) -> None:
        """Reach the tracking store now (before hours of trials): ``AutotuneError`` in one line if it cannot."""
        self._guard(self._experiment)

    def _guard(self, call, *args):
        try:
            return call(*args)
        except AutotuneError:
            raise
        except Exception as exc:  # MlflowException, OSError, a connection error of the HTTP client...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "MLFLOW_ALLOW_FILE_STORE" in first:  # MLflow 3 put file: stores in maintenance mode
                first = ("this MLflow refuses file: stores (maintenance mode); give a database, e.g. "
                         "sqlite:///mlflow.db, or export MLFLOW_ALLOW_FILE_STORE=true")
            raise AutotuneError(f"MLflow at {self.tracking_uri}: {first[:300]}") from None

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                self._experiment_id = found.experiment_id
            else:
                self._experiment_id = self.client.create_experiment(self.experiment,
                                                                    artifact_location=self._artifact_location())
        return self._experiment_id

    def _artifact_location(self) -> str | None:
        prefix = "sqlite:///"
        if self.tracking_uri.startswith(prefix) and ":memory:" not in self.tracking_uri:
            db = Path(self.tracking_uri[len(prefix):]).resolve()
            return (db.parent / "mlflow-artifacts").as_uri()
        return None  # MLflow's default for the store (a server's artifact root, a file store's own folder)

    def opened(self, study_name: str) -> bool:
        """Whether this logger has opened (found or made) the parent run of ``study_name``."""
        return study_name in self._parents

    def parent_run(self, study: Study) -> str:
        """The id of the study's parent run: found by its tag, else created; opened again as RUNNING, and the
        study's finished trials not yet logged under it are logged."""
        name = study.study_name
        if name in self._parents:
            return self._parents[name]
        exp = self._experiment()
        runs = self.client.search_runs([exp], filter_string=f"tags.`{STUDY_TAG}` = '{_quote(name)}'",
                                       max_results=1, order_by=["attributes.start_time ASC"])
        if runs:
            run_id = runs[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            ua = study.user_attrs
            tags = {STUDY_TAG: name, "autotune.hardware": str(ua.get(keys.STUDY_HARDWARE) or ""),
                    "autotune.fingerprint": str(ua.get(keys.STUDY_FINGERPRINT) or "")}
            run_id = self.client.create_run(exp, run_name=name, tags=tags).info.run_id
            workload = ua.get(keys.STUDY_WORKLOAD) or {}
            if workload:
                self.client.log_batch(run_id, params=_params({f"workload.{k}": v for k, v in workload.items()}))
        self._parents[name] = run_id
        children = self.client.search_runs([exp], filter_string=f"tags.`{_PARENT_TAG}` = '{run_id}'",
                                           max_results=50000)
        self._logged[name] = {int(r.data.tags[TRIAL_TAG]) for r in children if TRIAL_TAG in r.data.tags}
        for t in study.get_trials(deepcopy=False):
            if t.state.is_finished() and t.number not in self._logged[name]:
                self._log_trial(study, t)
        return run_id

    # --- trials ---------------------------------------------------------------------------------------
    def __call__(self, study: Study, trial: FrozenTrial) -> None:
        """Log ``trial`` (a finished FrozenTrial of ``study``) as a run nested under the study's parent."""
        if self._failed:
            return
        try:
            self.parent_run(study)
            if trial.number not in self._logged[study.study_name]:
                self._log_trial(study, trial)
        except Exception as exc:  # tuning goes on; the logging stops, once said
            self._failed = True
            self.log(f"MLflow logging stopped: {type(exc).__name__}: {str(exc)[:300]}")

    def _log_trial(self, study: Study, trial: FrozenTrial) -> None:
        from mlflow.entities import Metric

        ua = trial.user_attrs
        parent = self._parents[study.study_name]
        status = ua.get(keys.STATUS) or trial.state.name.lower()
        tags = {_PARENT_TAG: parent, TRIAL_TAG: str(trial.number),
                "status": str(status), "state": trial.state.name}
        for key, tag in (("bottleneck", "diagnosis"), ("reason", "reason"), ("duplicate_of", "duplicate_of"),
                         ("node", "node")):
            if ua.get(key) not in (None, ""):
                tags[tag] = str(ua[key])[:_MAX_TAG]
        for role in ("baseline", "likely_winner"):
            if ua.get(role):
                tags["role"] = role
        run = self.client.create_run(self._experiment(), run_name=f"trial {trial.number}", tags=tags,
                                     start_time=_ms(trial.datetime_start))
        config = ua.get(keys.CONFIG) or ua.get(keys.QUEUED_CONFIG) or {}
        stamp = _ms(trial.datetime_complete) or 0
        metrics = [Metric(k, float(ua[k]), stamp, 0) for k in _METRICS if _number(ua.get(k))]
        if trial.value is not None:
            metrics.append(Metric("value", float(trial.value), stamp, 0))
        self.client.log_batch(run.info.run_id, metrics=metrics, params=_params(config))
        self.client.set_terminated(run.info.run_id, status="FINISHED" if trial.state.name != "FAIL" else "FAILED",
                                   end_time=_ms(trial.datetime_complete))
        self._logged[study.study_name].add(trial.number)

    # --- the end of a run -----------------------------------------------------------------------------
    def finish(self, study: Study, rec=None, *, report_path: str | Path | None = None,
               status: str = "FINISHED") -> None:
        """Close the study's parent run with ``status`` (``KILLED`` for an interrupted run): the recommendation
        (its config as ``recommended.*`` tags, its figures as metrics, ``recommendation.yaml``) and ``report_path`` as
        artifacts."""
        from mlflow.entities import Metric

        run_id = self._guard(self.parent_run, study)
        for t in study.get_trials(deepcopy=False):  # e.g. the trial an interrupt failed, after the last callback
            if t.state.is_finished() and t.number not in self._logged[study.study_name]:
                self._guard(self._log_trial, study, t)
        if rec is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "recommendation.yaml"
                rec.to_yaml(path)
                self._guard(self.client.log_artifact, run_id, str(path))
            figures = {"median_samples_per_s": rec.median_samples_per_s, "speedup_vs_baseline": rec.speedup_vs_baseline,
                       "peak_host_mb": rec.peak_host_mb, "peak_device_mb": rec.peak_device_mb}
            metrics = [Metric(k, float(v), 0, 0) for k, v in figures.items() if _number(v)]
            # tags, not params: a resumed run may recommend another config, and MLflow params cannot change
            tags = {f"recommended.{k}": str(v) for k, v in rec.config.to_dict().items()}
            tags.update({"recommended": rec.config.short(), "recommended_trial": str(rec.trial_number)})
            self._guard(self.client.log_batch, run_id, metrics, (), _tags(tags))
        if report_path is not None and Path(report_path).is_file():
            self._guard(self.client.log_artifact, run_id, str(report_path))
        self._guard(self.client.set_terminated, run_id, status)


def _params(d: dict[str, Any]) -> list:
    from mlflow.entities import Param

    return [Param(str(k), "None" if v is None else str(v)[:6000]) for k, v in d.items()]


def _tags(d: dict[str, str]) -> list:
    from mlflow.entities import RunTag

    return [RunTag(k, v[:_MAX_TAG]) for k, v in d.items()]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _ms(when) -> int | None:
    return None if when is None else int(when.timestamp() * 1000)


def _quote(s: str) -> str:
    return s.replace("'", "\\'")
