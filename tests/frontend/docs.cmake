# docs/language.md documents every keyword, builtin, dtype and predefined
# name the front end knows (language_doc.sh reads them from the sources),
# and the whole-file examples of it and docs/from-pytorch.md check.
add_test(NAME language_doc COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/language_doc.sh $<TARGET_FILE:flexc>)
