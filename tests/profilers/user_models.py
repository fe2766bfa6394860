"""User-style modules for the profiler tests, loaded through `ModuleSource("path.py:NAME")` like a user's file."""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 32


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class AllocatesTooMuch(nn.Module):
    """Its forward asks the allocator for 4 PiB: the real out-of-memory error of the device it runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        huge = torch.empty(2**50, dtype=torch.float32, device=x.device)
        return self.fc(x) + huge[0]


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("a bug in the user's forward")


def tiny_mlp(batch_size: int):
    return TinyMLP(), torch.randn(batch_size, FEATURES)


def too_much(batch_size: int):
    return AllocatesTooMuch(), torch.randn(batch_size, FEATURES)


def broken(batch_size: int):
    return Broken(), torch.randn(batch_size, FEATURES)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def tiny_cnn(batch_size: int):
    return TinyCNN(), torch.randn(batch_size, 3, 16, 16)


class Sleepy(nn.Module):
    """A step of known length (the forward sleeps), for the time-budget logic."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(SLEEP_S)
        return self.fc(x)


SLEEP_S = 0.03


def sleepy(batch_size: int):
    return Sleepy(), torch.randn(batch_size, FEATURES)
