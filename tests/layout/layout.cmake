# The source tree's house rules (tests/layout/check_layout.sh): one place
# reads the environment, its table is documented, pieces written once, the
# folders in layers.
add_test(NAME check_layout COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/check_layout.sh ${PROJECT_SOURCE_DIR}
  ${CMAKE_BINARY_DIR})
# The call edges are read from the library's objects.
set_tests_properties(check_layout PROPERTIES DEPENDS flexc_lib)
