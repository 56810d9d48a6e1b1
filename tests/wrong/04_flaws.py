"""Known-wrong files of notebook 04, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/resnet_cifar_data_parallel/requirements.py) and the check case that must
reject it."""
from flaws import Def, Flaw

CHOOSE = "    backend, device = runner.choose_backend(world_size, rank)\n"
STORE_TIMEOUT = "                          is_master=rank == 0, timeout=timeout)\n"
GROUP = ("    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,\n"
         "                            timeout=timeout)\n")
BROADCAST = ("    for tensor in model.state_dict().values():\n"
             "        dist.broadcast(tensor, src=0)\n")
REDUCE = ("            for p in model.parameters():\n"
          "                if p.grad is not None:\n"
          "                    dist.all_reduce(p.grad)\n"
          "                    p.grad /= world_size\n")
EMA_UPDATE = ("            if ema is not None and step % config.ema_every == 0:\n"
              "                ema.update(model)\n")
VALIDATE = ("        if leader:\n"
            "            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)\n"
            "            history.append(runner.epoch_record(epoch, seconds, loss_sum / seen, "
            "accuracy))\n")
SLICE = ("    per_rank = len(train_set) // world_size            # the remainder is not used\n"
         "    x_local = train_set.x[rank * per_rank:(rank + 1) * per_rank]\n"
         "    y_local = train_set.y[rank * per_rank:(rank + 1) * per_rank]\n")


def rank_process(body):
    return Def("rank_process", "def rank_process(rank, world_size, config):\n" + body)


SETUP = """
    timeout = datetime.timedelta(seconds=config.timeout_s)
    store = dist.TCPStore(config.master_addr, config.master_port, world_size,
                          is_master=rank == 0, timeout=timeout)
    backend, device = runner.choose_backend(world_size, rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
"""

FLAWS = [
    # ------------------------------------------------------------------ rank_process
    Flaw("rank_process", "env_port", clause="store", case="rp-store",
         why="takes the port from the MASTER_PORT environment variable when it is set (as "
             "torchrun's env:// does) instead of config.master_port: the launcher chose "
             "config.master_port, and any other job's MASTER_PORT sends the ranks elsewhere.",
         expect="expected config.master_addr:config.master_port",
         patch=(("import datetime\nimport time\n", "import datetime\nimport os\nimport time\n"),
                ("    store = dist.TCPStore(config.master_addr, config.master_port, world_size,\n",
                 "    port = int(os.environ.get(\"MASTER_PORT\", config.master_port))\n"
                 "    store = dist.TCPStore(config.master_addr, port, world_size,\n"))),
    Flaw("rank_process", "hardcoded_addr", clause="rendezvous", case="rp-store",
         why="hosts the store at 127.0.0.1, the address every example uses, instead of "
             "config.master_addr: wrong as soon as the ranks meet elsewhere.",
         expect="expected config.master_addr:config.master_port = localhost",
         patch=(("    store = dist.TCPStore(config.master_addr, config.master_port, world_size,\n",
                 "    store = dist.TCPStore(\"127.0.0.1\", config.master_port, world_size,\n"),)),
    Flaw("rank_process", "hosted_by_last", clause="hosted", case="rp-store",
         why="lets the last rank host the store (is_master=rank == world_size - 1): the ranks "
             "still meet, but not at rank 0, whose address config.master_addr names.",
         expect="expected is_master=True, world_size=2",
         patch=((STORE_TIMEOUT, "                          is_master=rank == world_size - 1, "
                                "timeout=timeout)\n"),)),
    Flaw("rank_process", "forgets_store", clause="connects", case="rp-group",
         why="creates the TCPStore but calls init_process_group without store=store, so the "
             "group makes its own rendezvous from MASTER_ADDR / MASTER_PORT (env://).",
         expect="does not run on the dist.TCPStore rank_process created",
         patch=((GROUP, "    dist.init_process_group(backend, rank=rank, world_size=world_size,"
                        "\n                            timeout=timeout)\n"),)),
    Flaw("rank_process", "no_timeout", clause="short-timeout", case="rp-timeout",
         why="no timeout for the store nor for the process group: their defaults (5 minutes, "
             "30 minutes for gloo) leave a rank whose peer never comes blocked that long.",
         expect="the TCPStore has a timeout of 300 s",
         patch=(("    timeout = datetime.timedelta(seconds=config.timeout_s)\n", ""),
                (STORE_TIMEOUT, "                          is_master=rank == 0)\n"),
                (GROUP, "    dist.init_process_group(backend, store=store, rank=rank, "
                        "world_size=world_size)\n"))),
    Flaw("rank_process", "store_no_timeout", clause="store-timeout", case="rp-timeout",
         why="passes the timeout to init_process_group but not to the TCPStore, which keeps "
             "its default of 5 minutes.",
         expect="the TCPStore has a timeout of 300 s",
         patch=((STORE_TIMEOUT, "                          is_master=rank == 0)\n"),)),
    Flaw("rank_process", "group_no_timeout", clause="group", case="rp-timeout",
         why="gives the TCPStore its timeout but not the process group, which keeps gloo's "
             "30 minutes.",
         expect="the process group has a timeout of 1800 s",
         patch=((GROUP, "    dist.init_process_group(backend, store=store, rank=rank, "
                        "world_size=world_size)\n"),)),
    Flaw("rank_process", "hardcoded_gloo_cpu", clause="backend", case="rp-backend",
         why="hard-codes gloo on the CPU (the machine it was written on has no GPU) instead of "
             "choosing: on a GPU per rank it should be NCCL on cuda:rank.",
         expect="expected 'nccl' and 'cuda:0'",
         patch=((CHOOSE, "    backend, device = \"gloo\", torch.device(\"cpu\")\n"),)),
    Flaw("rank_process", "nccl_any_gpu", clause="nccl-gloo", case="rp-backend",
         why="NCCL on cuda:rank whenever CUDA is available: with one GPU and two ranks, rank 1 "
             "asks for a GPU that does not exist and NCCL for two ranks on one device.",
         expect="expected 'gloo' and 'cuda:0'",
         patch=((CHOOSE, "    if torch.cuda.is_available():\n"
                         "        backend, device = \"nccl\", torch.device(\"cuda\", rank)\n"
                         "    else:\n"
                         "        backend, device = \"gloo\", torch.device(\"cpu\")\n"),)),
    Flaw("rank_process", "choose_backend_swapped", clause="choose-backend", case="rp-backend",
         why="calls runner.choose_backend(rank, world_size), the arguments swapped: right on "
             "the CPU, wrong devices as soon as there are GPUs.",
         expect="expected 'nccl' and 'cuda:0'",
         patch=((CHOOSE, "    backend, device = runner.choose_backend(rank, world_size)\n"),)),
    Flaw("rank_process", "fresh_config", clause="train-call", case="rp-train",
         why="rebuilds the settings inside rank_process with runner.make_config() (the cpu "
             "preset) and trains with those, dropping the config it was given.",
         expect="'same_config': False",
         patch=(("        result = train(rank, world_size, config, device)\n",
                 "        result = train(rank, world_size, runner.make_config(\"cpu\"),\n"
                 "                       device)\n"),)),
    Flaw("rank_process", "no_barrier", clause="barrier-destroy", case="rp-barrier",
         why="destroys the process group as soon as train returns, without the barrier, so a "
             "rank can tear the group down while another is still in its last collective.",
         expect="expected dist.barrier() and then dist.destroy_process_group()",
         patch=(("        result = train(rank, world_size, config, device)\n"
                 "        dist.barrier()\n        return result\n",
                 "        return train(rank, world_size, config, device)\n"),)),
    Flaw("rank_process", "never_destroys", clause="barrier-destroy", case="rp-destroy",
         why="ends with the barrier and returns: the process group is never destroyed (the "
             "process ends anyway, the student thought).",
         expect="still initialized after rank_process returned",
         patch=(rank_process(SETUP + """
                 result = train(rank, world_size, config, device)
                 dist.barrier()
                 return result
             """.replace("\n                 ", "\n    ")),)),
    Flaw("rank_process", "no_finally", clause="barrier-destroy", case="rp-raise",
         why="destroy_process_group is only reached when train succeeds; when train raises, "
             "the process group is left behind.",
         expect="the process group was left initialized",
         patch=(("    try:\n        result = train(rank, world_size, config, device)\n"
                 "        dist.barrier()\n        return result\n"
                 "    finally:\n        dist.destroy_process_group()\n",
                 "    result = train(rank, world_size, config, device)\n    dist.barrier()\n"
                 "    dist.destroy_process_group()\n    return result\n"),)),
    Flaw("rank_process", "barrier_in_finally", clause="barrier-destroy", case="rp-raise",
         why="puts the barrier in the finally, beside destroy_process_group: a rank whose "
             "training raised then waits for ranks that may never arrive.",
         expect="the barrier belongs after a train that returned",
         patch=(("    try:\n        result = train(rank, world_size, config, device)\n"
                 "        dist.barrier()\n        return result\n"
                 "    finally:\n        dist.destroy_process_group()\n",
                 "    try:\n        return train(rank, world_size, config, device)\n"
                 "    finally:\n        dist.barrier()\n        dist.destroy_process_group()\n"),)),
    Flaw("rank_process", "swallows_error", clause="raise", case="rp-raise",
         why="catches train's exception, prints it and returns None, so the launcher believes "
             "the training went well.",
         expect="let train's exception through to the caller",
         patch=(("        return result\n    finally:\n",
                 "        return result\n    except Exception as exc:\n"
                 "        print(f\"rank {rank}: training failed: {exc}\")\n    finally:\n"),)),
    Flaw("rank_process", "no_return", clause="returns", case="rp-return",
         why="runs train and the cleanup but forgets to return train's result (returns None).",
         expect="it must return what train returned",
         patch=(("        dist.barrier()\n        return result\n", "        dist.barrier()\n"),)),
    # ------------------------------------------------------------------ train
    Flaw("train", "unequal_minibatches", clause="same-count", case="train-counts",
         why="the last rank takes 'the rest' of the training set, so it can get one more "
             "minibatch per epoch than the others; nothing checks the counts, and that rank "
             "waits in all_reduce until the timeout.",
         expect="minibatches per epoch differ",
         patch=((SLICE,
                 "    per_rank = len(train_set) // world_size\n"
                 "    stop = len(train_set) if rank == world_size - 1 else (rank + 1) * per_rank\n"
                 "    x_local = train_set.x[rank * per_rank:stop]\n"
                 "    y_local = train_set.y[rank * per_rank:stop]\n"),
                ("    counts = [None] * world_size\n    dist.all_gather_object(counts, steps)\n"
                 "    assert len(set(counts)) == 1, f\"minibatches per epoch differ between "
                 "ranks: {counts}\"\n", ""))),
    Flaw("train", "same_slice", clause="own-part", case="train-slices",
         why="every rank takes the same first slice of the training data (the slice ignores "
             "the rank), so the ranks train on duplicate examples and half the data is unused.",
         expect="trained on example",
         patch=(("    x_local = train_set.x[rank * per_rank:(rank + 1) * per_rank]\n"
                 "    y_local = train_set.y[rank * per_rank:(rank + 1) * per_rank]\n",
                 "    x_local = train_set.x[:per_rank]\n    y_local = train_set.y[:per_rank]\n"),)),
    Flaw("train", "whole_minibatches_only", clause="examples", case="train-slices",
         why="gives every rank only as many examples as fill whole minibatches (16 of its "
             "23): the counts agree, but each rank reshuffles a smaller slice every epoch and "
             "examples it could have trained on are never used.",
         expect="give every rank len(data) // world_size",
         patch=((SLICE,
                 "    per_rank = len(train_set) // batch_size * minibatch_size\n"
                 "    x_local = train_set.x[rank * per_rank:(rank + 1) * per_rank]\n"
                 "    y_local = train_set.y[rank * per_rank:(rank + 1) * per_rank]\n"),)),
    Flaw("train", "no_broadcast", clause="same-start", case="train-init",
         why="TODO 2 left empty: the given code seeds every rank with config.seed + rank, so "
             "the replicas start from different models and stay different.",
         expect="must be rank 0's on every rank",
         patch=((BROADCAST, ""),)),
    Flaw("train", "averaged_start", clause="same-start", case="train-init",
         why="averages the ranks' models (all_reduce, then divide, as model averaging does) "
             "instead of broadcasting rank 0's: every rank starts alike, but from a mixture, "
             "not from rank 0's model.",
         expect="rank 0's parameters and buffers at the first training step must be those",
         patch=((BROADCAST, "    for tensor in model.state_dict().values():\n"
                            "        if tensor.is_floating_point():\n"
                            "            dist.all_reduce(tensor)\n"
                            "            tensor /= world_size\n"
                            "        else:\n"
                            "            dist.broadcast(tensor, src=0)\n"),)),
    Flaw("train", "parameters_only", clause="broadcast", case="train-init",
         why="broadcasts model.parameters() but not the buffers: every rank keeps its own "
             "BatchNorm running statistics (and the EMA model validated with rank 0's).",
         expect="running_",
         patch=((BROADCAST, "    for p in model.parameters():\n"
                            "        dist.broadcast(p.data, src=0)\n"),)),
    Flaw("train", "trainable_only", clause="broadcast", case="train-init",
         why="broadcasts the parameters that require a gradient (the ones the optimizer "
             "updates) and the buffers, skipping the frozen ones (whitening, BatchNorm scales), "
             "which every rank thus keeps its own.",
         expect="weight",
         patch=((BROADCAST, "    for p in model.parameters():\n"
                            "        if p.requires_grad:\n"
                            "            dist.broadcast(p.data, src=0)\n"
                            "    for b in model.buffers():\n"
                            "        dist.broadcast(b, src=0)\n"),)),
    Flaw("train", "reseed_without_rebuild", clause="reseed", case="train-init",
         why="seeds every rank alike in TODO 2, after the model was built: too late, the "
             "models already differ.",
         expect="must be rank 0's on every rank",
         patch=((BROADCAST, "    torch.manual_seed(config.seed)\n"),)),
    Flaw("train", "sum_not_scaled", clause="scale", case="train-step",
         why="gradients are all-reduced (summed) but not divided by the world size, although "
             "the optimizer was built for one rank's minibatch: every update is world_size "
             "times too large.",
         expect="Too large or too small by a factor of 2",
         patch=(("                    p.grad /= world_size\n", ""),)),
    Flaw("train", "halved", clause="scale", case="train-step",
         why="divides the summed gradients by 2, the number of ranks it was tried with: right "
             "with 2 ranks only.",
         expect="run with 3 ranks",
         patch=(("                    p.grad /= world_size\n",
                 "                    p.grad /= 2\n"),)),
    Flaw("train", "weights_only", clause="one-step", case="train-step",
         why="all-reduces the weight matrices (the parameters that hold almost all elements) "
             "and leaves the biases local: every rank's biases follow its own minibatch.",
         expect="must equal single-process training",
         patch=((REDUCE, "            for p in model.parameters():\n"
                         "                if p.grad is not None and p.ndim > 1:\n"
                         "                    dist.all_reduce(p.grad)\n"
                         "                    p.grad /= world_size\n"),)),
    Flaw("train", "reduce_before_backward", clause="after-backward", case="train-step",
         why="all-reduces the gradients right after zero_grad, before backward: they are "
             "None then, so nothing is averaged and each rank steps with its own gradient.",
         expect="must equal single-process training",
         patch=(("            opt.zero_grad(set_to_none=True)\n            loss.backward()\n",
                 "            opt.zero_grad(set_to_none=True)\n"),
                ("                    p.grad /= world_size\n            opt.step()\n",
                 "                    p.grad /= world_size\n            loss.backward()\n"
                 "            opt.step()\n"))),
    Flaw("train", "ema_on_every_rank", clause="leader-ema", case="train-leader",
         why="every rank builds and updates its own EMA model (and validates), wasting memory "
             "and time on the non-leader ranks.",
         expect="only the leader (rank 0) keeps the EMA model",
         patch=(("    ema = T.EMA(model, config.ema_momentum) if leader else None\n"
                 "    test_set = runner.load_data(config, \"test\", verbose=False) if leader "
                 "else None\n",
                 "    ema = T.EMA(model, config.ema_momentum)\n"
                 "    test_set = runner.load_data(config, \"test\", verbose=False)\n"),
                ("        if leader:\n", "        if ema is not None:\n"))),
    Flaw("train", "logs_on_every_rank", clause="one-leader", case="train-returns",
         why="validates on the leader but appends an epoch record on every rank (accuracy NaN "
             "where there is no EMA model): every rank returns a log.",
         expect="train returned",
         patch=((VALIDATE, "        accuracy = T.evaluate(ema.model, test_set.x, test_set.y) "
                           "if leader else float(\"nan\")\n"
                           "        history.append(runner.epoch_record(epoch, seconds, "
                           "loss_sum / seen, accuracy))\n"),)),
    Flaw("train", "no_history", clause="returns", case="train-returns",
         why="the leader validates and prints the accuracy but never appends the epoch's "
             "record, so train returns no epochs.",
         expect="train returned",
         patch=((VALIDATE, "        if leader:\n"
                           "            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)\n"
                           "            print(f\"epoch {epoch}: accuracy {accuracy:.3f}\")\n"),)),
    Flaw("train", "ema_first_step", clause="ema-steps", case="train-ema",
         why="the EMA is updated after steps 1, 1 + ema_every, ... (the step counted from 0), "
             "one step early each time.",
         expect="expected after steps [2, 4]",
         patch=((EMA_UPDATE, "            if ema is not None and (step - 1) % config.ema_every"
                             " == 0:\n                ema.update(model)\n"),)),
    Flaw("train", "ema_steps_per_epoch", clause="ema-steps", case="train-ema",
         why="counts the steps from the examples seen this epoch (seen // minibatch_size), so "
             "the count restarts every epoch: with ema_every 3 and 2 steps per epoch the EMA "
             "is never updated.",
         expect="expected after steps [3]",
         patch=((EMA_UPDATE, "            if ema is not None and (seen // minibatch_size) % "
                             "config.ema_every == 0:\n                ema.update(model)\n"),)),
    Flaw("train", "ema_before_step", clause="ema-steps", case="train-ema",
         why="updates the EMA model in TODO 4, before opt.step(): the average always lags the "
             "model by one step.",
         expect="Likely cause: one step behind",
         patch=((EMA_UPDATE, ""),
                ("                    p.grad /= world_size\n            opt.step()\n",
                 "                    p.grad /= world_size\n"
                 "            if ema is not None and (step + 1) % config.ema_every == 0:\n"
                 "                ema.update(model)\n            opt.step()\n"))),
    Flaw("train", "validates_raw_model", clause="validates", case="train-validates",
         why="the leader keeps and updates the EMA model but validates the trained model "
             "instead.",
         expect="expected the EMA model (ema.model) once per epoch",
         patch=(("            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)\n",
                 "            accuracy = T.evaluate(model, test_set.x, test_set.y)\n"),)),
    Flaw("train", "validates_on_train_slice", clause="test-set", case="train-accuracy",
         why="the leader validates the EMA model once per epoch, but on its own training slice "
             "(x_local, y_local) instead of the test set: the accuracy it logs is a training "
             "accuracy.",
         expect="The leader validates on the test set",
         patch=(("            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)\n",
                 "            accuracy = T.evaluate(ema.model, x_local, y_local)\n"),)),
    Flaw("train", "log_loss_sum", clause="record", case="train-loss",
         why="records the epoch's summed loss (loss_sum) instead of the loss per example "
             "(loss_sum / seen) in the leader's epoch record.",
         expect="is the sum over the epoch (loss_sum), not divided by seen",
         patch=(("            history.append(runner.epoch_record(epoch, seconds, loss_sum / seen, "
                 "accuracy))\n",
                 "            history.append(runner.epoch_record(epoch, seconds, loss_sum, "
                 "accuracy))\n"),)),
]
