# Fails unless the ```c block that follows the marker line `<!-- docs/readme_example.c -->` in
# README.md is exactly the content of docs/readme_example.c (which the build compiles and ctest
# runs), so the README's example cannot drift from what actually works.
#   cmake -DREADME=README.md -DEXAMPLE=docs/readme_example.c -P check_readme_example.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
set(marker "<!-- docs/readme_example.c -->\n```c\n")
string(FIND "${readme}" "${marker}" begin)
if(begin EQUAL -1)
  message(FATAL_ERROR "README.md has no '<!-- docs/readme_example.c -->' marker followed by a ```c block")
endif()
string(LENGTH "${marker}" marker_len)
math(EXPR begin "${begin} + ${marker_len}")
string(SUBSTRING "${readme}" ${begin} -1 rest)
string(FIND "${rest}" "```" end)
if(end EQUAL -1)
  message(FATAL_ERROR "README.md: the example's ```c block is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${end} block)
if(NOT block STREQUAL example)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/readme_block.c" "${block}")
  message(FATAL_ERROR "README.md's example differs from ${EXAMPLE}; the README block is in "
                      "${CMAKE_CURRENT_BINARY_DIR}/readme_block.c (diff them, then make them equal)")
endif()
message(STATUS "README example matches ${EXAMPLE}")
