# Cross-compiles the CPU executor suite (tests/main.cpp, tests/exec/cpu/conformance_test.cpp and
# simd_test.cpp, SKIM_TEST_ARCH_BUILD: for exec::simd<xsimd::neon64> alone; with the summarizers'
# scoring paths, tests/summarize/score_paths_test.cpp) for aarch64 with a
# static link, and runs the binary under qemu-aarch64. Called by CTest (tests/CMakeLists.txt):
#   cmake -DCXX=aarch64-linux-gnu-g++ -DQEMU=qemu-aarch64 -DSOURCE_DIR=<skim> -DWORK_DIR=<dir>
#         -DXSIMD_INCLUDE=<dir holding xsimd/> -DDOCTEST_INCLUDE=<dir holding doctest/> -P simd_neon.cmake
# Only a tenth of the x86 case count runs (SKIM_SIMD_TEST_SCALE): qemu is ~20x slower than native.
foreach(var CXX QEMU SOURCE_DIR WORK_DIR XSIMD_INCLUDE DOCTEST_INCLUDE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "simd_neon.cmake: -D${var}=... is required")
  endif()
endforeach()

# Header-only dependencies from the host, without the host's /usr/include (its glibc headers are
# x86's): a directory of links to just xsimd/ and doctest/.
set(deps ${WORK_DIR}/deps)
file(MAKE_DIRECTORY ${deps})
file(CREATE_LINK ${XSIMD_INCLUDE}/xsimd ${deps}/xsimd SYMBOLIC)
file(CREATE_LINK ${DOCTEST_INCLUDE}/doctest ${deps}/doctest SYMBOLIC)

# Two compilers at once (execute_process runs its commands concurrently, as a pipeline; a compiler
# neither reads stdin nor writes stdout): conformance_test.cpp, about 60% of the work, beside the
# other two, so the test takes the longest compile's time rather than the sum. CTest counts it as
# one processor, so under `ctest -j 2` the second compiler shares a core with the short tests that
# run beside it (on 2 cores ctest's wall time went from ~123 to ~91 s). Objects go to WORK_DIR, then
# one static link.
set(binary ${WORK_DIR}/skim_simd_neon_tests)
set(flags -std=c++20 -O2 -pthread -DSKIM_SIMD_TEST_SCALE=0.1 -DSKIM_TEST_ARCH_BUILD -I${SOURCE_DIR}/include
          -I${SOURCE_DIR}/tests -isystem ${deps})
execute_process(
  COMMAND ${CXX} ${flags} -c ${SOURCE_DIR}/tests/exec/cpu/conformance_test.cpp
  COMMAND ${CXX} ${flags} -c ${SOURCE_DIR}/tests/main.cpp ${SOURCE_DIR}/tests/exec/cpu/simd_test.cpp
          ${SOURCE_DIR}/tests/summarize/score_paths_test.cpp
  WORKING_DIRECTORY ${WORK_DIR}
  RESULTS_VARIABLE compiled)
if(NOT compiled STREQUAL "0;0")
  message(FATAL_ERROR "aarch64 build of the simd suite failed (${compiled})")
endif()
execute_process(
  COMMAND ${CXX} -static -pthread ${WORK_DIR}/conformance_test.o ${WORK_DIR}/main.o ${WORK_DIR}/simd_test.o
          ${WORK_DIR}/score_paths_test.o -o ${binary}
  RESULT_VARIABLE built)
if(NOT built EQUAL 0)
  message(FATAL_ERROR "aarch64 link of the simd suite failed (${built})")
endif()
execute_process(COMMAND ${QEMU} ${binary} RESULT_VARIABLE ran)
if(NOT ran EQUAL 0)
  message(FATAL_ERROR "the simd suite under qemu-aarch64 failed (${ran})")
endif()
