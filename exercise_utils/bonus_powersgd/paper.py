"""The PowerSGD paper's CIFAR-10 figures, with its data column recomputed from ResNet-18.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019, arXiv:1905.13727), Table 3: ResNet-18 on CIFAR-10,
16 workers, 128 images per worker and step, 300 epochs (hyperparameters:
``paper-code/hyperparameters.md`` in github.com/epfml/powersgd).

The "data per epoch" column is not taken on trust: :func:`data_per_epoch` recomputes it from
the shapes of the paper's ResNet-18 (the CIFAR variant of its code: a 3x3 stem, four stages of
two basic blocks, 1x1 shortcut convolutions, a 512->10 classifier; 11,173,962 parameters) and
the number of steps a worker takes per epoch: every weight of two or more dimensions is
reshaped to (first dimension, the rest) and sent as P and Q, (rows + cols) * min(rows, cols, r)
numbers; BatchNorm weights, biases and the classifier's bias are sent whole; 4 bytes each.
The paper's "MB" are MiB (2**20 bytes): 1023.0 of them uncompressed. Used in
08_bonus_powersgd and checked in tests/test_08_powersgd_paper.py.
"""
from ..bench import format_table

WORKERS, BATCH_PER_WORKER, TRAIN_IMAGES = 16, 128, 50_000
BYTES_PER_NUMBER = 4
MIB = 2 ** 20

# Table 3 (image classification). accuracy: test accuracy; mb_per_epoch: data sent per worker
# and epoch in MiB; compression: how many times less than SGD.
PAPER = [
    {"method": "SGD (uncompressed)", "rank": None, "accuracy": 0.943, "mb_per_epoch": 1023,
     "compression": 1},
    {"method": "PowerSGD", "rank": 1, "accuracy": 0.936, "mb_per_epoch": 4, "compression": 243},
    {"method": "PowerSGD", "rank": 2, "accuracy": 0.944, "mb_per_epoch": 8, "compression": 136},
    {"method": "PowerSGD", "rank": 4, "accuracy": 0.945, "mb_per_epoch": 14, "compression": 72},
]


def resnet18_cifar_shapes(num_classes=10):
    """Shapes of every parameter of the paper's CIFAR ResNet-18, in registration order."""
    shapes = [(64, 3, 3, 3), (64,), (64,)]                      # stem conv, its BatchNorm
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for block in range(2):
            first = block == 0
            shapes += [(cout, cin, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if first and (stride != 1 or cin != cout):
                shapes += [(cout, cin, 1, 1), (cout,), (cout,)]  # shortcut conv + BatchNorm
            cin = cout
    return shapes + [(num_classes, 512), (num_classes,)]


def numbers_sent(shapes, rank=None):
    """Numbers one worker sends per step: every element (rank None) or PowerSGD at ``rank``."""
    total = 0
    for shape in shapes:
        numel = 1
        for d in shape:
            numel *= d
        if rank is None or len(shape) < 2:
            total += numel
        else:
            rows, cols = shape[0], numel // shape[0]
            total += (rows + cols) * min(rows, cols, rank)
    return total


def steps_per_epoch(workers=WORKERS, batch=BATCH_PER_WORKER, images=TRAIN_IMAGES):
    """Steps per epoch of one worker: its share of the images, incomplete last batch dropped."""
    return -(-images // workers) // batch


def data_per_epoch(rank=None, shapes=None):
    """MiB one worker sends per epoch, uncompressed (rank None) or with PowerSGD at ``rank``."""
    shapes = shapes or resnet18_cifar_shapes()
    return numbers_sent(shapes, rank) * BYTES_PER_NUMBER * steps_per_epoch() / MIB


def rows():
    """PAPER's rows with the recomputed data per epoch and compression beside the paper's."""
    full = data_per_epoch()
    out = []
    for r in PAPER:
        mib = data_per_epoch(r["rank"])
        out.append({**r, "rank": r["rank"] or "-", "accuracy": 100 * r["accuracy"],
                    "recomputed_mib": mib, "recomputed_x": full / mib})
    return out


def table():
    """The paper's figures and the recomputed data column as a text table."""
    return format_table(rows(), [
        ("method", "method"), ("rank", "rank"), ("accuracy", "accuracy %"),
        ("mb_per_epoch", "MiB/epoch"), ("compression", "x less"),
        ("recomputed_mib", "recomputed MiB/epoch"), ("recomputed_x", "recomputed x less")],
        {"accuracy": ".1f", "recomputed_mib": ".1f", "recomputed_x": ".0f"})
