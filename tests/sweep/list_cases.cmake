# Writes the sweep's case list (--gtest_list_tests) to OUT, for te_sweep_ctest.cmake.
execute_process(COMMAND ${EXE} --gtest_list_tests OUTPUT_FILE ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT})
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc})")
endif()
