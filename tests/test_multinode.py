"""Several simulated nodes (``ray.cluster_utils.Cluster``) with different ``accelerator_type``
resources: each pool lands on its own node, a run joined to the cluster completes, and killing one
node's sampler follows the restart rules (docs/reliability.md)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.faults import SMOKE, Run, rows, summary

pytestmark = pytest.mark.slow


def samplers_of(node, prefix: str = "ray::SamplerWorker") -> list[int]:
    """Pids of the ``ray::SamplerWorker`` processes this node's raylet started (with
    ``ray::SamplerWorker.generate``: those in the middle of a request)."""
    raylet = [p.process.pid for name, ps in node.all_processes.items() if name == "raylet" for p in ps]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith(prefix) and ppid in raylet:
            found.append(int(entry.name))
    return found


def test_pools_land_on_their_accelerator_nodes_and_survive_a_killed_sampler(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        h100 = cluster.add_node(num_cpus=1, resources={"accelerator_type:H100": 1})
        a100 = cluster.add_node(num_cpus=1, resources={"accelerator_type:A100": 1})
        run_dir = tmp_path / "run"
        # Enough steps after the kill that the dead sampler is offered requests again (smoke steps
        # take a fraction of a second; with a short run the survivor could serve the rest alone).
        run = Run(tmp_path, *SMOKE, "loop.steps=40", f"cluster.address={cluster.address}", f"hydra.run.dir={run_dir}")
        run.wait_for(lambda: rows(run_dir) and samplers_of(h100) and samplers_of(a100), "samplers on both nodes")
        assert len(samplers_of(h100)) == len(samplers_of(a100)) == 1  # the smoke fleet: one H100, one A100 pool
        assert samplers_of(cluster.head_node) == []
        # Killed in the middle of a request: an idle sampler's death costs no request to re-issue.
        generating: list[int] = []

        def h100_generating() -> bool:
            generating[:] = samplers_of(h100, "ray::SamplerWorker.generate")
            return bool(generating)

        run.wait_for(h100_generating, "the H100 sampler generating")
        os.kill(generating[0], signal.SIGKILL)
        assert run.finish() == 0, run.text()
        assert [r["step"] for r in rows(run_dir)] == list(range(1, 41))
        assert summary(run_dir)["status"] in ("completed", "collapsed")
        assert summary(run_dir)["fault"]["requests_reissued"] >= 1  # its request was served again
    finally:
        cluster.shutdown()
