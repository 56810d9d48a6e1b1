"""exercise_utils.bonus_powersgd.paper (notebook 08): the paper's data column recomputed from the
shapes of its ResNet-18."""
from exercise_utils.bonus_powersgd import paper


def test_paper_data_column_is_recomputed_from_resnet18():
    """The quoted MiB per epoch and compression factors follow from the architecture: a
    wrong shape, rank rule or step count moves them off the paper's rounded figures."""
    shapes = paper.resnet18_cifar_shapes()
    assert paper.numbers_sent(shapes) == 11_173_962     # the CIFAR ResNet-18
    assert paper.steps_per_epoch() == 24                # 3,125 images / 128
    for row in paper.rows():
        assert abs(row["recomputed_mib"] - row["mb_per_epoch"]) <= 0.55, row
        assert round(row["recomputed_x"]) == row["compression"], row
    # the rank rule matters: sending 1-D tensors compressed too, or full rank, changes it
    assert paper.numbers_sent([(64,)], rank=1) == 64
    assert paper.numbers_sent([(10, 512)], rank=4) == (10 + 512) * 4
    assert paper.numbers_sent([(3, 2)], rank=4) == (3 + 2) * 2
    text = paper.table()
    assert "243" in text and "1023.0" in text and "recomputed" in text
