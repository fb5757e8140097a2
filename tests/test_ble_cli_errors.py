"""BLE errors at the command line: exit 2 with the problem and the fix, before `ready`, never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.test_ble_hci_process import free_ports, keygen
from transports.ble.hci import AF_BLUETOOTH, BleSetupError, HciSpec

CLI = [sys.executable, "-m", "mesh.cli"]


def edgecoder(*args: str, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *CLI, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return keygen(tmp_path_factory.mktemp("ble-cli") / "k.key")


def assert_refused(done: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""  # no `ready`: the radio is checked before the node starts
    assert "Traceback" not in done.stderr
    for phrase in phrases:
        assert phrase in done.stderr, done.stderr


def kernel_has_bluetooth() -> bool:
    try:
        socket.socket(AF_BLUETOOTH, socket.SOCK_SEQPACKET, 0).close()
    except OSError:
        return False
    return True


def test_ble_without_bluez_exits_2_before_ready_with_the_reason_and_the_fix(key: Path) -> None:
    prefix: list[str] = []
    if kernel_has_bluetooth():
        # The kernel refuses Bluetooth sockets outside the initial network namespace (net/bluetooth/af_bluetooth.c),
        # so a node in a namespace of its own meets the no-Bluetooth refusal on any kernel. Making one takes root.
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            skip_or_fail(
                "this kernel has Bluetooth, and only root can hide it (unshare --net)", "EDGECODER_REQUIRE_NETNS"
            )
        prefix = ["unshare", "--net"]
    done = edgecoder("node", "--key", str(key), "--ble", prefix=prefix)
    assert_refused(done, "this kernel has no Bluetooth support", "Fix:", "--ble-hci usb:0")


@pytest.mark.parametrize(
    "spec", ["usb:xyz", "bogus:1", "hci-socket:zero", "tcp-client:nohost", "tcp-client:127.0.0.1:99999", "serial:"]
)
def test_a_bad_ble_hci_spec_exits_2_saying_how_to_write_it(key: Path, spec: str) -> None:
    assert_refused(edgecoder("node", "--key", str(key), "--ble-hci", spec), "--ble-hci", "Fix:")


def test_an_hci_transport_that_does_not_open_exits_2_with_the_fix(key: Path) -> None:
    (port,) = free_ports(1)  # nothing listens there
    done = edgecoder("node", "--key", str(key), "--ble-hci", f"tcp-client:127.0.0.1:{port}")
    assert_refused(done, "cannot open HCI transport", "ConnectionRefusedError", "bumble.apps.controllers")


def test_two_radios_at_once_are_refused(key: Path) -> None:
    done = edgecoder("node", "--key", str(key), "--ble-sim", "--ble-hci", "usb:0")
    assert_refused(done, "--ble-hci and --ble-sim name two different radios")


def test_offer_over_the_os_stack_is_refused_with_the_reason(key: Path, tmp_path: Path) -> None:
    code = tmp_path / "c.py"
    code.write_text("print(1)\n")
    done = edgecoder("offer", "--key", str(key), "--ble", "--language", "python", "--code-file", str(code))
    assert_refused(done, "not supported", "bless", "--ble-hci")
    done = edgecoder(
        "offer", "--key", str(key), "--to", "/ip4/127.0.0.1/tcp/1", "--ble-hci", "usb:0",
        "--language", "python", "--code-file", str(code),
    )  # fmt: skip
    assert_refused(done, "give exactly one of")
    done = edgecoder(
        "offer", "--key", str(key), "--gossip", "--peer", "/ip4/127.0.0.1/tcp/1", "--ble-link-model", "linux",
        "--language", "python", "--code-file", str(code),
    )  # fmt: skip
    assert_refused(done, "--ble-link-model paces a --ble-hci radio")


@pytest.mark.parametrize(
    "text", ["usb:0", "usb:2fe3:000b", "hci-socket:1", "serial:/dev/ttyACM0,1000000", "tcp-client:localhost:6402"]
)
def test_the_documented_specs_parse(text: str) -> None:
    assert HciSpec.parse(text).text == text


def test_every_refused_spec_names_its_fix() -> None:
    with pytest.raises(BleSetupError) as info:
        HciSpec.parse("pty:foo")  # bumble has it; this project does not promise it
    assert "usb:0" in info.value.fix
