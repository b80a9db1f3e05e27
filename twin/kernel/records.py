"""The sink agents write their records to (kernel interface; the run supplies a trace-writing
implementation, tests may supply their own). The base class drops everything."""

from __future__ import annotations


class Recorder:
    """Receives records from agents. Every method is a no-op here."""

    def op(self, cls: int, iteration: int, stream: str, kind: str, name: str, mb: int,
           chunk: int, layer: int, t0: float, t1: float, flops: float) -> None:
        """One executed operation of a rank class (times in s, FLOPs per device)."""

    def message(self, record) -> None:
        """One finished communication phase (a named tuple whose fields are the columns)."""
