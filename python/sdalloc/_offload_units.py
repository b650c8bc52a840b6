"""How sdalloc.torch.offload cuts a module into units and packs them (no native code).

A *unit* is a module whose weights move together, in one copy: a submodule owning
parameters directly (with its whole subtree), or a submodule whose subtree holds at most
`unit_bytes`; larger ones without parameters of their own are descended into. So a unit is
a block or a sub-block of tens of MB, never split inside a module that owns parameters.

Each unit's parameters are laid out back to back in its *image* (each at a multiple of
TENSOR_ALIGNMENT), and the images back to back in one host arena; a unit's image moves to
the device in one copy and its parameters become views into wherever the image is.

A parameter shared by two units (tied weights) cannot follow both: it goes to a unit of its
own, kept resident. Units smaller than `resident_below` are kept resident too (their bytes
are few; streaming them would cost a call each for nothing).

Also here: `unet_unit_table`, the units of workloads/sd_unet.py's UNet with the bytes and
FLOPs of each, built on the meta device (the simulated device's benchmarks and tests).
"""

TENSOR_ALIGNMENT = 256  # bytes; a parameter's offset in its unit's image
DEFAULT_UNIT_BYTES = 32 << 20
DEFAULT_RESIDENT_BELOW = 1 << 20


def _align(n, alignment=TENSOR_ALIGNMENT):
    return (n + alignment - 1) // alignment * alignment


def _tensor_bytes(p):
    return p.numel() * p.element_size()


class Unit:
    """One unit: its module (None for the tied weights' unit), its qualified name, and its
    parameters as (owner module, attribute name, parameter, offset in the image)."""

    def __init__(self, name, module):
        self.name = name
        self.module = module
        self.entries = []
        self.bytes = 0
        self.keep_resident = module is None

    def add(self, owner, attr, param):
        offset = _align(self.bytes)
        self.entries.append((owner, attr, param, offset))
        self.bytes = offset + _tensor_bytes(param)

    def __repr__(self):
        return f"Unit({self.name!r}, {self.bytes} B, {len(self.entries)} tensors)"


def _subtree_params(module):
    for owner in module.modules():
        for attr, p in owner._parameters.items():  # pylint: disable=protected-access
            if p is not None:
                yield owner, attr, p


def _subtree_bytes(module):
    seen = set()
    total = 0
    for _, _, p in _subtree_params(module):
        if id(p) not in seen:
            seen.add(id(p))
            total += _tensor_bytes(p)
    return total


def _is_container(torch, module):
    """ModuleList and ModuleDict hold modules but are never called: no hook of theirs runs."""
    return isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))


def _cut(torch, module, name, unit_bytes, out):
    own = any(p is not None for p in module._parameters.values())  # pylint: disable=protected-access
    children = [(n, c) for n, c in module.named_children() if _subtree_bytes(c) > 0]
    small = _subtree_bytes(module) <= unit_bytes and not _is_container(torch, module)
    if own or not children or small:
        if _subtree_bytes(module) > 0:
            out.append((name, module))
        return
    for child_name, child in children:
        _cut(torch, child, f"{name}.{child_name}" if name else child_name, unit_bytes, out)


def partition(module, unit_bytes=DEFAULT_UNIT_BYTES, resident_below=DEFAULT_RESIDENT_BELOW):
    """The units of `module`, in the order of its module tree (the order of use is recorded
    by the first step); tied weights in a last, resident unit. Containers (ModuleList,
    ModuleDict) are descended into whatever their size: they are never called."""
    import torch  # pylint: disable=import-outside-toplevel
    cut = []
    _cut(torch, module, "", unit_bytes, cut)
    owners = {}  # id(param) -> number of units holding it
    for _, unit_module in cut:
        for pid in {id(p) for _, _, p in _subtree_params(unit_module)}:
            owners[pid] = owners.get(pid, 0) + 1
    units, tied, placed = [], Unit("(tied weights)", None), set()
    for unit_name, unit_module in cut:
        unit = Unit(unit_name or "(root)", unit_module)
        for owner, attr, p in _subtree_params(unit_module):
            if owners[id(p)] > 1:
                if id(p) not in placed:
                    tied.add(owner, attr, p)
                    placed.add(id(p))
                else:
                    tied.entries.append((owner, attr, p, next(
                        e[3] for e in tied.entries if e[2] is p)))
                continue
            known = next((e for e in unit.entries if e[2] is p), None)
            if known is not None:  # the same parameter twice in one subtree
                unit.entries.append((owner, attr, p, known[3]))
            else:
                unit.add(owner, attr, p)
        if unit.bytes:
            unit.keep_resident = unit.bytes < resident_below
            units.append(unit)
    if tied.entries:
        units.append(tied)
    return units


# ---------------------------------------------------------------------------- the SD UNet

def _flops(torch, module, inputs, output):
    """FLOPs of one call of a leaf module (or an attention's two products), 2 per MAC."""
    nn = torch.nn
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        return 2 * output.numel() * (module.in_channels // module.groups) * kh * kw
    if isinstance(module, nn.Linear):
        return 2 * output.numel() * module.in_features
    return 5 * output.numel()  # norms: a few operations per element


def unet_unit_table(sd_unet, cfg=None, latent=64, batch=2, dtype_bytes=2,
                    unit_bytes=DEFAULT_UNIT_BYTES, resident_below=DEFAULT_RESIDENT_BELOW):
    """[{name, bytes, flops, kernels, keep_resident}] for the units of sd_unet's UNet in
    the order of a forward, from a forward on the meta device (no weights are allocated).
    bytes: the unit's image in `dtype_bytes` per parameter; flops: convolutions, linear
    layers, the attention products, norms; kernels: leaf module calls (a launch-bound step
    pays per kernel)."""
    import torch  # pylint: disable=import-outside-toplevel
    cfg = cfg or sd_unet.FULL
    default = torch.get_default_dtype()
    torch.set_default_dtype({2: torch.float16, 4: torch.float32}[dtype_bytes])
    try:  # parameters of the dtype's size: units are cut by bytes
        model = sd_unet.UNet(cfg, device="meta").eval()
    finally:
        torch.set_default_dtype(default)
    units = partition(model, unit_bytes, resident_below)
    unit_of = {}
    for index, unit in enumerate(units):
        if unit.module is not None:
            for m in unit.module.modules():
                unit_of[m] = index
    flops = [0] * len(units)
    kernels = [0] * len(units)
    order = []

    def leaf_hook(module, inputs, output):
        index = unit_of.get(module)
        if index is not None:
            flops[index] += _flops(torch, module, inputs, output)
            kernels[index] += 1

    def attention_hook(module, inputs, output):
        b, n, dim = inputs[0].shape
        flops[unit_of[module]] += 2 * 2 * b * n * inputs[1].shape[1] * dim

    def enter_hook(module, inputs):
        order.append(unit_of[module])

    hooks = []
    for m in model.modules():
        if isinstance(m, sd_unet.Attention):
            hooks.append(m.register_forward_hook(attention_hook))
        elif not list(m.children()):
            hooks.append(m.register_forward_hook(leaf_hook))
    for unit in units:
        if unit.module is not None:
            hooks.append(unit.module.register_forward_pre_hook(enter_hook))
    dtype = next(model.parameters()).dtype
    x = torch.empty(batch, cfg.latent_channels, latent, latent, device="meta", dtype=dtype)
    context = torch.empty(batch, cfg.context_tokens, cfg.context_dim, device="meta",
                          dtype=dtype)
    with torch.no_grad():
        model(x, torch.full((batch,), 500, device="meta"), context)
    for h in hooks:
        h.remove()
    seen, rows = set(), []
    for index in order + list(range(len(units))):  # order of use, then any never used
        if index in seen:
            continue
        seen.add(index)
        unit = units[index]
        image = unit.bytes
        rows.append({"name": unit.name, "bytes": image, "flops": flops[index],
                     "kernels": kernels[index], "keep_resident": image < resident_below,
                     "uses": order.count(index)})
    return rows
