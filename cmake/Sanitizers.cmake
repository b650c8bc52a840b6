# Applies SDALLOC_SANITIZE to every target of this project: "address;undefined" or "thread".
if(SDALLOC_SANITIZE)
  list(JOIN SDALLOC_SANITIZE "," _sdalloc_sanitizers)
  if(_sdalloc_sanitizers MATCHES "thread" AND _sdalloc_sanitizers MATCHES "address")
    message(FATAL_ERROR "SDALLOC_SANITIZE: thread cannot be combined with address")
  endif()
  # -O1 -g1: what the sanitizers' reports need (inlined frames, file and line per frame),
  # compiled in about half the time of the build type's -O2 -g, which the release build
  # keeps testing. They come after the build type's flags, so they win.
  add_compile_options(-fsanitize=${_sdalloc_sanitizers} -fno-omit-frame-pointer -O1 -g1)
  add_link_options(-fsanitize=${_sdalloc_sanitizers})
  if(_sdalloc_sanitizers MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()
