# The Python wheel: `pip install ./bindings/python` (scikit-build-core, bindings/python/
# pyproject.toml) configures this project with TE_BUILD_PYTHON=ON and installs the component
# `python` into the wheel's platlib directory:
#   libte/libte.so.0                         the C library, one real file named by its SONAME
#   libte/__te_swig.<SOABI>.so, _te_swig.py  the SWIG accelerator (bindings/swig/te.i), RUNPATH $ORIGIN
# The pure-Python package (bindings/python/libte) is copied next to them by scikit-build-core.
# The loader (libte/_loader.py) opens libte.so.0 from the package directory when LIBTE_PATH is
# not set, and the SWIG module's DT_NEEDED (libte.so.0) resolves to that same copy (already loaded,
# and through $ORIGIN anyway). Nothing here changes the ordinary build or `cmake --install`.
#
#   TE_PYTHON_SWIG   ON (default): build the SWIG module (needs swig >= 4 and the Python
#                    headers); OFF: a ctypes-only wheel.
option(TE_PYTHON_SWIG "Python wheel: build the SWIG accelerator libte._te_swig" ON)

# What the wheel builds (pyproject's build.targets): the library, and the SWIG module when on.
add_custom_target(te_python)
add_dependencies(te_python te)

# A wheel cannot hold symlinks (they would be stored as copies): give the library no VERSION, so
# that the real file is libte.so.0 (the SONAME, SOVERSION is kept) and the only symlink is the
# development name libte.so, which the wheel leaves out (NAMELINK_SKIP).
set_property(TARGET te PROPERTY VERSION)
install(TARGETS te
  LIBRARY DESTINATION libte COMPONENT python NAMELINK_SKIP
  RUNTIME DESTINATION libte COMPONENT python)

if(TE_PYTHON_SWIG)
  find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
  find_program(TE_SWIG_EXECUTABLE NAMES swig swig4.0 DOC "SWIG 4 for the Python wheel")
  if(NOT TE_SWIG_EXECUTABLE)
    message(FATAL_ERROR "The Python wheel's SWIG module needs swig (Debian: apt-get install swig); "
                        "or build a ctypes-only wheel: pip wheel -C cmake.define.TE_PYTHON_SWIG=OFF ./bindings/python")
  endif()
  set(_te_swig_dir ${PROJECT_BINARY_DIR}/swig-python)
  set(_te_swig_interface ${PROJECT_SOURCE_DIR}/bindings/swig/te.i)
  # The same command as bindings/swig/build.py (the development build into the source tree).
  add_custom_command(
    OUTPUT ${_te_swig_dir}/te_wrap.c ${_te_swig_dir}/_te_swig.py
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_te_swig_dir}
    COMMAND ${TE_SWIG_EXECUTABLE} -python -builtin -O -I${PROJECT_SOURCE_DIR}/capi/include
            -outdir ${_te_swig_dir} -o ${_te_swig_dir}/te_wrap.c ${_te_swig_interface}
    DEPENDS ${_te_swig_interface} ${PROJECT_SOURCE_DIR}/capi/include/te/te.h
    COMMENT "SWIG: libte._te_swig from bindings/swig/te.i"
    VERBATIM)
  Python_add_library(te_python_swig MODULE WITH_SOABI ${_te_swig_dir}/te_wrap.c)
  target_link_libraries(te_python_swig PRIVATE te)
  target_compile_options(te_python_swig PRIVATE -w)  # generated code
  set_target_properties(te_python_swig PROPERTIES
    OUTPUT_NAME __te_swig
    LIBRARY_OUTPUT_DIRECTORY ${_te_swig_dir}
    INSTALL_RPATH "$ORIGIN")
  add_dependencies(te_python te_python_swig)
  install(TARGETS te_python_swig LIBRARY DESTINATION libte COMPONENT python)
  install(FILES ${_te_swig_dir}/_te_swig.py DESTINATION libte COMPONENT python)
endif()
