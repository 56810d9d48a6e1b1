"""Tests for exercise_utils.data: sources, layouts, parsing, validation, synthetic data.

All tests run offline: HOME and DTFS_DATA are redirected to tmp_path, downloads are
monkeypatched, and fixtures are tiny files written in the datasets' own formats.
"""
import gzip
import os
import pickle
import socket
import sys
import time
import types
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

import exercise_utils.data as data
from exercise_utils.data import DatasetError, load_dataset

REAL_DEBIAN = Path("/usr/share/datasets/fashion-mnist")
N_TRAIN, N_TEST = 30, 12


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real cache, no DTFS_DATA, no Debian package unless a test puts them back."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DTFS_DATA", raising=False)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")


# ---------------------------------------------------------------- fixture writers
def idx_bytes(arr, magic):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_file(path, payload, gz):
    path.parent.mkdir(parents=True, exist_ok=True)
    path = path.with_name(path.name + ".gz") if gz else path
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def make_idx_split(folder, prefix, n, seed, gz=True, sep="-"):
    """Write {prefix}-images-idx3-ubyte and labels; return (images, labels, image path, label path)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) * 7 + seed) % 10
    ip = write_file(folder / f"{prefix}-images{sep}idx3-ubyte", idx_bytes(images, 0x803), gz)
    lp = write_file(folder / f"{prefix}-labels{sep}idx1-ubyte", idx_bytes(labels, 0x801), gz)
    return images, labels.astype(np.int64), ip, lp


def make_idx_dataset(folder, gz=True, seed=1, sep="-"):
    train = make_idx_split(folder, "train", N_TRAIN, seed, gz, sep)
    test = make_idx_split(folder, "t10k", N_TEST, seed + 100, gz, sep)
    return {"train": train, "test": test}


def make_cifar(folder, per_batch=4, n_test=6):
    """Write CIFAR-10 python batches (dicts with bytes keys, as in the real archive)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    out = {"train": ([], []), "test": ([], [])}
    for fname in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = n_test if fname == "test_batch" else per_batch
        arr = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        batch = {b"batch_label": fname.encode(), b"labels": labels, b"data": arr,
                 b"filenames": [f"img{i}.png".encode() for i in range(n)]}
        payload = pickle.dumps(batch, protocol=2)  # the real files name numpy.core (numpy < 2)
        payload = payload.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
        (folder / fname).write_bytes(payload)
        key = "test" if fname == "test_batch" else "train"
        out[key][0].append(arr)
        out[key][1].extend(labels)
    meta = {b"label_names": [c.encode() for c in data._SPECS["cifar10"]["classes"]]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return {k: (np.concatenate(v[0]), np.array(v[1])) for k, v in out.items()}


def fake_torchvision(monkeypatch, **classes):
    """Stand in for torchvision (importing the real one takes seconds) with the given dataset classes."""
    fake = types.SimpleNamespace(datasets=types.SimpleNamespace(**classes))
    monkeypatch.setitem(sys.modules, "torchvision", fake)


class MakesDirWhenUnpickled:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def denormalize(x, mean, std):
    return torch.round((x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)) * 255)


# ---------------------------------------------------------------- real Debian data
@pytest.mark.skipif(not REAL_DEBIAN.is_dir(), reason="Debian package dataset-fashion-mnist not installed "
                    "(/usr/share/datasets/fashion-mnist absent)")
def test_debian_fashion_mnist(monkeypatch, capsys):
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST", REAL_DEBIAN)
    start = time.perf_counter()
    ds = load_dataset("fashion-mnist", "train", download=False)
    elapsed = time.perf_counter() - start
    assert ds.x.shape == (60000, 1, 28, 28) and ds.x.dtype == torch.float32
    assert ds.y.dtype == torch.int64 and ds.y.bincount().tolist() == [6000] * 10
    assert ds.y[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert abs(ds.x.mean().item()) < 0.01 and abs(ds.x.std().item() - 1) < 0.01
    assert ds.classes[9] == "Ankle boot" and len(ds) == 60000
    assert "Debian package dataset-fashion-mnist" in ds.source
    assert "fashion-mnist train: 60000 images from Debian package" in capsys.readouterr().out
    assert elapsed < 10, f"loading took {elapsed:.1f} s"
    test = load_dataset("fashion-mnist", "test", download=False, verbose=False)
    assert test.x.shape == (10000, 1, 28, 28) and test.y[:5].tolist() == [9, 2, 1, 1, 6]


# ---------------------------------------------------------------- folders and layouts
@pytest.mark.parametrize("name,sub,gz,sep", [
    ("mnist", "", True, "-"), ("mnist", "", False, "-"), ("mnist", "mnist", True, "-"),
    ("mnist", "MNIST/raw", False, "-"), ("fashion-mnist", "FashionMNIST/raw", True, "-"),
    ("fashion-mnist", "fashion-mnist", False, "-"), ("fashion-mnist", "", True, "."),
])
def test_explicit_root_layouts(tmp_path, capsys, name, sub, gz, sep):
    made = make_idx_dataset(tmp_path / "d" / sub, gz=gz, sep=sep)
    for split in ("train", "test"):
        ds = load_dataset(name, split, root=tmp_path / "d", download=False)
        images, labels = made[split][:2]
        assert ds.x.shape == (len(labels), 1, 28, 28) and ds.x.dtype == torch.float32
        assert torch.equal(ds.y, torch.from_numpy(labels))
        spec = data._SPECS[name]
        restored = denormalize(ds.x, spec["mean"], spec["std"])[:, 0]
        assert torch.equal(restored, torch.from_numpy(images).float())
        assert "(root argument)" in ds.source and str(tmp_path / "d") in ds.source
    assert f"{name} test: {N_TEST} images from folder" in capsys.readouterr().out


def test_dtfs_data_env(tmp_path, monkeypatch):
    made = make_idx_dataset(tmp_path / "env" / "MNIST" / "raw", gz=False)
    monkeypatch.setenv("DTFS_DATA", str(tmp_path / "env"))
    ds = load_dataset("mnist", "test", download=False, verbose=False)
    assert torch.equal(ds.y, torch.from_numpy(made["test"][1]))
    assert "$DTFS_DATA" in ds.source and str(tmp_path / "env" / "MNIST" / "raw") in ds.source


def test_download_cache_is_used(tmp_path):
    made = make_idx_dataset(tmp_path / "home" / ".cache" / "dtfs" / "data" / "FashionMNIST" / "raw")
    ds = load_dataset("fashion-mnist", "train", download=False, verbose=False)
    assert torch.equal(ds.y, torch.from_numpy(made["train"][1])) and "download cache" in ds.source


def test_explicit_root_without_data_does_not_fall_back(tmp_path, monkeypatch):
    make_idx_dataset(tmp_path / "env" / "fashion-mnist")
    monkeypatch.setenv("DTFS_DATA", str(tmp_path / "env"))
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST", REAL_DEBIAN)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="does not contain fashion-mnist train") as err:
        load_dataset("fashion-mnist", root=tmp_path / "empty")
    assert str(tmp_path / "empty") in str(err.value) and "DTFS_DATA" in str(err.value)


# ---------------------------------------------------------------- auto
def test_auto_picks_local_mnist(tmp_path, monkeypatch, capsys):
    make_idx_dataset(tmp_path / "env" / "mnist")
    make_idx_dataset(tmp_path / "env" / "fashion-mnist", seed=3)
    monkeypatch.setenv("DTFS_DATA", str(tmp_path / "env"))
    ds = load_dataset("auto", download=False)
    assert ds.name == "mnist" and ds.classes[3] == "3"
    assert "auto chose MNIST" in capsys.readouterr().out


def test_auto_picks_mnist_from_root_and_cache(tmp_path):
    make_idx_dataset(tmp_path / "r" / "MNIST" / "raw")
    assert load_dataset(root=tmp_path / "r", download=False, verbose=False).name == "mnist"
    make_idx_dataset(tmp_path / "home" / ".cache" / "dtfs" / "data" / "MNIST" / "raw")
    assert load_dataset(download=False, verbose=False).name == "mnist"


def test_auto_falls_back_to_fashion_mnist(tmp_path, monkeypatch, capsys):
    made = make_idx_dataset(tmp_path / "deb", seed=4)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST", tmp_path / "deb")
    ds = load_dataset(download=False)
    assert ds.name == "fashion-mnist" and torch.equal(ds.y, torch.from_numpy(made["train"][1]))
    out = capsys.readouterr().out
    assert "auto chose Fashion-MNIST: MNIST is not available locally" in out and "Debian package" in out


def test_auto_refuses_ambiguous_bare_files(tmp_path):
    make_idx_dataset(tmp_path / "bare")
    with pytest.raises(DatasetError, match="may be MNIST or Fashion-MNIST"):
        load_dataset("auto", root=tmp_path / "bare", download=False)


def test_auto_never_uses_synthetic(tmp_path):
    with pytest.raises(DatasetError, match="fashion-mnist train data not found"):
        load_dataset("auto", download=False)


# ---------------------------------------------------------------- synthetic
@pytest.mark.parametrize("name,shape", [("synthetic", (1, 28, 28)), ("synthetic-cifar10", (3, 32, 32))])
def test_synthetic_is_deterministic_and_learnable(name, shape, capsys):
    train = load_dataset(name, "train", subset=2000, seed=7)
    assert "synthetic (random, not real images" in capsys.readouterr().out
    assert train.x.shape == (2000, *shape) and train.y.dtype == torch.int64 and len(train.classes) == 10
    assert abs(train.x.mean().item()) < 0.2 and 0.7 < train.x.std().item() < 1.3
    again = load_dataset(name, "train", subset=2000, seed=7, verbose=False)
    assert torch.equal(train.x, again.x) and torch.equal(train.y, again.y)
    assert not torch.equal(train.x, load_dataset(name, subset=2000, seed=8, verbose=False).x)
    test = load_dataset(name, "test", subset=1000, seed=7, verbose=False)
    assert not torch.equal(train.x[:1000], test.x)
    means = torch.stack([train.x[train.y == k].mean(0) for k in range(10)]).flatten(1)
    pred = torch.cdist(test.x.flatten(1), means).argmin(1)
    assert (pred == test.y).float().mean().item() > 0.5  # chance is 0.1


def test_synthetic_full_sizes():
    assert len(load_dataset("synthetic", "test", verbose=False)) == 10000
    with pytest.raises(DatasetError, match="subset"):
        load_dataset("synthetic-cifar10", "train", subset=50001, verbose=False)


def test_unknown_name_lists_valid_names():
    with pytest.raises(DatasetError) as err:
        load_dataset("imagenet")
    for valid in ("mnist", "fashion-mnist", "cifar10", "synthetic", "synthetic-cifar10", "auto"):
        assert valid in str(err.value)
    with pytest.raises(DatasetError, match="split"):
        load_dataset("synthetic", split="validation")


# ---------------------------------------------------------------- corrupt files
def _corrupt(kind, tmp_path):
    made = make_idx_dataset(tmp_path / "c", gz=kind in ("truncated-gzip", "garbage-gzip", "count-mismatch"))
    img, lab = made["train"][2], made["train"][3]
    if kind == "truncated":
        img.write_bytes(img.read_bytes()[:1000])
        return img, f"expected {16 + N_TRAIN * 784} bytes (header says ({N_TRAIN}, 28, 28)), found 1000"
    if kind == "bad-magic":
        img.write_bytes(b"\x00\x00\x08\x01" + img.read_bytes()[4:])
        return img, "magic number 0x00000801, expected 0x00000803"
    if kind == "truncated-gzip":
        img.write_bytes(img.read_bytes()[:-300])
        return img, "truncated, corrupt or unreadable (EOFError"
    if kind == "garbage-gzip":
        img.write_bytes(b"\x1f\x8b" + bytes(range(200)))
        return img, "truncated, corrupt or unreadable (BadGzipFile"
    if kind == "count-mismatch":
        lab.write_bytes(gzip.compress(idx_bytes(np.zeros(N_TRAIN - 1, np.uint8), 0x801)))
        return lab, f"has {N_TRAIN} images but"
    if kind == "empty-labels":
        lab.write_bytes(b"")
        return lab, "magic number none"
    if kind == "label-range":
        lab.write_bytes(idx_bytes(np.full(N_TRAIN, 12, np.uint8), 0x801))
        return lab, "label 12"
    if kind == "wrong-size":
        img.write_bytes(idx_bytes(np.zeros((N_TRAIN, 32, 32), np.uint8), 0x803))
        return img, "32x32 images, expected 28x28"
    lab.unlink()
    return img, "no train-labels-idx1-ubyte"


@pytest.mark.parametrize("kind", ["truncated", "bad-magic", "truncated-gzip", "garbage-gzip",
                                  "count-mismatch",
                                  "empty-labels", "label-range", "wrong-size", "missing-labels"])
def test_corrupt_idx_raises_dataset_error_naming_file(tmp_path, kind):
    path, expected = _corrupt(kind, tmp_path)
    with pytest.raises(DatasetError) as err:  # a ValueError/EOFError would fail this test
        load_dataset("mnist", root=tmp_path / "c", download=False, verbose=False)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_missing_data_without_download_lists_ways(monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("must not download when download=False")
    fake_torchvision(monkeypatch, FashionMNIST=no_download)
    with pytest.raises(DatasetError) as err:
        load_dataset("fashion-mnist", download=False)
    msg = str(err.value)
    for needle in ("not found", "download=False", "DTFS_DATA", "sudo apt install dataset-fashion-mnist",
                   "root=", "name='synthetic'"):
        assert needle in msg, needle


# ---------------------------------------------------------------- CIFAR-10
def test_cifar_pickle_batches(tmp_path, capsys):
    made = make_cifar(tmp_path / "c" / "cifar-10-batches-py")
    ds = load_dataset("cifar10", root=tmp_path / "c", download=False)
    assert ds.x.shape == (20, 3, 32, 32) and torch.equal(ds.y, torch.from_numpy(made["train"][1]))
    spec = data._SPECS["cifar10"]
    restored = denormalize(ds.x, spec["mean"], spec["std"])
    green = made["train"][0][1, 1024:2048].reshape(32, 32)
    assert torch.equal(restored[1, 1], torch.from_numpy(green).float())
    assert ds.classes[0] == "airplane" and "cifar10 train: 20 images" in capsys.readouterr().out
    test = load_dataset("cifar10", "test", root=tmp_path / "c" / "cifar-10-batches-py", verbose=False)
    assert test.x.shape == (6, 3, 32, 32) and test.y.tolist() == made["test"][1].tolist()


@pytest.mark.parametrize("kind", ["truncated", "wrong-shape", "missing-key", "not-numpy", "missing-batch"])
def test_corrupt_cifar_raises_dataset_error(tmp_path, kind):
    folder = tmp_path / "cifar-10-batches-py"
    make_cifar(folder)
    path = folder / "data_batch_3"
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    elif kind == "wrong-shape":
        path.write_bytes(pickle.dumps({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}))
    elif kind == "missing-key":
        path.write_bytes(pickle.dumps({b"data": np.zeros((4, 3072), np.uint8)}))
    elif kind == "not-numpy":  # a pickle that would run code must be refused, not executed
        path.write_bytes(pickle.dumps(MakesDirWhenUnpickled(tmp_path / "pwned")))
    else:
        path.unlink()
    with pytest.raises(DatasetError) as err:
        load_dataset("cifar10", root=tmp_path, download=False, verbose=False)
    assert (str(path) if kind != "missing-batch" else "missing data_batch_3") in str(err.value)
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------- subset
def test_subset_is_deterministic_random_subset(tmp_path):
    made = make_idx_dataset(tmp_path / "mnist")
    full = load_dataset("mnist", root=tmp_path, verbose=False)
    a = load_dataset("mnist", root=tmp_path, subset=10, seed=3, verbose=False)
    b = load_dataset("mnist", root=tmp_path, subset=10, seed=3, verbose=False)
    c = load_dataset("mnist", root=tmp_path, subset=10, seed=4, verbose=False)
    assert len(a) == 10 and torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and not torch.equal(a.x, c.x)
    images, labels = made["train"][:2]
    rows = {tuple(r.tolist()): int(lab) for r, lab in zip(images.reshape(N_TRAIN, -1), labels)}
    found = denormalize(a.x, (0.1307,), (0.3081,)).to(torch.uint8).flatten(1)
    assert [rows[tuple(r.tolist())] for r in found] == a.y.tolist()  # real samples with their own labels
    assert len({tuple(r.tolist()) for r in found}) == 10  # without repetition
    assert not torch.equal(a.x, full.x[:10])
    for bad in (0, -1, N_TRAIN + 1, 2.5):
        with pytest.raises(DatasetError, match="subset"):
            load_dataset("mnist", root=tmp_path, subset=bad, verbose=False)


# ---------------------------------------------------------------- downloads (faked, offline)
def test_download_failure_becomes_dataset_error(tmp_path, monkeypatch):
    calls = []

    def offline(root, train, download):
        calls.append(root)
        raise urllib.error.URLError("[Errno -2] Name or service not known")
    fake_torchvision(monkeypatch, MNIST=offline)
    monkeypatch.setenv("DTFS_DATA", str(tmp_path / "env"))
    start = time.perf_counter()
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist")
    assert time.perf_counter() - start < 2
    msg = str(err.value)
    assert "could not download mnist" in msg and "URLError" in msg and "DTFS_DATA" in msg and "root=" in msg
    assert calls == [str(tmp_path / "env")] and socket.getdefaulttimeout() is None


def test_successful_download_is_parsed(tmp_path, monkeypatch):
    made = {}

    def fake_cifar(root, train, download):
        made.update(make_cifar(Path(root) / "cifar-10-batches-py"))
        assert socket.getdefaulttimeout() == data.DOWNLOAD_TIMEOUT_S
    fake_torchvision(monkeypatch, CIFAR10=fake_cifar)
    ds = load_dataset("cifar10", "test", verbose=False)
    assert ds.y.tolist() == made["test"][1].tolist()
    assert ds.source.startswith("torchvision download into") and ".cache/dtfs/data" in ds.source
    again = load_dataset("cifar10", "test", download=False, verbose=False)  # now found in the cache
    assert "download cache" in again.source
