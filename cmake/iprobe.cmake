# A subcommand tool of `iprobe`: built into libexec/iprobe, where the `iprobe`
# dispatcher finds it (see cli/iprobe.cpp).
function(iprobe_libexec_tool name)
  add_executable(${name} ${ARGN})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${IPROBE_LIBEXEC_DIR})
  install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/iprobe)
endfunction()

# A GoogleTest suite run by ctest.  Tests find the build tree through
# IPROBE_BUILD_DIR and the sources through IPROBE_SOURCE_DIR.  A test that
# calls GTEST_SKIP() is reported by ctest as skipped, never as passed.
function(iprobe_gtest name)
  cmake_parse_arguments(ARG "SERIAL" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main iprobe_testutil ${ARG_LIBS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # SERIAL: tests that load the machine to a measured share of its capacity
  # (a clone kept at half its speed, a capture that must keep up) run alone
  # under `ctest -j`, so other tests do not change that capacity under them.
  set(serial FALSE)
  if(ARG_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${ARG_TIMEOUT}
               RUN_SERIAL ${serial}
               SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
               ENVIRONMENT "IPROBE_BUILD_DIR=${PROJECT_BINARY_DIR};IPROBE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
