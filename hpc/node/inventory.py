"""``python -m hpc.node.inventory``: this node's network interfaces and InfiniBand/RoCE HCA ports as one JSON line, for
``python -m hpc.site init`` (which runs it through ``srun -N1``). The listings are netcheck's, so a profile written
from it names what the node check later finds."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from hpc.node.files import NotASmallFile, read_range
from hpc.node.netcheck import IB_SYSFS, hca_ports, interfaces


def link_layer(device: str, port: int, root: Path = IB_SYSFS) -> str:
    """InfiniBand or Ethernet (RoCE) for an HCA port; "" when sysfs does not say."""
    try:
        data, _ = read_range(root / device / "ports" / str(port) / "link_layer", 0, 4096)
    except (OSError, NotASmallFile):
        return ""
    return data.decode("utf-8", errors="replace").strip()


def inventory() -> dict:
    return {
        "host": socket.gethostname(),
        "interfaces": [{"name": i.name, "addrs": list(i.addrs), "up": i.up} for i in interfaces()],
        "hcas": [
            {
                "device": p.device,
                "port": p.port,
                "state": p.state,
                "rate": p.rate,
                "link_layer": link_layer(p.device, p.port),
            }
            for p in hca_ports()
        ],
    }


if __name__ == "__main__":
    print(json.dumps(inventory()), flush=True)
