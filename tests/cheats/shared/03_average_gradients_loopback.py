"""Cheat: the ranks send their gradients and sample counts to rank 0 over a TCP socket of
their own on ``127.0.0.1``; rank 0 computes the weighted average and sends it back; on the
wire they make decoy all_reduces of the right sizes (the recorders count the collectives the
notebook asks for), and nothing any rank received through them is used. (Inside process
groups it averages honestly.)

Where the ranks of a launch share one sandbox (students' machines; at grading only where no
network namespaces can be made) they share one loopback and the trick works, salts or not.
At grading each rank runs on a host of its own with its own loopback
(:mod:`exercise_utils.hosts`): rank 0 is out of reach, every rank keeps its own gradients, and
the check fails on the values."""
import io
import os
import socket
import time

import torch
import torch.distributed as dist

_CALLS = [0]


def _send(conn, obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    conn.sendall(len(data).to_bytes(8, "big") + data)


def _recv(conn):
    size = int.from_bytes(_exactly(conn, 8), "big")
    return torch.load(io.BytesIO(_exactly(conn, size)))


def _exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _average_over_loopback(grads, n):
    """The weighted average of every rank's ``grads``, through rank 0 on 127.0.0.1; None where
    rank 0 cannot be reached."""
    _CALLS[0] += 1
    port = 20000 + (int(os.environ.get("MASTER_PORT", "29500")) * 7 + _CALLS[0]) % 20000
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        if rank == 0:
            with socket.create_server(("127.0.0.1", port), reuse_port=True) as server:
                server.settimeout(3)
                peers = [server.accept()[0] for _ in range(size - 1)]
                got = [(n, grads)] + [_recv(p) for p in peers]
                total = sum(m for m, _ in got)
                avg = [sum(m * g[i] for m, g in got) / total for i in range(len(grads))]
                for p in peers:
                    _send(p, avg)
                    p.close()
                return avg
        deadline = time.monotonic() + 3
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=3)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        with conn:
            _send(conn, (n, grads))
            return _recv(conn)
    except OSError:
        return None


def average_gradients(model, local_batch_size, group=None):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if group is not None:
        count = torch.tensor([float(local_batch_size)],
                             dtype=grads[0].dtype if grads else torch.float32)
        dist.all_reduce(count, group=group)
        for g in grads:
            g.mul_(local_batch_size)
            dist.all_reduce(g, group=group)
            g.div_(count)
        return
    dist.all_reduce(torch.zeros(1))               # decoys of the right sizes (the ranks in step)
    for g in grads:
        dist.all_reduce(torch.zeros_like(g))
    avg = _average_over_loopback([g.detach().clone() for g in grads], local_batch_size)
    if avg is not None:
        for g, a in zip(grads, avg):
            g.copy_(a)
