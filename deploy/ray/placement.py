"""Where the workers go: placement groups that spread them across the Ray cluster's nodes.

``reserve`` waits until every bundle is placed (else removes the group, ``TimeoutError``);
``in_bundle`` places an actor; ``ON_HEAD`` and ``free_ports_on_head`` pin actors to the head
node on fixed ports, so restarted ones keep their address.

See docs/architecture.md#ray-cluster-and-ray-serve.
"""
from __future__ import annotations

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

HEAD_RESOURCE = "node:__internal_head__"
ON_HEAD: dict[str, object] = {"resources": {HEAD_RESOURCE: 0.001}}


@ray.remote(num_cpus=0, resources={HEAD_RESOURCE: 0.001})
def _free_ports(count: int) -> list[int]:
    import socket

    # a ServiceActor listens on both (the node IP once when it is loopback itself)
    hosts = dict.fromkeys([ray.util.get_node_ip_address(), "127.0.0.1"])
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        tries = 100 * count
        while len(ports) < count and tries:  # every socket held until the end: distinct
            tries -= 1
            port = 0
            try:
                for host in hosts:
                    socks.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    socks[-1].bind((host, port))
                    port = socks[-1].getsockname()[1]
            except OSError:
                continue  # taken on loopback: try another
            ports.append(port)
        if len(ports) < count:
            raise RuntimeError(f"only {len(ports)} of {count} ports free on {list(hosts)}")
        return ports
    finally:
        for s in socks:
            s.close()


def free_ports_on_head(count: int, timeout: float = 60.0) -> list[int]:
    """``count`` distinct ports free on the head node's IP and on its loopback now."""
    return ray.get(_free_ports.remote(count), timeout=timeout)


def reserve(bundle: dict[str, float], count: int, *, strategy: str = "SPREAD",
            name: str = "", timeout: float = 60.0) -> PlacementGroup:
    """A ready placement group of ``count`` copies of ``bundle``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy,
                            name=name)
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(group)
        have = {k: v for k, v in ray.available_resources().items()
                if not k.startswith(("node:", "memory", "object_store_memory"))}
        raise TimeoutError(f"Ray could not place {count} worker(s) of {bundle} each within "
                           f"{timeout:.0f}s; available now: {have}")
    return group


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    """Schedule an actor into bundle ``index`` of ``group`` (its resources are reserved)."""
    return PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=index,
        placement_group_capture_child_tasks=False)


def release(group: PlacementGroup) -> None:
    """Give the group's resources back (its actors must be gone or are killed by Ray)."""
    remove_placement_group(group)


def actor_resources(bundle: dict[str, float]) -> dict[str, object]:
    """``.options(...)`` keywords that request exactly ``bundle``."""
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0),
            "resources": custom}
