"""The container configuration, pinned field by field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.container_config import build_container_config
from executor.contract import Limits
from executor.policy import ExecutorPolicy

BOOTSTRAP_COMMAND_PREFIX = ["python3", "-I", "-S", "-c"]


def test_every_field_is_pinned() -> None:
    config = build_container_config(Limits(5000, 128, 0.5), ExecutorPolicy(), labels={"edgecoder.node": "n1"})
    command = config.pop("command")
    assert command[:4] == BOOTSTRAP_COMMAND_PREFIX and len(command) == 5
    assert config == {
        "image": "edgecoder-sandbox:bookworm",
        "user": "65534:65534",
        "working_dir": "/tmp",
        "environment": [],
        "use_config_proxy": False,
        "stdin_open": True,
        "tty": False,
        "labels": {"edgecoder.node": "n1", "edgecoder.mesh": "1"},
        "host_config": {
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "Memory": 128 * 1024 * 1024,
            "MemorySwap": 128 * 1024 * 1024,
            "NanoCpus": 500_000_000,
            "PidsLimit": 50,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "Tmpfs": {"/tmp": "rw,noexec,nosuid,size=64m"},
            "Ulimits": [{"Name": "nofile", "Soft": 256, "Hard": 256}],
            "LogConfig": {"Type": "none", "Config": {}},
        },
    }


def test_no_mount_of_any_kind() -> None:
    config = build_container_config(Limits(), ExecutorPolicy(), labels={})
    text = json.dumps(config).lower()
    for word in ("binds", "mounts", "volumes", "volumesfrom", "devices", "privileged"):
        assert f'"{word}"' not in text


def test_mesh_label_cannot_be_overridden_by_the_node() -> None:
    config = build_container_config(Limits(), ExecutorPolicy(), labels={"edgecoder.mesh": "0"})
    assert config["labels"]["edgecoder.mesh"] == "1"


def test_seccomp_profile_travels_as_json_text_not_a_path(tmp_path: Path) -> None:
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"}]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile, indent=2))
    config = build_container_config(Limits(), ExecutorPolicy(seccomp_profile=str(path)), labels={})
    security = config["host_config"]["SecurityOpt"]
    assert security[0] == "no-new-privileges"
    assert security[1].startswith("seccomp=")
    assert json.loads(security[1].removeprefix("seccomp=")) == profile
    assert len(security) == 2


def test_a_broken_seccomp_profile_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError):
        build_container_config(Limits(), ExecutorPolicy(seccomp_profile=str(path)), labels={})
    with pytest.raises(OSError):
        build_container_config(Limits(), ExecutorPolicy(seccomp_profile=str(tmp_path / "absent")), labels={})


def test_network_only_when_the_policy_allows_it() -> None:
    config = build_container_config(Limits(), ExecutorPolicy(allow_network=True), labels={})
    assert config["host_config"]["NetworkMode"] == "default"


def test_limits_map_to_docker_units() -> None:
    host = build_container_config(Limits(1000, 33, 0.01), ExecutorPolicy(), labels={})["host_config"]
    assert (host["Memory"], host["MemorySwap"], host["NanoCpus"]) == (33 << 20, 33 << 20, 10_000_000)
