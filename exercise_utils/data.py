"""Datasets for the course: MNIST, Fashion-MNIST, CIFAR-10 and synthetic stand-ins.

Files are parsed here (IDX and CIFAR pickle batches) and validated; every problem
becomes a ``DatasetError`` naming the file and the ways to fix it. Where data comes
from (first match wins): the ``root=`` folder (nothing else when given), the folder
in ``$DTFS_DATA``, the Debian package ``dataset-fashion-mnist`` (Fashion-MNIST only),
the download cache ``~/.cache/dtfs/data``, a torchvision download (into
``$DTFS_DATA`` if set, else the cache).
Used in 01_mpi_parallel_sgd, 04_resnet_cifar_data_parallel.
"""
from __future__ import annotations

import gzip
import os
import pickle
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ENV_VAR = "DTFS_DATA"
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
DOWNLOAD_TIMEOUT_S = 30  # socket timeout during a download, so a blocked network fails fast
_SPECS = {  # tv: torchvision class; copy: folder a download creates; dirs: sub-folders searched
    "mnist": dict(kind="idx", mean=(0.1307,), std=(0.3081,), tv="MNIST", copy="MNIST",
                  dirs=["mnist", "MNIST/raw", "MNIST", "mnist/raw"], classes=[str(i) for i in range(10)]),
    "fashion-mnist": dict(kind="idx", mean=(0.2860,), std=(0.3530,), tv="FashionMNIST", copy="FashionMNIST",
                          dirs=["fashion-mnist", "FashionMNIST/raw", "FashionMNIST", "fashion_mnist"],
                          classes=["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                                   "Shirt", "Sneaker", "Bag", "Ankle boot"]),
    "cifar10": dict(kind="cifar", mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                    tv="CIFAR10", copy="cifar-10-batches-py",
                    dirs=["cifar-10-batches-py", "cifar10/cifar-10-batches-py", "cifar10"],
                    classes=["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                             "ship", "truck"]),
    "synthetic": dict(kind="synthetic", shape=(1, 28, 28), sizes={"train": 60000, "test": 10000}),
    "synthetic-cifar10": dict(kind="synthetic", shape=(3, 32, 32), sizes={"train": 50000, "test": 10000}),
}
NAMES = ["auto", *_SPECS]
_ALIASES = {"fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist", "cifar-10": "cifar10",
            "synthetic-mnist": "synthetic"}


class DatasetError(RuntimeError):
    """A dataset is missing, corrupt or was asked for wrongly; the message says how to fix it."""


@dataclass(repr=False)
class Dataset:
    """Images ``x`` (float32, N x C x H x W, normalized per channel) and labels ``y`` (int64, N)."""
    name: str
    split: str
    x: torch.Tensor
    y: torch.Tensor
    classes: list[str]
    source: str

    def __len__(self):
        return len(self.y)

    def __repr__(self):
        return f"Dataset({self.name!r}, {self.split!r}, x={tuple(self.x.shape)}, source={self.source!r})"


def dataset_sources(name: str) -> list[str]:
    """Human-readable ways to provide a dataset (used in error messages; docs/students.md lists them too).

    Args:
        name: a dataset name, e.g. "mnist", "fashion-mnist", "cifar10" ("auto" means Fashion-MNIST).
    Returns:
        One sentence per way.
    Used in 01_mpi_parallel_sgd, 04_resnet_cifar_data_parallel.
    """
    name = "fashion-mnist" if _canonical(name) == "auto" else _canonical(name)
    spec = _SPECS[name]
    if spec["kind"] == "synthetic":
        return [f"{name} is generated in memory from the seed; there is nothing to provide"]
    files = "data_batch_1..5, test_batch" if spec["kind"] == "cifar" else \
        "train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), t10k-*"
    apt = "sudo apt install dataset-fashion-mnist (installs to /usr/share/datasets/fashion-mnist)"
    return [f"pass root='/path/to/folder' to load_dataset('{name}'), a folder holding {files} "
            f"(directly or in {' or '.join(d + '/' for d in spec['dirs'][:3])})",
            f"set the environment variable {ENV_VAR}=/path/to/folder (same layouts; downloads go there too)",
            f"install the Debian/Ubuntu package: {apt}" if name == "fashion-mnist" else
            f"for real images without internet use name='fashion-mnist' after: {apt}",
            f"let load_dataset('{name}', download=True) download it (needs internet; saved to "
            f"${ENV_VAR} or ~/.cache/dtfs/data)",
            f"download it on a machine with internet (same call) and copy the folder "
            f"~/.cache/dtfs/data/{spec['copy']} to this machine, then use root= or {ENV_VAR}",
            f"for a smoke test only: name='{'synthetic-cifar10' if name == 'cifar10' else 'synthetic'}' "
            "(random, not real images)"]


def load_dataset(name="auto", split="train", root=None, download=True, subset=None, seed=0,
                 verbose=True) -> Dataset:
    """Load one split of a dataset as normalized tensors.

    Args:
        name: "auto" (MNIST if it is available locally, else Fashion-MNIST), "mnist",
            "fashion-mnist", "cifar10", "synthetic" (MNIST-shaped) or "synthetic-cifar10".
        split: "train" or "test".
        root: a folder that holds the data; when given, nothing else is searched.
        download: allow a torchvision download when no local copy is found.
        subset: return only this many samples, a random subset chosen with ``seed``.
        seed: seed for the subset and for synthetic data.
        verbose: print one line saying where the data came from.
    Returns:
        A ``Dataset``. Raises ``DatasetError`` (with the ways to fix it) on any problem.
    Used in 01_mpi_parallel_sgd, 04_resnet_cifar_data_parallel.
    """
    name, note = _canonical(name), ""
    if split not in ("train", "test"):
        raise DatasetError(f"split must be 'train' or 'test', got {split!r}")
    if name == "auto":
        name, note = _choose_auto(root, split)
    spec = _SPECS[name]
    if spec["kind"] == "synthetic":
        ds = _synthetic(name, split, subset, seed)
    else:
        folder, source = _locate(name, split, root, download)
        images, labels = _read_folder(name, folder, split)
        images, labels = _take_subset(images, labels, subset, seed, f"{name} {split}")
        ds = Dataset(name, split, _normalize(images, spec["mean"], spec["std"]),
                     torch.from_numpy(labels.astype(np.int64)), list(spec["classes"]), source)
    if verbose:
        print(f"{name} {split}: {len(ds)} images from {ds.source}{note}", flush=True)
    return ds


def _canonical(name):
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in NAMES:
        raise DatasetError(f"unknown dataset {name!r}; valid names: {', '.join(NAMES)}")
    return key


def _ways(name):
    return "Ways to provide it:\n" + "\n".join("  - " + w for w in dataset_sources(name))


def _bad_file(path, problem, name):
    """The DatasetError for a damaged file: what is wrong with it and how to replace it."""
    return DatasetError(f"{path} {problem}. Delete it and provide the dataset again. {_ways(name)}")


def _env_dir():
    return Path(os.environ[ENV_VAR]).expanduser() if os.environ.get(ENV_VAR) else None


def _cache_dir():
    return Path.home() / ".cache" / "dtfs" / "data"


def _idx_path(folder, prefix, what, ndim):
    """Return the IDX file ``{prefix}-{what}-idx{ndim}-ubyte`` in ``folder`` (plain, .gz, or '.idx')."""
    for stem in (f"{prefix}-{what}-idx{ndim}-ubyte", f"{prefix}-{what}.idx{ndim}-ubyte"):
        for path in (folder / stem, folder / (stem + ".gz")):
            if path.is_file():
                return path
    return None


def _has_split(folder, split, name):
    if _SPECS[name]["kind"] == "cifar":
        return (folder / ("data_batch_1" if split == "train" else "test_batch")).is_file()
    return _idx_path(folder, "train" if split == "train" else "t10k", "images", 3) is not None


def _find(name, folder, split, bare=True):
    """Return the folder (``folder`` itself if ``bare``, or a known sub-folder) holding the split."""
    for sub in ([""] if bare else []) + _SPECS[name]["dirs"]:
        if _has_split(folder / sub, split, name):
            return folder / sub
    return None


def _choose_auto(root, split):
    """Pick MNIST if a local copy exists, else Fashion-MNIST; return (name, note for the log line)."""
    named = [Path(root).expanduser()] if root is not None else [d for d in [_env_dir()] if d]
    folders = named if root is not None else named + [_cache_dir()]
    for folder in folders:
        if _find("mnist", folder, split, bare=False):
            return "mnist", f" (auto chose MNIST: found locally in {folder})"
        if folder in named and _has_split(folder, split, "mnist"):
            raise DatasetError(f"{folder} holds IDX files directly, which may be MNIST or Fashion-MNIST; "
                               "pass name='mnist' or name='fashion-mnist' instead of name='auto'")
    where = ", ".join(str(f) for f in folders)
    return "fashion-mnist", f" (auto chose Fashion-MNIST: MNIST is not available locally in {where})"


def _locate(name, split, root, download):
    """Return (folder, human-readable source) following the order in the module docstring."""
    if root is not None:
        folder = _find(name, Path(root).expanduser(), split)
        if folder is None:
            raise DatasetError(f"root={str(root)!r} does not contain {name} {split} data (searched the "
                               f"folder and its sub-folders {_SPECS[name]['dirs']}). {_ways(name)}")
        return folder, f"folder {folder} (root argument)"
    places = [(_env_dir(), f"folder {{}} (${ENV_VAR})")] if _env_dir() else []
    if name == "fashion-mnist":
        places.append((DEBIAN_FASHION_MNIST, "Debian package dataset-fashion-mnist ({})"))
    places.append((_cache_dir(), "download cache {}"))
    for place, label in places:
        folder = _find(name, place, split)
        if folder is not None:
            return folder, label.format(folder)
    if not download:
        looked = ", ".join(str(p) for p, _ in places)
        raise DatasetError(f"{name} {split} data not found (looked in {looked}) and download=False. "
                           f"{_ways(name)}")
    return _download(name, split)


def _download(name, split):
    """Download with torchvision into $DTFS_DATA or the cache; return (folder, source)."""
    target, old = _env_dir() or _cache_dir(), socket.getdefaulttimeout()
    try:
        import torchvision
        socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
        getattr(torchvision.datasets, _SPECS[name]["tv"])(root=str(target), train=split == "train",
                                                          download=True)
    except Exception as err:  # no internet, proxy, disk full, torchvision errors
        raise DatasetError(f"could not download {name} into {target}: {type(err).__name__}: "
                           f"{str(err).strip()}\n{_ways(name)}") from err
    finally:
        socket.setdefaulttimeout(old)
    folder = _find(name, target, split, bare=False)
    if folder is None:
        raise DatasetError(f"download of {name} finished but no files were found in {target}. {_ways(name)}")
    return folder, f"torchvision download into {folder}"


def _read_folder(name, folder, split):
    """Read uint8 images (N x C x H x W) and labels (N) of one split from ``folder``."""
    if _SPECS[name]["kind"] == "cifar":
        return _read_cifar(name, folder, split)
    prefix = "train" if split == "train" else "t10k"
    img_path, lab_path = _idx_path(folder, prefix, "images", 3), _idx_path(folder, prefix, "labels", 1)
    if lab_path is None:
        raise DatasetError(f"found {img_path} but no {prefix}-labels-idx1-ubyte(.gz) next to it. "
                           f"{_ways(name)}")
    images, labels = _read_idx(img_path, 0x803, name), _read_idx(lab_path, 0x801, name)
    if images.shape[1:] != (28, 28):
        raise _bad_file(img_path, f"holds {images.shape[1]}x{images.shape[2]} images, expected 28x28", name)
    if len(images) != len(labels):
        raise DatasetError(f"{img_path} has {len(images)} images but {lab_path} has {len(labels)} labels; "
                           f"one of them is from another dataset or corrupt. {_ways(name)}")
    _check_labels(labels, lab_path, name)
    return images[:, None], labels


def _read_bytes(path, name):
    """Return the content of ``path``, gunzipped if it is gzip (detected from its first bytes)."""
    try:
        with open(path, "rb") as f:
            opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            return bytearray(f.read())  # writable, so torch.from_numpy does not warn
    except (EOFError, OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        problem = f"is truncated, corrupt or unreadable ({type(err).__name__}: {err})"
        raise _bad_file(path, problem, name) from err


def _read_idx(path, magic, name):
    """Parse an IDX file (big-endian header, uint8 data) into a numpy array, validating it."""
    data, ndim = _read_bytes(path, name), magic & 0xFF
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found != magic:
        shown = "none (file too short)" if found is None else f"0x{found:08X}"
        raise _bad_file(path, f"is not an IDX {'images' if ndim == 3 else 'labels'} file: magic number "
                        f"{shown}, expected 0x{magic:08X}", name)
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise _bad_file(path, f"is truncated or corrupt: expected {expected} bytes (header says {dims}), "
                        f"found {len(data)}", name)
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _check_labels(labels, path, name):
    bad = labels[(labels < 0) | (labels > 9)]
    if len(bad):
        raise _bad_file(path, f"has label {int(bad[0])}; labels must be 0..9", name)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR batches that refuses anything but numpy arrays (no code execution)."""
    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module, name):
        module = module.replace("numpy.core.", "numpy._core.")  # files pickled by numpy < 2
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch")
        return super().find_class(module, name)


def _read_cifar_batch(path):
    """Read one CIFAR-10 python batch: a dict with b"data" (uint8 N x 3072) and b"labels"."""
    try:
        with open(path, "rb") as f:
            batch = _NumpyOnlyUnpickler(f, encoding="bytes").load()
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as err:  # pickle, EOF, missing keys, wrong types
        problem = f"is not a readable CIFAR-10 batch ({type(err).__name__}: {err})"
        raise _bad_file(path, problem, "cifar10") from err
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),):
        raise _bad_file(path, f"has data {data.dtype} {data.shape} and {labels.shape} labels; expected "
                        "uint8 N x 3072 and N labels", "cifar10")
    _check_labels(labels, path, "cifar10")
    return data.reshape(-1, 3, 32, 32), labels


def _read_cifar(name, folder, split):
    files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise DatasetError(f"{folder} is missing {', '.join(missing)}. {_ways(name)}")
    parts = [_read_cifar_batch(folder / f) for f in files]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _check_count(n, limit, what):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n <= limit:
        raise DatasetError(f"subset must be an integer in 1..{limit} for {what}, got {n!r}")


def _take_subset(images, labels, subset, seed, what):
    """Return ``subset`` samples chosen by a seeded permutation (no repeats); all if None."""
    if subset is None:
        return images, labels
    _check_count(subset, len(labels), what)
    idx = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:subset].numpy()
    return images[idx], labels[idx]


def _normalize(images, mean, std):
    """uint8 N x C x H x W -> float32 (x/255 - mean) / std per channel, in place on one copy."""
    x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32)
    shape = (1, -1, 1, 1)
    return x.sub_(torch.tensor(mean).view(shape) * 255).div_(torch.tensor(std).view(shape) * 255)


def _synthetic(name, split, subset, seed):
    """Blocky class templates plus noise, built in uint8 so even the full size takes about 1 s."""
    spec, (c, h, w) = _SPECS[name], _SPECS[name]["shape"]
    n = spec["sizes"][split] if subset is None else subset
    _check_count(n, spec["sizes"][split], f"{name} {split}")
    low = np.random.default_rng(seed).integers(0, 128, size=(10, c, h // 4, w // 4), dtype=np.uint8)
    templates = low.repeat(4, axis=2).repeat(4, axis=3).reshape(10, -1)  # shared by train and test
    rng = np.random.default_rng([seed, split == "test"])
    banks = rng.integers(0, 64, size=(2, 1024, c * h * w), dtype=np.uint8)  # noise = sum of 2 bank rows
    labels, pick = rng.integers(0, 10, size=n), rng.integers(0, 1024, size=(2, n))
    x = templates[labels]
    x += banks[0][pick[0]]
    x += banks[1][pick[1]]
    images = _normalize(x.reshape(n, c, h, w), (125 / 255,) * c, (45 / 255,) * c)
    return Dataset(name, split, images, torch.from_numpy(labels.astype(np.int64)),
                   [f"class {i}" for i in range(10)], f"synthetic (random, not real images; seed={seed})")
