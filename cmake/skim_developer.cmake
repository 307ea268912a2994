# Settings for skim's own tests, examples and benchmarks — never for the exported targets.
include_guard(GLOBAL)

# Off by default, so that a newer compiler's new warning does not break a user's build of the
# tests; scripts/test (and with it CI) turns it on, so that skim's own code stays warning-free.
option(SKIM_WERROR "Treat warnings in skim's own tests, examples and benchmarks as errors" OFF)

# GCC 12's avx512fintrin.h builds results from _mm512_undefined_*() ("__m512 __Y = __Y;"), which
# -Wmaybe-uninitialized (-Wuninitialized at -O1) reports at every inlined use of such an intrinsic
# (GCC bug 105593, fixed in GCC 13): hundreds of reports inside the compiler's own header for
# xsimd's and Eigen's AVX-512 kernels. The options below silence those two warnings in code built
# with AVX-512 flags on GCC < 13.
set(_skim_gcc12 "$<AND:$<COMPILE_LANG_AND_ID:CXX,GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>")
set(SKIM_AVX512_WARNING_OPTIONS "$<${_skim_gcc12}:-Wno-uninitialized>" "$<${_skim_gcc12}:-Wno-maybe-uninitialized>")
unset(_skim_gcc12)

# skim_developer_target(<target> [AVX512]): warnings (errors with SKIM_WERROR), and SKIM_SANITIZE
# if set, on one of skim's own targets. AVX512: the target is built with AVX-512 flags (above).
function(skim_developer_target target)
  cmake_parse_arguments(PARSE_ARGV 1 _skim "AVX512" "" "")
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:-Wall;-Wextra;-Wpedantic>")
  if(SKIM_WERROR)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:-Werror>")
  endif()
  if(_skim_AVX512)
    target_compile_options(${target} PRIVATE ${SKIM_AVX512_WARNING_OPTIONS})
  endif()
  if(SKIM_SANITIZE)
    # Stop at the first report so that ctest sees a failure.
    set(_flags -fsanitize=${SKIM_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>")
    target_link_options(${target} PRIVATE ${_flags})
  endif()
endfunction()
