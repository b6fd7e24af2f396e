"""The plugin's staged host copy of a step's tensors waits on an event of the tensors' own device:
SGLang's DSpark also runs on NPU and XPU, where a CUDA event would not exist."""

from __future__ import annotations

import torch

from sglang_dspark.sglang_plugin.observer import _Staged


class _OnDevice:
    """A tensor as seen by the staging code, on a device this host has no torch backend for."""

    def __init__(self, value: torch.Tensor, device: str):
        self.value, self.device = value, torch.device(device)

    def detach(self):
        return self

    def to(self, where, non_blocking=False):
        assert where == "cpu" and non_blocking  # a device copy is asynchronous, never a sync
        return self.value.clone()


def test_a_step_on_an_accelerator_is_staged_with_that_devices_event(monkeypatch):
    asked = []

    class Event:
        def __init__(self):
            self.recorded = False

        def record(self):
            self.recorded = True

        def query(self):
            return self.recorded

    def device_module(device):
        asked.append(torch.device(device).type)
        return type("DeviceModule", (), {"Event": Event})

    monkeypatch.setattr(torch, "get_device_module", device_module)
    staged = _Staged.stage(lens=_OnDevice(torch.tensor([3, 1]), "xpu"), ids=None)
    assert asked == ["xpu"] and isinstance(staged.event, Event) and staged.ready()
    assert staged.tensors["lens"].tolist() == [3, 1] and staged.tensors["ids"] is None


def test_a_step_on_the_cpu_needs_no_event():
    staged = _Staged.stage(lens=torch.tensor([2]))
    assert staged.event is None and staged.ready() and staged.tensors["lens"].tolist() == [2]
