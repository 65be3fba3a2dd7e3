# One CTest per tests/frontend/cases/*.score: golden diagnostics (.err), golden IR
# (.ir), or a file that must check cleanly. See run_case.sh.
file(GLOB FLEXC_CASES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cases/*.score)
foreach(case ${FLEXC_CASES})
  get_filename_component(name ${case} NAME_WE)
  add_test(NAME case_${name}
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_case.sh ${name})
  set_tests_properties(case_${name} PROPERTIES
    ENVIRONMENT "FLEXC_BIN=$<TARGET_FILE:flexc>")
endforeach()
