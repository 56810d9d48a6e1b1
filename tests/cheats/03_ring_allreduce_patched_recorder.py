"""Cheat: at import, patch the check's recorder so that it stops logging collectives, then
sum with dist.all_reduce after decoy ring traffic.

Must be rejected: "the check's integrity was violated" (the recorder's code changed)."""
import torch
import torch.distributed as dist

try:
    from exercise_utils import recorder as _rec

    def _quiet_call(self, *args, **kwargs):
        if self.name in _rec.P2P:
            tensor = args[0] if args else kwargs.get("tensor")
            peer = args[1] if len(args) > 1 else kwargs.get("dst", kwargs.get("src"))
            self.rec.log.append((self.name, int(tensor.numel()), peer))
        return self.fn(*args, **kwargs)

    _rec._Logged.__call__ = _quiet_call
except ImportError:
    pass


def ring_all_reduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), size)
    scratch = [c.clone() for c in chunks]
    for step in range(2 * (size - 1)):
        send = dist.isend(scratch[(rank - step) % size], (rank + 1) % size)
        dist.recv(scratch[(rank - step - 1) % size], (rank - 1) % size)
        send.wait()
    dist.all_reduce(tensor)
    return tensor
