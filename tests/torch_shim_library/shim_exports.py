#!/usr/bin/env python3
"""shim_exports.py NM HOST_LIBRARY SHIM_LIBRARY

The PyTorch shim (libsdalloc_torch.so) is self-contained: Python binds the C API of
sdalloc.h, the transfer and offload functions included, from it as from the host library
(python/sdalloc/_native.py, _offload.py). This checks that it exports every C function
(sdalloc_*) the host library exports. Until 2026-12-06 the shim linked the core as a static
archive, from which the linker takes only what something references: a build without CUDA
lacked the 24 sdalloc_transfer_* / sdalloc_offload_* functions, and every build the tensor
calls. Exit status 1, with the missing names, when any is missing.
"""

import subprocess
import sys


def exported_c_functions(nm, library):
    """The sdalloc_* functions `library` defines in its dynamic symbol table."""
    out = subprocess.run([nm, "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "T" and fields[2].startswith("sdalloc_"):
            names.add(fields[2].split("@")[0])
    return names


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    nm, host, shim = sys.argv[1:]
    host_names = exported_c_functions(nm, host)
    shim_names = exported_c_functions(nm, shim)
    # A host library that exports nothing (a broken nm or version script) proves nothing.
    for name in ("sdalloc_pool_create", "sdalloc_tensor_alloc", "sdalloc_transfer_engine_create",
                 "sdalloc_offload_create"):
        if name not in host_names:
            sys.exit(f"shim_exports: {host} does not export {name}: is this sdalloc's library?")
    missing = sorted(host_names - shim_names)
    if missing:
        print(f"shim_exports: {shim} lacks {len(missing)} of the {len(host_names)} C functions "
              f"{host} exports:", file=sys.stderr)
        for name in missing:
            print(f"  {name}", file=sys.stderr)
        sys.exit(1)
    print(f"shim_exports: {shim} exports all {len(host_names)} C functions of {host}, "
          f"and {len(shim_names - host_names)} of its own")


if __name__ == "__main__":
    main()
