"""scripts/check-layers.py refuses what reaches up a layer and accepts the tree as it is."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "check-layers.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True)


def write(root, path, text):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)


def small_tree(tmp_path):
    write(tmp_path, "include/sdalloc/core/stream.hpp", "#pragma once\n")
    write(tmp_path, "include/sdalloc/policies/caching_pool.hpp",
          '#pragma once\n#include "sdalloc/core/stream.hpp"\n')
    write(tmp_path, "src/pool/shard.hpp", '#pragma once\n#include "sdalloc/core/stream.hpp"\n')
    write(tmp_path, "src/policies/caching_pool.cpp",
          '#include "sdalloc/policies/caching_pool.hpp"\n#include "pool/shard.hpp"\n')
    return tmp_path


def test_the_repository_keeps_its_layers():
    result = run(ROOT)
    assert result.returncode == 0, result.stdout
    assert "none reaches up a layer" in result.stdout


def test_a_tree_that_includes_downwards_passes(tmp_path):
    result = run(small_tree(tmp_path))
    assert result.returncode == 0, result.stdout


def test_a_lower_layer_including_a_higher_one_fails(tmp_path):
    root = small_tree(tmp_path)
    write(root, "src/pool/shard.cpp", '#include "sdalloc/policies/caching_pool.hpp"\n')
    result = run(root)
    assert result.returncode == 1
    assert "src/pool/shard.cpp:1" in result.stdout
    assert "layer 'pool' (rank 3) may not include layer 'policies' (rank 4)" in result.stdout


def test_layers_of_equal_rank_may_not_include_each_other(tmp_path):
    root = small_tree(tmp_path)
    write(root, "src/planner/plan.cpp", '#include "pool/shard.hpp"\n')
    result = run(root)
    assert result.returncode == 1
    assert "layer 'planner' (rank 3) may not include layer 'pool' (rank 3)" in result.stdout


def test_a_public_header_may_not_include_a_private_one(tmp_path):
    root = small_tree(tmp_path)
    write(root, "include/sdalloc/core/bad.hpp", '#pragma once\n#include "pool/shard.hpp"\n')
    result = run(root)
    assert result.returncode == 1
    assert "a public header includes a private one" in result.stdout


def test_the_tree_may_not_use_a_compatibility_forwarder(tmp_path):
    root = small_tree(tmp_path)
    write(root, "include/compat/sdalloc/stream.hpp",
          "#pragma once\n#include <sdalloc/core/stream.hpp>\n")
    write(root, "tools/sdalloc/main.cpp", "#include <sdalloc/stream.hpp>\n")
    result = run(root)
    assert result.returncode == 1
    assert "a compatibility forwarder; include sdalloc/core/stream.hpp" in result.stdout
