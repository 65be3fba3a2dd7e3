# The GPU modes of the numerical suites (what bench/run_gpu.sh runs from a
# bundle, bench/gpu_checks.txt): the CUDA backend against the float64
# reference on device 0. Without a CUDA device each exits 77 (skipped) at
# once. On a 9.0 device FLEXC_CUDA_SM90_FWD=1 FLEXC_CUDA_SM90_BWD=1 in the
# environment turns the sm_90a bodies on (the matrix then asserts they ran).
foreach(t check_emu_kernels:--matrix check_emu_dropout check_determ check_varlen check_paged
          check_splitkv)
  string(REPLACE ":" ";" parts ${t})
  list(GET parts 0 suite)
  list(LENGTH parts n)
  set(extra "")
  set(name ${suite}_gpu)
  if(n GREATER 1)
    list(GET parts 1 extra)
    set(name ${suite}_matrix_gpu)
  endif()
  add_test(NAME ${name} COMMAND ${suite} --cuda ${extra} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
    ENVIRONMENT "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
endforeach()
