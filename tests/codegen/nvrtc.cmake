# The whole NVRTC compile matrix (every sample x dtype x head dim x arch):
# many minutes on two cores, so it carries the `slow` label.
add_test(NAME check_nvrtc_full COMMAND check_nvrtc)
set_tests_properties(check_nvrtc_full PROPERTIES SKIP_RETURN_CODE 77 LABELS slow TIMEOUT 7200
  ENVIRONMENT "FLEXC_NVRTC_FULL=1;CK_DEFAULT_TIMEOUT=7200;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
