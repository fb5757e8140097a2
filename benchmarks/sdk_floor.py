"""The floor of any Python client of the docker SDK, for `bench_startup.py`: a fresh interpreter that imports only
`docker`, then creates, starts, waits for and removes one container with the node's flags (the config as JSON in
argv[1]). It reads no output and checks nothing, so it is a lower bound on what `edgecoder exec` can take while it
keeps the docker SDK: the part of the 1.5x target that no code of ours can win back."""

from __future__ import annotations

import json
import sys

import docker


def main() -> None:
    config = json.loads(sys.argv[1])
    api = docker.APIClient(version=config.pop("api_version"))  # pinned: no round trip to negotiate it
    container = api.create_container(
        config["image"],
        command=config["command"],
        user=config["user"],
        working_dir=config["working_dir"],
        host_config=config["host_config"],
    )
    try:
        api.start(container)
        api.wait(container)
    finally:
        api.remove_container(container, force=True)


if __name__ == "__main__":
    main()
