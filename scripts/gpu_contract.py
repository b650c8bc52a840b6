#!/usr/bin/env python3
"""scripts/gpu_contract.py - PyTorch's allocator contract checked on the shim, a few seconds
per check, before gpu-check.sh times anything (docs/pytorch.md says what each promises).

  gpu_contract.py install --out FILE.json
      sdalloc.torch.install(capacity="256MiB"), then, in this order:
        oom           a 512 MiB tensor raises (RuntimeError / OutOfMemoryError, "out of
                      memory" in the message), and a small tensor still works after it
        memory_stats  torch.cuda.memory_allocated / memory_stats answer the shim's figures
        record_stream a block used on a side stream kept busy (torch.cuda._sleep) and freed
                      is not handed out again at once on its own stream
        empty_cache   torch.cuda.empty_cache() raises torch.cuda.mem_get_info's free bytes
        graph         a small torch.cuda.graph capture either works (replay right) or is
                      refused with a message naming sdalloc.torch.mempool(); last, since a
                      refused capture leaves its stream unusable
  gpu_contract.py mempool --out FILE.json
      a tensor made inside `with torch.cuda.use_mem_pool(sdalloc.torch.mempool())` is served
      by sdalloc and computes right (torch >= 2.5; a "skip" check otherwise)
  gpu_contract.py host --out FILE.json
      the CPU-possible parts (for --cpu-smoke), on a backend:host pool of the shim through
      its exported functions: oom (nullptr and the message; the raising variant is covered
      by tests/torch_shim_library), record_stream, empty_cache

Each check is {"check", "status": "ok"|"FAILED"|"skip", "detail"}; one line per check is
printed as it finishes. Exit 1 when a check FAILED.
"""

import argparse
import json
import sys
import traceback

MiB = 1 << 20


class Checks:
    def __init__(self, out):
        self.out = out
        self.checks = []

    def run(self, name, body):
        try:
            status, detail = body()
        except Exception as error:  # pylint: disable=broad-except
            status = "FAILED"
            detail = f"{type(error).__name__}: {error}".splitlines()[0]
            traceback.print_exc()
        self.checks.append({"check": name, "status": status, "detail": detail})
        print(f"gpu_contract: {name:<14} {status:<6} {detail}", flush=True)
        self.write()

    def write(self):
        with open(self.out, "w", encoding="utf-8") as f:
            json.dump({"checks": self.checks}, f, indent=1)

    def failed(self):
        return any(c["status"] == "FAILED" for c in self.checks)


def ok_if(condition, detail):
    return ("ok" if condition else "FAILED"), detail


# --------------------------------------------------------------------------- on a GPU

def install_checks(checks):
    import torch  # pylint: disable=import-outside-toplevel
    import sdalloc  # pylint: disable=import-outside-toplevel
    import sdalloc.torch as st  # pylint: disable=import-outside-toplevel
    st.install(capacity="256MiB")
    cuda = torch.device("cuda")

    def oom():
        try:
            torch.empty(512 * MiB, dtype=torch.uint8, device=cuda)
        except (RuntimeError, MemoryError) as error:
            text = str(error).splitlines()[0]
            small = torch.ones(1024, device=cuda)
            return ok_if("out of memory" in text and float(small.sum()) == 1024.0,
                         f"{type(error).__name__}: {text[:160]}")
        return "FAILED", "a 512 MiB tensor was allocated under capacity:256MiB"

    def memory_stats():
        x = torch.empty(4 * MiB, dtype=torch.uint8, device=cuda)
        allocated = torch.cuda.memory_allocated()
        stats = torch.cuda.memory_stats()
        del x
        return ok_if(allocated >= 4 * MiB and "reserved_bytes.all.peak" in stats,
                     f"memory_allocated {allocated}; hooks {st.hooks()['hooks']}")

    def record_stream():
        # The side stream must still run when the block is asked for again, or handing it
        # out is right: torch.cuda._sleep's cycles are a guess at the clock, so the attempt
        # is repeated with a longer sleep while the side stream finished too soon.
        side = torch.cuda.Stream()
        for cycles in (200_000_000, 2_000_000_000, 8_000_000_000):
            x = torch.empty(8 * MiB, dtype=torch.uint8, device=cuda)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(cycles)  # pylint: disable=protected-access
                x.add_(1)
            x.record_stream(side)
            old = x.data_ptr()
            del x
            pending = sdalloc.stats(device=torch.cuda.current_device())["pending_free_bytes"]
            y = torch.empty(8 * MiB, dtype=torch.uint8, device=cuda)
            busy = not side.query()  # still running after y was handed out
            reused = y.data_ptr() == old
            del y
            side.synchronize()
            seen = f" ({pending} bytes pending after the free; _sleep({cycles}))"
            if busy:
                return ok_if(not reused, ("the block was handed out again while the side "
                                          "stream used it" if reused else
                                          "not reused while the side stream ran") + seen)
        return "FAILED", "the side stream never stayed busy long enough to tell" + seen

    def empty_cache():
        x = torch.empty(96 * MiB, dtype=torch.uint8, device=cuda)
        del x
        torch.cuda.synchronize()
        before = torch.cuda.mem_get_info()[0]
        torch.cuda.empty_cache()
        after = torch.cuda.mem_get_info()[0]
        return ok_if(after > before, f"free bytes {before} -> {after}")

    def graph():
        static = torch.ones(1024, device=cuda)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static * 2  # pylint: disable=pointless-statement
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                out = static * 2
        except Exception as error:  # pylint: disable=broad-except
            # capture_end in torch.cuda.graph's __exit__ may raise in turn: read the chain.
            chain, cause = [], error
            while cause is not None and len(chain) < 4:
                chain.append(str(cause))
                cause = cause.__context__
            text = " | ".join(chain)
            ours = "sdalloc" in text and "mempool" in text
            torchs = "not yet support" in text or "not supported" in text
            first = next((t for t in chain if "sdalloc" in t), chain[0]).splitlines()
            return ok_if(ours or torchs, ("refused clearly: " if ours or torchs else
                                          "unclear failure: ") + (first[0] if first else "")[:160])
        g.replay()
        torch.cuda.synchronize()
        return ok_if(float(out.sum()) == 2048.0, "captured and replayed")

    for name, body in (("oom", oom), ("memory_stats", memory_stats),
                       ("record_stream", record_stream), ("empty_cache", empty_cache),
                       ("graph", graph)):
        checks.run(name, body)


def mempool_checks(checks):
    import torch  # pylint: disable=import-outside-toplevel
    import sdalloc  # pylint: disable=import-outside-toplevel
    import sdalloc.torch as st  # pylint: disable=import-outside-toplevel

    def mempool():
        if not hasattr(torch.cuda, "MemPool"):
            return "skip", f"torch {torch.__version__} has no torch.cuda.MemPool (needs 2.5)"
        pool = st.mempool()
        with torch.cuda.use_mem_pool(pool):
            x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
            y = x * 2
        served = sdalloc.stats(device=torch.cuda.current_device())["allocation.all.current"]
        right = float(y[-1]) == 2.0 * ((1 << 20) - 1)
        return ok_if(served > 0 and right, f"{served} sdalloc allocations live, result "
                                           f"{'right' if right else 'WRONG'}")

    checks.run("mempool", mempool)


# --------------------------------------------------------------------------- on the CPU

def host_checks(checks):
    from ctypes import c_size_t, c_void_p  # pylint: disable=import-outside-toplevel
    import sdalloc  # pylint: disable=import-outside-toplevel
    import sdalloc.torch as st  # pylint: disable=import-outside-toplevel
    from sdalloc import _native  # pylint: disable=import-outside-toplevel
    st.configure(backend="host", capacity="256MiB")
    c = _native.shim().c

    def oom():
        ptr = c.sdalloc_torch_malloc(c_size_t(512 * MiB), 0, None)
        text = c.sdalloc_torch_last_error().decode()
        return ok_if(ptr is None and "out of memory" in text, text[:160])

    def record_stream():
        main, side = c_void_p(0x1), c_void_p(0x2)
        p = c.sdalloc_torch_malloc(8 * MiB, 0, main)
        earlier = c.sdalloc_torch_last_error()  # the per-thread message of an earlier check
        c.sdalloc_torch_record_stream(p, side)
        c.sdalloc_torch_free(p, 8 * MiB, 0, main)
        q = c.sdalloc_torch_malloc(8 * MiB, 0, main)
        c.sdalloc_torch_free(q, 8 * MiB, 0, main)
        return ok_if(c.sdalloc_torch_last_error() == earlier, f"record_stream accepted ({'another' if q != p else 'the same'}"
                                  " block after the free: host pools have no events)")

    def empty_cache():
        p = c.sdalloc_torch_malloc(64 * MiB, 0, None)
        c.sdalloc_torch_free(p, 64 * MiB, 0, None)
        before = sdalloc.stats(device=0)["reserved_bytes.all.current"]
        released = st.empty_cache()
        after = sdalloc.stats(device=0)["reserved_bytes.all.current"]
        return ok_if(released > 0 and after < before, f"reserved {before} -> {after}")

    for name, body in (("oom", oom), ("record_stream", record_stream),
                       ("empty_cache", empty_cache)):
        checks.run(name, body)
    checks.run("graph", lambda: ("skip", "needs CUDA"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("install", "mempool", "host"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    checks = Checks(args.out)
    {"install": install_checks, "mempool": mempool_checks, "host": host_checks}[args.part](checks)
    checks.write()
    return 1 if checks.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
