"""A converted model under DistributedDataParallel and under FSDP2
(fully_shard): 2 processes (Gloo, 127.0.0.1, a free port), each on its half
of the batch. DDP averages the gradients of snip's quantized GEMMs like any
other, so both ranks hold the same weights, bit for bit; FSDP2 (each layer
sharded, gathered for its GEMMs) ends with the same weights as DDP."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import snip


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, out, how="ddp"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=__import__("datetime").timedelta(seconds=60))
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    snip.convert(model, recipe="nvfp4", seed=5)
    if how == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        for m in model:
            if isinstance(m, snip.nn.Linear):
                fully_shard(m)
        ddp = fully_shard(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(2, 16, 32, generator=g)[rank]  # this rank's half
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        snip.set_step(model, step + 1)
    sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone() for k, v in model.state_dict().items()}
    torch.save(sd, os.path.join(out, f"{how}{rank}.pt"))
    # Both ranks past their last collective before either tears Gloo down:
    # a rank destroying its group while the other still used it aborted
    # ("terminate called without an active exception") once in CI.
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_agree_bit_for_bit(tmp_path):
    mp.start_processes(worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    a, b = (torch.load(tmp_path / f"ddp{r}.pt") for r in (0, 1))
    assert list(a) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
        assert not torch.equal(a[k], init[k]), k  # trained


def test_fsdp2_trains_to_the_weights_of_ddp(tmp_path):
    mp.start_processes(worker, args=(free_port(), str(tmp_path), "ddp"), nprocs=2, join=True, start_method="spawn")
    mp.start_processes(worker, args=(free_port(), str(tmp_path), "fsdp2"), nprocs=2, join=True, start_method="spawn")
    ddp, fsdp = torch.load(tmp_path / "ddp0.pt"), torch.load(tmp_path / "fsdp20.pt")
    assert list(fsdp) == list(ddp)
    for k in ddp:
        torch.testing.assert_close(fsdp[k], ddp[k], rtol=0, atol=0, msg=k)
