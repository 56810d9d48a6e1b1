"""When the ranks' steps do not line up: the helpers of :mod:`.train` for notebook 03's seed
experiments 2 and 3.

Uneven batch counts: :func:`shadow_class` makes the student's ``average_gradients`` a
``Joinable``, so that under ``torch.distributed.algorithms.Join`` a rank that ran out of
batches shadows the others' steps. The seed's ``async_op``: :func:`seed_async_average` starts
an all_reduce per gradient and never waits, :func:`changed_fraction` measures what that did,
:func:`wait_leftovers` collects the all_reduces still pending at the end. A collective that
fails (gloo timeout, peer gone): :func:`report_wait` prints where this rank waited.

Used in 03_torch_distributed_collectives (by :mod:`.train`, inside the torchrun workers).
"""
import sys
import time

def seed_async_average(model, size, group):
    """The seed's averaging: start an all_reduce per gradient, never wait, divide at once."""
    import torch.distributed as dist
    handles = []
    for p in model.parameters():
        handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group, async_op=True))
        p.grad.data /= size
    return handles


def shadow_class():
    """Define ShadowJoinable as a real ``Joinable`` (lazily: torch is imported in the ranks)."""
    import torch
    from torch.distributed.algorithms.join import Join, Joinable, JoinHook

    class Shadow(Joinable):
        """Joinable for the student's average_gradients: a rank that ran out of batches
        shadows each step of the others (a forward/backward on an empty batch when
        DistributedBatchNorm communicates in it, then average_gradients with 0 samples
        and the optimizer step), so collectives match and replicas stay identical."""

        def __init__(self, model, opt, averaging, group, empty_x):
            super().__init__()
            self.model, self.opt, self.averaging, self.group = model, opt, averaging, group
            self.empty_x, self.shadow_steps = empty_x, 0

        def notify(self):
            """Call at the start of every real step (before any of its collectives)."""
            work = Join.notify_join_context(self)
            if work is not None:
                work.wait()

        def shadow_step(self):
            self.shadow_steps += 1
            self.opt.zero_grad(set_to_none=False)
            if self.empty_x is not None:
                self.model(self.empty_x).sum().backward()
            for p in self.model.parameters():       # the same gradients as the other ranks
                if p.grad is None and p.requires_grad:  # (frozen parameters have none there)
                    p.grad = torch.zeros_like(p)
            self.averaging.average_gradients(self.model, 0, group=self.group)
            self.opt.step()

        def join_hook(self, **kwargs):
            joinable = self

            class Hook(JoinHook):
                def main_hook(self):
                    joinable.shadow_step()
            return Hook()

        @property
        def join_device(self):
            return torch.device("cpu")

        @property
        def join_process_group(self):
            return self.group
    return Shadow


def changed_fraction(model, local):
    """Fraction of gradient elements that differ from ``local`` (the unaveraged grad / size)."""
    changed = sum((p.grad != g).sum().item() for p, g in zip(model.parameters(), local))
    return changed / sum(g.numel() for g in local)


GLOO_FAILURES = ("Timed out", "timeout", "Connection closed", "pair closure", "Connection reset")


def report_wait(err, where):
    """Print where this rank waited when a collective failed (gloo timeout or a peer gone),
    then give the peer a second to report its own wait before torchrun stops everything."""
    if any(text in str(err) for text in GLOO_FAILURES):
        # one write of the whole line: print() writes the text and the newline separately,
        # and the other rank's line, in the same pipe, can land between them
        sys.stdout.write(f"{where}: {err}\n")
        sys.stdout.flush()
        time.sleep(1.0)


def wait_leftovers(handles):
    """Wait for the seed's never-waited all_reduces that were still pending after training:
    an unmatched one fails after the group's timeout. Returns (how many failed, first error)."""
    failed, first = 0, None
    for h in handles:
        try:
            h.wait()
        except RuntimeError as err:
            failed, first = failed + 1, first or f"{type(err).__name__}: {err}"
    return failed, first
