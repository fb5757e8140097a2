"""The scenarios by name. Each module has `async def run(options) -> (Report, figures)`."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from simulations.report import Report
from simulations.scenario import Options

ScenarioFn = Callable[[Options], Awaitable[tuple[Report, dict[str, Any]]]]

SCENARIOS = {
    "storm": "simulations.storm",
    "churn": "simulations.churn",
    "docker-outage": "simulations.outage",
    "none-nodes": "simulations.none_nodes",
    "hostile": "simulations.hostile",
    "ble": "simulations.ble_cluster",
    "scaling": "simulations.scaling",
    "scaling-procs": "simulations.scaling_procs",
    "scale": "simulations.scale",
    "model": "simulations.model",
}


def scenario(name: str) -> ScenarioFn:
    module = importlib.import_module(SCENARIOS[name])
    fn: ScenarioFn = module.run
    return fn
