# Smoke tests: real programs run correctly with the drop-in preloaded (label preload_smoke,
# about 30-60 s on a loaded 2-core machine). Each one sets report:stderr and checks that the
# pool was built and reported, so a test cannot pass with the drop-in silently off.
set(_smoke_env "LD_PRELOAD=${_preload};SDALLOC_CONF=report:stderr")
set(_report "sdalloc preload report")

# PyTorch on the CPU: convolutions and matmuls at Stable Diffusion sizes, checked against
# the same computation in float64.
add_test(NAME preload_smoke_torch COMMAND ${_expect} "torch ok" "${_report}" --
  /usr/bin/python3 -c "import torch; torch.manual_seed(0); \
c = torch.nn.Conv2d(320, 320, 3, padding=1); x = torch.randn(2, 320, 32, 32); \
y = c(x); y64 = torch.nn.functional.conv2d(x.double(), c.weight.double(), c.bias.double(), padding=1); \
a = torch.randn(1024, 1280); m = (a @ a.T).softmax(-1); \
assert torch.allclose(y.double(), y64, atol=1e-3); assert abs(m.sum().item() - 1024) < 1e-2; \
print('torch ok')")
# git: a repository, a commit of a large file, and a log.
set(_git_dir ${CMAKE_CURRENT_BINARY_DIR}/smoke_git)
add_test(NAME preload_smoke_git COMMAND ${_expect} "smoke commit" "${_report}" -- sh -c
  "rm -rf '${_git_dir}' && mkdir -p '${_git_dir}' && cd '${_git_dir}' && git init -q . && \
   head -c 8000000 /dev/urandom > big.bin && seq 1 200000 > lines.txt && git add . && \
   git -c user.name=t -c user.email=t@t commit -qm 'smoke commit' && git log --oneline && \
   git diff HEAD~0 --stat")
# gcc and cmake --build: the compiler, the linker, cmake and the build tool preloaded.
set(_tiny_dir ${CMAKE_CURRENT_BINARY_DIR}/smoke_tiny)
add_test(NAME preload_smoke_cmake_build COMMAND ${_expect} "sum 4194304" "${_report}" -- sh -c
  "rm -rf '${_tiny_dir}' && \
   cmake -S '${CMAKE_CURRENT_SOURCE_DIR}/tiny_project' -B '${_tiny_dir}' -DCMAKE_CXX_COMPILER=g++ \
     -DCMAKE_CXX_COMPILER_LAUNCHER= >/dev/null && cmake --build '${_tiny_dir}' && '${_tiny_dir}/tiny'")
add_test(NAME preload_smoke_gcc COMMAND ${_expect} "sum 4194304" --
  sh -c "g++ -O2 '${CMAKE_CURRENT_SOURCE_DIR}/tiny_project/tiny.cpp' -o '${CMAKE_CURRENT_BINARY_DIR}/tiny_gcc' && '${CMAKE_CURRENT_BINARY_DIR}/tiny_gcc'")
# Two gloo ranks (torchrun's env:// rendezvous; see two_ranks.py), each with its own pool.
add_test(NAME preload_smoke_two_ranks COMMAND ${_expect} "rank 0 of 2 .*ok" "rank 1 of 2 .*ok"
  "exit codes \\[0, 0\\]" "${_report}" -- /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/two_ranks.py)
# The same ranks started by the real torchrun (the agent preloaded too, as a user's shell
# would). --redirects 2 --tee 1: torch 1.13's Std.from_str finds no member for 0 under
# Python 3.11 (IntFlag iteration skips zero), so its defaults crash the agent; these values
# route each worker's stderr to a log file and its stdout, prefixed, to the terminal.
find_program(SDALLOC_TORCHRUN torchrun)
if(SDALLOC_TORCHRUN)
  add_test(NAME preload_smoke_torchrun COMMAND ${_expect} "rank 0 of 2 .*ok" "rank 1 of 2 .*ok" --
    ${SDALLOC_TORCHRUN} --standalone --nproc_per_node 2 --redirects 2 --tee 1
    ${CMAKE_CURRENT_SOURCE_DIR}/two_ranks.py --rank)
  set_tests_properties(preload_smoke_torchrun PROPERTIES ENVIRONMENT "${_smoke_env}"
                                                         LABELS preload_smoke TIMEOUT 240)
endif()
# huge_pages:true: the pool's memory is backed by transparent huge pages.
add_test(NAME preload_smoke_huge_pages COMMAND ${_expect} "huge pages ok" --
  /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/huge_pages.py)
set_tests_properties(preload_smoke_huge_pages PROPERTIES
  ENVIRONMENT "LD_PRELOAD=${_preload};SDALLOC_PRELOAD_CONF=huge_pages:true,report:stderr"
  LABELS preload_smoke TIMEOUT 120)
# mode:planned with no marks: the loop's steps are found and planned; the result is glibc's.
add_test(NAME preload_smoke_planned_loop COMMAND ${_expect}
  "recorded, [1-9][0-9]* planned" "a step of [0-9]+ requests" "same result" -- sh -c
  "plain=$(env -u LD_PRELOAD /usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/planned_loop.py') && \
   SDALLOC_CONF=mode:planned,report:stderr planned=$(/usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/planned_loop.py') && \
   echo \"$plain / $planned\" && [ \"$plain\" = \"$planned\" ] && echo same result")
# The project's pytest suite with the drop-in preloaded into every interpreter it starts. Its
# settings go in SDALLOC_PRELOAD_CONF: SDALLOC_CONF is also the PyTorch shim's, which the
# suite configures, and the shim rejects the drop-in's keys.
# The report goes to a file, not stderr: tests of the suite check their subprocesses' stderr
# line by line. Each process writes it at exit; pytest itself exits last.
set(_pytest_report ${CMAKE_CURRENT_BINARY_DIR}/smoke_pytest_report.txt)
add_test(NAME preload_smoke_pytest COMMAND ${_expect} " passed" "${_report}" -- sh -c
  "rm -f '${_pytest_report}'; /usr/bin/python3 -m pytest -q -p no:cacheprovider \
     '${PROJECT_SOURCE_DIR}/tests/python'; rc=$?; cat '${_pytest_report}'; exit $rc")
set_tests_properties(preload_smoke_pytest PROPERTIES
  ENVIRONMENT "LD_PRELOAD=${_preload};SDALLOC_PRELOAD_CONF=report:${_pytest_report};SDALLOC_LIBRARY_DIR=${PROJECT_BINARY_DIR}/src"
  LABELS preload_smoke TIMEOUT 600)
foreach(t torch git cmake_build gcc two_ranks planned_loop)
  set_tests_properties(preload_smoke_${t} PROPERTIES ENVIRONMENT "${_smoke_env}"
                                                     LABELS preload_smoke TIMEOUT 180)
endforeach()
