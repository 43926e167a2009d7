# Install layout (under the prefix):
#   include/ferry/*.hpp
#   lib/libferry.so.<ver>, lib/libferry.so.<major.minor>, lib/libferry.so, lib/libferry.a
#   lib/cmake/ferry/ferryConfig.cmake, ferryConfigVersion.cmake, ferryTargets*.cmake
#   lib/pkgconfig/ferry.pc
#   bin/ferry (when the tools are built)
include(CMakePackageConfigHelpers)

set(FERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

install(TARGETS ferry_shared ferry_static EXPORT ferryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${FERRY_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ferryConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ferryConfig.cmake
                              INSTALL_DESTINATION ${FERRY_CMAKE_DIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ferryConfig.cmake ${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
        DESTINATION ${FERRY_CMAKE_DIR})

# ferry.pc finds its prefix from its own place, so a relocated install (DESTDIR, --prefix at
# install time) stays right.
file(RELATIVE_PATH FERRY_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
configure_file(${PROJECT_SOURCE_DIR}/cmake/ferry.pc.in ${PROJECT_BINARY_DIR}/ferry.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

if(FERRY_BUILD_TOOLS)
  install(TARGETS ferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/NOTICE
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/ferry)
