"""The networks of the course, in one place.

- :class:`MPINet`: the small 8/16-channel CNN of the MPI exercise (01).
- :class:`DropoutNet`: the 10/20-channel CNN with dropout of the PyTorch MNIST
  example, written correctly (``fc1 -> ReLU -> dropout -> fc2 -> log_softmax``;
  a seed report applied ``fc2`` twice and a ReLU before ``log_softmax``).
- Toy models for checkers: :class:`TinyMLP`, :class:`FrozenTiedNet` (a frozen
  parameter and weights tied between two layers), :class:`BNNet` (BatchNorm buffers),
  :class:`BranchNet` (a layer the forward can skip: a trainable parameter without gradient),
  :class:`EdgeNet` (all of these at once, plus a transposed weight and a 0-d parameter: the
  model the contract sweeps feed gradient and state code, in float32 and float64).
- :class:`GhostBatchNorm` (BatchNorm over consecutive ghost batches, frozen scale) and
  :class:`ResNetBagOfTricks` (David Page's fast CIFAR-10 ResNet), used in
  04_resnet_cifar_data_parallel.

Used in 01_mpi_parallel_sgd and later notebooks.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MPINet(nn.Module):
    """Small CNN for 1x28x28 images: conv(8) -> pool -> conv(16) -> pool -> fc(64) -> fc(10).

    About 25k parameters: fast enough to train on 2 CPU cores. Returns logits.
    Used in 01_mpi_parallel_sgd.
    """

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 8, kernel_size=5)    # 28 -> 24 -> pool 12
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)             # 12 -> 8 -> pool 4
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class DropoutNet(nn.Module):
    """The 10/20-channel CNN with dropout (PyTorch MNIST example). Returns log-probabilities.

    Train with ``F.nll_loss``. ``hidden``: the width of the fully connected layer (50: 21,840
    parameters; notebook 08's network section also trains a wide one, whose 320 x ``hidden``
    matrix makes communication, not compute, the cost of a step). Used in 02 to 05 and 08.
    """

    def __init__(self, num_classes=10, hidden=50):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class TinyMLP(nn.Module):
    """Two-layer perceptron on flat inputs; a fast model for checkers."""

    def __init__(self, in_features=20, hidden=16, out_features=4):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class FrozenTiedNet(nn.Module):
    """A model with a frozen parameter (no gradient) and a weight shared by two layers.

    ``encoder.weight`` and ``decoder.weight`` are the same tensor (tied), and
    ``frozen`` has ``requires_grad=False``: gradient code must skip the frozen one and
    reduce the tied one once.
    """

    def __init__(self, features=12):
        super().__init__()
        self.encoder = nn.Linear(features, features, bias=False)
        self.decoder = nn.Linear(features, features)
        self.decoder.weight = self.encoder.weight              # tied: one tensor, two layers
        self.frozen = nn.Parameter(torch.ones(features), requires_grad=False)
        self.head = nn.Linear(features, 3)

    def forward(self, x):
        h = torch.tanh(self.encoder(x))
        return self.head(self.decoder(h) * self.frozen)


class BNNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear: has running-statistics buffers."""

    def __init__(self, in_features=10, hidden=16, out_features=3):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


class BranchNet(nn.Module):
    """Linear -> tanh -> (+ branch) -> Linear, where the forward skips the branch layer while
    ``use_branch`` is False: then ``branch.weight`` and ``branch.bias`` are trainable but get
    no gradient in that step (an unused parameter, as with conditional layers)."""

    def __init__(self, features=8, out_features=3):
        super().__init__()
        self.fc1 = nn.Linear(features, features)
        self.branch = nn.Linear(features, features)
        self.head = nn.Linear(features, out_features)
        self.use_branch = True

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        return self.head(h + self.branch(h) if self.use_branch else h)


class EdgeNet(nn.Module):
    """A small model with every feature that gradient and state code must handle.

    * ``out.weight`` is tied to ``back.weight``: one tensor, used twice in the forward, listed
      once by ``parameters()`` and under both names by ``state_dict()``;
    * ``frozen`` has ``requires_grad=False`` (its ``.grad`` stays None);
    * ``unused`` is trainable but never called: its parameters get no gradient;
    * ``proj`` is stored transposed (not contiguous, and so is its gradient: ``.view(-1)`` fails
      on it, ``.reshape(-1)`` works);
    * ``scale`` is a 0-d parameter;
    * ``bn`` has float buffers (running statistics) and a 0-d int64 one (``num_batches_tracked``).

    Args:
        features, hidden, classes: input width, hidden width, outputs.
        dtype: the floating dtype of every parameter and float buffer.
    Maps (N, features) to (N, classes).
    """

    def __init__(self, features=6, hidden=8, classes=4, dtype=torch.float32):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.proj = nn.Parameter(torch.randn(hidden, hidden).div(hidden ** 0.5).t())
        self.bn = nn.BatchNorm1d(hidden)
        self.frozen = nn.Parameter(torch.linspace(0.5, 1.5, hidden), requires_grad=False)
        self.scale = nn.Parameter(torch.tensor(1.25))
        self.unused = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.back = nn.Linear(hidden, hidden)
        self.back.weight = self.out.weight                    # tied
        self.head = nn.Linear(hidden, classes)
        self.to(dtype)

    def forward(self, x):
        h = torch.tanh(self.inp(x)) @ self.proj
        h = F.relu(self.bn(h)) * self.frozen * self.scale
        return self.head(self.back(torch.tanh(self.out(h))))


def small_cnn(batch_norm=False):
    """The notebook-01 CNN (conv 8, conv 16, fc 64, fc 10) as an ``nn.Sequential``, optionally
    with BatchNorm after each hidden layer (BatchNorm2d, BatchNorm2d, BatchNorm1d).

    Args:
        batch_norm: insert the BatchNorm layers.
    Returns:
        nn.Sequential mapping (N, 1, 28, 28) images to (N, 10) logits.

    Used in 03_torch_distributed_collectives (the seed experiments' model).
    """
    def bn(kind, n):
        return [kind(n)] if batch_norm else []
    return nn.Sequential(
        nn.Conv2d(1, 8, 5), *bn(nn.BatchNorm2d, 8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5), *bn(nn.BatchNorm2d, 16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 64), *bn(nn.BatchNorm1d, 64), nn.ReLU(), nn.Linear(64, 10))


def count_parameters(model, trainable_only=True):
    """Return the number of (trainable) parameter elements, counting tied tensors once."""
    seen = {id(p): p for p in model.parameters() if p.requires_grad or not trainable_only}
    return sum(p.numel() for p in seen.values())


class GhostBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d that normalises each ghost batch of ``ghost_size`` consecutive examples
    with its own statistics ("ghost batch norm", Hoffer et al. 2017; Page 2018, part 8).

    Training mode: the batch (N, C, H, W) is split into ghost batches of rows
    ``0..g-1, g..2g-1, ...``; each is normalised per channel with ITS OWN mean and biased
    variance, then ``* weight + bias``. So the output for a ghost batch depends only on that
    ghost batch: the summed loss's gradient on ``k*g`` examples is the sum of the gradients of
    its ghost-aligned pieces, and data-parallel training (each rank's minibatch a multiple of
    ``ghost_size``) equals single-process training on the combined batch exactly. A batch of
    exactly ``ghost_size`` examples is ordinary BatchNorm. The running statistics are updated
    once per forward with ``momentum``, from the average over the ghost batches of (mean,
    unbiased variance). Eval mode: ordinary BatchNorm with the running statistics.

    Args:
        num_features: channels C.
        ghost_size: examples per ghost batch; N must be a multiple of it (else ValueError).
        freeze_weight: fix the scale (weight) at 1 (``requires_grad=False``); bias trainable.
        eps, momentum: as in ``nn.BatchNorm2d``.

    Used in 04_resnet_cifar_data_parallel.
    """

    def __init__(self, num_features, ghost_size=32, freeze_weight=True, eps=1e-5, momentum=0.1):
        super().__init__(num_features, eps=eps, momentum=momentum)
        if ghost_size < 1:
            raise ValueError("GhostBatchNorm: ghost_size must be at least 1")
        self.ghost_size = ghost_size
        if freeze_weight:
            self.weight.requires_grad_(False)       # stays at its initial value 1

    def forward(self, x):
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        n, c, h, w = x.shape
        g = self.ghost_size
        if n % g:
            raise ValueError(f"GhostBatchNorm: a batch of {n} examples is not a multiple of "
                             f"ghost_size {g}; use minibatches (per rank) that are multiples of "
                             f"{g}, or a ghost_size that divides them")
        xg = x.float().view(n // g, g, c, h, w)     # statistics in float32 (also under autocast)
        var, mean = torch.var_mean(xg, dim=(1, 3, 4), keepdim=True, correction=0)
        y = (xg - mean) * torch.rsqrt(var + self.eps)
        y = y.view(n, c, h, w) * self.weight.view(1, c, 1, 1) + self.bias.view(1, c, 1, 1)
        y = y.to(x.dtype)
        with torch.no_grad():
            count = g * h * w
            unbiased = var * (count / max(count - 1, 1))
            self.running_mean.lerp_(mean.mean(0).view(c), self.momentum)
            self.running_var.lerp_(unbiased.mean(0).view(c), self.momentum)
            self.num_batches_tracked += 1
        return y


class ResNetBagOfTricks(nn.Module):
    """The fast CIFAR-10 ResNet of David Page, "How to train your ResNet" 1-8 (2018).

    Architecture (w = ``width``; GBN = :class:`GhostBatchNorm` with frozen scale):

    - ``whiten``: frozen p x p conv whose K = 3*p*p filters are the PCA-whitening of image
      patches computed from training data (``cifar_tricks.patch_whitening``), so the first
      trainable layer sees decorrelated, unit-variance inputs.
    - ``prep``: 1x1 conv K -> w, GBN, CELU.
    - ``layer1``: conv3x3 w -> 2w, maxpool 2, GBN, CELU, plus residual
      ``x + res(res(x))`` with ``res`` = conv3x3-GBN-CELU.
    - ``layer2``: conv3x3 2w -> 4w, maxpool 2, GBN, CELU.
    - ``layer3``: conv3x3 4w -> 8w, maxpool 2, GBN, CELU, plus residual.
    - head: global max pool, Linear(8w, classes, bias=False), logits ``* scale``
      (a fixed temperature: the seed's 0.125).

    The other tricks live in the trainer (``cifar_tricks``): CELU (a smooth ReLU) with a small
    alpha, ghost BatchNorm with frozen scales (only BN biases train), label smoothing, an EMA of
    the weights for validation, Nesterov SGD with larger lr / smaller weight decay for biases,
    random crop + flip augmentation and flip test-time augmentation.

    width=64 is the seed's network (about 6.6M parameters); width 8 or 16 suits a CPU.

    Args:
        whitening: float tensor (K, 3, p, p); becomes the frozen ``whiten.weight`` Parameter.
        width: channels of the first layer w.
        num_classes: outputs.
        ghost_size: examples per ghost batch of every GBN.
        celu_alpha: alpha of every CELU.
        scale: multiplier of the logits.
    Returns (forward): logits (N, num_classes) for normalised images (N, 3, 32, 32).

    Used in 04_resnet_cifar_data_parallel.
    """

    def __init__(self, whitening, width=64, num_classes=10, ghost_size=32, celu_alpha=0.075,
                 scale=0.125):
        super().__init__()
        whitening = torch.as_tensor(whitening, dtype=torch.float32)
        k, cin, p, p2 = whitening.shape
        if cin != 3 or p != p2:
            raise ValueError(f"whitening must have shape (K, 3, p, p), got {tuple(whitening.shape)}")
        self.patch_size = p
        self.scale = scale
        self.whiten = nn.Conv2d(3, k, p, padding=p // 2 if p % 2 else 0, bias=False)
        self.whiten.weight = nn.Parameter(whitening.clone(), requires_grad=False)
        w = width

        def conv_bn(c_in, c_out, kernel=3, pool=False):
            layers = [nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=False)]
            if pool:
                layers.append(nn.MaxPool2d(2))
            layers += [GhostBatchNorm(c_out, ghost_size), nn.CELU(celu_alpha)]
            return nn.Sequential(*layers)

        self.prep = conv_bn(k, w, kernel=1)
        self.layer1 = conv_bn(w, 2 * w, pool=True)
        self.res1 = nn.Sequential(conv_bn(2 * w, 2 * w), conv_bn(2 * w, 2 * w))
        self.layer2 = conv_bn(2 * w, 4 * w, pool=True)
        self.layer3 = conv_bn(4 * w, 8 * w, pool=True)
        self.res3 = nn.Sequential(conv_bn(8 * w, 8 * w), conv_bn(8 * w, 8 * w))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.linear = nn.Linear(8 * w, num_classes, bias=False)

    def forward(self, x):
        p = self.patch_size
        if p % 2 == 0:                              # even p: pad so that 32x32 stays 32x32
            x = F.pad(x, ((p - 1) // 2, p // 2, (p - 1) // 2, p // 2))
        x = self.prep(self.whiten(x))
        x = self.layer1(x)
        x = x + self.res1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = x + self.res3(x)
        x = torch.flatten(self.pool(x), 1)
        return self.linear(x) * self.scale
