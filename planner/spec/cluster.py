"""Clusters of several kinds of node: pools, each a system and a node count, and the link
between pools. A cluster is what `--hardware` names when one job may span node kinds (an A100
pool beside an H100 pool); `planner.search.pools` plans over it.

YAML (the keys scripts write):

    kind: cluster
    name: lab
    pools:
      - {system: dgx-a100-80gb, nodes: 32}
      - {system: dgx-h100, nodes: 16, price_per_device_hour_usd: 8.0, partition: h100}
    between_pools: {link: ndr-ib, count: 8}   # links per node between pools

Without `between_pools` the pools share one fabric: traffic between them runs at the slower
pool's own NICs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pydantic import Field, model_validator

from planner.spec.base import Spec
from planner.spec.hardware import Link, System

MAX_POOLS = 8  # every subset of the pools is searched: 2^8 - 1 at most


class PoolSpec(Spec):
    system: str = Field(min_length=1)
    nodes: int = Field(ge=1, le=2**20)
    name: str | None = Field(default=None, min_length=1)  # default: the system's name
    # USD per device-hour on this pool (default: the device spec's price)
    price_per_device_hour_usd: float | None = Field(default=None, gt=0, le=1e6)
    # the share of the nodes a job can have (spot capacity, maintenance): floor(nodes x it)
    availability: float = Field(default=1.0, gt=0, le=1)
    # the Slurm partition holding the pool's nodes (the sbatch form of a plan over pools)
    partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.,-]+$")


class BetweenPools(Spec):
    link: str = Field(min_length=1)
    count: int = Field(ge=1, le=1024)  # links per node that reach the other pools


class ClusterSpec(Spec):
    kind: str = Field(pattern="^cluster$")
    name: str = Field(min_length=1)
    description: str = ""
    pools: list[PoolSpec] = Field(min_length=1, max_length=MAX_POOLS)
    between_pools: BetweenPools | None = None
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_unique(self) -> ClusterSpec:
        names = [p.name or p.system for p in self.pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"key 'pools': two pools named {twice[0]!r}; give each a `name`")
        return self


@dataclass(frozen=True)
class Pool:
    """One kind of node: its system, the nodes a job may use, the price per device-hour."""

    name: str
    system: System
    nodes: int
    price_per_device_hour: float | None
    partition: str | None = None

    @property
    def devices(self) -> int:
        return self.nodes * self.system.devices_per_node


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    pools: tuple[Pool, ...]
    between: Link | None  # None: one fabric (the pools' own NICs)
    between_count: int = 0
    # a what-if (`at_between`): the links between pools at this many bytes/s per node
    between_Bps: float | None = None
    sources: dict = field(default_factory=dict, compare=False)

    def pool(self, name: str) -> Pool:
        """The pool named `name`."""
        return next(p for p in self.pools if p.name == name)

    def between_node_Bps(self, a: Pool, b: Pool) -> float:
        """Achievable bandwidth per direction of one node's traffic to the other pool: its
        links to the other pools, never faster than either pool's own NICs."""
        own = min(a.system.inter_node_bandwidth_Bps, b.system.inter_node_bandwidth_Bps)
        if self.between_Bps is not None:
            return min(own, self.between_Bps)
        if self.between is None:
            return own
        return min(own, self.between.bandwidth_Bps * self.between_count)

    def at_between(self, node_Bps: float | None) -> Cluster:
        """This cluster with its links between pools at `node_Bps` per node (None: as
        specified)."""
        return replace(self, between_Bps=node_Bps)

    def between_latency_s(self, a: Pool, b: Pool) -> float:
        own = max(a.system.inter_node.latency_s, b.system.inter_node.latency_s)
        return own if self.between is None else max(own, self.between.latency_s)

    def subset(self, names) -> Cluster:
        return replace(self, pools=tuple(p for p in self.pools if p.name in names))
