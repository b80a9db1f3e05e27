"""Power-related scenario options (the ``power`` section).

The basic power model (``devices.accelerator``) needs no options; the detailed energy model
(P-states, regulators, DVFS policies, thermal) adds its keys here.
"""

from __future__ import annotations

from twin.schema import StrictModel


class PowerSpec(StrictModel):
    """Power model options."""
