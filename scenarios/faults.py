"""Fault descriptions (the scenario's ``faults`` list) and their injection into a run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from twin.schema import NonNegativeFloat, StrictModel


class LinkFault(StrictModel):
    """A link (both directions of a graph edge) goes down or comes back at a fixed time."""

    kind: Literal["link_down", "link_up"]
    time_s: NonNegativeFloat
    link: tuple[int, int] = Field(description="the edge's two device ids")


FaultSpec = Annotated[LinkFault, Field(discriminator="kind")]


def inject(env, fabric, fault, rows: list):
    """Process body: apply ``fault`` at its time and log ``(time, kind, target, action)``."""
    yield env.timeout(fault.time_s)
    u, v = fault.link
    if fault.kind == "link_down":
        fabric.fail_edge(u, v)
        rows.append((env.now, fault.kind, f"{u}-{v}", "reroute"))
    else:
        fabric.restore_edge(u, v)
        rows.append((env.now, fault.kind, f"{u}-{v}", "restore"))
