# ctest: skim-kv-error on its own small random input (--self-test) prints the table with every K/V row
# and only finite numbers; no ordering of the errors is assumed. A missing file and K/V of different
# shapes each give exit status 2 and one line on stderr.
#   cmake -DSKIM_KV_ERROR=<path to skim-kv-error> -DWORK_DIR=<scratch dir> -P kv_error_test.cmake
if(NOT SKIM_KV_ERROR OR NOT WORK_DIR)
  message(FATAL_ERROR "pass -DSKIM_KV_ERROR=... -DWORK_DIR=...")
endif()
file(REMOVE_RECURSE ${WORK_DIR})

execute_process(COMMAND ${SKIM_KV_ERROR} --self-test ${WORK_DIR} --threads 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "skim-kv-error --self-test exited with '${rc}'; stderr: ${err}")
endif()
foreach(name IN ITEMS "fp32" "bf16" "fp16" "int8, scale per block" "fp8 e4m3, scale per block"
                      "int8, scale per head" "fp8 e4m3, scale per head")
  string(REGEX MATCH "\n\\| ${name} \\|[^\n]*" row "${out}")
  if(NOT row)
    message(FATAL_ERROR "no row '${name}' in:\n${out}")
  endif()
  # bytes/elem, then three metrics as "mean | worst (Ln)".
  set(num "[0-9]+\\.[0-9]+(e[-+][0-9]+)?")
  set(cell " \\| ${num} \\| ${num} \\(L[0-9]+\\)")
  if(NOT row MATCHES "^\n\\| ${name} \\| ${num}${cell}${cell}${cell} \\|$")
    message(FATAL_ERROR "row '${name}' does not hold finite numbers: ${row}")
  endif()
endforeach()

function(expect_bad_input what expected)
  execute_process(COMMAND ${SKIM_KV_ERROR} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(STRIP "${err}" line)
  string(FIND "${line}" "\n" newline)
  if(NOT rc EQUAL 2 OR NOT newline EQUAL -1 OR NOT line MATCHES "^skim-kv-error: .*${expected}")
    message(FATAL_ERROR "${what}: expected exit status 2 and one line matching '${expected}', got '${rc}' and: ${err}")
  endif()
  message(STATUS "ok: ${line}")
endfunction()
expect_bad_input("missing file" "missing\\.npy"
                 --q ${WORK_DIR}/missing.npy --k ${WORK_DIR}/k.npy --v ${WORK_DIR}/v.npy)
expect_bad_input("K and V of different shapes" "differ in shape"
                 --q ${WORK_DIR}/q.npy --k ${WORK_DIR}/q.npy --v ${WORK_DIR}/v.npy)
expect_bad_input("bad option" "--block '0'" --self-test ${WORK_DIR} --block 0)
