"""Deterministic choices from a random stream, as both kinds' families and captions make them."""
from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def choose(rng: np.random.Generator, options: Sequence[T]) -> T:
    """One of ``options``, uniformly, consuming one integer draw."""
    return options[int(rng.integers(len(options)))]


class Picker:
    """Choices from a fixed vector of uniforms, one per call: the stream consumed does not depend on the options,
    so captions of a family's members (same caption seed) pick the same slots."""

    def __init__(self, u: np.ndarray) -> None:
        self.u = u
        self.i = 0

    def uniform(self) -> float:
        """The next uniform in [0, 1)."""
        x = float(self.u[self.i])
        self.i += 1
        return x

    def pick(self, options: Sequence[T]) -> T:
        """One of ``options``, by the next uniform."""
        return options[int(self.uniform() * len(options))]
