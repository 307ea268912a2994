# Builds and runs one consumer project (cmake -P run.cmake); called by ctest, see
# tests/CMakeLists.txt.
#   MODE            find_package: install skim into WORK_DIR/prefix, then find_package(skim)
#                   add_subdirectory: add_subdirectory(SKIM_SOURCE_DIR) from the consumer
#   SKIM_SOURCE_DIR skim's source tree; SKIM_BINARY_DIR its build tree (to install from)
#   WORK_DIR        scratch directory, emptied first
#   GENERATOR, CXX_COMPILER, CONFIG   as in skim's own build
cmake_minimum_required(VERSION 3.25)

foreach(var MODE SKIM_SOURCE_DIR SKIM_BINARY_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${MODE}: ${what} failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(consumer_source ${SKIM_SOURCE_DIR}/tests/consumers/${MODE})
set(configure_args
  -S ${consumer_source} -B ${WORK_DIR}/build -G ${GENERATOR}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  -DCMAKE_BUILD_TYPE=${CONFIG}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

if(MODE STREQUAL "find_package")
  set(prefix ${WORK_DIR}/prefix)
  run_step("install" ${CMAKE_COMMAND} --install ${SKIM_BINARY_DIR} --prefix ${prefix} --config ${CONFIG})
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${prefix} -DSKIM_EXPECTED_PREFIX=${prefix})
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args -DSKIM_SOURCE_DIR=${SKIM_SOURCE_DIR})
else()
  message(FATAL_ERROR "run.cmake: unknown MODE '${MODE}'")
endif()

run_step("configure" ${CMAKE_COMMAND} ${configure_args})
run_step("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build --config ${CONFIG})
find_program(consumer_exe NAMES skim_consumer
  PATHS ${WORK_DIR}/build ${WORK_DIR}/build/${CONFIG} NO_DEFAULT_PATH REQUIRED)
run_step("run" ${consumer_exe})
message(STATUS "consumer ${MODE}: ok")
