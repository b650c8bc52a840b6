#!/usr/bin/env python3
"""scripts/gpu_workload.py - a PyTorch inference workload under one allocator, and the table.

Used by scripts/gpu-check.sh; each allocator configuration runs in a fresh process, since a
process cannot change its CUDA allocator after the first allocation.

  gpu_workload.py run --config NAME --out FILE.json [--iterations N] [--cpu-smoke]
      Runs the workload under configuration NAME and writes its figures as JSON:
        native       PyTorch's caching allocator (PYTORCH_CUDA_ALLOC_CONF unset)
        expandable   PyTorch's, with expandable_segments:True
        async        PyTorch's backend:cudaMallocAsync
        sdalloc-pool sdalloc via sdalloc.torch.install(mode="pool")
        sdalloc-async sdalloc via sdalloc.torch.install(mode="async")
        sdalloc-vmm  sdalloc via sdalloc.torch.install(mode="vmm")
        sdalloc-planned sdalloc via sdalloc.torch.install(mode="planned"), each iteration
                     one sdalloc.torch.step() (recorded once, then served from the plan's
                     arena); its step figures go into the JSON ("step_stats") and the table
      The PyTorch settings are put in PYTORCH_CUDA_ALLOC_CONF before torch is imported.
      --cpu-smoke runs a tiny version on the CPU (no allocator swap, memory figures null):
      it checks the model code, the argument handling and the JSON without a GPU. For
      sdalloc-planned it still marks each iteration as a step of a backend:host planned
      pool of the shim (device 0); torch's CPU tensors do not go through sdalloc, so those
      steps hold no allocations: only the step calls and the figures' path are checked.
  gpu_workload.py table FILE.json... [--json OUT] [--strict]
      Prints one aligned table (peak reserved, peak allocated, time per iteration) and the
      verdict lines of the issue's bars: sdalloc's peak reserved below native's, no higher
      than expandable's, at <= 1.05 x expandable's time per iteration. A FILE that holds an
      "error" prints as a FAILED row. --json writes everything to OUT. --strict exits 1 when
      a bar is missed (a failed run always exits 1).

The workload: a UNet-like denoiser (convolutions, group norms, self-attention at two
resolutions, skip connections), random weights, fp16, inference under torch.inference_mode,
two latent shapes alternating (batch 1 at 96x96 and batch 2 at 128x128), several iterations
after a warm-up. Time per iteration is the median over the timed iterations, with
torch.cuda.synchronize() around each. Under sdalloc-planned, the iteration's begin_step is
inside the timed part; its end_step (after the iteration's tensors are freed) is not.
The shapes alternate: each is recorded once and gets its own plan (the iteration's first
allocation, the input of that shape, picks it), and both plans share one arena.
"""

import contextlib

import argparse
import json
import math
import os
import statistics
import sys
import time

CONFIGS = {
    "native": {"torch_conf": None, "sdalloc": None},
    "expandable": {"torch_conf": "expandable_segments:True", "sdalloc": None},
    "async": {"torch_conf": "backend:cudaMallocAsync", "sdalloc": None},
    "sdalloc-pool": {"torch_conf": None, "sdalloc": {"mode": "pool"}},
    "sdalloc-async": {"torch_conf": None, "sdalloc": {"mode": "async"}},
    "sdalloc-vmm": {"torch_conf": None, "sdalloc": {"mode": "vmm"}},
    "sdalloc-planned": {"torch_conf": None, "sdalloc": {"mode": "planned"}, "steps": True},
}
# The step figures the JSON and the table carry for a configuration with steps.
STEP_FIGURES = ("planned_allocations", "kept_allocations", "fallback_allocations",
                "recorded_allocations", "recorded_steps", "planned_steps", "divergent_steps",
                "replans", "arena_failures", "arena_bytes", "plans")
GPU_SHAPES = [(1, 4, 96, 96), (2, 4, 128, 128)]
CPU_SHAPES = [(1, 4, 16, 16), (2, 4, 24, 24)]
MiB = 1 << 20


# --------------------------------------------------------------------------- the model

def build_model(torch, channels, heads):
    nn = torch.nn
    F = torch.nn.functional

    class ResBlock(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.norm1 = nn.GroupNorm(32, cin)
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.norm2 = nn.GroupNorm(32, cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x):
            h = self.conv1(F.silu(self.norm1(x)))
            h = self.conv2(F.silu(self.norm2(h)))
            return h + self.skip(x)

    class Attention(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = nn.GroupNorm(32, dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.out = nn.Linear(dim, dim)
            self.heads = heads

        def forward(self, x):
            b, c, h, w = x.shape
            t = self.norm(x).flatten(2).transpose(1, 2)  # (b, hw, c)
            q, k, v = self.qkv(t).chunk(3, dim=-1)
            split = lambda z: z.reshape(b, h * w, self.heads, c // self.heads).transpose(1, 2)
            q, k, v = split(q), split(k), split(v)
            if hasattr(F, "scaled_dot_product_attention"):
                a = F.scaled_dot_product_attention(q, k, v)
            else:
                weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // self.heads), -1)
                a = weights @ v
            a = a.transpose(1, 2).reshape(b, h * w, c)
            return x + self.out(a).transpose(1, 2).reshape(b, c, h, w)

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            c1, c2, c3 = channels
            self.inp = nn.Conv2d(4, c1, 3, padding=1)
            self.d1 = ResBlock(c1, c1)
            self.down1 = nn.Conv2d(c1, c2, 3, stride=2, padding=1)
            self.d2 = ResBlock(c2, c2)
            self.a2 = Attention(c2)
            self.down2 = nn.Conv2d(c2, c3, 3, stride=2, padding=1)
            self.mid = ResBlock(c3, c3)
            self.amid = Attention(c3)
            self.up2 = nn.ConvTranspose2d(c3, c2, 4, stride=2, padding=1)
            self.u2 = ResBlock(2 * c2, c2)
            self.au2 = Attention(c2)
            self.up1 = nn.ConvTranspose2d(c2, c1, 4, stride=2, padding=1)
            self.u1 = ResBlock(2 * c1, c1)
            self.outp = nn.Conv2d(c1, 4, 3, padding=1)

        def forward(self, x):
            h1 = self.d1(self.inp(x))
            h2 = self.a2(self.d2(self.down1(h1)))
            m = self.amid(self.mid(self.down2(h2)))
            u2 = self.au2(self.u2(torch.cat([self.up2(m), h2], 1)))
            u1 = self.u1(torch.cat([self.up1(u2), h1], 1))
            return self.outp(u1)

    return UNet()


# --------------------------------------------------------------------------- run

def run(args):
    spec = CONFIGS[args.config]
    # Before torch is imported: PyTorch reads its allocator settings once.
    if args.cpu_smoke:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    elif spec["torch_conf"]:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = spec["torch_conf"]
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch  # pylint: disable=import-outside-toplevel

    result = {"config": args.config, "torch": torch.__version__, "cpu_smoke": args.cpu_smoke,
              "allocator_conf": spec["torch_conf"], "sdalloc": spec["sdalloc"]}
    sdalloc_torch = None
    if spec["sdalloc"] is not None and not args.cpu_smoke:
        import sdalloc.torch as sdalloc_torch  # pylint: disable=import-outside-toplevel
        sdalloc_torch.install(**spec["sdalloc"])
        result["sdalloc_conf"] = sdalloc_torch.config_text()
    # Configurations with steps: each iteration is one step of the shim's pool. On the CPU
    # smoke that is a host pool of device 0 that torch's CPU tensors never reach.
    step_device = None
    if spec.get("steps"):
        import sdalloc.torch as step_shim  # pylint: disable=import-outside-toplevel
        if args.cpu_smoke:
            step_shim.configure(backend="host", **spec["sdalloc"])
            step_device = 0
            result["sdalloc_conf"] = step_shim.config_text()

        def iteration_scope():
            return step_shim.step(device=step_device)
    else:
        iteration_scope = contextlib.nullcontext

    if args.cpu_smoke:
        device, dtype, shapes, channels, heads = "cpu", torch.float32, CPU_SHAPES, (32, 64, 64), 2
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_workload: torch.cuda.is_available() is False")
        device, dtype, shapes, channels, heads = "cuda", torch.float16, GPU_SHAPES, (128, 256,
                                                                                   512), 8
    torch.manual_seed(0)
    model = build_model(torch, channels, heads).to(device=device, dtype=dtype).eval()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["shapes"] = [list(s) for s in shapes]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    times = []
    with torch.inference_mode():
        for i in range(args.warmup + args.iterations):
            shape = shapes[i % len(shapes)]
            sync()
            start = time.perf_counter()
            with iteration_scope():
                x = torch.randn(shape, device=device, dtype=dtype)
                for _ in range(args.steps):  # a sampler's denoising steps
                    x = x - 0.1 * model(x)
                sync()
                if i >= args.warmup:
                    times.append(time.perf_counter() - start)
                del x
    result["iterations"] = len(times)
    result["time_per_iteration_s"] = statistics.median(times)
    result["time_min_s"] = min(times)
    result["time_max_s"] = max(times)

    if spec.get("steps"):
        figures = step_shim.step_stats(device=step_device)
        result["step_stats"] = {name: figures[name] for name in STEP_FIGURES}

    result["peak_reserved_bytes"] = None
    result["peak_allocated_bytes"] = None
    if device == "cuda":
        if sdalloc_torch is not None:
            import sdalloc  # pylint: disable=import-outside-toplevel
            stats = sdalloc.stats(device=torch.cuda.current_device())
        else:
            stats = torch.cuda.memory_stats()
        result["peak_reserved_bytes"] = stats.get("reserved_bytes.all.peak")
        result["peak_allocated_bytes"] = stats.get("allocated_bytes.all.peak")
        free, total = torch.cuda.mem_get_info()
        result["device_used_bytes_at_end"] = total - free
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=1)
    print(f"gpu_workload: {args.config}: {len(times)} iterations, "
          f"median {result['time_per_iteration_s'] * 1e3:.1f} ms")


# --------------------------------------------------------------------------- table

def load_results(paths):
    results = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                results.append(json.load(f))
        except (OSError, ValueError) as error:
            name = os.path.splitext(os.path.basename(path))[0]
            results.append({"config": name, "error": f"no result: {error}"})
    return results


def mib(value):
    return "-" if value is None else f"{value / MiB:.1f}"


def step_note(result):
    """The table's note for a run with steps: where its allocations were served, and how
    many steps left the plan."""
    steps = result.get("step_stats")
    if not steps:
        return ""
    return (f"; steps: {steps['planned_allocations']} planned, {steps['kept_allocations']} "
            f"kept, {steps['fallback_allocations']} fallback allocations; "
            f"{steps['divergent_steps']}/{steps['planned_steps']} planned steps divergent, "
            f"{steps['recorded_steps']} recorded, {steps['replans']} replans, "
            f"{steps['plans']} plans")


def format_table(results):
    header = ("config", "peak reserved MiB", "peak allocated MiB", "ms/iteration", "status")
    rows = []
    for r in results:
        if r.get("error"):
            rows.append((r["config"], "-", "-", "-", "FAILED: " + r["error"].splitlines()[0]))
            continue
        rows.append((r["config"], mib(r.get("peak_reserved_bytes")),
                     mib(r.get("peak_allocated_bytes")),
                     f"{r['time_per_iteration_s'] * 1e3:.2f}", "ok" + step_note(r)))
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header] + rows):
        cells = [str(c).ljust(widths[i]) if i in (0, 4) else str(c).rjust(widths[i])
                 for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdicts(results):
    """The issue's bars, per sdalloc configuration: a list of (ok, line)."""
    by_name = {r["config"]: r for r in results if not r.get("error")}
    native, expandable = by_name.get("native"), by_name.get("expandable")
    lines = []
    for name, r in by_name.items():
        if not name.startswith("sdalloc") or r.get("peak_reserved_bytes") is None:
            continue
        mine = r["peak_reserved_bytes"]
        if native and native.get("peak_reserved_bytes") is not None:
            ok = mine < native["peak_reserved_bytes"]
            lines.append((ok, f"{name}: peak reserved {mib(mine)} MiB < native "
                              f"{mib(native['peak_reserved_bytes'])} MiB"))
        if expandable and expandable.get("peak_reserved_bytes") is not None:
            ok = mine <= expandable["peak_reserved_bytes"]
            lines.append((ok, f"{name}: peak reserved {mib(mine)} MiB <= expandable "
                              f"{mib(expandable['peak_reserved_bytes'])} MiB"))
            ratio = r["time_per_iteration_s"] / expandable["time_per_iteration_s"]
            lines.append((ratio <= 1.05, f"{name}: time per iteration {ratio:.3f} x "
                                         "expandable's (bar: <= 1.05)"))
    return lines


def table(args):
    results = load_results(args.files)
    print(format_table(results))
    checks = verdicts(results)
    for ok, line in checks:
        print(f"{'PASS' if ok else 'MISS'}  {line}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"results": results,
                       "bars": [{"ok": ok, "check": line} for ok, line in checks]},
                      out, indent=1)
    failed = [r["config"] for r in results if r.get("error")]
    if failed:
        print(f"gpu_workload: FAILED runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    if args.strict and not all(ok for ok, _ in checks):
        return 1
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workload under one configuration")
    r.add_argument("--config", required=True, choices=sorted(CONFIGS))
    r.add_argument("--out", required=True)
    r.add_argument("--iterations", type=int, default=6)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--steps", type=int, default=4, help="model calls per iteration")
    r.add_argument("--cpu-smoke", action="store_true")
    t = sub.add_parser("table", help="print the table of result files")
    t.add_argument("files", nargs="+")
    t.add_argument("--json")
    t.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.iterations < 1 or args.warmup < 0 or args.steps < 1:
            parser.error("--iterations and --steps must be >= 1, --warmup >= 0")
        try:
            run(args)
        except BaseException as error:  # pylint: disable=broad-except
            # Leave a result that says what went wrong, so the table shows the failure.
            with open(args.out, "w", encoding="utf-8") as out:
                json.dump({"config": args.config, "error": f"{type(error).__name__}: {error}"},
                          out)
            raise
        return 0
    return table(args)


if __name__ == "__main__":
    sys.exit(main())
