"""BLE transport: offers from nearby peers over one GATT service (see docs/ble.md).

The node's entry point is `BleTransport.open(...)` (Trio). The simulated radio lives in `transports.ble.sim`; it
imports bumble, so it is not imported here.
"""

from transports.ble.outcomes import SessionOutcome
from transports.ble.policy import ProximityPolicy
from transports.ble.reasons import BleFault, BleReason
from transports.ble.transport import BleBackend, BleRadioTransport, BleTransport

__all__ = [
    "BleBackend",
    "BleFault",
    "BleRadioTransport",
    "BleReason",
    "BleTransport",
    "ProximityPolicy",
    "SessionOutcome",
]
