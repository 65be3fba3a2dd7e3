# Installing flexc: the shared library libflexc.so.VERSION (SONAME
# libflexc.so.MAJOR), the static library libflexc.a, the `flexc` command,
# the public headers as <flexc/flex.h>, <flexc/flex_mirror.h> and
# <flexc/dlpack.h>, a pkg-config
# file and a CMake package (find_package(flexc) gives flexc::flexc and
# flexc::flexc_static). The Python package (python/, built by
# scikit-build-core, which sets SKBUILD) takes only the shared library and
# the command, into the package's own folder.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers, also copied into the build tree as
# include/flexc/*.h, so in-tree programs can spell them as installed ones do.
set(FLEXC_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/runtime/flex.h ${PROJECT_SOURCE_DIR}/runtime/dlpack.h
  ${PROJECT_SOURCE_DIR}/runtime/flex_mirror.h)
foreach(header ${FLEXC_PUBLIC_HEADERS})
  get_filename_component(name ${header} NAME)
  configure_file(${header} ${PROJECT_BINARY_DIR}/include/flexc/${name} COPYONLY)
endforeach()

# The shared library: the static library's objects (built position
# independent), exporting the flex_* API and nothing else.
add_library(flexc_shared SHARED $<TARGET_OBJECTS:flexc_lib>)
set_target_properties(flexc_shared PROPERTIES
  OUTPUT_NAME flexc EXPORT_NAME flexc
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/flexc.map)
target_link_options(flexc_shared PRIVATE
  -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/flexc.map -Wl,--no-undefined)
# Whatever the static library links (libm, libdl, threads, and what a
# backend adds) the shared one links too.
target_link_libraries(flexc_shared PRIVATE $<TARGET_PROPERTY:flexc_lib,LINK_LIBRARIES>)
target_include_directories(flexc_shared INTERFACE
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# The static library's source-tree include paths are for the build only.
get_target_property(flexc_lib_includes flexc_lib INTERFACE_INCLUDE_DIRECTORIES)
set_target_properties(flexc_lib PROPERTIES EXPORT_NAME flexc_static
  INTERFACE_INCLUDE_DIRECTORIES
  "$<BUILD_INTERFACE:${flexc_lib_includes};${PROJECT_BINARY_DIR}/include>;$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")

if(SKBUILD)
  # The wheel: flexc/lib/libflexc.so.MAJOR (what the ctypes binding loads)
  # and flexc/bin/flexc (what the `flexc` console script runs).
  install(FILES $<TARGET_FILE:flexc_shared> DESTINATION flexc/lib RENAME libflexc.so.${PROJECT_VERSION_MAJOR}
    PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE
    COMPONENT python)
  install(TARGETS flexc RUNTIME DESTINATION flexc/bin COMPONENT python)
  return()
endif()

install(TARGETS flexc RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS flexc_shared flexc_lib EXPORT flexcTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
install(FILES ${FLEXC_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flexc
  COMPONENT development)

# pkg-config: relocatable (prefix found from the .pc file's own place), so
# `cmake --install --prefix DIR` into any DIR gives a working file.
file(RELATIVE_PATH FLEXC_PC_TO_PREFIX
  /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" FLEXC_PC_TO_PREFIX "${FLEXC_PC_TO_PREFIX}")
# A static link also needs what the CPU backend links (LLVM).
set(FLEXC_PC_PRIVATE "")
if(FLEXC_HAVE_LLVM)
  get_filename_component(flexc_llvm_dir ${FLEXC_LLVM_LIB} DIRECTORY)
  set(FLEXC_PC_PRIVATE "-L${flexc_llvm_dir} -Wl,-rpath,${flexc_llvm_dir} ${FLEXC_LLVM_LIB}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/flexc.pc.in ${PROJECT_BINARY_DIR}/flexc.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flexc.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT development)

# The CMake package.
set(FLEXC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flexc)
install(EXPORT flexcTargets NAMESPACE flexc:: DESTINATION ${FLEXC_CMAKE_DIR}
  COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flexcConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flexcConfig.cmake INSTALL_DESTINATION ${FLEXC_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flexcConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flexcConfig.cmake ${PROJECT_BINARY_DIR}/flexcConfigVersion.cmake
  DESTINATION ${FLEXC_CMAKE_DIR} COMPONENT development)
