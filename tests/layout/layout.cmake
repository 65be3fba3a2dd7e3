# The source tree's house rules (tests/layout/check_layout.sh): one place
# reads the environment, its table is documented, pieces written once.
add_test(NAME check_layout COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/check_layout.sh ${PROJECT_SOURCE_DIR})
