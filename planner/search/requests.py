"""The CNN's search request (`Problem`): what the user fixed and bounded, in a leaf module so
that reading its fields (the Python API's accepted names) loads neither family's cost model.
The transformer's is `planner.search.hybrid_space.Search`."""

from __future__ import annotations

from dataclasses import dataclass

from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM
from planner.search.objective import Objective
from planner.search.table import DEFAULT_KNEE_TOLERANCE
from planner.search.training import Training
from planner.vocabulary import Collective


@dataclass(frozen=True)
class Problem:
    """What the user fixed and bounded. None means free (within the defaults)."""

    nodes: int | None = None
    nodes_max: int | None = None
    devices: int | None = None
    devices_max: int | None = None
    devices_per_node: int | None = None
    global_batch: int | None = None
    global_batch_range: tuple[int, int] | None = None
    local_batch: int | None = None
    local_batch_min: int | None = None
    collectives: tuple[Collective, ...] = tuple(Collective)
    overlap: bool = True
    softsync: int | None = None  # the parameter server's n-softsync (None: synchronous)
    objective: Objective = Objective.throughput
    fewest_nodes_within: float | None = None  # 0.05: the fewest nodes within 5% of the best
    top: int = 0
    time_limit_s: float = 10.0
    workers: int = 1  # one worker: a deterministic search
    training: Training | None = None
    pareto: bool = False
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM  # fraction of device memory kept free
    knee_tolerance: float = DEFAULT_KNEE_TOLERANCE  # the knee: fewest devices within it
