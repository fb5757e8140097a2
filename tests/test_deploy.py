"""The systemd unit says what docs/deploy.md says it does: a dedicated user, the config file, restarts that stop at
bad settings, and the hardening directives. (`systemd-analyze verify deploy/edgecoder-node.service` checks the
syntax on a machine with systemd; this checks the content.)"""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).parent.parent / "deploy" / "edgecoder-node.service"


def directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_the_unit_runs_a_configured_node_as_its_own_user() -> None:
    d = directives()
    assert d["User"] == ["edgecoder"] and d["SupplementaryGroups"] == ["docker"]
    assert d["ExecStart"][0].endswith("edgecoder node --config /etc/edgecoder/edgecoder.toml")
    assert d["StateDirectory"] == ["edgecoder"] and d["Environment"] == ["EDGECODER_STATE_DIR=%S/edgecoder"]


def test_restarts_after_failures_but_not_after_bad_settings() -> None:
    d = directives()
    assert d["Restart"] == ["on-failure"] and d["RestartPreventExitStatus"] == ["2"]
    assert d["KillSignal"] == ["SIGTERM"]


def test_the_hardening_directives_are_on() -> None:
    d = directives()
    for key in (
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "RestrictNamespaces",
        "RestrictSUIDSGID",
        "LockPersonality",
    ):
        assert d[key] == ["yes"], key
    assert d["ProtectSystem"] == ["strict"] and d["CapabilityBoundingSet"] == [""]
    assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
    assert "@system-service" in d["SystemCallFilter"]
