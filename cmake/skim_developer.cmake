# Settings for skim's own tests, examples and benchmarks — never for the exported targets.
include_guard(GLOBAL)

# skim_developer_target(<target>): warnings, and SKIM_SANITIZE if set, on one of skim's own
# targets. Warnings are not errors: others add code in parallel, and a new compiler's new
# warning should not break a user's build of the tests.
function(skim_developer_target target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:-Wall;-Wextra;-Wpedantic>")
  if(SKIM_SANITIZE)
    # Stop at the first report so that ctest sees a failure.
    set(_flags -fsanitize=${SKIM_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>")
    target_link_options(${target} PRIVATE ${_flags})
  endif()
endfunction()
