"""The networks of the course, in one place.

- :class:`MPINet`: the small 8/16-channel CNN of the MPI exercise (01).
- :class:`DropoutNet`: the 10/20-channel CNN with dropout of the PyTorch MNIST
  example, written correctly (``fc1 -> ReLU -> dropout -> fc2 -> log_softmax``;
  a seed report applied ``fc2`` twice and a ReLU before ``log_softmax``).
- Toy models for checkers: :class:`TinyMLP`, :class:`FrozenTiedNet` (a frozen
  parameter and weights tied between two layers), :class:`BNNet` (BatchNorm buffers).

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

    Train with ``F.nll_loss``. Used in 02 to 05.
    """

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)

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
