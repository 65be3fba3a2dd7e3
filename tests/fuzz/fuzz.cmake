# The call fuzzer (check_call_fuzz.c, call_fuzz.c): random calls through
# flex.h on each backend against the reference, bounded by time
# (FLEXC_CALL_FUZZ_SECONDS; scripts/fuzz.sh call-BACKEND MINUTES runs it
# longer). check_call_fuzz itself fuzzes the reference backend.
target_sources(check_call_fuzz PRIVATE ${CMAKE_CURRENT_LIST_DIR}/call_fuzz.c)
target_include_directories(check_call_fuzz PRIVATE ${CMAKE_CURRENT_LIST_DIR})
set(FLEXC_CALL_FUZZ_ENV "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE};FLEXC_CALL_FUZZ_SECONDS=25")
set_tests_properties(check_call_fuzz PROPERTIES TIMEOUT 1200 ENVIRONMENT "${FLEXC_CALL_FUZZ_ENV}")
foreach(be cpu emu cuda)
  add_test(NAME check_call_fuzz_${be} COMMAND check_call_fuzz --backend ${be})
  set_tests_properties(check_call_fuzz_${be} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1200
    ENVIRONMENT "${FLEXC_CALL_FUZZ_ENV}")
endforeach()
# Where every module is a compile (the emulator's host compiler, NVRTC),
# calls share eight modules per run: more calls in the same 25 seconds.
foreach(be emu cuda)
  set_property(TEST check_call_fuzz_${be} APPEND PROPERTY ENVIRONMENT FLEXC_CALL_FUZZ_MODULES=8)
endforeach()
# Over the stand-in driver with NVRTC loaded: no leak checking, for the
# reason tests/CMakeLists.txt gives for check_hw (LeakSanitizer's tracer).
set_property(TEST check_call_fuzz_cuda APPEND PROPERTY ENVIRONMENT ASAN_OPTIONS=detect_leaks=0)

# The libFuzzer targets (fuzz_*.c): with CC=clang and -DFLEXC_FUZZ=ON each
# is built against the instrumented library and its CTest runs a bounded
# number of inputs under ASan and UBSan, from the seed corpus (samples/,
# the front end's cases, tests/fuzz/corpus/); scripts/fuzz.sh TARGET
# MINUTES runs one for longer. Without them, one test says how, skipped.
set(FLEXC_FUZZ_TARGETS score npy blockmask cli)
if(FLEXC_FUZZ)
  set(FLEXC_FUZZ_RUNS_score 20000)
  set(FLEXC_FUZZ_RUNS_npy 100000)
  set(FLEXC_FUZZ_RUNS_blockmask 20000)
  set(FLEXC_FUZZ_RUNS_cli 5000)
  set(FLEXC_FUZZ_SEEDS_score ${PROJECT_SOURCE_DIR}/samples ${PROJECT_SOURCE_DIR}/tests/frontend/cases)
  file(GLOB FLEXC_FUZZ_CLI_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cli/*.c)
  foreach(t ${FLEXC_FUZZ_TARGETS})
    add_executable(fuzz_${t} ${CMAKE_CURRENT_LIST_DIR}/fuzz_${t}.c)
    target_compile_options(fuzz_${t} PRIVATE ${FLEXC_WARNINGS})
    target_link_libraries(fuzz_${t} PRIVATE flexc_lib)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    set(corpus ${CMAKE_BINARY_DIR}/fuzz-corpus/${t})
    file(MAKE_DIRECTORY ${corpus})
    add_test(NAME fuzz_${t} COMMAND fuzz_${t} -runs=${FLEXC_FUZZ_RUNS_${t}} -timeout=60 -close_fd_mask=3
      -print_final_stats=1 ${corpus} ${CMAKE_CURRENT_LIST_DIR}/corpus/${t} ${FLEXC_FUZZ_SEEDS_${t}})
    set_tests_properties(fuzz_${t} PROPERTIES LABELS fuzz TIMEOUT 900
      ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1")
  endforeach()
  target_sources(fuzz_cli PRIVATE ${FLEXC_FUZZ_CLI_SOURCES})
  target_compile_definitions(fuzz_cli PRIVATE main=flexc_main) # libFuzzer has the main
  if(FLEXC_HAVE_LLVM) # fuzz_score builds the cpu backend's LLVM IR too
    target_include_directories(fuzz_score SYSTEM PRIVATE ${FLEXC_LLVM_INCLUDE})
  endif()
else()
  add_test(NAME fuzz_targets COMMAND sh -c
    "echo 'the libFuzzer targets need clang: configure with CC=clang -DFLEXC_FUZZ=ON (scripts/fuzz.sh TARGET MINUTES builds them)'; exit 77")
  set_tests_properties(fuzz_targets PROPERTIES LABELS fuzz SKIP_RETURN_CODE 77)
endif()
