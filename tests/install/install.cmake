# The installed tree: `cmake --install` into a fresh prefix, then
# samples/embed.c (which includes only <flexc/flex.h> and
# <flexc/flex_mirror.h>) built against it with pkg-config and with
# find_package(flexc), shared and static, and run on the emulator.
add_test(NAME install_consumer
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${CMAKE_BINARY_DIR} ${CMAKE_BINARY_DIR}/install-test)
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS install
  ENVIRONMENT "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
if(FLEXC_SANITIZE)
  set_tests_properties(install_consumer PROPERTIES ENVIRONMENT
    "FLEXC_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache;CONSUMER_CFLAGS=-fsanitize=address,undefined")
endif()
