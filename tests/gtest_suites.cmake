# Writes CTEST_FILE: one ctest entry per GoogleTest suite of TEST_EXECUTABLE,
# running that suite's tests in one process (--gtest_filter=Suite.*).
# Run after each build of a test program (see tests/CMakeLists.txt).
#
#   cmake -D TEST_EXECUTABLE=... -D CTEST_FILE=... -D LABEL=... -D TIMEOUT=...
#         [-D DISCOVERY_TIMEOUT=60] -P gtest_suites.cmake
#
# A process per suite instead of per test: each process loads LibTorch and
# the OpenBLAS/OpenMP runtimes before the first test runs, which on small
# tests costs more than the test. Entry names are the suite names
# (parameterized: Instantiation/Suite), so `ctest -R Suite` selects a
# suite; the label is the program's name (`ctest -L test_lion`).
cmake_minimum_required(VERSION 3.16)

foreach(var TEST_EXECUTABLE CTEST_FILE LABEL TIMEOUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "gtest_suites.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT DEFINED DISCOVERY_TIMEOUT)
  set(DISCOVERY_TIMEOUT 60)
endif()

execute_process(
  COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
  TIMEOUT ${DISCOVERY_TIMEOUT}
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE errors
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "gtest_suites.cmake: '${TEST_EXECUTABLE} --gtest_list_tests' "
                      "failed (${result}):\n${listing}${errors}")
endif()

# Suite lines start in column 0 and end with '.', possibly followed by a
# comment ("Suite.  # TypeParam = int"); test lines are indented.
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ][^ ]*)\\.( *#.*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script
      "add_test([==[${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==])\n"
      "set_tests_properties([==[${suite}]==] PROPERTIES TIMEOUT ${TIMEOUT} LABELS ${LABEL})\n")
  endif()
endforeach()
if(script STREQUAL "")
  message(FATAL_ERROR "gtest_suites.cmake: no test suites in '${TEST_EXECUTABLE}'")
endif()
file(WRITE "${CTEST_FILE}" "${script}")
