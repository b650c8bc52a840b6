"""README.md's code blocks, each run as its language (or the directive before it) says, so the
README cannot drift from the code.

Every fenced block runs, against the release build that SDALLOC_LIBRARY_DIR points at
(scripts/test-all.sh's stage `python`):
  sh      bash -e -o pipefail in a fresh folder; on PATH `sdalloc` (`python3 -m sdalloc`, as the
          wheel's console script) and /usr/bin's python3; PYTHONPATH is the tree's python/ and
          SDALLOC_LIBRARY_DIR the build's libraries, as after `pip install`.
  python  /usr/bin/python3 in a fresh folder, with the same variables.
  c, cpp  compiled against include/ (and the build's generated headers) with warnings as
          errors, linked to the build's libsdalloc.so, then run.
A block that cannot run as written says how it runs in an HTML comment on the line before it,
`<!-- readme-test: KIND [key=value ...] -->`, KIND one of:
  source-tree   (sh) run in the source tree with HOME a fresh folder, no SDALLOC_* variable and
                no PYTHONPATH, pip offline, SDALLOC_CMAKE_BUILD_DIR the tested build (so
                `pip install .` rebuilds nothing); the tested build must be build/release.
  fake-cuda     (python) SDALLOC_CONF=backend:host and torch's CUDA side replaced by recorders,
                as tests/python/test_sdalloc_torch_shim.py does; afterwards an allocation through
                the allocator PyTorch was handed must show in torch.cuda.memory_allocated().
  onnxruntime   (cpp) compiled against ONNX Runtime's headers, linked to the build's adapter
                (libsdalloc_onnxruntime.a) and ORT, run with the model named by model=NAME
                (tests/onnxruntime/export_models.py) as its argument.
  repo-commands (sh) each command is an executable script of the tree that `bash -n` accepts,
                and the test command is the one .ci/run runs (they take minutes: not run).
  main-job-output (text) the block is what scripts/main_job_summary.py prints for the figures
                in it: the table is read back, the script run on them, the text compared.
Any directive may add expect=REGEX: the block's standard output must match it (a directive
whose KIND is the block's language, `<!-- readme-test: sh expect=... -->`, adds only that).
A block with a language no runner knows and no directive, an unknown directive, or a
directive that is not followed by a block fails the test.
"""

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PYTHON = "/usr/bin/python3"  # Debian's: it has torch and pytest
IN_CI = bool(os.environ.get("CI"))
DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")


class ReadmeError(Exception):
    """A block that cannot run, or README text the harness cannot read."""


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str = ""  # the directive's KIND, "" without one
    options: dict = field(default_factory=dict)

    @property
    def name(self):
        kind = f" {self.kind}" if self.kind and self.kind != self.lang else ""
        return f"README.md:{self.line} {self.lang or 'plain'}{kind}"


def parse(text):
    """The fenced blocks of a Markdown text with their directives; raises ReadmeError for an
    unclosed fence, a malformed directive or one that no block follows."""
    blocks, pending = [], None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line)
        fence = FENCE.match(line)
        if directive:
            if pending is not None:
                raise ReadmeError(f"README.md:{pending[0]}: readme-test directive followed by "
                                  "another directive, not by a code block")
            words = shlex.split(directive.group(1))
            if not words:
                raise ReadmeError(f"README.md:{i + 1}: readme-test directive without a kind")
            options = {}
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if not sep:
                    raise ReadmeError(f"README.md:{i + 1}: directive option {word!r} is not "
                                      "key=value")
                options[key] = value
            pending = (i + 1, words[0], options)
        elif fence:
            start = i
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            if i == len(lines):
                raise ReadmeError(f"README.md:{start + 1}: code block never closed")
            kind, options = ("", {}) if pending is None else pending[1:]
            blocks.append(Block(start + 1, fence.group(1), "\n".join(lines[start + 1:i]) + "\n",
                                kind, options))
            pending = None
        elif line.strip() and pending is not None:
            raise ReadmeError(f"README.md:{pending[0]}: readme-test directive not followed by a "
                              "code block")
        i += 1
    if pending is not None:
        raise ReadmeError(f"README.md:{pending[0]}: readme-test directive at the end, no block")
    return blocks


# --- what the blocks run against ----------------------------------------------------------
@dataclass
class Build:
    root: Path  # a CMake build tree of this source tree

    @property
    def src(self):
        return self.root / "src"

    @property
    def program(self):
        return self.root / "tools" / "sdalloc"

    def cache(self, key):
        for line in (self.root / "CMakeCache.txt").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split("=", 1)[1]
        return ""


def build_under_test():
    configured = os.environ.get("SDALLOC_LIBRARY_DIR")
    return Build(Path(configured).resolve().parent if configured else ROOT / "build" / "release")


@pytest.fixture(scope="module", name="build")
def release_build():
    """The release build the blocks run against. A sanitizer build (the ubsan stage runs the
    Python tests over one without tools) skips: the README is about the release build."""
    b = build_under_test()
    if not (b.root / "CMakeCache.txt").is_file():
        message = f"no build at {b.root} (build the release preset, SDALLOC_LIBRARY_DIR=<it>/src)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    if b.cache("SDALLOC_SANITIZE") or b.cache("CMAKE_BUILD_TYPE") != "Release":
        pytest.skip(f"{b.root} is not a release build: the README's blocks run on the release one")
    missing = [p for p in (b.src / "libsdalloc.so", b.program) if not p.exists()]
    if missing:
        pytest.fail(f"the release build lacks {', '.join(map(str, missing))}")
    return b


def clean_environment():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SDALLOC_") and k not in ("PYTHONPATH", "LD_PRELOAD", "CI")}
    env["PATH"] = "/usr/bin:/bin"
    return env


def user_environment(b, work):
    """What a user has after `pip install`: `sdalloc` on PATH, the package importable."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "sdalloc"
    launcher.write_text(f'#!/bin/sh\nexec {PYTHON} -m sdalloc "$@"\n')
    launcher.chmod(0o755)
    env = clean_environment()
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(work), PYTHONPATH=str(ROOT / "python"),
               SDALLOC_LIBRARY_DIR=str(b.src))
    return env


def run(block, command, cwd, env, timeout=180):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{block.name} failed ({' '.join(map(str, command))}: exit "
                             f"{result.returncode})\n--- block ---\n{block.code}--- stdout ---\n"
                             f"{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}")
    return result


# --- the runners ----------------------------------------------------------------------------
def run_sh(block, b, work):
    script = work / "block.sh"
    script.write_text(block.code)
    return run(block, ["bash", "-e", "-o", "pipefail", str(script)], work,
               user_environment(b, work))


def run_python(block, b, work):
    script = work / "block.py"
    script.write_text(block.code)
    return run(block, [PYTHON, str(script)], work, user_environment(b, work))


def compile_and_run(block, b, work, suffix, compiler, flags, link, args=()):
    source = work / f"block{suffix}"
    source.write_text(block.code)
    program = work / "block"
    env = clean_environment()
    run(block, [compiler, *flags, "-Wall", "-Wextra", "-pedantic", "-Werror",
                f"-I{ROOT / 'include'}", f"-I{b.root / 'include'}", str(source), "-o",
                str(program), *link], work, env)
    return run(block, [str(program), *args], work, env)


def shared_library(b):
    return [f"-L{b.src}", "-lsdalloc", f"-Wl,-rpath,{b.src}"]


def run_c(block, b, work):
    return compile_and_run(block, b, work, ".c", "cc", ["-std=c11"], shared_library(b))


def run_cpp(block, b, work):
    return compile_and_run(block, b, work, ".cpp", "c++", ["-std=c++20"], shared_library(b))


def run_source_tree(block, b, work):
    if b.root != ROOT / "build" / "release":
        raise AssertionError(f"{block.name} builds build/release, but the tested build is "
                             f"{b.root}: run this test against build/release")
    script = work / "block.sh"
    script.write_text(block.code)
    env = clean_environment()
    env.update(HOME=str(work), SDALLOC_CMAKE_BUILD_DIR=str(b.root), PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return run(block, ["bash", "-e", "-o", "pipefail", str(script)], ROOT, env, timeout=600)


# PyTorch's CUDA side, replaced by recorders: this torch has no GPU (and may lack
# CUDAPluggableAllocator). What install() hands PyTorch is kept to allocate through afterwards.
FAKE_CUDA_PRELUDE = """
import ctypes, torch
_handed = []
class _FakePluggable:
    def __init__(self, path, malloc_name, free_name):
        self.library = ctypes.CDLL(path)
        self.malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_void_p)((malloc_name, self.library))
        self.free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_void_p)((free_name, self.library))
    def allocator(self):
        return object()  # no set_*_fn hooks: install() replaces the torch calls instead
torch.cuda.is_available = lambda: True
torch.cuda.is_initialized = lambda: False
torch.cuda.current_device = lambda: 0
torch.cuda.device_count = lambda: 1
torch.cuda.memory.CUDAPluggableAllocator = _FakePluggable
torch.cuda.memory.change_current_allocator = _handed.append
"""
FAKE_CUDA_CHECK = """
assert len(_handed) == 1, f"install() handed PyTorch {len(_handed)} allocators"
_pointer = _handed[0].malloc(3 << 20, 0, None)          # as PyTorch's first CUDA tensor would
assert _pointer and torch.cuda.memory_allocated(0) == 3 << 20, torch.cuda.memory_stats(0)
_handed[0].free(_pointer, 3 << 20, 0, None)
assert torch.cuda.memory_allocated(0) == 0
print("readme-test: PyTorch's allocations go to sdalloc")
"""


def run_fake_cuda(block, b, work):
    script = work / "block.py"
    script.write_text(FAKE_CUDA_PRELUDE + "exec(compile(" + repr(block.code) +
                      ", 'README.md block', 'exec'))\n" + FAKE_CUDA_CHECK)
    env = user_environment(b, work)
    env["SDALLOC_CONF"] = "backend:host"
    result = run(block, [PYTHON, str(script)], work, env)
    assert "readme-test: PyTorch's allocations go to sdalloc" in result.stdout
    return result


def run_onnxruntime(block, b, work):
    ort_root = b.cache("ONNXRUNTIME_ROOT")
    adapter = b.src / "onnxruntime" / "libsdalloc_onnxruntime.a"
    if not ort_root or not adapter.is_file():
        raise AssertionError(f"{block.name}: the build has no ONNX Runtime adapter ({adapter}; "
                             "scripts/install-deps.sh fetches ORT, then reconfigure)")
    model_name = block.options.get("model")
    if not model_name:
        raise AssertionError(f"{block.name}: the onnxruntime directive needs model=NAME")
    model = b.root / "tests" / "onnxruntime" / "models" / f"{model_name}.onnx"
    if not model.is_file():  # the ctest fixture ort_models exports it; else export it here
        run(block, [PYTHON, str(ROOT / "tests/onnxruntime/export_models.py"), "--out",
                    str(work / "models"), model_name], work, clean_environment())
        model = work / "models" / f"{model_name}.onnx"
    ort_lib = Path(ort_root) / "lib"
    link = [str(adapter), str(b.src / "libsdalloc.a"), f"-L{ort_lib}", "-l:libonnxruntime.so.1",
            f"-Wl,-rpath,{ort_lib}", "-lz", "-lpthread"]
    # ORT's headers are not -pedantic clean: they come in as system headers.
    return compile_and_run(block, b, work, ".cpp", "c++",
                           ["-std=c++20", "-isystem", str(Path(ort_root) / "include")], link,
                           [str(model)])


def run_repo_commands(block, b, work):  # pylint: disable=unused-argument
    """Answers nothing: no block runs here."""
    commands = [line.split("#")[0].split() for line in block.code.splitlines()]
    commands = [words for words in commands if words]
    assert commands, f"{block.name}: no command"
    for words in commands:
        script = ROOT / words[0]
        assert script.is_file() and os.access(script, os.X_OK), \
            f"{block.name}: {words[0]} is not an executable file of the tree"
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                                check=False)
        assert syntax.returncode == 0, f"{block.name}: bash -n {words[0]}: {syntax.stderr}"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_command = [line.split()[1:] for line in ci if line.startswith("exec ")]
    assert len(ci_command) == 1, ".ci/run should end with one `exec COMMAND`"
    assert ci_command[0] in commands, \
        f".ci/run runs {' '.join(ci_command[0])}, which is not one of {block.name}'s commands"


def _bytes(text):
    number, unit = text.split()
    return round(float(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit])


def run_main_job_output(block, b, work):  # pylint: disable=unused-argument
    """Reads the table back into the --json files scripts/run-main-job.sh hands the summary,
    runs the summary on them and compares: the pasted text must be that script's output."""
    lines = block.code.splitlines()
    header = {}
    for line in lines[:3]:
        key, _, value = line.partition(":")
        header[key] = value.strip()
    trace = header["trace"]  # the path in the tree that ran it
    assert (ROOT / "data" / "traces" / Path(trace).name).is_file(), \
        f"{block.name}: no trace {Path(trace).name} in data/traces"
    events = re.match(r"(\d+) per pass \((\d+) allocations\)(, every 4 KiB page written)?",
                      header["events"])
    peak_live = _bytes(header["peak live"].split(",")[0])
    table = lines[lines.index("") + 1:]
    assert table[0].split() == ["allocator", "passes", "peak", "held", "x", "live", "s/pass",
                                "1st", "pass", "s", "notes"], f"{block.name}: {table[0]}"
    notes_at = table[0].index("notes")
    runs = {}
    for row in table[1:]:
        if not row.strip():
            break
        # Right-aligned cells may start before their header: split on the gaps; the notes
        # column is left-aligned under its header.
        words, notes = row[:notes_at].split(), row[notes_at:].strip()
        if words[2] == "-":  # an allocator that did not run: its problem in the notes
            runs.setdefault(int(words[1]), []).append(
                {"allocator": words[0], "ran": False, "problem": notes})
            continue
        name, passes, held, ratio, median, first = (words[0], int(words[1]),
                                                    " ".join(words[2:4]), *words[4:7])
        runs.setdefault(passes, []).append({
            "allocator": name, "ran": True, "ratio": float(ratio),
            "pass_seconds": [float(first)] + [float(median)] * (passes - 1),
            "peak_reserved": _bytes(held), "counters": notes, "problem": None})
    paths = []
    for passes, results in runs.items():
        path = work / f"run{passes}.json"
        path.write_text(json.dumps({
            "trace": trace, "events": int(events.group(1)), "allocations": int(events.group(2)),
            "passes": passes, "touch": bool(events.group(3)), "peak_live": peak_live,
            "results": results}))
        paths.append(str(path))
    result = run(block, [PYTHON, str(ROOT / "scripts" / "main_job_summary.py"), *paths], work,
                 clean_environment())
    assert result.stdout == block.code, \
        f"{block.name} is not what scripts/main_job_summary.py prints for its figures:\n" \
        f"--- printed ---\n{result.stdout}--- in the README ---\n{block.code}"
    return result


RUNNERS = {
    ("sh", ""): run_sh,
    ("python", ""): run_python,
    ("c", ""): run_c,
    ("cpp", ""): run_cpp,
    ("sh", "source-tree"): run_source_tree,
    ("python", "fake-cuda"): run_fake_cuda,
    ("cpp", "onnxruntime"): run_onnxruntime,
    ("sh", "repo-commands"): run_repo_commands,
    ("text", "main-job-output"): run_main_job_output,
}


def runner(block):
    kind = "" if block.kind == block.lang else block.kind  # `<!-- readme-test: sh expect=... -->`
    try:
        return RUNNERS[(block.lang, kind)]
    except KeyError:
        raise ReadmeError(f"{block.name}: no way to run a {block.lang or 'plain'} block"
                          + (f" with directive {block.kind!r}" if block.kind else
                             " (add a <!-- readme-test: KIND --> line before it)")) from None


# --- the tests --------------------------------------------------------------------------------
def readme_blocks():
    return parse(README.read_text())


def test_every_readme_block_has_a_way_to_run():
    blocks = readme_blocks()
    assert len(blocks) >= 8, f"only {len(blocks)} code blocks in README.md"
    for block in blocks:
        runner(block)


@pytest.mark.parametrize("block", readme_blocks(), ids=lambda block: block.name)
def test_readme_block(block, build, tmp_path):
    result = runner(block)(block, build, tmp_path)
    if "expect" in block.options:
        assert result is not None, f"{block.name}: a {block.kind} block has no output to match"
        assert re.search(block.options["expect"], result.stdout), \
            f"{block.name}: its output does not match {block.options['expect']!r}:\n{result.stdout}"


@pytest.mark.parametrize("text, message", [
    ("```rust\nfn main() {}\n```\n", "no way to run a rust block"),
    ("```\nplain\n```\n", "no way to run a plain block"),
    ("<!-- readme-test: teleport -->\n```sh\ntrue\n```\n", "with directive 'teleport'"),
    ("<!-- readme-test: fake-cuda -->\n\n```sh\ntrue\n```\n", "no way to run a sh block"),
])
def test_a_block_with_no_way_to_run_fails(text, message):
    with pytest.raises(ReadmeError, match=message):
        for block in parse(text):
            runner(block)


@pytest.mark.parametrize("text, message", [
    ("```sh\ntrue\n", "never closed"),
    ("<!-- readme-test: fake-cuda -->\nSome prose.\n```python\npass\n```\n", "not followed"),
    ("text\n<!-- readme-test: fake-cuda -->\n", "at the end"),
    ("<!-- readme-test: onnxruntime model -->\n```c\n```\n", "not key=value"),
])
def test_malformed_readme_text_fails(text, message):
    with pytest.raises(ReadmeError, match=message):
        parse(text)


@pytest.mark.parametrize("lang, code", [
    ("sh", "true\nfalse\necho never\n"),
    ("sh", "sdalloc replay --no-such-option\n"),
    ("python", "import sdalloc\nsdalloc.Pool(mode='no-such-mode')\n"),
    ("c", "int main(void) { return 1; }\n"),
    ("c", "int main(void) { undeclared(); }\n"),
])
def test_a_failing_block_fails(lang, code, build, tmp_path):
    block = Block(1, lang, code)
    with pytest.raises(AssertionError, match="README.md:1 .* failed"):
        runner(block)(block, build, tmp_path)


def _another_ratio(match):
    return f"{float(match.group(1)) + 0.5:.2f} x"


@pytest.mark.parametrize("edit", [
    lambda text: text.replace("What the table means", "What the table says", 1),
    # the first "N.NN x" of the reading: a ratio the table's figures do not give
    lambda text: re.sub(r"\b(\d+\.\d\d) x\b", _another_ratio, text, count=1),
], ids=["words", "figure"])
def test_a_main_job_table_typed_by_hand_fails(edit, build, tmp_path):
    block = next(b for b in readme_blocks() if b.kind == "main-job-output")
    changed = edit(block.code)
    assert changed != block.code, "the edit found nothing to change in the README's table"
    with pytest.raises(AssertionError, match="is not what scripts/main_job_summary.py prints"):
        run_main_job_output(Block(block.line, block.lang, changed, block.kind), build, tmp_path)
