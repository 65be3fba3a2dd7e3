# The emulator against the reference over the whole cross product (every
# sample x dtype x shape variant: many minutes on two cores), and the
# emulator timing case (prints seconds, asserts nothing but success).
add_test(NAME check_emu_kernels_full COMMAND check_emu_kernels --full)
set_tests_properties(check_emu_kernels_full PROPERTIES LABELS slow TIMEOUT 3600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
add_test(NAME check_emu_kernels_timing COMMAND check_emu_kernels --timing)
set_tests_properties(check_emu_kernels_timing PROPERTIES LABELS slow TIMEOUT 600
  ENVIRONMENT "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# Fifteen samples x three dtypes on two shared cores: minutes, more under load.
set_tests_properties(check_emu_kernels PROPERTIES TIMEOUT 1500)
# The same cases on the GPU (the CUDA backend against the reference); they
# exit 77 (skipped) where there is no CUDA device.
add_test(NAME check_emu_kernels_gpu COMMAND check_emu_kernels --cuda)
set_tests_properties(check_emu_kernels_gpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
add_test(NAME check_emu_kernels_gpu_full COMMAND check_emu_kernels --cuda --full)
set_tests_properties(check_emu_kernels_gpu_full PROPERTIES LABELS slow SKIP_RETURN_CODE 77
  TIMEOUT 3600 ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# Every row of the tile table and every shape of bench/tile_sweep.txt on the
# emulator against the reference (causal, relpos_bias with a grad buffer,
# paged BlockMask lists; interior and edge tiles, GQA).
add_test(NAME check_tiles COMMAND check_emu_kernels --tiles)
set_tests_properties(check_tiles PROPERTIES TIMEOUT 1200
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# The sm_90a forward's cross product (samples x fp16/bf16 x shapes).
add_test(NAME check_emu_sm90_fwd_full COMMAND check_emu_sm90_fwd --full)
set_tests_properties(check_emu_sm90_fwd_full PROPERTIES LABELS slow TIMEOUT 3600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# The sm_90a backward's cross product (samples x fp16/bf16 x shapes).
add_test(NAME check_emu_sm90_bwd_full COMMAND check_emu_sm90_bwd --full)
set_tests_properties(check_emu_sm90_bwd_full PROPERTIES LABELS slow TIMEOUT 3600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# The same on GPU 0 (exit 77 without one): on a 9.0 device the sm_90a body
# on the hardware (FLEXC_CUDA_SM90_FWD=1 turns it on for the CUDA backend).
add_test(NAME check_emu_sm90_fwd_gpu COMMAND check_emu_sm90_fwd --cuda)
set_tests_properties(check_emu_sm90_fwd_gpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "FLEXC_CUDA_SM90_FWD=1;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# Every sample on the sm_90a kernels (fp16 / bf16; head dims 64, 128, 256 and
# padded ones): the default spread, and the cross product (slow).
add_test(NAME check_emu_kernels_sm90 COMMAND check_emu_kernels --sm90)
set_tests_properties(check_emu_kernels_sm90 PROPERTIES TIMEOUT 1500
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
add_test(NAME check_emu_kernels_sm90_full COMMAND check_emu_kernels --sm90 --full)
set_tests_properties(check_emu_kernels_sm90_full PROPERTIES LABELS slow TIMEOUT 3600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# Extreme inputs (huge magnitudes and scores) on every path in every dtype;
# check_emu_extreme alone runs each path in one dtype, rotated by the seed.
add_test(NAME check_emu_extreme_full COMMAND check_emu_extreme --full)
set_tests_properties(check_emu_extreme_full PROPERTIES LABELS slow TIMEOUT 3600
  ENVIRONMENT "CK_DEFAULT_TIMEOUT=600;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
# The fiber switch's portable fallback (ucontext: machines other than
# x86-64 run it): check_emu with every module built -DFLEXC_EMU_UCONTEXT.
add_test(NAME check_emu_ucontext COMMAND check_emu)
set_tests_properties(check_emu_ucontext PROPERTIES TIMEOUT 1200
  ENVIRONMENT "FLEXC_EMU_CXX=c++ -DFLEXC_EMU_UCONTEXT;FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
