"""Lightning: what a recommendation gives ``Trainer`` and the DataModule's DataLoaders, and ``AutotuneCallback``,
which applies the process-wide settings for the length of a fit.

Needs ``lightning`` (or the older ``pytorch_lightning``): ``pip install "autotune[lightning]"``. Reached through
``Recommendation.lightning()``, which imports this module only when called.

>>> lt = rec.lightning()                                                     # doctest: +SKIP
>>> trainer = L.Trainer(max_epochs=3, **lt.trainer_kwargs, callbacks=[lt.callback])   # doctest: +SKIP
>>> train_loader = DataLoader(train_ds, shuffle=True, **lt.dataloader_kwargs)  # in the DataModule  # doctest: +SKIP
>>> trainer.fit(model, train_loader)                                         # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from autotune.integrations import require

__all__ = ["LightningSettings", "AutotuneCallback", "settings", "trainer_kwargs", "PRECISION"]


def _lightning():
    """``lightning.pytorch``, else ``pytorch_lightning`` (the same Trainer under its older name)."""
    try:
        import lightning.pytorch as pl

        return pl
    except ImportError:
        return require("pytorch_lightning", "lightning", what="lightning")


pl = _lightning()

# the recommendation's autocast mode -> Lightning's precision string
PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def trainer_kwargs(rec) -> dict[str, Any]:
    """``Trainer(**trainer_kwargs(rec))``: the device it was measured on, the precision, and the gradient
    accumulation (``rec.accumulation_steps``: global batch / batch size when tuned with a global batch, else 1).
    Measured as N DDP ranks: ``devices=N`` and ``strategy="ddp"``, or a ``DDPStrategy`` carrying DDP's arguments
    where they differ from DDP's defaults (Lightning passes its extra keyword arguments to DDP), with the backend
    the ranks used; Lightning shards the data and skips the all-reduce on accumulation batches itself."""
    device = rec.workload.device
    if device == "cpu":
        accelerator, devices = "cpu", 1
    else:
        accelerator, devices = "gpu", [int(device.split(":", 1)[1])] if ":" in device else 1
    out = {"accelerator": accelerator, "devices": devices, "precision": PRECISION[rec.config.amp],
           "accumulate_grad_batches": rec.accumulation_steps}
    if rec.world_size > 1:
        out.update(devices=rec.world_size, strategy=_strategy(rec))
    return out


def _strategy(rec) -> Any:
    from autotune.config import TrialConfig

    ddp = {k: v for k, v in rec.config.ddp_kwargs().items() if v != TrialConfig.__dataclass_fields__[k].default}
    if not ddp:
        return "ddp"
    return pl.strategies.DDPStrategy(process_group_backend=rec.ddp_backend, **ddp)


class AutotuneCallback(pl.Callback):
    """Applies a recommendation's process-wide settings when a fit starts and restores them when it ends
    (``teardown``: also after an exception).

    At ``on_fit_start`` (the module is on its device by then): ``Recommendation.apply()`` (intra-/inter-op
    threads, cudnn.benchmark on a GPU, the malloc mode), channels_last on the module's weights, and
    ``LightningModule.compile(mode=...)`` in place (only its ``forward``, through ``__call__``, is compiled).
    Inputs stay as the DataLoader gives them: convolutions follow the weights' channels_last layout.
    Thread counts the OpenMP runtime read at start-up are set by the launch environment, not here
    (``rec.launch_env()``).
    The fit is measured (``field``, on by default): a step per training batch through Lightning's batch hooks,
    validation as the loop's own work; ``field()`` gives the line, which the fit's end logs too.
    """

    def __init__(self, rec, *, field=True) -> None:
        self.rec = rec
        self._undo: contextlib.ExitStack | None = None
        self._field_spec = field  # True, a FieldSpec, or False: measure the fit (autotune.field)
        self.field_run = None

    def on_fit_start(self, trainer, pl_module) -> None:
        import torch

        from autotune.machine.device import channels_last_model

        undo = contextlib.ExitStack()
        undo.enter_context(self.rec.apply(field=False))  # measured here, through Lightning's batch hooks
        if self._field_spec:
            # one step per training batch (accumulation's micro-batches each), its samples the batch's own
            self.field_run = self.rec.field_run(spec=None if self._field_spec is True else self._field_spec,
                                                source="lightning", steps="callback", accumulation=1).start()
            undo.callback(self.field_run.stop)
        config = self.rec.config
        if config.channels_last:
            channels_last_model(pl_module)  # a lazy module (LazyLinear) converts at its first forward
            undo.callback(channels_last_model, pl_module, torch.contiguous_format)
        if config.compile_mode != "none":
            pl_module.compile(mode=config.compile_mode)
            undo.callback(_uncompile, pl_module)
        self._undo = undo

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.field_run is not None:
            self.field_run.batch_start(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.field_run is not None:
            self.field_run.step_end()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.field_run is not None:  # validation inside the fit: the loop's own work, not the data wait
            self.field_run.evaluating()

    def field(self) -> str:
        """How the fit stands against what the trials measured, in one line (``autotune.field``)."""
        return self.field_run.line() if self.field_run is not None else "autotune field: off"

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._undo is not None:
            undo, self._undo = self._undo, None
            undo.close()


def _uncompile(module) -> None:
    # nn.Module.compile() keeps the compiled call in _compiled_call_impl and torch has no public way back;
    # clearing it makes __call__ run the eager forward again.
    if getattr(module, "_compiled_call_impl", None) is not None:
        module._compiled_call_impl = None


@dataclass(frozen=True)
class LightningSettings:
    """What to pass where: ``Trainer(**trainer_kwargs, callbacks=[callback])`` and
    ``DataLoader(dataset, **dataloader_kwargs)`` in the DataModule's ``*_dataloader`` methods."""

    trainer_kwargs: dict[str, Any]
    dataloader_kwargs: dict[str, Any]
    callback: AutotuneCallback

    @property
    def callbacks(self) -> list:
        return [self.callback]


def settings(rec) -> LightningSettings:
    """The Lightning settings of a recommendation (``Recommendation.lightning()``)."""
    return LightningSettings(trainer_kwargs=trainer_kwargs(rec), dataloader_kwargs=rec.dataloader_kwargs(),
                             callback=AutotuneCallback(rec))
