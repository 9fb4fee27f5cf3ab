# Installs the header, libte.so with its SONAME links, te.pc and the te::te CMake package.
# (fleshed out by the packaging work)
install(TARGETS te EXPORT teTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY capi/include/te DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
