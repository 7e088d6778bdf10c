"""A GPU node behind a network partition, on one machine: a network namespace for the node, joined to this
host through a router namespace whose queues can drop every packet.

The partition drops every packet both ways on the router (a queue of length 0 on each of its two links):
no reset, no FIN, no "no route to host", as when a switch or a route dies, so neither end's kernel knows
and each side's TCP behaves as across real hosts. The neighbours are fixed (no ARP to fail during the
cut). Needs root (ip netns, tc): `partition_supported` says why not where the kernel or the user refuses.

    with NodeBehindRouter("dg") as node:       # the node's processes: node.inside(argv)
        node.cut(); ...; node.heal()            # this host's services listen on node.HOST_ADDRESS too
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Self

# node namespace <-> router namespace <-> this host
NODE_ADDRESS, ROUTER_NODE_SIDE = "10.231.0.2", "10.231.0.1"
HOST_ADDRESS, ROUTER_HOST_SIDE = "10.231.1.1", "10.231.1.2"
NODE_NET, PREFIX = "10.231.0.0/30", "/30"
DROP_EVERYTHING = ("pfifo", "limit", "0")  # a queue that holds no packet: each one forwarded is dropped
# the links' names (at most 15 characters): the node's, the router's two, this host's
NODE_LINK, ROUTER_NODE_LINK, ROUTER_HOST_LINK, HOST_LINK = "dg-w", "dg-r-w", "dg-r-h", "dg-h"


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def partition_supported() -> str | None:
    """None where this process may make network namespaces; else why not, in a line."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` here (Debian: iproute2)"
    probe = f"dg-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"the kernel refuses a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NodeBehindRouter:
    """A node namespace and a router namespace, named after `prefix` (and this process)."""

    def __init__(self, prefix: str) -> None:
        self.node = f"{prefix}-node-{os.getpid()}"
        self.router = f"{prefix}-router-{os.getpid()}"

    def inside(self, argv: Sequence[str]) -> list[str]:
        """`argv` run in the node's namespace."""
        return ["ip", "netns", "exec", self.node, *argv]

    def _in(self, namespace: str | None) -> list[str]:
        return ["ip", "netns", "exec", namespace] if namespace else []

    def __enter__(self) -> Self:
        self.remove()  # what an earlier run killed before its cleanup left
        node, router = self._in(self.node), self._in(self.router)
        _sh("ip", "netns", "add", self.node)
        _sh("ip", "netns", "add", self.router)
        _sh(
            "ip",
            "link",
            "add",
            NODE_LINK,
            "netns",
            self.node,
            "type",
            "veth",
            "peer",
            ROUTER_NODE_LINK,
            "netns",
            self.router,
        )
        _sh(
            "ip",
            "link",
            "add",
            HOST_LINK,
            "type",
            "veth",
            "peer",
            "name",
            ROUTER_HOST_LINK,
            "netns",
            self.router,
        )
        _sh(*node, "ip", "addr", "add", NODE_ADDRESS + PREFIX, "dev", NODE_LINK)
        _sh(*router, "ip", "addr", "add", ROUTER_NODE_SIDE + PREFIX, "dev", ROUTER_NODE_LINK)
        _sh(*router, "ip", "addr", "add", ROUTER_HOST_SIDE + PREFIX, "dev", ROUTER_HOST_LINK)
        _sh("ip", "addr", "add", HOST_ADDRESS + PREFIX, "dev", HOST_LINK)
        for inside, device in (
            (node, NODE_LINK),
            (node, "lo"),
            (router, ROUTER_NODE_LINK),
            (router, ROUTER_HOST_LINK),
            ([], HOST_LINK),
        ):
            _sh(*inside, "ip", "link", "set", device, "up")
        _sh(*router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _sh(*node, "ip", "route", "add", "default", "via", ROUTER_NODE_SIDE)
        _sh("ip", "route", "add", NODE_NET, "via", ROUTER_HOST_SIDE)
        for inside, address, device, peer, peer_namespace in (
            (node, ROUTER_NODE_SIDE, NODE_LINK, ROUTER_NODE_LINK, self.router),
            (router, NODE_ADDRESS, ROUTER_NODE_LINK, NODE_LINK, self.node),
            (router, HOST_ADDRESS, ROUTER_HOST_LINK, HOST_LINK, None),
            ([], ROUTER_HOST_SIDE, HOST_LINK, ROUTER_HOST_LINK, self.router),
        ):
            lladdr = self._mac(peer, peer_namespace)
            _sh(
                *inside,
                "ip",
                "neigh",
                "replace",
                address,
                "lladdr",
                lladdr,
                "nud",
                "permanent",
                "dev",
                device,
            )
        return self

    def _mac(self, device: str, namespace: str | None) -> str:
        path = f"/sys/class/net/{device}/address"
        read = subprocess.run([*self._in(namespace), "cat", path], capture_output=True, text=True, check=True)
        return read.stdout.strip()

    def cut(self) -> None:
        """Every packet the router forwards, either way, is dropped from now on."""
        for device in (ROUTER_NODE_LINK, ROUTER_HOST_LINK):
            _sh(*self._in(self.router), "tc", "qdisc", "add", "dev", device, "root", *DROP_EVERYTHING)

    def heal(self) -> None:
        for device in (ROUTER_NODE_LINK, ROUTER_HOST_LINK):
            _sh(*self._in(self.router), "tc", "qdisc", "del", "dev", device, "root")

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", HOST_LINK], capture_output=True)
        for namespace in (self.node, self.router):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.remove()
