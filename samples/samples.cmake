# The embedding sample: a C program that loads a .score file with the
# runtime and checks a device backend against the float64 reference. The
# CUDA test exits 77 (skipped) where there is no CUDA device; the emulator
# test runs everywhere, the CPU backend's where the build has LLVM.
add_executable(embed ${CMAKE_CURRENT_LIST_DIR}/embed.c)
target_compile_options(embed PRIVATE ${FLEXC_WARNINGS})
target_link_libraries(embed PRIVATE flexc_lib)
enable_testing()
add_test(NAME sample_embed COMMAND embed --backend cuda ${CMAKE_CURRENT_LIST_DIR}/gemma2.score
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(sample_embed PROPERTIES SKIP_RETURN_CODE 77
  ENVIRONMENT "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
add_test(NAME sample_embed_bf16 COMMAND embed --backend cuda --dtype bf16
  ${CMAKE_CURRENT_LIST_DIR}/gemma2.score WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(sample_embed_bf16 PROPERTIES SKIP_RETURN_CODE 77
  ENVIRONMENT "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
add_test(NAME sample_embed_emu COMMAND embed --backend emu --dtype bf16 ${CMAKE_CURRENT_LIST_DIR}/gemma2.score
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(sample_embed_emu PROPERTIES
  ENVIRONMENT "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
if(FLEXC_HAVE_LLVM)
  add_test(NAME sample_embed_cpu COMMAND embed --backend cpu --dtype bf16
    ${CMAKE_CURRENT_LIST_DIR}/gemma2.score WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(sample_embed_cpu PROPERTIES
    ENVIRONMENT "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
endif()
add_test(NAME driver_gpu COMMAND check_driver --gpu WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(driver_gpu PROPERTIES SKIP_RETURN_CODE 77
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=120;FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")

# randn: random .npy inputs for trying the command line without Python.
add_executable(randn ${CMAKE_CURRENT_LIST_DIR}/randn.c)
target_compile_options(randn PRIVATE ${FLEXC_WARNINGS})
target_link_libraries(randn PRIVATE flexc_lib)
