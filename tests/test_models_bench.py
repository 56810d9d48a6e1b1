"""Models of the course, benchmark helpers and the notebook-file extractor."""
import json

import pytest
import torch

from exercise_utils import bench, models
from exercise_utils.notebook_files import extract_writefiles, writefile_cells


def test_cnns_take_mnist_images():
    x = torch.randn(3, 1, 28, 28)
    assert models.MPINet()(x).shape == (3, 10)
    net = models.DropoutNet().eval()
    out = net(x)
    assert out.shape == (3, 10)
    assert torch.allclose(out.exp().sum(1), torch.ones(3), atol=1e-5), "log-probabilities"


def test_dropout_net_is_deterministic_in_eval_only():
    net, x = models.DropoutNet(), torch.randn(4, 1, 28, 28)
    torch.manual_seed(0)
    assert not torch.allclose(net.train()(x), net(x))
    assert torch.allclose(net.eval()(x), net(x))


def test_frozen_and_tied_parameters():
    net = models.FrozenTiedNet()
    assert net.decoder.weight is net.encoder.weight
    net(torch.randn(5, 12)).sum().backward()
    assert net.frozen.grad is None and net.encoder.weight.grad is not None
    names = [n for n, _ in net.named_parameters()]
    assert "decoder.weight" not in names          # a tied tensor is listed once
    assert models.count_parameters(net) == 12 * 12 + 12 + 12 * 3 + 3


def test_bn_net_has_running_buffers():
    net = models.BNNet()
    before = net.bn.running_mean.clone()
    net(torch.randn(8, 10))
    assert not torch.equal(before, net.bn.running_mean)


def test_time_it_warms_up_and_repeats():
    calls = []
    result = bench.time_it(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and len(result["all"]) == 5
    assert result["min"] <= result["median"]
    with pytest.raises(ValueError):
        bench.time_it(lambda: None, repeats=0)


def test_format_table_aligns_and_formats():
    text = bench.format_table([{"n": 1, "t": 0.5}, {"n": 16, "t": None}],
                              [("n", "procs"), ("t", "seconds")], {"t": ".2f"})
    lines = text.splitlines()
    assert lines[0].split() == ["procs", "seconds"] and lines[2].split() == ["1", "0.50"]
    assert lines[3].split() == ["16", "-"] and len({len(l) for l in lines}) == 1


def test_save_json_and_plot(tmp_path):
    path = bench.save_json(tmp_path / "a" / "r.json", {"x": [1, 2]})
    assert bench.load_json(path) == {"x": [1, 2]}
    bench.line_plot({"s": ([1, 2], [3, 4])}, "x", "y", "t", tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_writefile_cells_strip_solution_markers(tmp_path):
    nb = {"cells": [
        {"cell_type": "code", "source": "%%writefile work/01_a.py\ndef f():\n"
         "    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"},
        {"cell_type": "markdown", "source": "%%writefile work/no.py\n"},
        {"cell_type": "code", "source": "print(1)"}], "metadata": {}}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    assert writefile_cells(path) == {"work/01_a.py": "def f():\n    return 1\n"}
    files = extract_writefiles(path, tmp_path / "out")
    assert files["01_a"].read_text() == "def f():\n    return 1\n"


@pytest.mark.serial       # measures the machine's load: run alone
def test_other_load_counts_other_processes_and_not_ours():
    """bench.OtherLoad: busy neighbours count, this process's own work and its waited-for
    children do not; the warning names the busy cores."""
    import subprocess
    import sys
    import time

    from exercise_utils.bench import OtherLoad, load_warning
    from exercise_utils.mpi_parallel_sgd.experiments import busy_processes
    with OtherLoad() as quiet:
        subprocess.run([sys.executable, "-c", "import time\nt = time.time()\n"
                        "while time.time() - t < 1.5: pass"])     # ours: a waited child
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:                           # ours: this process
            pass
    with busy_processes(2) as procs:
        with OtherLoad() as busy:
            time.sleep(2.0)
    assert all(p.poll() is not None for p in procs)               # killed at the end
    assert quiet.cores < 0.5, quiet.cores
    assert busy.cores > 1.2, busy.cores
    assert load_warning([{"others": quiet.cores}]) == ""
    assert f"kept up to {busy.cores:.1f} of the 2 cores" in load_warning([{"others": busy.cores}],
                                                                      cores=2)


def test_tables_of_timings_end_with_the_load_record():
    """bench.record_load / load_note: every row gets the cores others kept busy and the
    machine's cores; the tables of notebooks 02 to 09's timings end with a line saying so, and
    with the warning where others kept more than a quarter of a core busy."""
    from types import SimpleNamespace

    from exercise_utils.bench import load_note, record_load
    from exercise_utils.bonus_fsdp import bench as fsdp_bench
    from exercise_utils.bonus_powersgd import experiments as psgd
    from exercise_utils.shared_memory_hogwild import experiments as hogwild
    from exercise_utils.torch_distributed_collectives import bench as ring_bench

    rows = record_load([{"run": "a"}, {"run": "b", "cores": 8}], SimpleNamespace(cores=0.1),
                       cores=2)
    assert [(r["others"], r["cores"]) for r in rows] == [(0.1, 2), (0.1, 8)]
    quiet = load_note(rows)
    assert "measured on 8 cores; other processes kept up to 0.1 of them busy" in quiet
    assert "WARNING" not in quiet
    busy = load_note(record_load([{"run": "c"}], SimpleNamespace(cores=1.6), cores=2))
    assert "kept up to 1.6 of them busy" in busy and "cannot be trusted" in busy, busy
    assert load_note([{"run": "d"}]) == ""                    # rows without a record

    load = SimpleNamespace(cores=1.2)
    hog = record_load([{"run": "2x1", "procs": 2, "threads": 1, "busy_threads": 2, "cores": 2,
                        "startup_s": 1.0, "epoch_s": 2.0, "speedup": 1.0, "accuracy": 0.8}], load)
    ring = record_load([{"kib": 4, "bytes": 4096, "procs": 2, "ring_ms": 1.0,
                         "all_reduce_ms": 1.0, "ratio": 1.0}], load)
    psgd_rows = record_load([{"method": "uncompressed", "rank": 0, "accuracy": 0.9,
                              "bytes_per_worker": 1e6, "compression": 1.0, "train_s": 3.0}], load)
    fsdp_rows = record_load([{"variant": v, "world_size": 2, "state_mb": 1.0, "peak_mb": 2.0,
                              "step_ms": 3.0, "loss": 0.5, "param_mb": 1.0}
                             for v in fsdp_bench.VARIANTS], load)
    for text in (hogwild.table(hog), ring_bench.ring_table(ring), psgd.table(psgd_rows),
                 fsdp_bench.table(fsdp_rows)):
        assert "other processes kept up to 1.2 of them busy" in text, text
        assert text.rstrip().endswith("run the cell again."), text
