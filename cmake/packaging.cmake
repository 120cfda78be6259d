# Debian packages with CPack (scripts/package.sh; docs/packaging.md), one per
# install component:
#   librdmakit0     (runtime) librdmakit.so.0, librdmakit-session.so.0,
#                             librdmakit-stream.so.0, librdmakit-preload.so
#   librdmakit-dev  (dev)     headers, the .so links of the three libraries,
#                             CMake package config, pkg-config files
#   rdmakit-tools   (tools)   every binary tools/ and apps/ install (a rule
#                             without COMPONENT lands here), man pages,
#                             systemd units, config files
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rdmakit)
set(CPACK_PACKAGE_VENDOR rdmakit)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "rdmakit maintainers <maintainers@rdmakit.example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "C++20 RDMA communication stack")
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends on shared libraries from dpkg-shlibdeps; librdmakit0 ships a
# shlibs file so that the other two find it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The libraries of this build (not yet installed; all three in the build
# directory's top): the Depends on librdmakit0 itself is the explicit one
# below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(rdmakit_deb_version ${PROJECT_VERSION})

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME librdmakit0)
# A shlibs file (librdmakit 0, librdmakit-session 0, librdmakit-stream 0:
# librdmakit0 (= VERSION)) and the ldconfig trigger (lintian: no-shlibs,
# lacks-ldconfig-trigger).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/debian/triggers)
string(CONCAT CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "C++20 RDMA communication stack: shared libraries\n"
    "rdmakit gives verbs semantics (queue pairs, one-sided READ/WRITE, atomics)\n"
    "over RDMA NICs (verbs), shared memory (shm) and TCP. This package holds\n"
    "librdmakit.so.0 (the core), librdmakit-session.so.0 (sessions),\n"
    "librdmakit-stream.so.0 (byte streams) and librdmakit-preload.so, which\n"
    "runs unmodified socket programs over rdmakit streams (see rdmakit-run(1)).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME librdmakit-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# What find_package(rdmakit) and rdmakit.pc ask for (RDMAKIT_PC_REQUIRES).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "librdmakit0 (= ${rdmakit_deb_version}), libfmt-dev, libspdlog-dev, libsodium-dev")
if(RDMAKIT_PC_REQUIRES MATCHES "libibverbs")
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libibverbs-dev, librdmacm-dev")
endif()
string(CONCAT CPACK_COMPONENT_DEV_DESCRIPTION
    "C++20 RDMA communication stack: development files\n"
    "Headers, the CMake package (find_package(rdmakit): rdmakit::rdmakit,\n"
    "rdmakit::session, rdmakit::stream) and pkg-config files (rdmakit,\n"
    "rdmakit-session, rdmakit-stream).")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME rdmakit-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
# python3: rdmakit-mesh-heatmap.py (rdmakit-mesh -o), which also recommends
# matplotlib for its PNG.
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS
    "librdmakit0 (= ${rdmakit_deb_version}), passwd, python3:any")
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "python3-matplotlib")
set(CPACK_DEBIAN_TOOLS_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
    ${PROJECT_SOURCE_DIR}/packaging/debian/postrm
    ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles)
string(CONCAT CPACK_COMPONENT_TOOLS_DESCRIPTION
    "C++20 RDMA communication stack: tools and daemons\n"
    "rdmakit-perf, rdmakit-info, rdmakit-run, rdmakit-cp, rdmakit-kv,\n"
    "rdmakit-mesh, rdmakit-pingpong (and the other tools of the build), their\n"
    "man pages, and systemd units for the rdmakit-cp and rdmakit-kv daemons.")
include(CPack)
