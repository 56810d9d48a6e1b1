"""Parts of the CIFAR-10 bag-of-tricks trainer (David Page, "How to train your ResNet", 2018):
patch whitening, label smoothing, an EMA of the weights, the optimizer with its schedule,
augmentation, minibatches and flip test-time-augmented evaluation.

Every part is small and deterministic given its inputs (random numbers come from an explicit
``torch.Generator``), so a data-parallel trainer can reproduce a single-process one.
The network itself is :class:`exercise_utils.models.ResNetBagOfTricks`.

Used in 04_resnet_cifar_data_parallel.
"""
import copy
import functools

import torch
import torch.nn.functional as F


def patch_whitening(images, patch_size=3, eps=1e-2):
    """PCA-whitening filters for the first (frozen) conv, computed from image patches.

    All p x p patches (stride 1, no padding) of ``images`` are flattened to vectors of
    length 3*p*p (channel-major, like a Conv2d weight); their covariance C (float64, centred,
    divided by n-1) is decomposed with ``torch.linalg.eigh``: C = V diag(lam) V^T. Filter k is
    the eigenvector v_k / sqrt(lam_k + eps), largest eigenvalue first, with its sign fixed so
    that its largest-magnitude entry is positive. Filtered patches thus have covariance
    diag(lam / (lam + eps)), close to the identity when eps is small.

    Deterministic: the same images give bit-identical weights (patches are accumulated in a
    fixed order of chunks; the sign convention removes eigh's sign ambiguity).

    Args:
        images: float tensor (N, 3, H, W) (normalised training images).
        patch_size: p.
        eps: added to the eigenvalues (regularises the near-zero ones).
    Returns:
        float32 tensor (3*p*p, 3, p, p) on the CPU.
    """
    x = torch.as_tensor(images).detach().to("cpu", torch.float64)
    if x.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(x.shape)}")
    c, p = x.shape[1], patch_size
    d = c * p * p
    total, outer, count = torch.zeros(d, dtype=torch.float64), torch.zeros(d, d, dtype=torch.float64), 0
    for start in range(0, len(x), 256):             # fixed chunks: bounded memory, fixed order
        patches = F.unfold(x[start:start + 256], p).transpose(1, 2).reshape(-1, d)
        total += patches.sum(0)
        outer += patches.T @ patches
        count += len(patches)
    if count < 2:
        raise ValueError("patch_whitening needs at least two patches")
    mean = total / count
    cov = (outer - count * torch.outer(mean, mean)) / (count - 1)
    cov = (cov + cov.T) / 2
    lam, vec = torch.linalg.eigh(cov)               # ascending eigenvalues, columns = vectors
    lam, vec = lam.flip(0), vec.flip(1)
    rows = vec.T
    sign = torch.sign(rows.gather(1, rows.abs().argmax(1, keepdim=True)))
    rows = rows * sign / torch.sqrt(lam.clamp(min=0) + eps)[:, None]
    return rows.reshape(d, c, p, p).to(torch.float32)


def label_smoothing_loss(logits, labels, smoothing=0.2):
    """Cross-entropy against smoothed targets, per example.

    loss_i = (1 - s) * (-log p_i[y_i]) + s * mean_k(-log p_i[k]), with p = softmax(logits):
    the target puts 1 - s + s/K on the true class and s/K on every class.
    The trainer's minibatch loss is the SUM of these (see :func:`make_optimizer`).

    Args:
        logits: (N, K). labels: (N,) int64. smoothing: s.
    Returns:
        tensor (N,).
    """
    logp = F.log_softmax(logits, dim=-1)
    nll = -logp.gather(1, labels.view(-1, 1)).squeeze(1)
    return (1 - smoothing) * nll - smoothing * logp.mean(dim=-1)


class EMA:
    """Exponential moving average of a model's weights, used for validation.

    ``self.model`` is a deep copy of the model (eval mode, no gradients). :meth:`update`
    sets ``ema = m * ema + (1 - m) * current`` for every floating-point parameter and copies
    the buffers (BatchNorm running statistics, ``num_batches_tracked``) from the model;
    ``self.updates`` counts the calls. ``m`` warms up: ``m = min(momentum, (1 + updates) /
    (10 + updates))`` (0.1, 0.18, 0.25, ... then ``momentum``), so that a short run is not
    averaged with its random initial weights (with a fixed 0.99, 20 updates would still keep
    82% of the initialisation).

    Why the running statistics are copied, not averaged (measured, width 16, 2 epochs of
    2,048 synthetic images, an update every step): averaging them too keeps the huge
    variances of the first steps, and the EMA model scored 0.38 (momentum 0.99) or 0.78
    (0.5) where the trained model scored 0.965; with copied statistics it scored 0.985.

    Args:
        model: the trained model. momentum: weight of the old average.
    """

    def __init__(self, model, momentum=0.99):
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.momentum = momentum
        self.updates = 0

    @torch.no_grad()
    def update(self, model):
        """Move the average towards ``model`` (same architecture)."""
        m = min(self.momentum, (1 + self.updates) / (10 + self.updates))
        current = dict(model.named_parameters())
        for name, ema in self.model.named_parameters():
            if ema.is_floating_point():
                ema.mul_(m).add_(current[name].detach().to(ema.dtype), alpha=1 - m)
        current = dict(model.named_buffers())
        for name, ema in self.model.named_buffers():
            ema.copy_(current[name])
        self.updates += 1


def lr_factor(step, total_steps, warmup_steps):
    """Learning-rate multiplier of :func:`make_optimizer`'s schedule at optimizer step ``step``.

    ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (a linear warm-up that is not
    0 at step 0), then ``max(0, (total_steps - step) / max(1, total_steps - warmup_steps))``:
    1 at ``warmup_steps``, linear down to 0 at ``total_steps``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def make_optimizer(model, examples_per_step, total_steps, lr=0.4, momentum=0.9,
                   weight_decay=5e-4, bias_scale=64.0, warmup_frac=0.2):
    """Nesterov SGD with Page's settings and the piecewise-linear schedule.

    Only parameters with ``requires_grad`` are optimized, in two groups with a ``"name"``
    key: ``"weights"`` (ndim > 1) and ``"biases"`` (ndim <= 1, e.g. BatchNorm biases).
    ``lr`` is the learning rate for the MEAN loss, but the trainer's loss is the SUM over the
    ``examples_per_step`` examples of a step (all ranks together), so

    - weights: lr / examples_per_step, weight_decay * examples_per_step;
    - biases: lr * bias_scale / examples_per_step, weight_decay * examples_per_step / bias_scale;

    the per-step decay lr * weight_decay does not depend on ``examples_per_step``.

    Schedule (``LambdaLR``, call ``scheduler.step()`` once per optimizer step): with
    ``warmup_steps = max(1, round(warmup_frac * total_steps))`` the factor at step s is
    ``(s + 1) / warmup_steps`` for s < warmup_steps, then
    ``max(0, (total_steps - s) / max(1, total_steps - warmup_steps))`` (see :func:`lr_factor`).

    Args:
        model: the network. examples_per_step: examples in one optimizer step (global batch).
        total_steps: optimizer steps of the whole training.
        lr, momentum, weight_decay, bias_scale, warmup_frac: see above.
    Returns:
        (torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR)
    """
    if examples_per_step < 1 or total_steps < 1:
        raise ValueError("examples_per_step and total_steps must be at least 1")
    params = [p for p in model.parameters() if p.requires_grad]
    weights = [p for p in params if p.ndim > 1]
    biases = [p for p in params if p.ndim <= 1]
    groups = [
        dict(params=weights, name="weights", lr=lr / examples_per_step,
             weight_decay=weight_decay * examples_per_step),
        dict(params=biases, name="biases", lr=lr * bias_scale / examples_per_step,
             weight_decay=weight_decay * examples_per_step / bias_scale),
    ]
    optimizer = torch.optim.SGD(groups, lr=lr / examples_per_step, momentum=momentum,
                                nesterov=True)
    warmup_steps = max(1, round(warmup_frac * total_steps))
    schedule = functools.partial(lr_factor, total_steps=total_steps, warmup_steps=warmup_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def augment(images, generator, pad=4, flip=True):
    """Random crop of the original size from the reflect-padded images, and random
    horizontal flip, independently per image, in one vectorised gather.

    Random numbers are drawn on the CPU from ``generator`` in this order: row offsets (N,),
    column offsets (N,) in ``[0, 2*pad]``, then (if ``flip``) N flip coins (probability 1/2).

    Args:
        images: (N, C, H, W) on any device. generator: a CPU ``torch.Generator``.
        pad: padding (maximum shift) in pixels. flip: draw random horizontal flips.
    Returns:
        tensor (N, C, H, W) on the images' device.
    """
    n, _, h, w = images.shape
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flips = (torch.randint(0, 2, (n,), generator=generator).bool() if flip
             else torch.zeros(n, dtype=torch.bool))
    padded = F.pad(images, (pad, pad, pad, pad), mode="reflect") if pad else images
    cols = torch.arange(w)
    cols = torch.where(flips[:, None], w - 1 - cols, cols) + dx[:, None]       # (N, W)
    rows = torch.arange(h)[None, :] + dy[:, None]                                # (N, H)
    dev = images.device
    idx = torch.arange(n)[:, None, None].to(dev)
    out = padded[idx, :, rows[:, :, None].to(dev), cols[:, None, :].to(dev)]     # (N, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


_augment = augment          # minibatches() has an argument named augment


def num_minibatches(num_examples, minibatch_size):
    """Number of (complete) minibatches :func:`minibatches` yields: ``num_examples // minibatch_size``."""
    if minibatch_size < 1:
        raise ValueError(f"minibatch_size must be at least 1, got {minibatch_size}")
    return num_examples // minibatch_size


def minibatches(x, y, minibatch_size, generator, augment=True):
    """Return a generator of one epoch of shuffled minibatches ``(xb, yb)`` of exactly ``minibatch_size``.

    A permutation of ``len(x)`` is drawn from ``generator``; consecutive slices of it form
    the minibatches and the last incomplete one is DROPPED (every rank with the same number
    of examples runs the same number of steps: :func:`num_minibatches`). With ``augment``
    each ``xb`` goes through :func:`augment` with the same generator.

    Args:
        x: (N, C, H, W) images. y: (N,) labels. minibatch_size: examples per minibatch.
        generator: CPU ``torch.Generator``. augment: apply random crop + flip.
    Yields:
        (xb, yb) on the device of x and y. The permutation is drawn at the first ``next``.
    """
    count = num_minibatches(len(x), minibatch_size)     # ValueError now, not at first next()
    return _minibatches(x, y, minibatch_size, generator, augment, count)


def _minibatches(x, y, minibatch_size, generator, augment, count):
    perm = torch.randperm(len(x), generator=generator)
    for i in range(count):
        idx = perm[i * minibatch_size:(i + 1) * minibatch_size]
        xb, yb = x[idx.to(x.device)], y[idx.to(y.device)]
        if augment:
            xb = _augment(xb, generator)
        yield xb, yb


@torch.no_grad()
def evaluate(model, x, y, batch_size=500, tta=True):
    """Accuracy of ``model`` on (x, y), in eval mode, with flip test-time augmentation.

    With ``tta`` the prediction is the argmax of logits(image) + logits(flipped image).
    Batches are moved to the model's device; the model's training mode is restored.

    Args:
        model: classifier returning logits. x: (N, C, H, W). y: (N,). batch_size: per forward.
        tta: add the logits of the horizontally flipped images.
    Returns:
        float in [0, 1].
    """
    if len(x) == 0:
        raise ValueError("evaluate needs at least one example")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(x), batch_size):
            xb = x[start:start + batch_size].to(device)
            logits = model(xb)
            if tta:
                logits = logits + model(xb.flip(3))
            correct += (logits.argmax(1) == y[start:start + batch_size].to(device)).sum().item()
    finally:
        model.train(was_training)
    return correct / len(x)
