"""Notebook 11's try cells (issue 39): each part of ``work/11_composed.py`` run as soon as it is
written, printing what it computed beside what one process (or torch) computes
(:mod:`exercise_utils.tries`). Not a check: nothing is judged or graded here.

    from exercise_utils.bonus_composed import tries
    tries.run("mesh")        # then "vocab", "ring", "sequence" and "step"

Used in 11_bonus_composed.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import tries as core

WORK = "work/11_composed.py"


def run(piece, work=WORK):
    """Run the try of ``piece`` (``"mesh"``, ``"vocab"``, ``"ring"``, ``"sequence"`` or
    ``"step"``) with
    the file ``work``; print what each rank computed."""
    core.run(TRIES, piece, work)


def _diff(a, b):
    return f"{float((a - b).detach().abs().max()):.1e}"


def try_mesh(mine, ctx):
    """A 1 x 2 x 2 mesh of 4 ranks: yours beside init_device_mesh's groups."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = mine.Mesh(1, 2, 2)
    torch_mesh = init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
    theirs = {dim: dist.get_process_group_ranks(torch_mesh.get_group(dim))
              for dim in ("dp", "pp", "tp")}
    yours = {dim: dist.get_process_group_ranks(mesh.groups[dim]) for dim in ("dp", "pp", "tp")}
    return [f"coords {mesh.coords}, prev {mesh.prev}, next {mesh.next}",
            f"your groups {yours}", f"init_device_mesh's {theirs}"
            + ("  (the same)" if yours == theirs else "  (DIFFERENT)")]


def try_vocab(mine, ctx):
    """2 ranks, a vocabulary of 8: the split embedding and loss beside one process's."""
    torch.manual_seed(0)
    group, rank, world = dist.group.WORLD, ctx.rank, ctx.size
    emb = torch.nn.Embedding(8, 3).double()
    tokens = torch.tensor([[0, 3, 4, 7]])
    shard = mine.VocabParallelEmbedding.from_embedding(emb, group)
    logits = torch.randn(4, 8, dtype=torch.float64) * 3
    logits[1] += 800.0
    targets = torch.tensor([0, 5, 2, 7])
    k = 8 // world
    mine_logits = logits[:, rank * k:(rank + 1) * k].clone().requires_grad_(True)
    full = logits.clone().requires_grad_(True)
    loss = mine.vocab_parallel_cross_entropy(mine_logits, targets, group)
    ref = F.cross_entropy(full, targets)
    loss.backward()
    ref.backward()
    return [f"embedding rows {shard.start}..{shard.start + shard.weight.shape[0] - 1}: max "
            f"difference from the full table's lookup {_diff(shard(tokens), emb(tokens))}",
            f"loss {float(loss):.6f} (one process {float(ref):.6f}; row 1's logits near 800); "
            f"gradient of my columns: max difference "
            f"{_diff(mine_logits.grad, full.grad[:, rank * k:(rank + 1) * k])}"]


def try_ring(mine, ctx):
    """2 ranks, causal attention over 12 tokens split by balanced_positions, beside one
    process."""
    torch.manual_seed(0)
    rank = ctx.rank
    positions = mine.balanced_positions(12, ctx.size)
    q, k, v, up = (torch.randn(1, 2, 12, 4, dtype=torch.float64) for _ in range(4))
    mask = torch.ones(12, 12, dtype=torch.bool).tril()
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    scores = (full[0] @ full[1].transpose(-1, -2) / 2.0).masked_fill(~mask, float("-inf"))
    ref = scores.softmax(-1) @ full[2]
    ref.backward(up)
    pos = positions[rank]
    mine_qkv = [t[:, :, pos].clone().requires_grad_(True) for t in (q, k, v)]
    out = mine.ring_attention(*mine_qkv, positions, None, True)
    out.backward(up[:, :, pos])
    grads = ", ".join(f"d{n} {_diff(t.grad, f.grad[:, :, pos])}"
                      for n, t, f in zip("qkv", mine_qkv, full))
    return [f"my positions {pos.tolist()}",
            f"output: max difference from one process {_diff(out, ref[:, :, pos])}; "
            f"gradients: {grads}"]


def try_sequence(mine, ctx):
    """2 ranks: the sequence-parallel NormMLP on 6 rows beside the block on the whole
    sequence."""
    torch.manual_seed(0)
    group, rank = dist.group.WORLD, ctx.rank
    block = mine.NormMLP(4, 8).double()
    x = torch.randn(6, 1, 4, dtype=torch.float64)
    full = x.clone().requires_grad_(True)
    ref = block(full)
    ref.sum().backward()
    k = 6 // ctx.size
    mine_x = x[rank * k:(rank + 1) * k].clone().requires_grad_(True)
    par = mine.SequenceParallelNormMLP.from_block(block, group)
    out = par(mine_x)
    out.sum().backward()
    mine.sequence_parallel_grads(par)
    return [f"my rows {rank * k}..{(rank + 1) * k - 1}: output max difference "
            f"{_diff(out, ref[rank * k:(rank + 1) * k])}, input gradient "
            f"{_diff(mine_x.grad, full.grad[rank * k:(rank + 1) * k])}",
            f"after sequence_parallel_grads: the norm's weight gradient max difference "
            f"{_diff(par.norm.weight.grad, block.norm.weight.grad)}"]


def try_step(mine, ctx):
    """4 ranks, a 1 x 2 x 2 mesh (two stages of two tensor-parallel ranks): one composed step of a small GPT beside the whole model in one process."""
    torch.manual_seed(0)
    model = mine.GPT(8, 8, 4, 16, 2, 6).double()
    tokens, targets = torch.randint(0, 8, (2, 6)), torch.randint(0, 8, (2, 6))
    ref = mine.GPT(8, 8, 4, 16, 2, 6).double()
    ref.load_state_dict(model.state_dict())
    ref_loss = ref.loss(tokens, targets)
    ref_loss.backward()
    mesh = mine.Mesh(1, 2, 2)
    stage = mine.GPTStage.from_model(model, mesh)
    loss = mine.composed_step(stage, tokens, targets, mesh)
    lines = [f"stage {mesh.coords['pp']}, tp rank {mesh.coords['tp']}: loss {loss:.6f} (one "
             f"process {float(ref_loss):.6f})"]
    block, full = stage.blocks[0], ref.blocks[stage.first_layer]
    lines.append(f"block {stage.first_layer}: ln1's weight gradient max difference "
                 f"{_diff(block.ln1.weight.grad, full.ln1.weight.grad)}, fc2's bias "
                 f"{_diff(block.b2.grad, full.fc2.bias.grad)}")
    return lines


TRIES = {
    "mesh": core.Try(try_mesh, ("mesh_coords", "mesh_lines", "Mesh.__init__"),
                     "a 1 x 2 x 2 mesh", ranks=4),
    "vocab": core.Try(try_vocab, ("ReduceFromGroup.forward", "ReduceFromGroup.backward",
                                  "VocabParallelEmbedding.from_embedding",
                                  "VocabParallelEmbedding.forward",
                                  "VocabParallelCrossEntropy.forward",
                                  "VocabParallelCrossEntropy.backward"),
                      "the vocabulary split"),
    "ring": core.Try(try_ring, ("merge_blocks", "balanced_positions", "block_pairs",
                                "RingAttention.forward", "RingAttention.backward"),
                     "ring attention on 2 ranks"),
    "sequence": core.Try(try_sequence, ("GatherFromSequence.forward",
                                        "GatherFromSequence.backward",
                                        "ReduceScatterToSequence.forward",
                                        "ReduceScatterToSequence.backward",
                                        "SequenceParallelNormMLP.forward",
                                        "sequence_parallel_grads"),
                         "the sequence-parallel block on 2 ranks"),
    "step": core.Try(try_step, ("CopyToGroup.forward", "CopyToGroup.backward",
                                "TensorParallelBlock.forward", "GPTStage.forward",
                                "composed_step"),
                     "one composed step on a 1 x 2 x 2 mesh", ranks=4),
}
