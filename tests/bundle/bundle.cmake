# The GPU bundle (scripts/gpu_bundle.sh, bench/run_gpu.sh, docs/cuda.md "A
# GPU session") made and started as on a bare GPU machine: a Release build
# without LLVM (its own tree, kept between runs), a bundle whose kernel
# cache holds one line's kernels, every ldd closure and the size asserted,
# the bundle and the checkout copied where no ../shared is, and run_gpu.sh
# run there with a PATH of the GPU machine's tools only: its pre-flight
# passes and it exits 77 (no CUDA device); its dry run goes through every
# stage; the copied cache serves the copied programs (keys do not depend
# on where the bundle lies). 79 s from a fresh tree on the 2-core
# development machine at load 15, 30 s with the tree kept, most of it the
# build (label `bundle`). Not in sanitizer builds (ASan binaries are
# not what a bundle holds) nor in a FLEXC_PORTABLE build itself.
if(FLEXC_SANITIZE OR FLEXC_PORTABLE)
  add_test(NAME gpu_bundle COMMAND sh -c
    "echo 'gpu_bundle skipped: the plain (non-sanitizer, non-portable) build runs it'; exit 77")
else()
  add_test(NAME gpu_bundle COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${PROJECT_SOURCE_DIR}
    ${CMAKE_BINARY_DIR}/gpu-bundle-test)
endif()
set_tests_properties(gpu_bundle PROPERTIES SKIP_RETURN_CODE 77 LABELS bundle TIMEOUT 1500
  PROCESSORS 2)
