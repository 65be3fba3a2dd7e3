# Golden generated CUDA for two samples (run_golden.sh): a change to
# the generated source shows up as a diff in review.
foreach(g "gemma2 bf16 sm_80 64" "document fp16 sm_90a 128")
  separate_arguments(args UNIX_COMMAND "${g}")
  list(GET args 0 sample)
  add_test(NAME golden_cuda_${sample}
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_golden.sh ${args})
  set_tests_properties(golden_cuda_${sample} PROPERTIES ENVIRONMENT "FLEXC_BIN=$<TARGET_FILE:flexc>")
endforeach()
