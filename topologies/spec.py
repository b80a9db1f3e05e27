"""Typed topology description (the ``cluster.topology`` section of a scenario)."""

from __future__ import annotations

from math import prod
from typing import Literal

from pydantic import Field, model_validator

from twin.schema import StrictModel

#: Number of shape dimensions each topology kind takes.
SHAPE_ARITY: dict[str, int] = {"torus2d": 2, "mesh2d": 2}


class TopologySpec(StrictModel):
    """Kind and shape of the device graph.

    ``torus2d`` / ``mesh2d``: ``shape: [X, Y]`` devices along x and y; device ``d`` sits at
    ``(d % X, d // X)``. A torus wraps around in both dimensions, a mesh does not, so mesh edge
    nodes have 3 links and corners 2 instead of 4.
    """

    kind: Literal["torus2d", "mesh2d"]
    shape: tuple[int, ...] = Field(description="devices per dimension")

    @model_validator(mode="after")
    def _arity(self) -> TopologySpec:
        want = SHAPE_ARITY[self.kind]
        if len(self.shape) != want:
            raise ValueError(f"{self.kind} takes a shape of {want} integers, "
                             f"got {len(self.shape)}: {list(self.shape)}")
        if any(n < 1 for n in self.shape):
            raise ValueError(f"every dimension of shape must be >= 1, got {list(self.shape)}")
        return self

    @property
    def num_devices(self) -> int:
        """Number of accelerators in the topology."""
        return prod(self.shape)
