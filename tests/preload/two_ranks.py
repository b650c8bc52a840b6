"""two_ranks.py - two gloo ranks on the CPU, each with libsdalloc_preload.so preloaded.

`two_ranks.py` launches two ranks of itself the way torchrun does (env:// rendezvous: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), with the environment it was given
(LD_PRELOAD, SDALLOC_CONF); the test preload_smoke_torchrun runs the same ranks under the
real `torchrun --standalone --nproc_per_node 2 --redirects 2 --tee 1 two_ranks.py --rank` (the
two options work around torch 1.13's elastic agent crashing on its defaults under Python
3.11). Each rank checks
that its large tensors lie in its own pool (sdalloc_preload_owns), all-reduces, checks the
sum and its pool's figures, and exits 0.
"""
import ctypes
import os
import socket
import subprocess
import sys


def rank_main():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lib = ctypes.CDLL(None)
    owns = lib.sdalloc_preload_owns
    owns.argtypes = [ctypes.c_void_p]
    x = torch.full((1 << 20,), float(rank + 1))  # 4 MiB: the pool's
    assert owns(x.data_ptr()) == 1, "a large tensor is not in the drop-in's pool"
    y = None
    for _ in range(3):
        y = torch.randn(512, 1024) @ torch.randn(1024, 512)
        s = x.clone()
        dist.all_reduce(s)
        assert s[0].item() == sum(range(1, world + 1)), s[0].item()
    assert owns(y.data_ptr()) == 1
    print(f"rank {rank} of {world} (pid {os.getpid()}) ok", flush=True)
    dist.destroy_process_group()


def launch():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank"], env=env))
    codes = [p.wait(timeout=240) for p in procs]
    print("exit codes", codes, flush=True)
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank_main()
    else:
        sys.exit(launch())
