"""Parts of the CIFAR-10 bag-of-tricks trainer (notebook 04): GhostBatchNorm, ResNetBagOfTricks
and exercise_utils.resnet_cifar_data_parallel.tricks."""
import hashlib
import math
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from exercise_utils.resnet_cifar_data_parallel import tricks as ct
from exercise_utils import launch
from exercise_utils.models import GhostBatchNorm, ResNetBagOfTricks, count_parameters


def _images(n, seed=0, size=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


def _whitening(seed=0):
    return ct.patch_whitening(_images(16, seed, 16))


# ---------------------------------------------------------------- GhostBatchNorm

def test_ghost_batchnorm_normalises_each_ghost_batch_on_its_own():
    torch.manual_seed(0)
    gbn = GhostBatchNorm(5, ghost_size=4, freeze_weight=False)
    with torch.no_grad():
        gbn.weight.uniform_(0.5, 2)
        gbn.bias.uniform_(-1, 1)
    x = torch.randn(12, 5, 3, 3) * torch.arange(1, 13.0).view(12, 1, 1, 1)  # ghosts differ
    out = gbn(x)
    expected = torch.cat([F.batch_norm(x[i:i + 4], None, None, gbn.weight, gbn.bias, True, 0.0, gbn.eps)
                          for i in range(0, 12, 4)])
    assert torch.allclose(out, expected, atol=1e-5)
    whole = F.batch_norm(x, None, None, gbn.weight, gbn.bias, True, 0.0, gbn.eps)
    assert not torch.allclose(out, whole, atol=1e-2), "must not use the statistics of the whole batch"
    # running statistics: one momentum update from the average of (mean, unbiased var)
    ghosts = x.view(3, 4, 5, 3, 3)
    mean = ghosts.mean(dim=(1, 3, 4)).mean(0)
    var = ghosts.var(dim=(1, 3, 4), unbiased=True).mean(0)
    assert torch.allclose(gbn.running_mean, 0.9 * torch.zeros(5) + 0.1 * mean, atol=1e-5)
    assert torch.allclose(gbn.running_var, 0.9 * torch.ones(5) + 0.1 * var, atol=1e-4)
    assert gbn.num_batches_tracked.item() == 1


def test_ghost_batchnorm_of_one_ghost_is_ordinary_batchnorm():
    x = torch.randn(8, 3, 4, 4) * 3 + 1
    gbn, bn = GhostBatchNorm(3, ghost_size=8), nn.BatchNorm2d(3)
    assert torch.allclose(gbn(x), bn(x), atol=1e-5)
    assert torch.allclose(gbn.running_mean, bn.running_mean, atol=1e-6)
    assert torch.allclose(gbn.running_var, bn.running_var, atol=1e-5)


def test_ghost_batchnorm_rejects_a_batch_that_is_not_a_multiple():
    gbn = GhostBatchNorm(3, ghost_size=4)
    with pytest.raises(ValueError, match="a batch of 6 examples is not a multiple of ghost_size 4"):
        gbn(torch.randn(6, 3, 2, 2))
    gbn.eval()
    assert gbn(torch.randn(6, 3, 2, 2)).shape == (6, 3, 2, 2)   # eval mode: any batch size


def test_ghost_batchnorm_eval_uses_running_statistics():
    gbn = GhostBatchNorm(3, ghost_size=2, freeze_weight=False)
    for _ in range(3):
        gbn(torch.randn(4, 3, 2, 2) * 2 + 5)
    gbn.eval()
    x = torch.randn(5, 3, 2, 2)
    expected = (x - gbn.running_mean.view(1, 3, 1, 1)) / torch.sqrt(gbn.running_var.view(1, 3, 1, 1) + gbn.eps)
    assert torch.allclose(gbn(x), expected * gbn.weight.view(1, 3, 1, 1) + gbn.bias.view(1, 3, 1, 1), atol=1e-5)
    assert torch.allclose(gbn(x[:1]), gbn(x)[:1], atol=1e-6)      # no batch dependence
    before = gbn.running_mean.clone()
    gbn(x)
    assert torch.equal(before, gbn.running_mean)


def test_ghost_batchnorm_freezes_only_the_weight():
    gbn = GhostBatchNorm(4)
    assert not gbn.weight.requires_grad and gbn.bias.requires_grad
    assert torch.equal(gbn.weight, torch.ones(4))
    assert GhostBatchNorm(4, freeze_weight=False).weight.requires_grad


def _grads(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y, reduction="sum").backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_gradient_is_additive_over_ghost_aligned_pieces():
    torch.manual_seed(0)
    model = ResNetBagOfTricks(_whitening(), width=4, ghost_size=2)
    x, y = _images(8, 1), torch.randint(0, 10, (8,))
    whole = _grads(model, x, y)
    pieces = [_grads(model, x[i:i + 4], y[i:i + 4]) for i in (0, 4)]
    for name, g in whole.items():
        assert torch.allclose(g, pieces[0][name] + pieces[1][name], rtol=1e-4, atol=1e-6), name
    # with ordinary BatchNorm (one ghost of 8) the same split is NOT additive
    model8 = ResNetBagOfTricks(_whitening(), width=4, ghost_size=8)
    model8.load_state_dict(model.state_dict())
    whole8 = _grads(model8, x, y)
    model8_4 = ResNetBagOfTricks(_whitening(), width=4, ghost_size=4)
    model8_4.load_state_dict(model.state_dict())
    split = [_grads(model8_4, x[i:i + 4], y[i:i + 4]) for i in (0, 4)]
    assert not all(torch.allclose(g, split[0][n] + split[1][n], rtol=1e-3, atol=1e-5) for n, g in whole8.items())


# ---------------------------------------------------------------- ResNetBagOfTricks

def test_resnet_shape_frozen_parts_and_one_training_step():
    w = _whitening()
    model = ResNetBagOfTricks(w, width=4, ghost_size=2)
    x = _images(4, 2)
    assert model(x).shape == (4, 10)
    names = dict(model.named_parameters())
    assert "whiten.weight" in names and "whiten.weight" in model.state_dict()
    assert torch.equal(model.whiten.weight, w) and not model.whiten.weight.requires_grad
    gbns = [m for m in model.modules() if isinstance(m, GhostBatchNorm)]
    assert len(gbns) == 8 and all(m.ghost_size == 2 for m in gbns)
    assert all(not m.weight.requires_grad and m.bias.requires_grad for m in gbns)
    assert all(m.bias is None for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert model.linear.in_features == 32 and model.scale == 0.125
    before = {n: p.clone() for n, p in model.named_parameters()}
    opt, _ = ct.make_optimizer(model, 4, 10)
    ct.label_smoothing_loss(model(x), torch.arange(4)).sum().backward()
    opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (not p.requires_grad), n


def test_resnet_width_64_is_the_seed_network():
    model = ResNetBagOfTricks(_whitening(), width=64)
    assert 6_400_000 < count_parameters(model) < 6_700_000       # Page's network: ~6.5M
    assert model.linear.weight.shape == (10, 512)


def test_resnet_even_patch_size_keeps_32x32():
    w = ct.patch_whitening(_images(4, 0, 8), patch_size=2)
    model = ResNetBagOfTricks(w, width=4, ghost_size=2)
    assert model.whiten(F.pad(_images(2), (0, 1, 0, 1))).shape[-2:] == (32, 32)
    assert model(_images(2)).shape == (2, 10)


# ---------------------------------------------------------------- patch whitening

def _correlated_images(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 12, 12, generator=g)
    x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), 3, stride=1)      # spatial correlation
    mix = torch.tensor([[1.0, 0.5, 0.2], [0.3, 1.0, 0.4], [0.1, 0.2, 1.0]])
    return torch.einsum("dc,nchw->ndhw", mix, x) * 3 + 1                     # channel correlation


def test_patch_whitening_gives_identity_covariance():
    x = _correlated_images()
    w = ct.patch_whitening(x, patch_size=3, eps=1e-6)
    assert w.shape == (27, 3, 3, 3) and w.dtype == torch.float32
    patches = F.unfold(x.double(), 3).transpose(1, 2).reshape(-1, 27)
    raw_cov = torch.cov(patches.T)
    assert (raw_cov - torch.diag(torch.diag(raw_cov))).abs().max() > 0.1   # really correlated
    out = F.conv2d(x.double(), w.double())                                  # whitened patches
    cov = torch.cov(out.permute(1, 0, 2, 3).reshape(27, -1))
    assert torch.allclose(cov, torch.eye(27, dtype=torch.float64), atol=1e-3)
    lam = torch.linalg.eigvalsh(raw_cov).flip(0)
    assert torch.allclose(w.reshape(27, -1).norm(dim=1).double(), 1 / torch.sqrt(lam + 1e-6), rtol=1e-4)


def _digest(w):
    return hashlib.sha256(w.numpy().tobytes()).hexdigest()


def test_patch_whitening_is_deterministic_across_threads_and_processes(tmp_path):
    x = _correlated_images(40, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ct.patch_whitening(x)
        torch.set_num_threads(max(2, threads))
        two = ct.patch_whitening(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    torch.save(x, tmp_path / "x.pt")
    script = tmp_path / "whiten.py"
    script.write_text(textwrap.dedent(f"""
        import hashlib, torch
        from exercise_utils.resnet_cifar_data_parallel import tricks
        w = tricks.patch_whitening(torch.load({str(tmp_path / 'x.pt')!r}))
        print("DIGEST", hashlib.sha256(w.numpy().tobytes()).hexdigest())
    """))
    result = launch.python(script, timeout=60, echo=False)
    assert f"DIGEST {_digest(one)}" in result.output


# ---------------------------------------------------------------- loss, EMA

def test_label_smoothing_loss_matches_the_formula():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 5, generator=g) * 3, torch.tensor([0, 4, 2, 2, 1, 3])
    loss = ct.label_smoothing_loss(logits, labels, smoothing=0.2)
    assert loss.shape == (6,)
    for i in range(6):
        logp = [logits[i, k].item() - math.log(sum(math.exp(v) for v in logits[i].tolist())) for k in range(5)]
        target = [0.8 * (k == labels[i].item()) + 0.2 / 5 for k in range(5)]
        assert abs(loss[i].item() + sum(t * lp for t, lp in zip(target, logp))) < 1e-5
    assert torch.allclose(ct.label_smoothing_loss(logits, labels, 0.0), F.cross_entropy(logits, labels, reduction="none"))


def test_ema_averages_parameters_and_copies_buffers():
    from exercise_utils.models import BNNet
    torch.manual_seed(0)
    model = BNNet()
    ema = ct.EMA(model, momentum=0.9)
    assert ema.model is not model and not ema.model.training and ema.updates == 0
    assert all(not p.requires_grad for p in ema.model.parameters())
    old = {k: v.clone() for k, v in ema.model.state_dict().items()}
    model.train()(torch.randn(16, 10))                 # running stats move
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)
    ema.update(model)
    assert ema.updates == 2
    cur, params = model.state_dict(), dict(model.named_parameters())
    for k, v in ema.model.state_dict().items():
        if k in params:
            kept = 0.1 * (2 / 11)                       # warm-up momenta of updates 1 and 2
            expected = kept * old[k] + (1 - kept) * cur[k]
            assert torch.allclose(v, expected, atol=1e-6), k
        else:                                           # buffers: the model's, copied
            assert torch.equal(v, cur[k]), k
    assert ema.model.bn.num_batches_tracked.item() == 1


def test_ema_momentum_warms_up_to_its_value():
    model = torch.nn.Linear(1, 1, bias=False)
    ema = ct.EMA(model, momentum=0.9)
    momenta = []
    for _ in range(100):
        before = ema.model.weight.item()
        with torch.no_grad():
            model.weight.fill_(before + 1.0)       # current - ema = 1, so ema moves by 1 - m
        ema.update(model)
        momenta.append(1 - (ema.model.weight.item() - before))
    assert abs(momenta[0] - 0.1) < 1e-5 and abs(momenta[2] - 3 / 12) < 1e-5
    assert all(abs(m - 0.9) < 1e-5 for m in momenta[81:])


# ---------------------------------------------------------------- optimizer and schedule

def test_make_optimizer_groups_and_scaled_hyperparameters():
    model = ResNetBagOfTricks(_whitening(), width=4, ghost_size=2)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    for eps in (64, 512):
        opt, _ = ct.make_optimizer(model, eps, 100, lr=0.4, weight_decay=5e-4, bias_scale=64.0)
        groups = {g["name"]: g for g in opt.param_groups}
        assert set(groups) == {"weights", "biases"}
        assert {id(p) for g in opt.param_groups for p in g["params"]} == trainable
        assert all(p.ndim > 1 for p in groups["weights"]["params"])
        assert all(p.ndim <= 1 for p in groups["biases"]["params"]) and groups["biases"]["params"]
        assert all(g["nesterov"] and g["momentum"] == 0.9 for g in opt.param_groups)
        w, b = groups["weights"], groups["biases"]
        assert math.isclose(w["initial_lr"], 0.4 / eps) and math.isclose(b["initial_lr"], 0.4 * 64 / eps)
        assert math.isclose(w["weight_decay"], 5e-4 * eps) and math.isclose(b["weight_decay"], 5e-4 * eps / 64)
        assert math.isclose(w["initial_lr"] * w["weight_decay"], 0.4 * 5e-4)   # independent of eps


def test_schedule_warms_up_then_decays_to_zero():
    model = nn.Linear(3, 2)
    opt, sched = ct.make_optimizer(model, 1, total_steps=10, lr=1.0, warmup_frac=0.2)   # warmup 2
    factors = []
    for _ in range(11):
        factors.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [0.5, 1.0] + [(10 - s) / 8 for s in range(2, 11)]
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(factors, expected)), factors
    assert ct.lr_factor(0, 1, 1) == 1.0 and ct.lr_factor(1, 1, 1) == 0.0


# ---------------------------------------------------------------- augment, minibatches

def test_augment_is_deterministic_and_shaped():
    x = _images(10, 0)
    a = ct.augment(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, ct.augment(x, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, ct.augment(x, torch.Generator().manual_seed(2)))
    assert torch.equal(ct.augment(x, torch.Generator(), pad=0, flip=False), x)


def test_augment_outputs_are_shifted_crops_flipped_about_half_the_time():
    x, pad = _images(200, 4, size=8), 2
    out = ct.augment(x, torch.Generator().manual_seed(0), pad=pad)
    padded = F.pad(x, (pad,) * 4, mode="reflect")
    flips, offsets = 0, set()
    for i in range(len(x)):
        found = [(dy, dx, f) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1) for f in (0, 1)
                 if torch.equal(out[i], (lambda c: c.flip(2) if f else c)(padded[i, :, dy:dy + 8, dx:dx + 8]))]
        assert len(found) == 1, f"output {i} is not a (flipped) crop of the padded input"
        flips += found[0][2]
        offsets.add(found[0][:2])
    assert 70 <= flips <= 130, flips
    assert len(offsets) == (2 * pad + 1) ** 2                  # every offset occurs


def test_minibatches_drop_last_and_use_each_example_once():
    x = torch.arange(23.0).view(23, 1, 1, 1).expand(23, 3, 4, 4).contiguous()
    y = torch.arange(23)
    assert ct.num_minibatches(23, 5) == 4 and ct.num_minibatches(4, 5) == 0
    batches = list(ct.minibatches(x, y, 5, torch.Generator().manual_seed(0), augment=False))
    assert len(batches) == 4 and all(len(xb) == len(yb) == 5 for xb, yb in batches)
    ids = torch.cat([yb for _, yb in batches])
    assert len(set(ids.tolist())) == 20 and ids.tolist() != list(range(20))   # shuffled, once each
    assert all(torch.equal(xb[:, 0, 0, 0].long(), yb) for xb, yb in batches)  # rows stay paired
    again = list(ct.minibatches(x, y, 5, torch.Generator().manual_seed(0), augment=False))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches, again))
    aug = list(ct.minibatches(_images(8), y[:8], 4, torch.Generator().manual_seed(0)))
    assert len(aug) == 2 and aug[0][0].shape == (4, 3, 32, 32)
    with pytest.raises(ValueError):
        ct.minibatches(x, y, 0, torch.Generator())


# ---------------------------------------------------------------- evaluate

class _Toy(nn.Module):
    """Linear model on flattened images with a BatchNorm (so train/eval modes differ)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.bn(x), 1))


def test_evaluate_accuracy_tta_and_mode():
    model = _Toy()
    with torch.no_grad():
        model.bn.running_mean.fill_(0.5)
    x = torch.randn(50, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        plain = model(x).argmax(1)
        both = (model(x) + model(x.flip(3))).argmax(1)
    assert not torch.equal(plain, both), "toy data must make TTA matter"
    y = both.clone()
    y[:10] = (y[:10] + 1) % 3                                     # 10 of 50 wrong for TTA
    model.train()
    assert ct.evaluate(model, x, y, batch_size=7, tta=True) == pytest.approx(0.8)
    assert model.training, "training mode must be restored"
    assert ct.evaluate(model, x, y, batch_size=7, tta=False) == pytest.approx((plain == y).float().mean().item())
    assert torch.equal(model.bn.running_mean, torch.full((3,), 0.5)), "must run in eval mode"
    model.eval()
    ct.evaluate(model, x, y)
    assert not model.training


def test_model_trains_under_bfloat16_autocast():
    """The GPU preset trains under bfloat16 autocast: ghost BatchNorm keeps float32 statistics."""
    model = ResNetBagOfTricks(_whitening(), width=4, ghost_size=4)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = ct.label_smoothing_loss(model(x), y).sum()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters() if p.requires_grad)
    bn = model.prep[1]
    assert bn.running_mean.dtype == torch.float32 and torch.isfinite(bn.running_var).all()
