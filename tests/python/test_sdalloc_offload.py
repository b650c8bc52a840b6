"""sdalloc.torch.offload on the CPU (the simulated device computing on the host): outputs
equal the unoffloaded model's, the device region holds the budget, the first forward is
recorded and the next ones planned, parameters are views into the device region (and
their own storage is gone: one copy of the model in RAM), one hook per streamed unit; and
the errors: a budget below the largest unit, bad arguments, a module changed after
offload(), a forward on another stream, no CUDA device, page-locking refused by the
operating system (RLIMIT_MEMLOCK, in a child process)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sdalloc.torch
from sdalloc._native import SdallocError


def _model(torch, layers=8, width=64):
    torch.manual_seed(14)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks).eval()


def _bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_offloaded_outputs_equal_and_the_budget_holds(torch):
    model = _model(torch)
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = [model(x + i) for i in range(4)]
    budget = _bytes(model) // 2
    host_pointer = model[0].weight.data_ptr()
    off = sdalloc.torch.offload(model, budget=budget)
    seen = []
    probe = model[0].register_forward_pre_hook(lambda m, i: seen.append(m.weight.data_ptr()))
    with torch.no_grad():
        got = [model(x + i) for i in range(4)]
    probe.remove()
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    stats = off.stats()
    assert stats["region_bytes"] <= budget
    assert stats["recorded_steps"] == 1 and stats["planned_steps"] == 3
    assert stats["units"] == 8 and 0 < stats["streamed_units"] < 8
    assert stats["hooked_units"] == stats["streamed_units"]  # one call per streamed unit
    assert stats["device_allocations"] == 1 and stats["divergent_steps"] == 0
    assert all(p != host_pointer for p in seen)  # the layer read the device region
    assert "predicted step" in off.describe() and "floor" in off.describe()
    off.remove()
    assert model[0].weight.data_ptr() != 0
    with torch.no_grad():
        assert torch.equal(model(x), expected[0])
    assert not model[0]._forward_pre_hooks  # pylint: disable=protected-access


def test_budget_below_the_largest_unit_is_refused_naming_it(torch):
    model = _model(torch, layers=2)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    with pytest.raises(SdallocError) as error:
        sdalloc.torch.offload(model, budget=largest - 1)
    assert "the budget must hold the largest unit" in str(error.value)
    assert "(unit 0)" in str(error.value)
    assert error.value.status == "INVALID_ARGUMENT"
    with torch.no_grad():  # nothing was left installed
        model(torch.randn(1, 64))
    assert not model._forward_pre_hooks  # pylint: disable=protected-access


def test_tied_weights_are_one_weight(torch):
    first, second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
    second.weight = first.weight  # tied: one tensor, two modules
    model = torch.nn.Sequential(first, second).eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = model(x)
        off = sdalloc.torch.offload(model, budget=2 * (16 * 16 * 4 + 64) + 256)
        for _ in range(3):
            assert torch.equal(model(x), expected)
    stats = off.stats()
    # The tied weight is a unit of its own (kept resident), each bias one.
    assert stats["planned_steps"] == 2 and stats["units"] == 3
    assert first.weight.data_ptr() == second.weight.data_ptr()
    off.remove()


def test_bad_arguments_are_refused_before_anything_is_made(torch):
    model = _model(torch, layers=2)
    for kwargs, error, message in (
            ({"budget": 0}, ValueError, "budget must be a positive number of bytes"),
            ({"budget": -1}, ValueError, "budget must be a positive number of bytes"),
            ({"budget": "1MiB"}, TypeError, "budget must be a number of bytes, not str"),
            ({"budget": True}, TypeError, "budget must be a number of bytes, not bool"),
            ({"budget": float("inf")}, ValueError, "budget must be finite"),
            ({"budget": 0.5}, ValueError, "budget must be a positive number of bytes"),
            ({"budget": 1 << 20, "unit_bytes": 0}, ValueError, "unit_bytes must be a positive"),
            ({"budget": 1 << 20, "device": "meta"}, ValueError, "neither 'cpu' nor 'cuda[:N]'"),
            ({"budget": 1 << 20, "device": 1.0}, TypeError, "device must be a str, int"),
            ({"budget": 1 << 20, "device": "cuda", "copy_bytes_per_second": 1e9}, ValueError,
             "copy_bytes_per_second is the CPU path's")):
        with pytest.raises(error) as raised:
            sdalloc.torch.offload(model, **kwargs)
        assert message in str(raised.value), (kwargs, str(raised.value))
        assert not model[0]._forward_pre_hooks  # pylint: disable=protected-access
    with torch.no_grad():
        model(torch.randn(1, 64))


def test_a_cuda_target_without_a_usable_device_is_refused_saying_why(torch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present here (gpu-check's offload stage runs that path)")
    model = _model(torch, layers=2)
    host_pointers = [p.data_ptr() for p in model.parameters()]
    expected = ("no CUDA device to offload to" if sdalloc.torch.has_cuda()
                else "built without CUDA")
    for device in ("cuda", "cuda:0", 0, torch.device("cuda", 0)):
        with pytest.raises(SdallocError) as error:
            sdalloc.torch.offload(model, budget=1 << 20, device=device)
        assert error.value.status == "INVALID_ARGUMENT"
        assert expected in str(error.value), str(error.value)
        assert "sdalloc_torch_stream_device_create_cuda" in str(error.value)
    # Nothing was installed: the model runs on its host weights as before.
    assert [p.data_ptr() for p in model.parameters()] == host_pointers
    assert not model[0]._forward_pre_hooks  # pylint: disable=protected-access
    with torch.no_grad():
        model(torch.randn(1, 64))


def test_device_cpu_is_the_simulated_device_computing_on_the_host(torch):
    model = _model(torch, layers=4)
    x = torch.randn(2, 64)
    with torch.no_grad():
        expected = model(x)
        # A float budget is taken as int(budget).
        off = sdalloc.torch.offload(model, budget=2.0 * (64 * 64 * 4 + 256), device="cpu")
        for _ in range(3):
            assert torch.equal(model(x), expected)
    stats = off.stats()
    assert stats["planned_steps"] == 2 and stats["budget"] == 2 * (64 * 64 * 4 + 256)
    off.remove()


def test_a_module_changed_after_offload_is_refused_at_its_next_forward(torch):
    x = torch.randn(2, 64)
    for change in ("replace", "data", "to"):
        model = _model(torch, layers=4)
        off = sdalloc.torch.offload(model, budget=_bytes(model) // 2)
        with torch.no_grad():
            model(x)
            if change == "replace":
                model[2].weight = torch.nn.Parameter(torch.zeros(64, 64))
            elif change == "data":
                model[2].bias.data = torch.zeros(64)
            else:
                model.double()
            with pytest.raises(RuntimeError) as error:
                model(x.double() if change == "to" else x)
        assert "was replaced or moved after offload()" in str(error.value), change
        assert "Linear." in str(error.value)
        off.remove()


def test_a_forward_on_another_stream_is_refused_naming_both(torch):
    model = _model(torch, layers=2)
    sim = sdalloc.torch.SimulatedDevice(host_compute=True)
    off = sdalloc.torch.offload(model, budget=_bytes(model), device=sim)
    x = torch.randn(2, 64)
    with torch.no_grad():
        expected = model(x)
        with sim.on_stream(0x99):
            with pytest.raises(SdallocError) as error:
                model(x)
        assert error.value.status == "INVALID_ARGUMENT"
        assert "stream 0x99" in str(error.value) and "before stream 0x1" in str(error.value)
        assert torch.equal(model(x), expected)  # on its own stream it goes on
    off.remove()
    sim.close()


def test_the_model_is_in_ram_once(torch):
    """RSS growth from before the model to after three offloaded steps, less the simulated
    device's memory: the arena, about 1x the weights (their own storage was freed)."""
    if "sdalloc_preload" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("a caching malloc (the sdalloc drop-in preloaded here) keeps the freed "
                    "parameters' storage for the process's later allocations")
    def rss():
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    before = rss()
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(12)]).eval()
    weights = _bytes(model)  # 192 MiB
    sim = sdalloc.torch.SimulatedDevice(host_compute=True)
    off = sdalloc.torch.offload(model, budget=weights // 2, device=sim)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, 2048))
    host = rss() - before - sim.stats()["device_bytes"]
    stats = off.stats()
    assert abs(stats["arena_bytes_in_ram"] - weights) <= 0.01 * weights
    assert host <= 1.05 * weights, f"{host} B of RAM for {weights} B of weights"
    off.remove()
    sim.close()


_REFUSED = """
import ctypes, resource, sys
sys.path.insert(0, {python!r})
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
libc = ctypes.CDLL(None, use_errno=True)
header, data = Header(0x20080522, 0), (Data * 2)()
assert libc.capget(ctypes.byref(header), data) == 0
data[0].effective &= ~(1 << 14)   # CAP_IPC_LOCK: root's way around RLIMIT_MEMLOCK
data[0].permitted &= ~(1 << 14)
assert libc.capset(ctypes.byref(header), data) == 0
resource.setrlimit(resource.RLIMIT_MEMLOCK, ({limit}, {limit}))
import torch, sdalloc.torch
torch.manual_seed(3)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(16)]).eval()
x = torch.randn(2, 512)
with torch.no_grad():
    expected = model(x)
    off = sdalloc.torch.offload(model, budget=4 << 20)
    for _ in range(4):
        assert torch.equal(model(x), expected)
stats = off.stats()
print("refused", stats["registration_refused"], "staged", stats["staged_copies"],
      "planned", stats["planned_steps"])
print(off.describe())
"""


def test_page_locking_refused_by_the_os_falls_back_to_staging(torch):  # pylint: disable=unused-argument
    """In a child without CAP_IPC_LOCK and RLIMIT_MEMLOCK 6 MiB: 16 MiB of weights, the
    arena's registration refused, its units staged through locked chunks; outputs equal."""
    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(_REFUSED).format(python=str(root / "python"), limit=6 << 20)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused True" in result.stdout and "planned 3" in result.stdout, result.stdout
    assert "staged 0" not in result.stdout, result.stdout
    assert "RLIMIT_MEMLOCK" in result.stdout, result.stdout
