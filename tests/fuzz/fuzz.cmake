# The call fuzzer (check_call_fuzz.c, call_fuzz.c): random calls through
# flex.h on each backend against the reference, bounded by time
# (FLEXC_CALL_FUZZ_SECONDS; scripts/fuzz.sh call-BACKEND MINUTES runs it
# longer). check_call_fuzz itself fuzzes the reference backend.
target_sources(check_call_fuzz PRIVATE ${CMAKE_CURRENT_LIST_DIR}/call_fuzz.c)
target_include_directories(check_call_fuzz PRIVATE ${CMAKE_CURRENT_LIST_DIR})
set(FLEXC_CALL_FUZZ_ENV "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache;FLEXC_CALL_FUZZ_SECONDS=25")
set_tests_properties(check_call_fuzz PROPERTIES TIMEOUT 1200 ENVIRONMENT "${FLEXC_CALL_FUZZ_ENV}")
foreach(be cpu emu cuda)
  add_test(NAME check_call_fuzz_${be} COMMAND check_call_fuzz --backend ${be})
  set_tests_properties(check_call_fuzz_${be} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1200
    ENVIRONMENT "${FLEXC_CALL_FUZZ_ENV}")
endforeach()

