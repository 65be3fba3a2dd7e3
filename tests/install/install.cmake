# The installed tree: `cmake --install` into a fresh prefix, then
# samples/embed.c (which includes only <flexc/flex.h> and
# <flexc/flex_mirror.h>) built against it with pkg-config and with
# find_package(flexc), shared and static, and run on the emulator.
add_test(NAME install_consumer
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${CMAKE_BINARY_DIR} ${CMAKE_BINARY_DIR}/install-test)
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS install
  ENVIRONMENT "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
if(FLEXC_SANITIZE)
  set_tests_properties(install_consumer PROPERTIES ENVIRONMENT
    "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE};CONSUMER_CFLAGS=-fsanitize=address,undefined")
endif()
# The README's build-tree link lines, run as written (readme_link.sh). The
# sanitizer build's libraries need the sanitizer's flags, which the README
# does not write: there it skips (the plain build runs it).
if(FLEXC_SANITIZE)
  add_test(NAME readme_link COMMAND sh -c
    "echo 'readme_link skipped: the README links without sanitizer flags (the plain build runs it)'; exit 77")
else()
  add_test(NAME readme_link
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/readme_link.sh ${CMAKE_BINARY_DIR} ${CMAKE_BINARY_DIR}/readme-link-test)
endif()
set_tests_properties(readme_link PROPERTIES TIMEOUT 300 LABELS install SKIP_RETURN_CODE 77
  ENVIRONMENT "FLEXC_CACHE_DIR=${FLEXC_TEST_CACHE}")
