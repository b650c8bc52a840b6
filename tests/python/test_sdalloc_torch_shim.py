"""libsdalloc_torch.so through ctypes with the exact signatures PyTorch calls, its
SDALLOC_CONF parsing and errors, its hooks, and sdalloc.torch's install()/mempool() guards.

The shim keeps one configuration and one pool per device for the whole process, so each
scenario runs in a fresh interpreter (conftest.run_python)."""

import pytest

from conftest import run_python

# Indented like the scenarios, which are dedented as one text.
PRELUDE = """
    import ctypes, gc, sys
    from ctypes import c_int, c_size_t, c_void_p, c_double
    import sdalloc, sdalloc.torch as st
    from sdalloc import _native
    lib = _native.shim()
    c = lib.c
    MiB = 1 << 20
"""


def check(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def test_exported_functions_have_pytorchs_signatures_and_serve_host_pools(libraries):
    check(run_python(PRELUDE + """
    st.configure(backend="host")
    # void* sdalloc_torch_malloc(size_t, int, cudaStream_t)
    malloc = ctypes.CFUNCTYPE(c_void_p, c_size_t, c_int, c_void_p)(("sdalloc_torch_malloc", c))
    # void sdalloc_torch_free(void*, size_t, int, cudaStream_t)
    free = ctypes.CFUNCTYPE(None, c_void_p, c_size_t, c_int, c_void_p)(("sdalloc_torch_free", c))
    stream = c_void_p(0x1234)
    a = malloc(1 << 20, 0, stream)
    b = malloc(1000, 0, None)
    h = malloc(4096, -1, None)     # device -1: the host pool of the CPU tests
    d3 = malloc(512, 3, None)      # one pool per device
    assert a and b and h and d3 and len({a, b, h, d3}) == 4
    assert a % 512 == 0 and b % 512 == 0
    ctypes.memset(a, 0xAB, 1 << 20)  # real, writable host memory
    pools = st.pools()
    assert sorted(pools) == [-1, 0, 3], sorted(pools)
    assert st.pool(0).mode == "vmm"   # mode:auto on host memory: pages that map
    s0 = sdalloc.stats(device=0)
    assert s0["allocation.all.current"] == 2 and s0["requested_bytes.all.current"] == (1 << 20) + 1000
    assert malloc(0, 0, None) is None  # zero bytes: nullptr
    free(a, 1 << 20, 0, stream)
    free(b, 1000, 0, None)
    free(h, 4096, -1, None)
    free(d3, 512, 3, None)
    assert sdalloc.stats(device=0)["allocation.all.current"] == 0
    assert sdalloc.stats(device=0)["allocation.all.freed"] == 2
    assert st.empty_cache() > 0               # the reset hook's work: cached segments go back
    assert sdalloc.stats(device=0)["reserved_bytes.all.current"] == 0
    c.sdalloc_torch_empty_cache()             # the hook itself (void(void))
    snap = sdalloc.snapshot()
    assert {s["device"] for s in snap["segments"]} <= {-1, 0, 3}
    assert "backend:host" in snap["allocator_settings"]["SDALLOC_CONF"]
    print("ok")
    """))


def test_free_of_a_foreign_pointer_is_reported_not_fatal(libraries):
    result = check(run_python(PRELUDE + """
    st.configure(backend="host")
    p = c.sdalloc_torch_malloc(100, 0, None)
    buf = ctypes.create_string_buffer(64)
    c.sdalloc_torch_free(ctypes.addressof(buf), 64, 0, None)
    assert b"not memory of this pool" in c.sdalloc_torch_last_error(), c.sdalloc_torch_last_error()
    c.sdalloc_torch_free(p, 100, 7, None)       # a device that never allocated
    assert b"device 7 has no sdalloc pool" in c.sdalloc_torch_last_error()
    c.sdalloc_torch_free(p, 100, 0, None)
    c.sdalloc_torch_free(p, 100, 0, None)       # double free: reported, ignored
    assert sdalloc.stats(device=0)["allocation.all.current"] == 0
    assert c.sdalloc_torch_malloc(100, 64, None) is None  # device out of range
    assert b"out of range" in c.sdalloc_torch_last_error()
    print("ok")
    """))
    assert "sdalloc_torch: free ignored" in result.stderr


def test_record_stream_hook_and_memory_fraction(libraries):
    check(run_python(PRELUDE + """
    st.configure(backend="host", capacity="64MiB")
    p = c.sdalloc_torch_malloc(MiB, 0, None)
    c.sdalloc_torch_record_stream(p, c_void_p(0x99))   # void(void*, cudaStream_t)
    assert c.sdalloc_torch_last_error() == b""
    c.sdalloc_torch_record_stream(c_void_p(0x10), c_void_p(0x99))
    assert b"not a live allocation of any sdalloc pool" in c.sdalloc_torch_last_error()
    c.sdalloc_torch_free(p, MiB, 0, None)
    # Half of the 64 MiB capacity: 40 MiB fails, 20 MiB fits.
    c.sdalloc_torch_memory_fraction_hook(c_double(0.5), 0)   # void(double, int)
    assert c.sdalloc_torch_malloc(40 * MiB, 0, None) is None
    assert b"out of memory" in c.sdalloc_torch_last_error()
    q = c.sdalloc_torch_malloc(20 * MiB, 0, None)
    assert q
    c.sdalloc_torch_free(q, 20 * MiB, 0, None)
    st.set_memory_fraction(1.0, 0)
    r = c.sdalloc_torch_malloc(40 * MiB, 0, None)
    assert r
    c.sdalloc_torch_free(r, 40 * MiB, 0, None)
    for bad in (0.0, 1.5, -1.0):
        try:
            st.set_memory_fraction(bad, 0)
        except sdalloc.SdallocError as e:
            assert "outside (0, 1]" in str(e), e
        else:
            raise AssertionError("fraction accepted")
    # A fraction set before the device's pool exists applies when it is created.
    st.set_memory_fraction(0.25, 5)
    assert c.sdalloc_torch_malloc(20 * MiB, 5, None) is None
    print("ok")
    """))


def test_memory_fraction_on_host_needs_capacity(libraries):
    check(run_python(PRELUDE + """
    st.configure(backend="host")
    try:
        st.set_memory_fraction(0.5, 0)
    except sdalloc.SdallocError as e:
        assert "needs capacity" in str(e), e
    else:
        raise AssertionError("accepted")
    print("ok")
    """))


@pytest.mark.parametrize("conf, message", [
    ("mode:bogus", "mode must be auto, pool, async, vmm or planned, in 'mode:bogus'"),
    ("backend:host,capacity:12XB", "unknown size unit 'XB'"),
    ("backend:host,capcity:1", "unknown key 'capcity'"),
    ("backend:host,backend:cuda", "the key 'backend' is repeated"),
    ("backend:host,mode", "expected key:value, in 'mode'"),
    ("backend:host,memory_fraction:2", "memory_fraction must be a number in (0, 1]"),
    ("backend:host,granularity:1000", "segment_granularity must be a power of two"),
    ("backend:host,consolidate:maybe", "expected true or false"),
    ("backend:host,mode:async", "mode:async needs backend:cuda"),
])
def test_bad_sdalloc_conf_fails_allocations_with_a_message(libraries, conf, message):
    result = check(run_python(PRELUDE + f"""
    assert c.sdalloc_torch_malloc(100, 0, None) is None
    error = c.sdalloc_torch_last_error().decode()
    assert {message!r} in error, error
    assert c.sdalloc_torch_config() == b""
    import os
    del os.environ["SDALLOC_CONF"]  # configure() starts from it; here only the keywords count
    try:
        st.configure(backend="host", mode="bogus")
    except sdalloc.SdallocError as e:
        assert e.status == "INVALID_ARGUMENT" and "mode must be" in str(e)
    else:
        raise AssertionError("bad configure accepted")
    print("ok")
    """, env={"SDALLOC_CONF": conf}))
    assert "SDALLOC_CONF:" in result.stderr  # printed once, since PyTorch shows nothing


def test_python_keywords_are_the_shims_keys(libraries):
    """sdalloc.torch names the keys once more, to reject a typo before loading the shim: they
    must be the shim's option table's keys, in its order (config_text() writes every key once
    memory_fraction and plan_nodes are set)."""
    check(run_python(PRELUDE + """
    st.configure(backend="host", capacity="1MiB", memory_fraction=0.5, plan_nodes=100)
    keys = tuple(pair.split(":", 1)[0] for pair in st.config_text().split(","))
    assert keys == st._CONFIG_KEYS, (keys, st._CONFIG_KEYS)
    print("ok")
    """))


def test_configure_after_the_first_allocation_is_refused(libraries):
    check(run_python(PRELUDE + """
    st.configure(backend="host", granularity="4MiB")
    assert "granularity:4MiB" in st.config_text()
    p = c.sdalloc_torch_malloc(100, 0, None)
    try:
        st.configure(backend="host")
    except sdalloc.SdallocError as e:
        assert "configure before the first allocation" in str(e), e
    else:
        raise AssertionError("accepted")
    try:
        st.configure(bogus=1)
    except TypeError as e:
        assert "unknown setting 'bogus'" in str(e)
    c.sdalloc_torch_free(p, 100, 0, None)
    print("ok")
    """))


def test_environment_configuration_is_read_on_first_use(libraries):
    check(run_python(PRELUDE + """
    assert c.sdalloc_torch_malloc(100, 0, None)
    text = c.sdalloc_torch_config().decode()
    assert text.startswith("backend:host,mode:auto,capacity:32MiB"), text
    assert "min_segment:4MiB" in text and "release_before_growth:false" in text
    print("ok")
    """, env={"SDALLOC_CONF": "backend:host, capacity:32MiB ,min_segment:4MiB,"
                              "release_before_growth:false"}))


def test_cuda_backend_without_a_device_fails_cleanly(libraries):
    check(run_python(PRELUDE + """
    p = c.sdalloc_torch_malloc(100, 0, None)   # default backend: cuda
    error = c.sdalloc_torch_last_error().decode()
    if st.has_cuda():
        assert p is None and "CUDA is not usable here" in error, error
    else:
        assert p is None and "built without CUDA" in error, error
    print("ok")
    """))


def test_record_traces_the_shim_pool(libraries, tmp_path):
    trace = tmp_path / "shim.csv"
    check(run_python(PRELUDE + f"""
    st.configure(backend="host")
    st.pool(0)
    with sdalloc.record({str(trace)!r}) as rec:
        p = c.sdalloc_torch_malloc(4096, 0, c_void_p(0x42))
        c.sdalloc_torch_free(p, 4096, 0, c_void_p(0x42))
    assert rec.events == 2
    print("ok")
    """))
    assert trace.read_text() == "op,id,size,stream\na,0,4096,1\nf,0,4096,1\n"


def test_install_after_cuda_initialised_says_it_is_too_late(torch):  # pylint: disable=unused-argument
    result = check(run_python("""
    import torch, sdalloc.torch as st
    torch.cuda.is_initialized = lambda: True   # as after the first CUDA allocation
    torch.cuda.device_count = lambda: 1
    torch.cuda.memory_reserved = lambda device=None: 20971520
    try:
        st.install(mode="pool")
    except RuntimeError as e:
        print(e)
    else:
        raise AssertionError("install accepted")
    assert not st.installed()
    """))
    assert "called too late" in result.stdout
    assert "20971520 bytes already reserved" in result.stdout
    assert "before the first CUDA tensor" in result.stdout


def test_install_and_mempool_name_what_this_torch_lacks(torch):
    result = check(run_python("""
    import torch, sdalloc.torch as st
    for call in (st.install, st.mempool):
        try:
            call()
        except RuntimeError as e:
            print(call.__name__, "->", e)
        else:
            raise AssertionError(call.__name__ + " accepted")
    """))
    major_minor = tuple(int(x) for x in torch.__version__.split(".")[:2])
    if major_minor < (2, 0):
        assert "install -> sdalloc.torch: torch" in result.stdout
        assert "CUDAPluggableAllocator" in result.stdout
    else:
        assert "install -> sdalloc.torch:" in result.stdout
    if major_minor < (2, 5):
        assert "needs torch.cuda.MemPool, which PyTorch added in 2.5" in result.stdout
        assert f"this is torch {torch.__version__}" in result.stdout


def test_vmm_mode_serves_from_virtual_memory_and_says_what_it_lacks(libraries):
    check(run_python(PRELUDE + """
    st.configure(backend="host", mode="vmm", capacity="64MiB")
    a = c.sdalloc_torch_malloc(5 * MiB, 0, None)
    b = c.sdalloc_torch_malloc(1000, 0, c_void_p(0x77))
    assert a and b
    ctypes.memset(a, 1, 5 * MiB)
    s = sdalloc.stats(device=0)
    assert s["requested_bytes.all.current"] == 5 * MiB + 1000
    assert 5 * MiB <= s["reserved_bytes.all.current"] <= 64 * MiB
    assert c.sdalloc_torch_malloc(80 * MiB, 0, None) is None   # the physical cap
    assert b"out of memory" in c.sdalloc_torch_last_error().lower()
    c.sdalloc_torch_record_stream(c_void_p(0x10), c_void_p(0x99))   # foreign: a message
    foreign = c.sdalloc_torch_last_error()
    assert b"not a live allocation" in foreign, foreign
    c.sdalloc_torch_record_stream(a, c_void_p(0x99))   # honoured (its free waits for 0x99 too)
    assert c.sdalloc_torch_last_error() == foreign     # no new failure
    # Its segments are runs of mapped pages; the live blocks are the allocations.
    mine = [seg for seg in sdalloc.snapshot()["segments"] if seg["device"] == 0]
    assert sum(seg["total_size"] for seg in mine) <= s["reserved_bytes.all.current"]
    assert sum(seg["requested_size"] for seg in mine) == 5 * MiB + 1000
    st.set_memory_fraction(0.25, 0)   # 16 MiB: what is held stays, more is refused
    assert c.sdalloc_torch_malloc(12 * MiB, 0, None) is None
    assert b"physical cap of 16777216 B" in c.sdalloc_torch_last_error(), c.sdalloc_torch_last_error()
    st.set_memory_fraction(1.0, 0)
    c.sdalloc_torch_free(a, 5 * MiB, 0, None)
    c.sdalloc_torch_free(b, 1000, 0, c_void_p(0x77))
    assert sdalloc.stats(device=0)["allocation.all.current"] == 0
    before = c.sdalloc_torch_vmm_unmaps(0)
    st.empty_cache()
    assert c.sdalloc_torch_vmm_unmaps(0) > before, (before, c.sdalloc_torch_vmm_unmaps(0))
    assert c.sdalloc_torch_vmm_unmaps(7) == 0           # no pool there
    # A fraction set before device 1's pool exists caps it: half of 64 MiB.
    st.set_memory_fraction(0.5, 1)
    assert c.sdalloc_torch_malloc(40 * MiB, 1, None) is None
    p = c.sdalloc_torch_malloc(20 * MiB, 1, None)
    assert p
    c.sdalloc_torch_free(p, 20 * MiB, 1, None)
    print("ok")
    """))


def test_retired_keys_are_accepted_and_ignored_with_one_warning(libraries):
    result = check(run_python(PRELUDE + """
    st.configure(backend="host", segments="chunked", spare_pages=False, capacity="64MiB")
    assert "segments" not in st.config_text() and "spare_pages" not in st.config_text()
    p = c.sdalloc_torch_malloc(4 * MiB, 0, None)
    assert p
    ctypes.memset(p, 0x5a, 4 * MiB)
    assert st.pool(0).mode == "vmm"                       # the default pool maps pages
    c.sdalloc_torch_free(p, 4 * MiB, 0, None)
    print("ok")
    """))
    assert result.stderr.count("'segments' no longer has any effect") == 1, result.stderr
    assert result.stderr.count("'spare_pages' no longer has any effect") == 1, result.stderr


def test_install_hands_pytorch_the_shim_and_its_two_functions(torch):  # pylint: disable=unused-argument
    # PyTorch's side replaced by recorders (this torch may lack CUDAPluggableAllocator): what
    # install() passes and how it reacts to a refusal is checked; the swap itself needs a GPU.
    result = check(run_python("""
    import ctypes, torch, sdalloc.torch as st
    from sdalloc import _native
    calls = []
    class FakePluggable:
        def __init__(self, path, malloc_name, free_name):
            calls.append(("new", path, malloc_name, free_name))
            lib = ctypes.CDLL(path)
            getattr(lib, malloc_name), getattr(lib, free_name)   # both exported
    torch.cuda.is_available = lambda: True
    torch.cuda.is_initialized = lambda: False
    torch.cuda.memory.CUDAPluggableAllocator = FakePluggable
    refuse = [True]
    def change(allocator):
        if refuse[0]:
            raise RuntimeError("Can't swap an already initialized allocator")
        calls.append(("swap", type(allocator).__name__))
    torch.cuda.memory.change_current_allocator = change
    try:
        st.install(backend="host")
    except RuntimeError as e:
        print("refused ->", e)
    assert not st.installed()
    refuse[0] = False
    st.install(backend="host")
    assert st.installed()
    st.install(backend="host")             # the same settings again: nothing happens
    try:
        st.install(backend="host", capacity="1GiB")
    except RuntimeError as e:
        print("other settings ->", e)
    print(calls)
    assert calls[-1] == ("swap", "FakePluggable")
    assert calls[1][1] == _native.shim().path
    assert calls[1][2:] == ("sdalloc_torch_malloc_raising", "sdalloc_torch_free")
    assert st.config_text().startswith("backend:host,mode:auto")
    """))
    assert "refused -> sdalloc.torch.install() was called too late: PyTorch refused" in \
        result.stdout
    assert "other settings -> sdalloc.torch.install(): already installed with" in result.stdout


# PyTorch's side for the hook tests: a CUDAPluggableAllocator whose allocator() object has
# (or lacks) the set_*_fn methods of PyTorch's binding, which take a function's address.
FAKE_TORCH = """
    import ctypes, torch, sdalloc, sdalloc.torch as st
    from ctypes import c_void_p, c_int, c_double, CFUNCTYPE
    from sdalloc import _native
    MiB = 1 << 20
    set_hooks = {}
    class FakeNative:
        pass
    def setter(name):
        return lambda address: set_hooks.__setitem__(name, address)
    class FakePluggable:
        def __init__(self, path, malloc_name, free_name):
            self.native = FakeNative()
            if WITH_HOOKS:
                for name in ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn",
                             "set_record_stream_fn"):
                    setattr(self.native, name, setter(name))
        def allocator(self):
            return self.native
    swapped = []
    torch.cuda.is_available = lambda: True
    torch.cuda.is_initialized = lambda: False
    torch.cuda.current_device = lambda: 0
    torch.cuda.memory.CUDAPluggableAllocator = FakePluggable
    torch.cuda.memory.change_current_allocator = lambda a: swapped.append(dict(set_hooks))
    st.install(backend="host", capacity="64MiB")
    lib = _native.shim()
    c = lib.c
"""


def test_install_sets_every_hook_before_the_swap_and_wraps_the_stats(torch):  # pylint: disable=unused-argument
    check(run_python("\n    WITH_HOOKS = True" + FAKE_TORCH + """
    names = ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_record_stream_fn")
    assert swapped == [set_hooks] and sorted(set_hooks) == sorted(names), (swapped, set_hooks)
    assert st.hooks()["hooks"] == names, st.hooks()
    # Each address is the shim's function: call them as PyTorch would.
    init = CFUNCTYPE(None, c_int)(set_hooks["set_init_fn"])
    reset = CFUNCTYPE(None)(set_hooks["set_reset_fn"])
    fraction = CFUNCTYPE(None, c_double, c_int)(set_hooks["set_memory_fraction_fn"])
    record = CFUNCTYPE(None, c_void_p, c_void_p)(set_hooks["set_record_stream_fn"])
    init(1)
    p = c.sdalloc_torch_malloc(4 * MiB, 0, None)
    record(p, c_void_p(0x99))
    assert c.sdalloc_torch_last_error() == b"", c.sdalloc_torch_last_error()
    record(c_void_p(0x10), c_void_p(0x99))
    assert b"not a live allocation" in c.sdalloc_torch_last_error()
    # torch.cuda's statistics now answer the shim pool's figures instead of raising.
    assert torch.cuda.memory_allocated(0) == 4 * MiB, torch.cuda.memory_allocated(0)
    assert torch.cuda.memory_stats(0)["allocation.all.current"] == 1
    assert torch.cuda.memory_reserved() >= 4 * MiB          # device None: the current one
    assert torch.cuda.memory_stats(5) == {}                 # a device that never allocated
    c.sdalloc_torch_free(p, 4 * MiB, 0, None)
    assert torch.cuda.max_memory_allocated(0) == 4 * MiB
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(0) == 0, torch.cuda.max_memory_allocated(0)
    reset()                                                 # torch.cuda.empty_cache's hook
    assert torch.cuda.memory_reserved(0) == 0
    fraction(0.25, 0)                                       # set_per_process_memory_fraction
    assert c.sdalloc_torch_malloc(20 * MiB, 0, None) is None
    assert isinstance(torch.cuda.memory_snapshot(), list)
    assert "memory_stats" in st.hooks()["wrapped"] and "empty_cache" not in st.hooks()["wrapped"]
    print("ok")
    """))


def test_install_wraps_the_torch_calls_whose_hooks_this_torch_lacks(torch):  # pylint: disable=unused-argument
    check(run_python("\n    WITH_HOOKS = False" + FAKE_TORCH + """
    assert st.hooks()["hooks"] == ()
    wrapped = st.hooks()["wrapped"]
    for name in ("empty_cache", "set_per_process_memory_fraction", "Tensor.record_stream",
                 "memory_stats", "reset_peak_memory_stats"):
        assert name in wrapped, wrapped
    p = c.sdalloc_torch_malloc(4 * MiB, 0, None)
    class Storage:
        def __init__(self, ptr): self.ptr = ptr
        def data_ptr(self): return self.ptr
    class Tensor:
        def __init__(self, ptr): self.storage_ = Storage(ptr)
        def untyped_storage(self): return self.storage_
    class Stream:
        cuda_stream = 0x99
    torch.Tensor.record_stream(Tensor(p), Stream())        # the storage's base pointer
    assert c.sdalloc_torch_last_error() == b"", c.sdalloc_torch_last_error()
    torch.Tensor.record_stream(Tensor(0x10), Stream())
    assert b"not a live allocation" in c.sdalloc_torch_last_error()
    c.sdalloc_torch_free(p, 4 * MiB, 0, None)
    assert torch.cuda.memory_reserved(0) > 0
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(0) == 0
    torch.cuda.set_per_process_memory_fraction(0.25, 0)
    assert c.sdalloc_torch_malloc(20 * MiB, 0, None) is None
    torch.cuda.set_per_process_memory_fraction(1.0, torch.device("cuda", 0))
    q = c.sdalloc_torch_malloc(20 * MiB, 0, None)
    assert q
    c.sdalloc_torch_free(q, 20 * MiB, 0, None)
    print("ok")
    """))
