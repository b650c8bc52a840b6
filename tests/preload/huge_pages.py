"""huge_pages.py - with SDALLOC_PRELOAD_CONF=huge_pages:true the pool's memory is backed by
transparent huge pages (madvise MADV_HUGEPAGE), where the kernel allows THP at all.

Prints "huge pages ok" when a 64 MiB tensor from the pool shows AnonHugePages in
/proc/self/smaps_rollup, or when the kernel's THP setting is "never" (nothing to ask for);
exits 1 otherwise.
"""
import re
import sys

import torch


def thp_mode():
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "never"
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else "never"


def anon_huge_kib():
    text = open("/proc/self/smaps_rollup").read()
    return int(re.search(r"AnonHugePages:\s+(\d+) kB", text).group(1))


if __name__ == "__main__":
    before = anon_huge_kib()
    x = torch.ones(64 << 18)  # 64 MiB of float32, written
    grown = anon_huge_kib() - before
    mode = thp_mode()
    print(f"THP {mode}: AnonHugePages grew by {grown} kB for a 64 MiB tensor", flush=True)
    if mode == "never" or grown >= 32 << 10:
        print("huge pages ok")
        sys.exit(0)
    sys.exit(1)
