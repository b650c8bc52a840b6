"""workloads/dit.py and workloads/pixart.py: the --small models run their denoising loops with
the right shapes and the same output bytes twice, guidance doubles the model's batch, the
pieces do what the papers say (adaLN-Zero gates, attention, unpatchify, the caption's
cross-attention), the full configurations have the published sizes (counted on the meta
device, so no weights are allocated); bad options exit 2.

Run: /usr/bin/python3 -m pytest -q tests/python/test_workload_dit.py
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "workloads"
IN_CI = bool(os.environ.get("CI"))

if importlib.util.find_spec("torch") is None:
    if IN_CI:
        raise RuntimeError("torch is not importable (CI needs Debian's python3-torch)")
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402  pylint: disable=wrong-import-position

if str(WORKLOADS) not in sys.path:
    sys.path.insert(0, str(WORKLOADS))  # dit.py imports sd_unet, pixart.py imports dit
import dit  # noqa: E402  pylint: disable=wrong-import-position,import-error
import pixart  # noqa: E402  pylint: disable=wrong-import-position,import-error


def run_small(tmp_path, script, name, *extra):
    """Runs `script` with --small in a fresh interpreter; answers (process, its JSON)."""
    out = tmp_path / f"{name}.json"
    # One thread: the bytes then do not depend on how the BLAS splits work.
    proc = subprocess.run([sys.executable, str(WORKLOADS / script), "--small", "--steps", "2",
                           "--threads", "1", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- the programs
def test_small_dit_loop_is_guided_and_reports_each_step(tmp_path):
    proc, report = run_small(tmp_path, "dit.py", "a", "--warmup", "1")
    assert report["config"] == "small"
    assert report["output_shape"] == [1, 4, 8, 8]
    assert report["model_batch"] == 2 and report["guidance"] == 4.0  # guided by default
    assert report["tokens"] == 16  # (8 / patch 2) ^ 2
    assert len(report["step_seconds"]) == 2 and len(report["warmup_seconds"]) == 1
    assert report["finite"]
    assert "BLAS:" in proc.stdout and "step 2/2" in proc.stdout


def test_dit_runs_give_the_same_output_bytes(tmp_path):
    _, first = run_small(tmp_path, "dit.py", "a")
    _, second = run_small(tmp_path, "dit.py", "b")
    assert first["sha256"] == second["sha256"]
    _, other_seed = run_small(tmp_path, "dit.py", "c", "--seed", "1")
    assert other_seed["sha256"] != first["sha256"]


def test_cfg_scale_one_runs_the_model_on_the_images_only(tmp_path):
    _, report = run_small(tmp_path, "dit.py", "plain", "--batch", "3", "--latent", "4",
                          "--cfg-scale", "1")
    assert report["output_shape"] == [3, 4, 4, 4]
    assert report["model_batch"] == 3 and report["guidance"] is None


def test_small_pixart_loop_takes_the_caption_length(tmp_path):
    proc, report = run_small(tmp_path, "pixart.py", "p", "--text-tokens", "5", "--batch", "2")
    assert report["text_tokens"] == 5
    assert report["output_shape"] == [2, 4, 8, 8]
    assert report["model_batch"] == 4 and report["guidance"] == 4.5
    assert report["finite"]
    assert "5 caption tokens" in proc.stdout
    _, again = run_small(tmp_path, "pixart.py", "q", "--text-tokens", "5", "--batch", "2")
    assert again["sha256"] == report["sha256"]


@pytest.mark.parametrize("script,args", [
    ("dit.py", ["--latent", "7"]), ("dit.py", ["--steps", "0"]), ("dit.py", ["--warmup", "-1"]),
    ("dit.py", ["--config", "DiT-XXL/2"]), ("pixart.py", ["--text-tokens", "0"]),
    ("pixart.py", ["--latent", "5"])])
def test_bad_options_exit_2(script, args, capsys):
    module = dit if script == "dit.py" else pixart
    with pytest.raises(SystemExit) as exit_info:  # argparse's exit, before any model is built
        module.main(["--small", *args])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the pieces
def test_attention_is_softmax_of_scaled_scores_per_head():
    torch.manual_seed(0)
    heads, d = 3, 4
    q = torch.randn(2, 5, heads * d)
    k, v = torch.randn(2, 7, heads * d), torch.randn(2, 7, heads * d)  # 7 keys per query
    out = dit.attention(q, k, v, heads)
    assert out.shape == (2, 5, heads * d)
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        weights = torch.softmax(q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(d), -1)
        assert torch.allclose(out[..., cols], weights @ v[..., cols], atol=1e-5)


def test_unpatchify_puts_each_tokens_patch_at_its_grid_place():
    channels, patch, grid = 2, 2, 3
    x = torch.arange(grid * grid * patch * patch * channels, dtype=torch.float32)
    image = dit.unpatchify(x.reshape(1, grid * grid, -1), channels, patch, grid)
    assert image.shape == (1, channels, grid * patch, grid * patch)
    pieces = x.reshape(grid, grid, patch, patch, channels)  # token (row, column), pixel, channel
    for index in torch.cartesian_prod(*(torch.arange(n) for n in pieces.shape)):
        row, col, dy, dx, c = index.tolist()
        assert image[0, c, row * patch + dy, col * patch + dx] == pieces[row, col, dy, dx, c]


def test_a_block_with_zero_modulation_is_the_identity():
    # adaLN-Zero: the gates come from the conditioning; zero gates leave the tokens as they are.
    torch.manual_seed(0)
    block = dit.DiTBlock(dit.SMALL).eval()
    x, c = torch.randn(2, 6, dit.SMALL.hidden), torch.randn(2, dit.SMALL.hidden)
    with torch.inference_mode():
        assert not torch.allclose(block(x, c), x)
        torch.nn.init.zeros_(block.ada_ln.weight)
        torch.nn.init.zeros_(block.ada_ln.bias)
        assert torch.equal(block(x, c), x)


def test_dit_output_depends_on_the_class_and_has_eight_channels():
    torch.manual_seed(0)
    model = dit.DiT(dit.SMALL, 8).eval()
    x, t = torch.randn(2, 4, 8, 8), torch.tensor([10, 10])
    with torch.inference_mode():
        a = model(x, t, torch.tensor([1, 1]))
        b = model(x, t, torch.tensor([1, model.null_class]))
    assert a.shape == (2, 8, 8, 8)  # noise and learned variance
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])


def test_pixart_output_depends_on_the_caption():
    torch.manual_seed(0)
    cfg = pixart.SMALL
    model = pixart.PixArt(cfg, 8).eval()
    x, t = torch.randn(1, 4, 8, 8), torch.tensor([10])
    caption = torch.randn(1, 6, cfg.caption_dim)
    with torch.inference_mode():
        a = model(x, t, caption)
        b = model(x, t, caption + 1.0)
        null = model.null_caption(3, 10)
    assert a.shape == (1, 8, 8, 8) and not torch.allclose(a, b)
    assert null.shape == (3, 10, cfg.caption_dim)  # repeated past its 8 learned tokens
    assert torch.equal(null[0, 8], null[0, 0]) and torch.equal(null[2], null[0])


def test_position_embedding_differs_for_every_patch():
    embedding = dit.sincos_position_embedding(64, 4)
    assert embedding.shape == (16, 64)
    assert len({tuple(row.tolist()) for row in embedding}) == 16


# ---------------------------------------------------------------------------- full sizes
@pytest.mark.parametrize("name,count", [
    ("DiT-XL/2", 675_129_632), ("DiT-L/2", 458_102_816), ("DiT-B/2", 130_512_416),
    ("DiT-S/2", 32_963_360)])
def test_full_configs_have_the_published_sizes(name, count):
    # The paper's 675M, 458M, 130M and 33M (256 px, with the frozen position embedding).
    assert dit.parameter_count(dit.CONFIGS[name]) == count


def test_pixart_xl2_is_the_dit_xl2_trunk_with_a_t5_caption():
    model = pixart.PixArt(pixart.CONFIGS["PixArt-XL/2"], 64, device="meta")
    assert len(model.blocks) == 28
    assert model.blocks[0].attn.qkv.in_features == 1152
    assert model.y_embedder.fc1.in_features == 4096  # T5-XXL's width
    assert model.blocks[0].cross_attn.kv_linear.in_features == 1152  # after the embedder
    assert model.t_block.out_features == 6 * 1152  # adaLN-single, shared by the blocks
    assert model.y_embedding.shape == (120, 4096)
    assert model.x_embedder.pos_embed.shape == (1, 1024, 1152)  # 64 x 64 latent, patch 2


def test_attention_is_defined_whatever_the_allocator_recycles():
    # torch 1.x's CPU baddbmm with beta 0 multiplies its uninitialised result by 0: memory
    # that last held NaN, handed out again, made attention rows NaN now and then.
    torch.manual_seed(0)
    heads, d = 3, 4
    q = torch.randn(2, 5, heads * d)
    k, v = torch.randn(2, 7, heads * d), torch.randn(2, 7, heads * d)
    for _ in range(50):
        poison = torch.full((2 * heads, 5, 7), float("nan"))
        del poison  # its block is the next one of that size
        assert not dit.attention(q, k, v, heads).isnan().any()
