# The Python package's tests (python/tests, label `python`), in the virtual
# environment scripts/python_env.sh makes in the build tree (PyTorch, NumPy,
# pytest and scikit-build-core from PyPI; scripts/test.sh runs it). Each
# exits 77 (skipped), saying why, where that environment could not be made.
set(FLEXC_PYTHON_VENV ${CMAKE_BINARY_DIR}/venv CACHE PATH "virtual environment of the Python tests")
if(FLEXC_SANITIZE)
  # libflexc.so is instrumented and the Python interpreter is not: ctypes
  # cannot load it, so the sanitizer build skips these visibly.
  add_test(NAME python COMMAND sh -c
    "echo 'python tests skipped: the sanitizer build makes an ASan-instrumented libflexc.so, which an uninstrumented Python cannot load (the plain build runs them)'; exit 77")
  set_tests_properties(python PROPERTIES SKIP_RETURN_CODE 77 LABELS python)
  return()
endif()
foreach(part api torch blockmask compile package frozen_buffers mods trace sinks offsets gradcheck
    distributed)
  set(needs "")
  if(part STREQUAL "package")
    set(needs scikit_build_core)
  endif()
  add_test(NAME python_${part}
    COMMAND ${PROJECT_SOURCE_DIR}/python/tests/run.sh ${FLEXC_PYTHON_VENV}
      $<TARGET_FILE:flexc_shared> python/tests/test_${part}.py ${needs}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(python_${part} PROPERTIES SKIP_RETURN_CODE 77 LABELS python TIMEOUT 900
    ENVIRONMENT "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
endforeach()
# The 64 traced attention-gym and PyTorch mods, forward and gradients on
# two backends (about two minutes on two cores): run by hand or with -L slow.
set_tests_properties(python_mods PROPERTIES LABELS "python;slow")
