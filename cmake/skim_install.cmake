# Install rules: headers, the skim::skim (and, if built, skim::cuda) export, and a package
# config so that find_package(skim CONFIG) works from the install prefix.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Header-only and architecture independent, so the package files go under share/.
set(SKIM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_DATADIR}/cmake/skim CACHE STRING
  "Where skim's CMake package files are installed, relative to the prefix")

install(TARGETS skim EXPORT skimTargets
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILE_SET cuda_headers DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT skimTargets NAMESPACE skim:: DESTINATION ${SKIM_INSTALL_CMAKEDIR})

if(TARGET skim_cuda)
  install(TARGETS skim_cuda EXPORT skimCudaTargets)
  install(EXPORT skimCudaTargets NAMESPACE skim:: DESTINATION ${SKIM_INSTALL_CMAKEDIR})
endif()

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/skimConfig.cmake.in
  ${PROJECT_BINARY_DIR}/skimConfig.cmake
  INSTALL_DESTINATION ${SKIM_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/skimConfigVersion.cmake
  COMPATIBILITY SameMinorVersion
  ARCH_INDEPENDENT)
install(FILES
  ${PROJECT_BINARY_DIR}/skimConfig.cmake
  ${PROJECT_BINARY_DIR}/skimConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/skim_dependencies.cmake
  DESTINATION ${SKIM_INSTALL_CMAKEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/skim)
