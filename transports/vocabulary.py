"""Every layer's refusal and fault codes, and the table that maps each onto the one vocabulary, `Reason`.

A layer keeps an enum of its own only where it needs a closed set (a Prometheus label set, an HTTP status table,
the executor's contract, which may not import the wire floor). Each is listed here with its table onto `Reason`;
tests/test_reasons.py checks that every table is total and that every code keeps its spelling, and
scripts/gen_reasons.py writes docs/reference/reasons.md from `Reason` and these tables.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from executor.contract import ErrorKind, QueueReason
from transports.ble.reasons import BleReason
from transports.framing import FrameFault
from transports.hardening.refusals import Refusal
from transports.wire.coordinator_errors import CoordinatorReason
from transports.wire.reasons import ERROR_KINDS, QUEUE_REASONS, WIRE_REFUSALS, Reason


@dataclass(frozen=True)
class Vocabulary:
    name: str  # as the reference page shows it
    codes: type[enum.StrEnum] | None  # None: a set of `Reason` members, not an enum of its own
    onto: Mapping[Any, Reason]  # every code of the layer -> the `Reason` it is


def _same(codes: type[enum.StrEnum]) -> dict[enum.StrEnum, Reason]:
    """A layer enum whose members are spelled from `Reason`: each is the `Reason` of its value."""
    return {code: Reason(code.value) for code in codes}


VOCABULARIES: tuple[Vocabulary, ...] = (
    Vocabulary("refusal on the wire", None, {reason: reason for reason in sorted(WIRE_REFUSALS)}),
    Vocabulary("`queueReason` of a run", QueueReason, QUEUE_REASONS),
    Vocabulary("`errorKind` of a run", ErrorKind, ERROR_KINDS),
    Vocabulary("frame on a stream", FrameFault, _same(FrameFault)),
    Vocabulary("connection defences", Refusal, _same(Refusal)),
    Vocabulary("BLE session", BleReason, _same(BleReason)),
    Vocabulary("coordinator HTTP", CoordinatorReason, _same(CoordinatorReason)),
)


def layers_of(reason: Reason) -> list[tuple[Vocabulary, str]]:
    """Each vocabulary that has `reason`, with the code's spelling there (errorKind hyphenates its own)."""
    return [(v, str(code)) for v in VOCABULARIES for code, onto in v.onto.items() if onto is reason]
