# The static kernel model (bench/kernel_model.py) on one sample: it compiles
# causal for sm_80, bf16, E=128, disassembles it and fails when a kernel
# loses its steady-state HMMA loop, spills, or goes above the instruction
# and shared-memory figures recorded in bench/RESULTS.md. Skipped (77) where
# python3 or cuobjdump cannot be had (--install tries pip into build/model-venv).
# The forward's 5.9: the scale folded into the exponent's FMA (measured
# 5.78, causal; 6.03 before).
# The backward (64 x 128 tiles, 8 warps, since 2026-11-23) measured 6.58
# instructions and 363.2 shared bytes per HMMA on causal (13.68 and 369.6
# at 64 x 32 x 4 before); the limits are those plus about 2%.
find_program(FLEXC_PYTHON3 python3)
if(FLEXC_PYTHON3)
  add_test(NAME kernel_model COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/kernel_model.py
    samples/causal.score --arch sm_80 --dtype bf16 --head-dim 128 --install
    --flexc $<TARGET_FILE:flexc>
    --max flex_fwd:spill=0 --max flex_bwd:spill=0 --max flex_fwd:stack=0 --max flex_bwd:stack=0
    --max flex_fwd:i_per_hmma=5.9 --max flex_fwd:b_per_hmma=166
    --max flex_bwd:i_per_hmma=6.7 --max flex_bwd:b_per_hmma=370
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(kernel_model PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "FLEXC_CACHE_DIR=off")
  # The kernels a call with dropout runs (FLEX_DROPOUT; forward tiles
  # 128 x 32 at EV = 128, see codegen/kernel.c): no local memory either.
  # Measured on causal: forward 11.03 and backward 11.92 instructions per
  # HMMA (the Philox rounds: one call per key pair in the forward, per
  # element in the backward's transposed fragments; the backward was 19.72
  # at 64 x 32 x 4).
  add_test(NAME kernel_model_dropout COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/kernel_model.py
    samples/causal.score --arch sm_80 --dtype bf16 --head-dim 128 --install --dropout
    --flexc $<TARGET_FILE:flexc>
    --max flex_fwd:spill=0 --max flex_bwd:spill=0 --max flex_fwd:stack=0 --max flex_bwd:stack=0
    --max flex_fwd:i_per_hmma=11.1 --max flex_bwd:i_per_hmma=12.2 --max flex_bwd:b_per_hmma=370
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(kernel_model_dropout PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "FLEXC_CACHE_DIR=off")
  # The sm_90a kernels (wgmma): the steady-state loop found, no spills, no
  # stack, and the wgmma not serialised by ptxas (a serialised kernel waits
  # for each wgmma before issuing the next). Measured on causal, bf16,
  # E=128: forward 6.21 instructions per 4096 FLOP (99 per HGMMA), 6.10
  # after the ping-pong turns and the scale fold (2026-11-24).
  add_test(NAME kernel_model_sm90 COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/kernel_model.py
    samples/causal.score --arch sm_90a --dtype bf16 --head-dim 128 --install
    --flexc $<TARGET_FILE:flexc>
    --max flex_fwd:spill=0 --max flex_bwd:spill=0 --max flex_fwd:stack=0 --max flex_bwd:stack=0
    --max flex_fwd:serial=0 --max flex_bwd:serial=0 --max flex_fwd:i_per_hmma=6.4
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(kernel_model_sm90 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "FLEXC_CACHE_DIR=off")
endif()
