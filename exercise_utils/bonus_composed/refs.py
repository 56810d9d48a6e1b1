"""The judge's expected answers of notebook 11 (hidden at grading: no probe imports this
module): the mesh's coordinates and groups, computed by rule, and the single-process
embedding and cross-entropy the vocabulary-parallel ranks must equal.

Used in 11_bonus_composed.
"""
import numpy as np
import torch
import torch.nn.functional as F

from . import inputs

DIMS = ("dp", "pp", "tp")


def coords(rank, dp, pp, tp):
    return {"dp": rank // (pp * tp), "pp": rank // tp % pp, "tp": rank % tp}


def lines(dim, dp, pp, tp):
    """Every group of ``dim``: ranks sharing the other two coordinates, ordered by ``dim``;
    the lists by their first rank (torch's ``init_device_mesh`` over ``("dp", "pp", "tp")``
    gives the same)."""
    world = dp * pp * tp
    found = {}
    for rank in range(world):
        c = coords(rank, dp, pp, tp)
        found.setdefault(tuple(c[k] for k in DIMS if k != dim), []).append(rank)
    return sorted(found.values())


def made(dp, pp, tp):
    """The groups every rank makes, in order: the lines of ``dp``, then ``pp``, then ``tp``."""
    return [line for dim in DIMS for line in lines(dim, dp, pp, tp)]


def mesh(rank, dp, pp, tp):
    """What ``Mesh(dp, pp, tp)`` holds on ``rank``."""
    c = coords(rank, dp, pp, tp)
    ranks = {dim: next(line for line in lines(dim, dp, pp, tp) if rank in line) for dim in DIMS}
    stages = ranks["pp"]
    return {"sizes": {"dp": dp, "pp": pp, "tp": tp}, "coords": c, "ranks": ranks,
            "prev": stages[c["pp"] - 1] if c["pp"] > 0 else None,
            "next": stages[c["pp"] + 1] if c["pp"] + 1 < pp else None}


def vocab(salts, salt0, group_index, t, dtype, size="small"):
    """One process on a group's whole table and logits (``inputs.SIZES[size]``): ``{"emb":
    output, "emb_grad": the table's gradient, "loss": float, "logits_grad": (rows, V)}``,
    float64 arrays."""
    table = inputs.table(salts, group_index, t, dtype, size).requires_grad_(True)
    tokens, targets, upstream = inputs.shared(salt0, group_index, t, dtype, size)
    out = F.embedding(tokens, table)
    (out * upstream).sum().backward()
    logits = inputs.logits(salts, group_index, t, dtype, size).requires_grad_(True)
    loss = F.cross_entropy(logits, targets)
    (loss * inputs.LOSS_SCALE).backward()
    return {"emb": out.detach().double().numpy(), "emb_grad": table.grad.double().numpy(),
            "loss": float(loss.detach()), "logits_grad": logits.grad.double().numpy()}


def digest(array, wide):
    """What a rank reports of a tensor (:func:`.probes.digest`'s rule): whole, or (``wide``)
    each row times :func:`.inputs.projection`."""
    return array @ inputs.projection(array.shape[-1]).numpy() if wide else array


def embedding_grads(salts, members, salt0, group_index, t, dtype, size="small"):
    """The full table's gradient after the forward on each case of
    :func:`.inputs.token_cases` (the 2-D tokens, their first row, an empty batch), apart,
    float64 arrays."""
    dtype = getattr(torch, dtype)
    tokens, _, upstream = inputs.shared(salt0, group_index, t, dtype, size)
    grads = {}
    for name, toks, up in inputs.token_cases(tokens, upstream):
        table = inputs.table([salts[r] for r in members], group_index, t, dtype,
                             size).requires_grad_(True)
        (F.embedding(toks, table) * up).sum().backward()
        grads[name] = table.grad.double().numpy()
    return grads


# ------------------------------------------------------------------ ring attention
def attention(q, k, v, positions, causal, dout):
    """Full attention over the whole sequence, and the gradients of q, k, v from ``dout``:
    float64 arrays ``(out, dq, dk, dv)``."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        S = q.shape[-2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v
    out.backward(dout)
    return tuple(t.detach().double().numpy() for t in (out, q.grad, k.grad, v.grad))


def merged(out, lse, out_b, lse_b):
    """The merge by its definition, float64: the output over the union of the key sets."""
    new = torch.logaddexp(lse, lse_b)
    safe = new.masked_fill(new == float("-inf"), 0.0)
    return (out * torch.exp(lse - safe).unsqueeze(-1) + out_b * torch.exp(lse_b - safe)
            .unsqueeze(-1)), new


def balanced(S, c):
    chunks = torch.arange(S).tensor_split(2 * c)
    return [torch.cat([chunks[r], chunks[2 * c - 1 - r]]).tolist() for r in range(c)]


def runs(pos):
    out, start = [], 0
    for i in range(1, len(pos) + 1):
        if i == len(pos) or pos[i] != pos[i - 1] + 1:
            out.append((start, i))
            start = i
    return out


def pairs(q_pos, k_pos, causal):
    """``[(query indices, key indices, mask as lists or None)]`` by the notebook's rule."""
    if not causal:
        return [[list(range(len(q_pos))), list(range(len(k_pos))), None]]
    found = []
    for qa, qb in runs(q_pos):
        for ka, kb in runs(k_pos):
            if q_pos[qb - 1] < k_pos[ka]:
                continue
            full = q_pos[qa] >= k_pos[kb - 1]
            mask = None if full else [[q >= kk for kk in k_pos[ka:kb]] for q in q_pos[qa:qb]]
            found.append([list(range(qa, qb)), list(range(ka, kb)), mask])
    return found


def causal_entries(q_pos, positions):
    """The query x key entries a rank at ``q_pos`` must see over all the ring's blocks: for
    each query, the keys at positions up to its own."""
    keys = np.sort(np.concatenate([np.asarray(p).reshape(-1) for p in positions]))
    return int(np.searchsorted(keys, np.asarray(q_pos), side="right").sum())


# ------------------------------------------------------------------ sequence parallelism
def sp(salts, salt0, group_index, t, dtype, size="small"):
    """The judge's block on the whole sequence: ``{"y", "x_grad", "grads": {name: full}}``,
    float64 arrays (``w1``/``b1`` fc1's, ``w2``/``b2`` fc2's, the norm's)."""
    block = inputs.sp_block(salt0, group_index, dtype, size)
    x, up = inputs.sp_rows(salts, group_index, t, dtype, size)
    x.requires_grad_(True)
    y = block(x)
    y.backward(up)
    grads = {"w1": block.fc1.weight.grad, "b1": block.fc1.bias.grad,
             "w2": block.fc2.weight.grad, "b2": block.fc2.bias.grad,
             "norm.weight": block.norm.weight.grad, "norm.bias": block.norm.bias.grad}
    return {"y": y.detach().double().numpy(), "x_grad": x.grad.double().numpy(),
            "grads": {k: v.double().numpy() for k, v in grads.items()}}


# ------------------------------------------------------------------ the composed step
def _norm(x, state, name):
    return F.layer_norm(x, x.shape[-1:], state[f"{name}.weight"], state[f"{name}.bias"])


def gpt(salt0, dtype, step, sizes=inputs.GPT_SIZES):
    """The judge's GPT on the whole batch in one process (written from the notebook's
    definition, not from its code), in float64 on the weights of ``dtype``: ``(loss,
    {parameter name: gradient})``."""
    state = {k: v.double().requires_grad_(True)
             for k, v in inputs.gpt_state(salt0, dtype, sizes).items()}
    tokens, targets = inputs.gpt_batch(salt0, step, sizes)
    _, d, H, _, L, S = sizes
    B, hd = tokens.shape[0], d // H
    x = state["tok.weight"][tokens] + state["pos.weight"][:S]
    visible = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(L):
        w = {k[len(f"blocks.{i}."):]: v for k, v in state.items() if k.startswith(f"blocks.{i}.")}
        qkv = _norm(x, w, "ln1") @ w["qkv.weight"].T + w["qkv.bias"]
        q, k, v = (z.reshape(B, S, H, hd).transpose(1, 2) for z in qkv.split(d, dim=-1))
        scores = (q @ k.transpose(-1, -2) / hd ** 0.5).masked_fill(~visible, float("-inf"))
        heads = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, d)
        x = x + heads @ w["proj.weight"].T + w["proj.bias"]
        hidden = F.gelu(_norm(x, w, "ln2") @ w["fc1.weight"].T + w["fc1.bias"])
        x = x + hidden @ w["fc2.weight"].T + w["fc2.bias"]
    logits = _norm(x, state, "norm") @ state["head.weight"].T
    logp = logits.flatten(0, 1).log_softmax(-1)
    loss = -logp.gather(1, targets.reshape(-1, 1)).mean()
    loss.backward()
    return float(loss.detach()), {k: v.grad.numpy() for k, v in state.items()}


def stage_layers(n_layers, pp, p):
    """The global indices of stage ``p``'s blocks (``tensor_split``, the longer runs first)."""
    bounds = np.cumsum([0] + [n_layers // pp + (1 if j < n_layers % pp else 0)
                              for j in range(pp)])
    return list(range(int(bounds[p]), int(bounds[p + 1])))


def stage_grads(grads, p, pp, r, t, sizes=inputs.GPT_SIZES):
    """``{name in the stage: its expected gradient}`` of group rank ``r`` of ``t`` on stage
    ``p`` of ``pp``, cut from the whole model's ``grads`` (of ``sizes``) as the notebook's
    ``from_model`` and ``from_block`` cut the weights."""
    V, d, H, h, L, _ = sizes
    heads = slice(r * d // t, (r + 1) * d // t)      # the rank's heads' features (H / t heads)
    rows, vocab = slice(r * h // t, (r + 1) * h // t), slice(r * V // t, (r + 1) * V // t)
    out = {}
    if p == 0:
        out.update({"tok.weight": grads["tok.weight"][vocab], "pos.weight": grads["pos.weight"]})
    for j, i in enumerate(stage_layers(L, pp, p)):
        g = {k[len(f"blocks.{i}."):]: v for k, v in grads.items() if k.startswith(f"blocks.{i}.")}
        out.update({f"blocks.{j}.{k}": v for k, v in (      # in the forward's order
            ("ln1.weight", g["ln1.weight"]), ("ln1.bias", g["ln1.bias"]),
            ("w_qkv", np.concatenate([g["qkv.weight"][n * d:(n + 1) * d][heads]
                                      for n in range(3)])),
            ("b_qkv", np.concatenate([g["qkv.bias"][n * d:(n + 1) * d][heads]
                                      for n in range(3)])),
            ("w_proj", g["proj.weight"][:, heads]), ("b_proj", g["proj.bias"]),
            ("ln2.weight", g["ln2.weight"]), ("ln2.bias", g["ln2.bias"]),
            ("w1", g["fc1.weight"][rows]), ("b1", g["fc1.bias"][rows]),
            ("w2", g["fc2.weight"][:, rows]), ("b2", g["fc2.bias"]))})
    if p == pp - 1:
        out.update({"norm.weight": grads["norm.weight"], "norm.bias": grads["norm.bias"],
                    "head": grads["head.weight"][vocab]})
    return out
