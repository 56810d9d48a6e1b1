"""The links of a cluster: their rates, their shaping, their byte counters, a measured rate.

A link is shaped with a token bucket (``tc ... tbf``) on the sending end of each interface, at
a rate such as ``100mbit``, ``1gbit``, ``10gbit`` (``None``: unshaped; then a veth moves about
10 Gbit/s on a laptop). This kernel-level shaping limits bandwidth only: there is no added
delay (``netem`` is not available everywhere), so small messages cost what they cost on the
machine, large ones what the link allows. A token bucket also lets a burst (64 kB, or 4 ms
of traffic at rates above 128 Mbit/s) pass at full speed and refills while the link is idle:
a message smaller than the burst, sent every few milliseconds, hardly waits (measured in
notebook 08: DropoutNet's 87 kB per step cost no more at 100 Mbit/s than unshaped).

Owns: :func:`rate_bits` (a rate's bits per second), :func:`shape` (the token buckets),
:func:`sent_bytes` (an interface's counter), and the two ends of a measured transfer
(``python -m exercise_utils.links serve PORT | send ADDRESS PORT MBYTES``). Called by
:mod:`.cluster` (:meth:`.cluster.Cluster.shape`, ``link_bytes``, ``measure``) and by 03's
network benchmark (:func:`rate_bits`). Used in 03, 05, 06, 08, 10 and 11.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

from .netns import ip, tool

UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
USAGE = "python -m exercise_utils.links serve PORT | send ADDRESS PORT MBYTES"


def rate_bits(rate):
    """Bits per second of a link rate: ``"100mbit"`` -> 1e8; ``None``/``"unshaped"`` -> None.

    Raises:
        ValueError: not ``<number>kbit|mbit|gbit``.
    """
    if rate in (None, "unshaped"):
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)", str(rate).strip().lower())
    if not found:
        raise ValueError(f"link rate {rate!r}: expected e.g. '100mbit', '1gbit', '10gbit' "
                         "or None (unshaped)")
    return float(found[1]) * UNITS[found[2]]


def shape(devices, rate):
    """Shape every sending end in ``devices`` (``[(netns, interface)]``) to ``rate`` (a
    token bucket; None: its queueing discipline removed, unshaped).

    Raises:
        ValueError: a bad ``rate`` (:func:`rate_bits`).
    """
    bits = rate_bits(rate)
    for netns, dev in devices:
        if bits is None:
            subprocess.run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True)
            continue
        # the bucket must hold at least one timer tick of traffic (and 64 kB)
        burst = max(64_000, int(bits / 8 / 250))
        tool(["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf",
              "rate", f"{bits:.0f}bit", "burst", str(burst), "latency", "100ms"])


def sent_bytes(netns):
    """``{interface: bytes sent so far}`` in ``netns``, as the kernel counts them (every byte
    on the wire: TCP/IP headers, the connections' set-up and acknowledgements included)."""
    found = json.loads(ip("-n", netns, "-s", "-j", "link", "show").stdout)
    return {link["ifname"]: int(link["stats64"]["tx"]["bytes"]) for link in found}


def host_tx_bytes():
    """Bytes the host this process runs on (its network namespace) has sent so far on all its
    interfaces but ``lo`` (the kernel's counters: every byte on the wire). Used by the
    network sweeps' ranks of 10_bonus_model_parallel and 11_bonus_composed."""
    root = "/sys/class/net"
    total = 0
    for dev in os.listdir(root):
        if dev != "lo":
            with open(f"{root}/{dev}/statistics/tx_bytes") as f:
                total += int(f.read())
    return total


def serve(port):
    """Receive one transfer on ``port``; answer one byte once all of it is read."""
    with socket.create_server(("0.0.0.0", int(port)), reuse_port=True) as srv:
        conn, _ = srv.accept()
        with conn:
            while conn.recv(1 << 20):
                pass
            conn.sendall(b"k")


def send(address, port, mbytes):
    """Send ``mbytes`` MB to :func:`serve` at ``address:port``; print the rate as JSON."""
    deadline = time.monotonic() + 20
    while True:                          # the server may still be starting
        try:
            conn = socket.create_connection((address, int(port)), timeout=30)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk, total = b"\0" * (1 << 20), int(float(mbytes) * 1e6)
    with conn:
        start, sent = time.perf_counter(), 0
        while sent < total:
            conn.sendall(chunk[:min(len(chunk), total - sent)])
            sent += min(len(chunk), total - sent)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)                    # the receiver has read everything
        seconds = time.perf_counter() - start
    print(json.dumps({"bytes": total, "seconds": seconds, "mbit_per_s": total * 8 / seconds / 1e6}))


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "serve" and len(sys.argv) == 3:
        serve(sys.argv[2])
    elif what == "send" and len(sys.argv) == 5:
        send(*sys.argv[2:])
    else:
        sys.exit(USAGE)
