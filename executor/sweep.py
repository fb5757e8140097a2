"""What dead executors left behind: every edgecoder container whose owner is dead (executor/owner.py), or stopped
for a while under an owner that cannot be judged from here, whichever node label it carries."""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

import docker
import docker.errors

from executor.container_config import MESH_LABEL
from executor.owner import OWNER_LABEL, STOPPED_GRACE_S, Owner, this_process


def doomed_blocking(api: docker.APIClient) -> list[str]:
    """The ids of the containers to remove (a blocking SDK call: run it in a worker thread)."""
    here = this_process()
    now = time.time()
    doomed = []
    for container in api.containers(all=True, filters={"label": f"{MESH_LABEL}=1"}):
        owner = Owner.parse((container.get("Labels") or {}).get(OWNER_LABEL))
        alive = None if owner is None else owner.alive(here)
        if alive is False or (
            # An owner that cannot be judged from here: only what has been stopped for a while.
            alive is None
            and container.get("State") in ("created", "exited", "dead")
            and now - stopped_at_blocking(api, container) > STOPPED_GRACE_S
        ):
            doomed.append(container["Id"])
    return doomed


def stopped_at_blocking(api: docker.APIClient, container: dict[str, Any]) -> float:
    if container.get("State") == "created":  # never started
        return float(container.get("Created") or 0)
    try:
        finished = (api.inspect_container(container["Id"]).get("State") or {}).get("FinishedAt") or ""
        return datetime.fromisoformat(finished).timestamp()
    except docker.errors.NotFound:  # its owner removed it meanwhile: nothing to sweep
        return math.inf
    except ValueError:
        return float(container.get("Created") or 0)
