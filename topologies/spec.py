"""Typed topology description (the ``cluster.topology`` section of a scenario).

Kinds and the shape each takes (devices are always addressable on a 2D (or 3D) arrangement,
``coords`` of :class:`~topologies.base.Topology`, so placement and the trace's ``x``/``y``
columns make sense for every kind):

===============  =============  ========================================================
kind             shape          devices / arrangement
===============  =============  ========================================================
``torus2d``      ``[X, Y]``     X*Y; device ``d`` at ``(d % X, d // X)``; wraps both ways
``mesh2d``       ``[X, Y]``     X*Y; same addressing, no wrap (edges have fewer links)
``dragonfly2d``  ``[A, G]``     A*G; ``G`` groups of ``A`` devices, device at ``(a, g)``
``ring``         ``[N]``        N; device ``d`` at ``(d, 0)``
``torus3d``      ``[X, Y, Z]``  X*Y*Z; device at ``(d % X, d // X % Y, d // (X*Y))``
``switched``     ``[G, N]``     G*N; ``N`` nodes of ``G`` GPUs, GPU ``g`` of node ``k``
                                is device ``g + G*k`` at ``(g, k)``
===============  =============  ========================================================

The wiring of each kind is documented in :mod:`topologies.graph`.
"""

from __future__ import annotations

from math import prod
from typing import Literal

from pydantic import Field, model_validator

from twin.kernel.errors import Problem
from twin.kernel.schema import StrictModel

#: Number of shape dimensions each topology kind takes.
SHAPE_ARITY: dict[str, int] = {"torus2d": 2, "mesh2d": 2, "dragonfly2d": 2, "ring": 1,
                               "torus3d": 3, "switched": 2}

#: Topology kinds (the allowed values of ``cluster.topology.kind``).
KINDS: tuple[str, ...] = tuple(SHAPE_ARITY)

#: Fields only the ``switched`` kind takes.
SWITCHED_FIELDS: tuple[str, ...] = ("nics_per_node", "nodes_per_leaf", "oversubscription")

TopologyKind = Literal["torus2d", "mesh2d", "dragonfly2d", "ring", "torus3d", "switched"]


class TopologySpec(StrictModel):
    """Kind and shape of the device graph (and the fat-tree options of ``switched``).

    ``torus2d`` / ``mesh2d``: ``shape: [X, Y]`` devices along x and y; device ``d`` sits at
    ``(d % X, d // X)``. A torus wraps around in both dimensions, a mesh does not, so mesh edge
    nodes have 3 links and corners 2 instead of 4. See the module docstring for other kinds.
    """

    kind: TopologyKind
    shape: tuple[int, ...] = Field(description="devices per dimension")
    nics_per_node: int | None = Field(
        default=None, ge=1, description="switched: InfiniBand NICs per node; default one per "
                                        "GPU on the GPU (rail-optimized); fewer sit on the "
                                        "node's NVSwitch, shared by its GPUs")
    nodes_per_leaf: int | None = Field(
        default=None, ge=1, description="switched: nodes per leaf switch of a rail; default "
                                        "all nodes on one leaf per rail")
    oversubscription: float | None = Field(
        default=None, ge=1.0, allow_inf_nan=False,
        description="switched: leaf down-links per up-link; 1 = full bisection (default)")

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

    def problems(self, prefix: str = "cluster.topology") -> list[Problem]:
        """Kind-specific problems of the options, each naming its field under ``prefix``."""
        out: list[Problem] = []
        if self.kind != "switched":
            for key in SWITCHED_FIELDS:
                value = getattr(self, key)
                if value is not None:
                    out.append(Problem(f"{prefix}.{key}", f"only used by kind switched, not "
                                       f"{self.kind}", value, "leave it out"))
            return out
        gpn = self.shape[0]
        if self.nics_per_node is not None and self.nics_per_node > gpn:
            out.append(Problem(f"{prefix}.nics_per_node", f"more NICs than the {gpn} GPUs of "
                               "a node", self.nics_per_node, f"1..{gpn}"))
        return out
