"""``Applied``: the per-call helpers ``Recommendation.apply()`` yields to a training loop (model and input
preparation, autocast, the grad scaler, the accumulation steps). Re-exported by ``recommendation``."""

from __future__ import annotations

from autotune.config import TrialConfig

__all__ = ["Applied"]


class Applied:
    """Per-call helpers of an applied recommendation (see ``Recommendation.apply``)."""

    def __init__(self, config: TrialConfig, device: str, *, accumulation_steps: int = 1) -> None:
        from autotune.machine.device import CPUDevice, CUDADevice

        self.config = config
        # micro-batches per optimizer step: backward each (the loss divided by this), step and zero_grad after
        # the last one
        self.accumulation_steps = accumulation_steps
        self._dev = CPUDevice() if device == "cpu" else CUDADevice(device)

    def prepare_model(self, model):
        import torch

        model = model.to(self._dev.torch_device())
        if self.config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.config.compile_mode != "none":
            model = torch.compile(model, mode=self.config.compile_mode)
        return model

    def prepare_input(self, x, *, non_blocking: bool | None = None):
        nb = self.config.pin_memory if non_blocking is None else non_blocking
        return self._dev.to_device(x, non_blocking=nb, channels_last=self.config.channels_last)

    def autocast(self):
        return self._dev.autocast(self.config.amp)

    def grad_scaler(self):
        return self._dev.grad_scaler(self.config.amp)
