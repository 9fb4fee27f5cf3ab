# Installs what a consumer of libte needs, and nothing else:
#   <includedir>/te/*.h                       the public C header(s)
#   <libdir>/libte.so.0.1.0, libte.so.0, libte.so   the library with its SONAME links
#   <libdir>/pkgconfig/te.pc                  for `pkg-config --cflags --libs te`
#   <libdir>/cmake/te/teConfig.cmake          for `find_package(te)` -> te::te
#                    teConfigVersion.cmake     (SameMajorVersion, like the SONAME)
#                    teTargets*.cmake          the exported target
#   <docdir>/LICENSE                          the Apache License 2.0 (docdir: share/doc/libte)
# The core (te_core) is linked whole into libte.so and is not installed: consumers see only
# the C ABI. tests/install checks all of this against a copy installed into a temp prefix.
include(CMakePackageConfigHelpers)

set(TE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/te CACHE STRING
    "Where teConfig.cmake is installed, relative to the prefix")
set(TE_INSTALL_PKGCONFIGDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig CACHE STRING
    "Where te.pc is installed, relative to the prefix")
mark_as_advanced(TE_INSTALL_CMAKEDIR TE_INSTALL_PKGCONFIGDIR)

# ---- the library and its header ----------------------------------------------------------
# VERSION/SOVERSION (set on the target) give libte.so.0.1.0, libte.so.0 -> it (the SONAME), and
# the development link libte.so -> libte.so.0.
install(TARGETS te EXPORT teTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY capi/include/te DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT development FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)

# ---- CMake package: find_package(te) -> te::te --------------------------------------------
# te links its dependencies (the core, OpenBLAS, threads) privately into the shared library, so
# the exported target carries no link dependencies and teConfig.cmake needs no find_dependency.
install(EXPORT teTargets
  NAMESPACE te::
  FILE teTargets.cmake
  DESTINATION ${TE_INSTALL_CMAKEDIR}
  COMPONENT development)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/teConfig.cmake.in
  ${PROJECT_BINARY_DIR}/teConfig.cmake
  INSTALL_DESTINATION ${TE_INSTALL_CMAKEDIR})
# The ABI promise is the SONAME's: any 0.y.z satisfies find_package(te 0.1).
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/teConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/teConfig.cmake ${PROJECT_BINARY_DIR}/teConfigVersion.cmake
  DESTINATION ${TE_INSTALL_CMAKEDIR}
  COMPONENT development)

# ---- pkg-config: te.pc ---------------------------------------------------------------------
# libte.so is shared and links OpenBLAS itself, so `pkg-config --libs te` is just -lte.
# Requires.private / Libs.private list what a static link of the same code would need (the
# BLAS, the C++ runtime, threads); pkg-config reads them only with --static (and needs
# openblas.pc to resolve Requires.private, which is how the build found OpenBLAS).
set(TE_PC_REQUIRES_PRIVATE "${TE_BLAS_PC_REQUIRES}")
set(TE_PC_LIBS_PRIVATE "${TE_BLAS_PC_LIBS}")
string(REPLACE "-l " "-l" TE_PC_LIBS_PRIVATE "${TE_PC_LIBS_PRIVATE}")
string(STRIP "${TE_PC_LIBS_PRIVATE} -lstdc++ -lm -pthread" TE_PC_LIBS_PRIVATE)

# The prefix is only known at install time (`cmake --install build --prefix /somewhere`), so
# te.pc is generated then, with absolute paths; DESTDIR is applied to where it is copied, not
# to what it says.
foreach(dir_var IN ITEMS LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir_var}}")
    set(TE_PC_${dir_var} "${CMAKE_INSTALL_${dir_var}}")
  else()
    set(TE_PC_${dir_var} "\${prefix}/${CMAKE_INSTALL_${dir_var}}")
  endif()
endforeach()
set(TE_PC_STAGED ${PROJECT_BINARY_DIR}/pkgconfig-staged/te.pc)
install(CODE "
  set(TE_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(TE_PC_LIBDIR [==[${TE_PC_LIBDIR}]==])
  set(TE_PC_INCLUDEDIR [==[${TE_PC_INCLUDEDIR}]==])
  set(TE_PC_VERSION [==[${PROJECT_VERSION}]==])
  set(TE_PC_REQUIRES_PRIVATE [==[${TE_PC_REQUIRES_PRIVATE}]==])
  set(TE_PC_LIBS_PRIVATE [==[${TE_PC_LIBS_PRIVATE}]==])
  configure_file([==[${PROJECT_SOURCE_DIR}/pkgconfig/te.pc.in]==] [==[${TE_PC_STAGED}]==] @ONLY)
" COMPONENT development)
install(FILES ${TE_PC_STAGED} DESTINATION ${TE_INSTALL_PKGCONFIGDIR} COMPONENT development)
