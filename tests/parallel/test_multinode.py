"""Across a node boundary: two torchrun agents on this machine as two nodes (`--nnodes 2 --node-rank 0/1`, c10d
rendezvous on 127.0.0.1), one process each, take the same steps as one process (docs/distributed.md)."""

from __future__ import annotations

import os
import subprocess
import sys

from test_distributed import WORKER, assert_same_steps_as_one, free_port, launch, worker_inputs

TIMEOUT_S = 240  # each agent; the rendezvous itself gives up after --rdzv-conf join_timeout


def test_two_nodes_equal_one_process(tmp_path, tokenizer):
    inputs = worker_inputs(tmp_path, tokenizer)
    single, double = tmp_path / "single", tmp_path / "double"
    single.mkdir(), double.mkdir()
    launch(1, [*inputs, str(single)])

    port = free_port()
    # what torchrun sets itself must not leak in from a surrounding launch
    env = {key: value for key, value in os.environ.items()
           if key not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", GLOO_SOCKET_IFNAME="lo")  # gloo over loopback only
    agents = []
    for node in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", "two-nodes-test", "--local-addr", "127.0.0.1", "--max-restarts", "0",
                   # node 0 hosts the rendezvous store (as the first node of a real cluster would)
                   "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'},join_timeout=120",
                   "--monitor-interval", "1", str(WORKER), *inputs, str(double)]
        agents.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:  # a failed or timed-out agent must not outlive the test, nor leave its worker
            if agent.poll() is None:
                agent.terminate()  # torchrun stops its workers on SIGTERM
                try:
                    agent.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
    for node, (agent, output) in enumerate(zip(agents, outputs)):
        assert agent.returncode == 0, f"node {node}: {output[-3000:]}"
    # the rendezvous may number the nodes in either order: each process reports its rank and rows
    assert sorted(path.name for path in double.glob("rank*.pt")) == ["rank0.pt", "rank1.pt"]
    assert_same_steps_as_one(single, double)
