# The CPU backend (cpu/) against the float64 reference: the sample suite of
# check_emu_kernels with --cpu (every sample x fp32/fp16/bf16, odd shapes,
# GQA/MQA, dLSE, grad buffers); --full runs the whole cross product. Skips
# (77) in a build without LLVM.
add_test(NAME check_cpu_kernels COMMAND check_emu_kernels --cpu)
set_tests_properties(check_cpu_kernels PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=300;FLEXC_BIN=$<TARGET_FILE:flexc>;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
add_test(NAME check_cpu_kernels_full COMMAND check_emu_kernels --cpu --full)
set_tests_properties(check_cpu_kernels_full PROPERTIES LABELS slow SKIP_RETURN_CODE 77 TIMEOUT 1800
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_BIN=$<TARGET_FILE:flexc>;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# The same suite on the AVX2 and baseline kernel tables (cpu/kern_*.c; the
# dispatcher picks AVX-512 where the CPU has it); the generic one on one
# thread, packing one key/value head at a time.
add_test(NAME check_cpu_kernels_avx2 COMMAND check_emu_kernels --cpu)
set_tests_properties(check_cpu_kernels_avx2 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=300;FLEXC_CPU_ISA=avx2;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
add_test(NAME check_cpu_kernels_generic COMMAND check_emu_kernels --cpu)
set_tests_properties(check_cpu_kernels_generic PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=300;FLEXC_CPU_ISA=generic;FLEXC_THREADS=1;FLEXC_CPU_PACK_MB=0;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# check_cpu's kernel-table tests (row_helpers, bf16 attention, dispatch) on
# the baseline table too.
add_test(NAME check_cpu_generic COMMAND check_cpu)
set_tests_properties(check_cpu_generic PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=120;FLEXC_CPU_ISA=generic;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE};FLEXC_BIN=$<TARGET_FILE:flexc>")
