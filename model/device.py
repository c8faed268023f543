"""The one device rule of the CPU/GPU-agnostic parts (evaluation, first stage, miner, backbone training).

`None` or "auto" = cuda when a GPU is visible, else cpu. Inside Ray, a task or replica given no GPU
sees none (Ray empties CUDA_VISIBLE_DEVICES), so "auto" follows the resources it was given.
"""
from __future__ import annotations

from typing import Optional, Union

import torch


def pick_device(name: Optional[Union[str, torch.device]] = None) -> torch.device:
    """torch.device for a name ("cpu", "cuda", "cuda:1", "auto"/None); asking for a GPU where none is visible raises."""
    if name is None or str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but no CUDA device is visible here")
    return device
