"""When the node runs mDNS: by default exactly when it listens beyond loopback; `--mdns`/`--no-mdns` decide otherwise.

The decision is checked on `NodeConfig` (what `MeshNode` reads), through the CLI's own parsing of `edgecoder node`
options down to the NodeConfig it would run with, and on a real loopback node. (mDNS itself, three nodes finding
each other on a LAN bridge, is tests/test_netns_swarm.py: multicast leaves loopback, so it runs in namespaces.)
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mesh.cli import config_show, node, resolve_settings
from mesh.commands import NodeOptions, node_config
from mesh.config import node_settings
from mesh.node import MeshNode, NodeConfig
from transports.mdns import LanDiscovery
from transports.wire.identity import NodeIdentity

LOOPBACK4 = "/ip4/127.0.0.1/tcp/0"
LOOPBACK6 = "/ip6/::1/tcp/0"
WILDCARD = "/ip4/0.0.0.0/tcp/4001"
LAN = "/ip4/192.168.1.20/tcp/4001"


@pytest.mark.parametrize(
    ("listen", "mdns", "enabled"),
    [
        ((LOOPBACK4,), None, False),
        ((LOOPBACK4, LOOPBACK6), None, False),
        ((WILDCARD,), None, True),
        (("/ip6/::/tcp/4001",), None, True),
        ((LAN,), None, True),
        ((LOOPBACK4, LAN), None, True),  # one address beyond loopback is enough
        ((WILDCARD,), False, False),  # --no-mdns
        ((LAN,), False, False),
        ((LOOPBACK4,), True, True),  # --mdns
    ],
)
def test_mdns_is_on_by_default_only_beyond_loopback_and_the_flag_decides(
    listen: tuple[str, ...], mdns: bool | None, enabled: bool
) -> None:
    config = NodeConfig(identity=NodeIdentity.generate(), listen=listen, mdns=mdns)
    assert config.mdns_enabled is enabled


def cli_node_config(*args: str) -> NodeConfig:
    """The NodeConfig `edgecoder node ARGS` would run with: click's parsing, the settings' resolution, and
    `mesh.commands.node_config`, as the node command does them (without running the node)."""
    ctx = node.make_context("node", list(args))
    with ctx:
        settings = node_settings(resolve_settings(ctx, ctx.params))
    return node_config(NodeOptions(identity=NodeIdentity.generate(), settings=settings))


def test_the_cli_flag_reaches_the_node_s_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EDGECODER_MDNS", "EDGECODER_CONFIG", "EDGECODER_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    assert cli_node_config("--listen", WILDCARD).mdns_enabled is True
    assert cli_node_config("--listen", LOOPBACK4).mdns_enabled is False
    assert cli_node_config("--listen", WILDCARD, "--no-mdns").mdns_enabled is False
    assert cli_node_config("--listen", LOOPBACK4, "--mdns").mdns_enabled is True


def test_config_show_says_where_the_mdns_choice_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EDGECODER_MDNS", "EDGECODER_CONFIG"):
        monkeypatch.delenv(name, raising=False)

    def mdns_row(*args: str) -> dict[str, object]:
        result = CliRunner().invoke(config_show, ["--json", *args])
        assert result.exit_code == 0, result.output
        [row] = [r for r in json.loads(result.output)["settings"] if r["key"] == "node.mdns"]
        return row

    assert mdns_row("--no-mdns") == {"key": "node.mdns", "value": False, "source": "flag", "from": "--no-mdns"}
    assert mdns_row("--mdns")["value"] is True
    assert mdns_row() == {"key": "node.mdns", "value": None, "source": "default", "from": ""}  # None: auto


async def test_a_loopback_node_runs_no_lan_discovery() -> None:
    config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none")
    async with MeshNode.open(config) as mesh_node:
        assert not any(isinstance(s, LanDiscovery) for s in mesh_node.services)
