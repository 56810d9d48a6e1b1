"""exercise_utils.powersgd_experiment (notebook 08): one tiny launch of every method with the
solution's PowerSGD; the bytes are counted from the all_reduce calls and must match the
PowerSGD formula, torch's powerSGD_hook sends exactly as much as the solution; table and plot.
exercise_utils.powersgd_paper: the paper's data column recomputed from ResNet-18's shapes.
No timing asserts."""
from pathlib import Path

import numpy as np

from exercise_utils import powersgd_experiment as pe
from exercise_utils import powersgd_paper
from exercise_utils.notebook_files import extract_writefiles
from exercise_utils.models import DropoutNet

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "08_bonus_powersgd.ipynb"


def expected_bytes(steps, start_iter, r):
    """4 bytes per element: uncompressed steps send every gradient; compressed ones send
    (n + m) * r' per matrix that shrinks and every other element."""
    per_step = 0
    for p in DropoutNet().parameters():
        n, m = p.shape[0], int(np.prod(p.shape[1:]))
        rr = min(n, m, r)
        per_step += (n + m) * rr if p.dim() >= 2 and (n + m) * rr < n * m else p.numel()
    full = sum(p.numel() for p in DropoutNet().parameters())
    return 4 * (start_iter * full + (steps - start_iter) * per_step)


def test_experiment_counts_bytes_and_matches_torch(tmp_path):
    out = tmp_path / "08.json"
    work = extract_writefiles(SOLUTION, tmp_path)["08_powersgd"]
    rows = pe.run(work, ranks=(1, 4), out=out, echo=False, timeout=120,
                  extra=("--epochs", "1", "--train-size", "384", "--test-size", "128",
                         "--start-iter", "2", "--data", "synthetic"))
    by = {(r["method"], r["rank"]): r for r in rows}
    assert set(by) == {("uncompressed", None), ("yours", 1), ("yours", 4), ("torch", 1),
                       ("torch", 4)}
    steps = by[("uncompressed", None)]["steps"]
    assert steps == 6                                   # 384 / 2 workers / 32
    assert by[("uncompressed", None)]["bytes_per_worker"] == expected_bytes(steps, steps, 1)
    for r in (1, 4):
        want = expected_bytes(steps, 2, r)
        assert by[("yours", r)]["bytes_per_worker"] == want, r
        assert by[("torch", r)]["bytes_per_worker"] == want, r
        assert by[("yours", r)]["compression"] > 1.5
    assert by[("yours", 1)]["bytes_per_worker"] < by[("yours", 4)]["bytes_per_worker"]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    text = pe.table(rows)
    assert "yours r=1" in text and "torch r=4" in text and "uncompressed" in text
    pe.plot(rows, tmp_path / "08.png")
    assert (tmp_path / "08.png").stat().st_size > 1000


def test_paper_data_column_is_recomputed_from_resnet18():
    """The quoted MiB per epoch and compression factors follow from the architecture: a
    wrong shape, rank rule or step count moves them off the paper's rounded figures."""
    shapes = powersgd_paper.resnet18_cifar_shapes()
    assert powersgd_paper.numbers_sent(shapes) == 11_173_962     # the CIFAR ResNet-18
    assert powersgd_paper.steps_per_epoch() == 24                # 3,125 images / 128
    for row in powersgd_paper.rows():
        assert abs(row["recomputed_mib"] - row["mb_per_epoch"]) <= 0.55, row
        assert round(row["recomputed_x"]) == row["compression"], row
    # the rank rule matters: sending 1-D tensors compressed too, or full rank, changes it
    assert powersgd_paper.numbers_sent([(64,)], rank=1) == 64
    assert powersgd_paper.numbers_sent([(10, 512)], rank=4) == (10 + 512) * 4
    assert powersgd_paper.numbers_sent([(3, 2)], rank=4) == (3 + 2) * 2
    text = powersgd_paper.table()
    assert "243" in text and "1023.0" in text and "recomputed" in text
