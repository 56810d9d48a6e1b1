"""The salted inputs of notebook 11's checks, built the same way inside every rank
(:mod:`.probes`) and by the judge (:mod:`.checks`, :mod:`.refs`): each rank's own parts from its
own number, the parts every rank of a group must share from rank 0's.

Vocabulary split: the full embedding table's row block ``i`` and the full logits' column block
``i`` come from the number of the rank that holds them (a rank builds the other blocks from its
own number: stand-ins, right only where it communicates for them); the tokens, the targets and
the upstream gradient come from rank 0's number and the group's index.

Used in 11_bonus_composed.
"""
import torch

from ..rankworker import salted_generator

VOCAB_PER_RANK, D_EMB = 5, 6             # V = t * 5 classes, embeddings of 6 features
ROWS = 7                                 # N rows of logits (odd)
TOKENS = (3, 4)                          # a (B, T) batch of tokens
# The sizes of each part: "small" (every launch) and "wire" (where links are observed, float64:
# a table and logits wide enough that gathering either stands far above the all-reduces the
# notebook asks for and the set-up; the ranks report digests of its gradients, not the whole)
SIZES = {"small": (VOCAB_PER_RANK, D_EMB, ROWS, TOKENS), "wire": (1024, 32, 64, (4, 16))}
BIG = 800.0                              # added to one row's logits: exp(800) overflows float64
LOSS_SCALE = 2.5                         # the upstream gradient of the loss
DTYPES = (torch.float64, torch.float32)
# (launch name, world size, the tensor-parallel groups the probe makes: None = the world)
VOCAB_LAUNCHES = (("two groups of 2", 4, ((0, 1), (2, 3))), ("the world of 3", 3, None))


def table(salts, group_index, t, dtype, size="small"):
    """The full ``(t * per_rank, d)`` embedding table of a group (``SIZES[size]``): row block
    ``i`` from ``salts[i]`` (the number of the group's rank ``i``)."""
    per, d, _, _ = SIZES[size]
    blocks = [torch.randn(per, d, dtype=torch.float64,
                          generator=salted_generator(7100 + 10 * group_index + i, salts[i]))
              for i in range(t)]
    return torch.cat(blocks).to(dtype)


def logits(salts, group_index, t, dtype, size="small"):
    """The full ``(rows, t * per_rank)`` logits of a group (``SIZES[size]``): column block ``i``
    from ``salts[i]``; row 1 shifted by ``BIG`` (only a stable loss survives it)."""
    per, _, rows, _ = SIZES[size]
    blocks = [3.0 * torch.randn(rows, per, dtype=torch.float64,
                                generator=salted_generator(7200 + 10 * group_index + i,
                                                           salts[i]))
              for i in range(t)]
    full = torch.cat(blocks, dim=1)
    full[1] += BIG
    return full.to(dtype)


def shared(salt0, group_index, t, dtype, size="small"):
    """What every rank of a group shares: ``(tokens (B, T), targets (rows,), upstream
    gradient of the embedding (B, T, d))``, from rank 0's number; the tokens cover the
    first and the last id of every rank's block."""
    per, d, rows, tokens_shape = SIZES[size]
    gen = salted_generator(7300 + group_index + (0 if size == "small" else 50), salt0)
    v = t * per
    tokens = torch.randint(0, v, tokens_shape, generator=gen)
    edges = torch.tensor([i * per + e for i in range(t) for e in (0, per - 1)])
    tokens.view(-1)[:edges.numel()] = edges[:tokens.numel()]
    targets = torch.randint(0, v, (rows,), generator=gen)
    targets[0], targets[-1] = 0, v - 1
    upstream = torch.randn(*tokens_shape, d, dtype=torch.float64, generator=gen).to(dtype)
    return tokens, targets, upstream


TOKEN_CASES = ("2-d", "1-d", "empty")


def token_case(name, x):
    """``x`` (a ``(B, T, ...)`` array or tensor) cut as the embedding's forward case ``name``:
    the ``(B, T)`` batch ("2-d"), its first row ("1-d"), an empty batch of ``B`` rows of no
    tokens ("empty")."""
    return {"2-d": x, "1-d": x[0], "empty": x[:, :0]}[name]


def token_cases(tokens, upstream):
    """``(name, tokens, upstream)`` for each of :data:`TOKEN_CASES`."""
    return tuple((name, token_case(name, tokens), token_case(name, upstream))
                 for name in TOKEN_CASES)


def projection(n):
    """A fixed vector of ``n`` float64 numbers: a wide gradient is reported as its product with
    it (a digest: the rows of the gradient, each as one number)."""
    return torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(7800 + n))


def mesh_value(salt, rank):
    """What a rank adds to each of its mesh groups' all-reduce: from its own number."""
    gen = salted_generator(7400 + rank, salt)
    return float(torch.randint(1, 1000, (1,), generator=gen))


# ------------------------------------------------------------------ ring attention
B, H, HD = 2, 2, 4
# (name, dtype, layout, causal, S): every ring of every launch runs these
RING_CASES = (("causal-balanced-float64", torch.float64, "balanced", True, 13),
              ("causal-contiguous-float64", torch.float64, "contiguous", True, 11),
              ("full-contiguous-float64", torch.float64, "contiguous", False, 10),
              ("causal-balanced-float32", torch.float32, "balanced", True, 24))
# Where links are observed, one case more on every ring: a sequence long and wide enough
# (WIRE_HD features per head) that a block of keys and values sent anywhere but to the next rank
# of the ring stands far above the set-up; the ranks report digests of its values
RING_WIRE_CASE = ("causal-balanced-wire-float64", torch.float64, "balanced", True, 1024)
WIRE_HD = 32
# (launch name, world size, the rings the probe makes: tuples of global ranks; None = the world)
RING_LAUNCHES = (("a ring of 3", 3, (None,)),
                 ("a ring of 4, two rings of 2 and rings of 1", 4,
                  (None, ((0, 2), (1, 3)), ((0,), (1,), (2,), (3,)))))


def layout(kind, S, c):
    """The positions each rank of a ring of ``c`` holds: ``"contiguous"`` (``arange(S)``
    in c chunks) or ``"balanced"`` (chunks r and 2c-1-r of 2c; the judge's own rule, the same
    as the notebook's ``balanced_positions``)."""
    if kind == "contiguous":
        return list(torch.arange(S).tensor_split(c))
    chunks = torch.arange(S).tensor_split(2 * c)
    return [torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)]


def ring_cases(wire):
    """The cases every ring runs: :data:`RING_CASES`, and :data:`RING_WIRE_CASE` where links
    are observed."""
    return RING_CASES + ((RING_WIRE_CASE,) if wire else ())


def head_dim(case):
    return WIRE_HD if case[0].endswith("wire-float64") else HD


def qkv(salts, positions, case_index, dtype, hd=HD):
    """``(q, k, v, dout)`` of the whole sequence, ``(B, H, S, hd)``: the tokens of ring rank
    ``i`` (``positions[i]``) from ``salts[i]``."""
    S = sum(len(p) for p in positions)
    full = torch.zeros(4, B, H, S, hd, dtype=torch.float64)
    for i, pos in enumerate(positions):
        gen = salted_generator(7600 + 10 * case_index + i, salts[i])
        full[:, :, :, pos] = torch.randn(4, B, H, len(pos), hd, dtype=torch.float64,
                                         generator=gen)
    return tuple(t.to(dtype) for t in full)


# ------------------------------------------------------------------ sequence parallelism
SP_S, SP_B, SP_D, SP_H = 6, 2, 8, 12     # S and h divisible by 2 and 3 (the groups checked)
# (S, B, d, h) of each size: "wire", held where links are observed (grading), has weights far
# heavier than the activations, so that weights sent anywhere stand far above what sequence
# parallelism sends (the activations and the replicated parameters' gradients)
SP_SIZES = {"small": (SP_S, SP_B, SP_D, SP_H), "wire": (6, 2, 96, 384)}
# the parts a probe runs: name -> (dtype, size); "wire" only where links are observed
SP_PARTS = {"float64": ("float64", "small"), "float32": ("float32", "small"),
            "wire": ("float64", "wire")}
# (launch name, world size, the tensor-parallel groups the probe makes: None = the world)
SP_LAUNCHES = (("two groups of 2", 4, ((0, 1), (2, 3))), ("the world of 3", 3, None))


def sp_block(salt0, group_index, dtype, size="small"):
    """The single-process ``NormMLP``-shaped block of a group (the judge's own class,
    :class:`NormMLPRef`) of ``SP_SIZES[size]``, its weights from rank 0's number; the norm's
    weight and bias are not the default ones."""
    _, _, d, h = SP_SIZES[size]
    gen = salted_generator(7900 + group_index + (0 if size == "small" else 50), salt0)
    block = NormMLPRef(d, h)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5
                    + (1.0 if p is block.norm.weight else 0.0))
    return block.to(dtype)


def sp_rows(salts, group_index, t, dtype, size="small"):
    """``(x, upstream)`` of the whole sequence ``(S, B, d)`` of ``SP_SIZES[size]``: the rows of
    group rank ``i`` from ``salts[i]``."""
    S, B, d, _ = SP_SIZES[size]
    k = S // t
    x, up = torch.zeros(2, S, B, d, dtype=torch.float64)
    for i in range(t):
        gen = salted_generator(7950 + 10 * group_index + i + (0 if size == "small" else 500),
                               salts[i])
        x[i * k:(i + 1) * k] = torch.randn(k, B, d, generator=gen, dtype=torch.float64)
        up[i * k:(i + 1) * k] = torch.randn(k, B, d, generator=gen, dtype=torch.float64)
    return x.to(dtype), up.to(dtype)


class NormMLPRef(torch.nn.Module):
    """The judge's ``x + fc2(act(fc1(norm(x))))`` (attribute names as the notebook's
    ``NormMLP``; GELU's tanh form: ``from_block`` must keep the block's own activation)."""

    def __init__(self, d, h):
        super().__init__()
        self.norm, self.act = torch.nn.LayerNorm(d), torch.nn.GELU("tanh")
        self.fc1, self.fc2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


# ------------------------------------------------------------------ the composed step
# (vocab, d_model, n_heads, d_hidden, n_layers, seq_len): every size divisible by 1, 2, 3, 4
GPT_SIZES = (24, 24, 12, 48, 4, 5)
GPT_BATCH = 12
# Where links are observed (grading), one float64 step more on each launch's first mesh with a
# wide model (1.2 M parameters): its gradients' all-reduces and activations stand far above the
# set-up, so that a step without them, or traffic beside them, shows on the wire; the ranks
# report digests of its gradients (:func:`.probes.digest`)
GPT_WIRE_SIZES = (96, 192, 12, 384, 4, 16)
# (launch name, world size, the (dp, pp, tp) meshes the probe builds, in order; the first of
# each launch runs in float32 too)
STEP_LAUNCHES = (("8 ranks", 8, ((2, 2, 2), (1, 2, 4), (2, 4, 1), (4, 1, 2))),
                 ("3 ranks", 3, ((1, 1, 3), (1, 3, 1), (3, 1, 1))))


def gpt_shapes(sizes=GPT_SIZES):
    """``[(name, shape)]`` of the notebook's ``GPT`` of ``sizes`` (:data:`GPT_SIZES`), in the
    order of its ``state_dict``."""
    V, d, _, h, L, S = sizes
    block = (("ln1.weight", (d,)), ("ln1.bias", (d,)), ("ln2.weight", (d,)), ("ln2.bias", (d,)),
             ("qkv.weight", (3 * d, d)), ("qkv.bias", (3 * d,)), ("proj.weight", (d, d)),
             ("proj.bias", (d,)), ("fc1.weight", (h, d)), ("fc1.bias", (h,)),
             ("fc2.weight", (d, h)), ("fc2.bias", (d,)))
    return ([("tok.weight", (V, d)), ("pos.weight", (S, d))]
            + [(f"blocks.{i}.{n}", s) for i in range(L) for n, s in block]
            + [("norm.weight", (d,)), ("norm.bias", (d,)), ("head.weight", (V, d))])


def gpt_state(salt0, dtype, sizes=GPT_SIZES):
    """The GPT's weights, from rank 0's number: matrices scaled by ``1/sqrt(fan_in)``, norms'
    weights near 1, biases and embeddings away from their defaults."""
    gen = salted_generator(7700 + (sizes != GPT_SIZES), salt0)
    state = {}
    for name, shape in gpt_shapes(sizes):
        w = torch.randn(shape, generator=gen, dtype=torch.float64)
        if len(shape) == 2:                 # a matrix or an embedding table
            w = w if name.startswith(("tok", "pos")) else w / shape[-1] ** 0.5
        else:                               # a norm's weight near 1, a bias near 0
            w = 0.3 * w + (1.0 if name.endswith("weight") else 0.0)
        state[name] = w.to(dtype)
    return state


def gpt_batch(salt0, step, sizes=GPT_SIZES):
    """``(tokens, targets)`` ``(GPT_BATCH, seq_len)`` int64 of step ``step``, from rank 0's
    number."""
    gen = salted_generator(7750 + step + 10 * (sizes != GPT_SIZES), salt0)
    V, S = sizes[0], sizes[5]
    return (torch.randint(0, V, (GPT_BATCH, S), generator=gen),
            torch.randint(0, V, (GPT_BATCH, S), generator=gen))
