# Finds skim's dependencies; included by the top-level CMakeLists.txt and by the installed
# skimConfig.cmake so that a consumer sees exactly what skim's own build saw.
if(DEFINED CMAKE_FIND_PACKAGE_NAME)
  # Inside find_package(skim): find_dependency forwards QUIET/REQUIRED and, on failure, sets
  # skim_FOUND to false (skimConfig.cmake checks it after including this file).
  include(CMakeFindDependencyMacro)
  find_dependency(xsimd 8 CONFIG)
  find_dependency(Eigen3 3.4 NO_MODULE)
else()
  # skim's own build, or an engine's add_subdirectory(skim): fail early with CMake's message.
  find_package(xsimd 8 CONFIG REQUIRED)
  find_package(Eigen3 3.4 REQUIRED NO_MODULE)
endif()

# Debian 12's xsimd 8.1 package exports a target that links "xtl", but ships no xtl package
# (xsimd needs xtl only for its optional xtl::complex support, which skim does not use).
# Without a target of that name the linker is asked for -lxtl and fails, so stand in an empty one.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_skim_xsimd_libs xsimd INTERFACE_LINK_LIBRARIES)
  if(_skim_xsimd_libs MATCHES "(^|;)xtl(;|$)")
    add_library(xtl INTERFACE IMPORTED)
  endif()
  unset(_skim_xsimd_libs)
endif()
