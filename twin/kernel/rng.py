"""Seeded random streams: one ``numpy.random.Generator`` per named agent, from one seed.

Streams are keyed by name rather than by creation order, so adding an agent never changes the
random numbers another agent sees. ``RngStreams(seed).get("device/17")`` always returns a
generator seeded from ``SeedSequence(seed, spawn_key=(crc32("device/17"),))``.
"""

from __future__ import annotations

import zlib

import numpy as np


def _key(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


class RngStreams:
    """A family of independent generators derived from one root seed.

    Args:
        seed: root seed of the run (recorded in the trace).
    """

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._cache: dict[str, np.random.Generator] = {}

    def sequence(self, name: str) -> np.random.SeedSequence:
        """The ``SeedSequence`` of stream ``name`` (stable across runs and Python versions)."""
        return np.random.SeedSequence(self.seed, spawn_key=(_key(name),))

    def get(self, name: str) -> np.random.Generator:
        """The generator of stream ``name``; the same object on every call within a run."""
        gen = self._cache.get(name)
        if gen is None:
            gen = np.random.Generator(np.random.PCG64(self.sequence(name)))
            self._cache[name] = gen
        return gen

    def fresh(self, name: str) -> np.random.Generator:
        """A new generator for ``name`` positioned at the start of its stream."""
        return np.random.Generator(np.random.PCG64(self.sequence(name)))
