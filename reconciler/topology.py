"""The fleet's topology as a networkx graph: clouds -> regions -> zones, plus links.

Edges carry latency_ms and egress_per_gb. The solver asks one question of it:
what does it cost to read a job's data from its location on a given zone?"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from reconciler.model import TopologySpec

if TYPE_CHECKING:
    import networkx as nx


def node_id(cloud: str, region: str | None = None, zone: str | None = None) -> str:
    return "/".join(p for p in (cloud, region, zone) if p)


def topology_nodes(spec: TopologySpec) -> set[str]:
    nodes = set()
    for c, ct in spec.clouds.items():
        nodes.add(node_id(c))
        for r, rt in ct.regions.items():
            nodes.add(node_id(c, r))
            nodes.update(node_id(c, r, z) for z in rt.zones)
    return nodes


def build_graph(spec: TopologySpec) -> nx.Graph:
    """Hierarchy edges cost half the default hop price each way, so two regions of
    one cloud are region_egress_per_gb apart through their cloud node."""
    import networkx as nx  # lazily: `reconcile validate` reads topology_nodes only (networkx pulls numpy)

    d = spec.defaults
    g = nx.Graph()
    clouds = list(spec.clouds)
    for c, ct in spec.clouds.items():
        g.add_node(c, level="cloud")
        for r, rt in ct.regions.items():
            rn = node_id(c, r)
            g.add_node(rn, level="region")
            g.add_edge(c, rn, latency_ms=d.region_latency_ms / 2, egress_per_gb=d.region_egress_per_gb / 2)
            for z in rt.zones:
                zn = node_id(c, r, z)
                g.add_node(zn, level="zone")
                g.add_edge(rn, zn, latency_ms=d.zone_latency_ms, egress_per_gb=d.zone_egress_per_gb)
    for i, a in enumerate(clouds):
        for b in clouds[i + 1:]:
            g.add_edge(a, b, latency_ms=d.cloud_latency_ms, egress_per_gb=d.cloud_egress_per_gb)
    for link in spec.links:  # explicit links override or add paths (interconnects, peering)
        g.add_edge(link.source, link.target, latency_ms=link.latency_ms, egress_per_gb=link.egress_per_gb)
    return g


@dataclass(frozen=True)
class Distance:
    egress_per_gb: float
    latency_ms: float


class TopologyIndex:
    """Shortest-path distances from data locations, computed once per location."""

    def __init__(self, spec: TopologySpec):
        self.graph = build_graph(spec)
        self._cache: dict[str, tuple[dict, dict]] = {}

    def _from(self, source: str) -> tuple[dict, dict]:
        if source not in self._cache:
            import networkx as nx

            egress = nx.single_source_dijkstra_path_length(self.graph, source, weight="egress_per_gb")
            latency = nx.single_source_dijkstra_path_length(self.graph, source, weight="latency_ms")
            self._cache[source] = (egress, latency)
        return self._cache[source]

    def distance(self, source: str, cloud: str, region: str, zone: str) -> Distance:
        egress, latency = self._from(source)
        target = node_id(cloud, region, zone)
        if target not in egress:
            target = node_id(cloud, region)
        return Distance(egress.get(target, float("inf")), latency.get(target, float("inf")))

    @cached_property
    def zones(self) -> list[str]:
        return sorted(n for n, lvl in self.graph.nodes(data="level") if lvl == "zone")
