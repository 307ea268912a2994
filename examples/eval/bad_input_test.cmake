# ctest: skim-eval on a malformed .npy must fail with exit status 2 and one line on stderr.
#   cmake -DSKIM_EVAL=<path to skim-eval> -DWORK_DIR=<scratch dir> -P bad_input_test.cmake
if(NOT SKIM_EVAL OR NOT WORK_DIR)
  message(FATAL_ERROR "pass -DSKIM_EVAL=... -DWORK_DIR=...")
endif()
file(MAKE_DIRECTORY ${WORK_DIR})
set(bad ${WORK_DIR}/malformed.npy)
file(WRITE ${bad} "\x93NUMPY this is not a header")
execute_process(
  COMMAND ${SKIM_EVAL} --q ${bad} --k ${bad} --v ${bad} --config summarizer=max_bound,block=16,k=4
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(STRIP "${err}" err_line)
string(FIND "${err_line}" "\n" newline)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "skim-eval exited with '${rc}', expected 2; stderr: ${err}")
endif()
if(NOT err_line MATCHES "^skim-eval: .*malformed\\.npy" OR NOT newline EQUAL -1)
  message(FATAL_ERROR "expected one line 'skim-eval: <file>: <problem>' on stderr, got: ${err}")
endif()
message(STATUS "ok: ${err_line}")
