"""Free TCP ports that no other launch is handed at the same time (a marker file per port,
created exclusively, held for :data:`PORT_HOLD` seconds), drawn below the kernel's ephemeral
range.

Owns: :func:`free_port`. Called by :mod:`.launch` (re-exported: ``launch.free_port``),
:mod:`.launch_many` and every launcher that needs a rendezvous port.
"""
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path


PORTS = Path(tempfile.gettempdir()) / "dtfs-ports"   # ports handed out lately, one file each


PORT_HOLD = 300                                       # seconds a handed-out port stays reserved


def free_port():
    """Return a TCP port on 127.0.0.1 that is free right now and was not handed out by this
    function, in any process, in the last :data:`PORT_HOLD` seconds.

    The kernel's free port is only free until someone binds it: launches running side by side
    (pytest workers, ``course.py autograde --jobs N``) could be given the same one before
    either binds it. A marker file per port, created exclusively, settles who owns it. And the
    port is drawn below the kernel's ephemeral range, which it hands to outgoing connections
    (gloo's, the stores'): none of those can take it before the launched job binds it.

    Returns:
        int: the port number.
    """
    PORTS.mkdir(exist_ok=True)
    now = time.time()
    for _ in range(100):
        port = _candidate_port()
        if port is None:
            continue
        marker = PORTS / str(port)
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            _expire(marker, now)
    if sum(1 for _ in zip(range(1000), PORTS.iterdir())) >= 1000:
        for old in list(PORTS.iterdir()):
            _expire(old, now)
    return port


def _candidate_port():
    """A port free right now: below the ephemeral range when the kernel says where it starts
    (Linux: 32768), else one the kernel picks. None when the drawn port is taken."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if low <= 12000:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
        port = low - 10000 + secrets.randbelow(10000)   # not random: a seeded state repeats
        try:
            s.bind(("", port))              # every interface, as a store binds it
        except OSError:
            return None
        return port


def _expire(marker, now):
    try:
        if now - marker.stat().st_mtime > PORT_HOLD:
            marker.unlink()
    except FileNotFoundError:
        pass
