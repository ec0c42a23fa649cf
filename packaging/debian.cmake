# The four Debian packages (packaging/build-deb.sh configures with
# -DBURNSTORE_DEBIAN=ON and runs cpack): one per install component,
#   burnstore          bin: /usr/bin/burnstore, /sbin/mount.burnstore (beside
#                      fuse3's mount.fuse3: mount(8) looks in /sbin), man pages
#   libburnstore0.2    lib: libburnstore.so.0.2.0 and its SONAME link (Debian
#                      names a library package after its SONAME, libburnstore.so.0.2:
#                      it moves with every ABI break, and the package name with it)
#   libburnstore-dev   dev: burnstore.h, the libburnstore.so link, burnstore.pc,
#                      the docs' examples
#   python3-burnstore  python: the ctypes module in /usr/lib/python3/dist-packages
#                      (Architecture: all)
# each with its copyright and changelog.Debian.gz in /usr/share/doc/PACKAGE,
# man pages gzipped -9n (no name or time in the gzip header: reproducible).
# packaging/lintian.md lists what lintian said and what fixed it.
get_target_property(BS_SOVERSION burnstore_shared SOVERSION)
set(BS_DEB_LIB libburnstore${BS_SOVERSION})
set(BS_DEB_REVISION 1)
set(BS_DEB_VERSION ${PROJECT_VERSION}-${BS_DEB_REVISION})
set(BS_DEB_DIR ${CMAKE_BINARY_DIR}/debian)
set(BS_DOCDIR ${CMAKE_INSTALL_DATAROOTDIR}/doc)
file(MAKE_DIRECTORY ${BS_DEB_DIR}/man1 ${BS_DEB_DIR}/man8)

# gzip -9n, at build time.
set(BS_DEB_GZ)
function(bs_deb_gzip src out)
  add_custom_command(OUTPUT ${out} COMMAND sh -c "gzip -9n -c \"$0\" >\"$1\"" ${src} ${out}
                     DEPENDS ${src} VERBATIM)
  set(BS_DEB_GZ ${BS_DEB_GZ} ${out} PARENT_SCOPE)
endfunction()
foreach(sec 1 8)
  foreach(page ${BS_MAN${sec}})
    get_filename_component(name ${page} NAME)
    bs_deb_gzip(${page} ${BS_DEB_DIR}/man${sec}/${name}.gz)
    install(FILES ${BS_DEB_DIR}/man${sec}/${name}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sec}
            COMPONENT bin)
  endforeach()
endforeach()
bs_deb_gzip(${CMAKE_SOURCE_DIR}/packaging/changelog ${BS_DEB_DIR}/changelog.Debian.gz)

# The symbols file: packaging/libburnstore.symbols, kept by hand (every
# exported function and the version it came in; its Build-Depends-Package
# line names the -dev package for dpkg-shlibdeps), checked against the built
# library by dpkg-gensymbols -c4: a function added, removed or renamed fails
# the build until the file says so (and a removal moves the SOVERSION).
file(STRINGS ${CMAKE_SOURCE_DIR}/packaging/libburnstore.symbols _bs_sym0 LIMIT_COUNT 1)
if(NOT _bs_sym0 STREQUAL "libburnstore.so.${BS_SOVERSION} ${BS_DEB_LIB} #MINVER#")
  message(FATAL_ERROR "packaging/libburnstore.symbols begins '${_bs_sym0}', not "
                      "'libburnstore.so.${BS_SOVERSION} ${BS_DEB_LIB} #MINVER#'")
endif()
add_custom_command(OUTPUT ${BS_DEB_DIR}/symbols
                   COMMAND dpkg-gensymbols -q -c4 -p${BS_DEB_LIB} -v${PROJECT_VERSION}
                           -e$<TARGET_FILE:burnstore_shared>
                           -I${CMAKE_SOURCE_DIR}/packaging/libburnstore.symbols
                           -O${BS_DEB_DIR}/symbols
                   DEPENDS burnstore_shared ${CMAKE_SOURCE_DIR}/packaging/libburnstore.symbols
                   VERBATIM)
add_custom_target(bs_debian ALL DEPENDS ${BS_DEB_GZ} ${BS_DEB_DIR}/symbols)

foreach(comp_pkg "bin;burnstore" "lib;${BS_DEB_LIB}" "dev;libburnstore-dev"
                 "python;python3-burnstore")
  list(GET comp_pkg 0 comp)
  list(GET comp_pkg 1 pkg)
  install(FILES ${CMAKE_SOURCE_DIR}/packaging/copyright ${BS_DEB_DIR}/changelog.Debian.gz
          DESTINATION ${BS_DOCDIR}/${pkg} COMPONENT ${comp})
endforeach()
# lintian is clean without overrides (packaging/lintian.md): 0.1.0-1 overrode
# initial-upload-closes-no-bugs, which a changelog of more than one entry no
# longer raises (an unused override fails tests/package/test_package.sh).
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/docs/user-guide.md
        DESTINATION ${BS_DOCDIR}/burnstore COMPONENT bin)
install(FILES ${CMAKE_SOURCE_DIR}/docs/library.md DESTINATION ${BS_DOCDIR}/libburnstore-dev
        COMPONENT dev)
install(FILES ${CMAKE_SOURCE_DIR}/docs/examples/list_tensors.c
              ${CMAKE_SOURCE_DIR}/docs/examples/read_f32.c ${CMAKE_SOURCE_DIR}/docs/examples/convert.c
        DESTINATION ${BS_DOCDIR}/libburnstore-dev/examples COMPONENT dev)

set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL bin lib dev python)
set(CPACK_PACKAGE_NAME burnstore)
set(CPACK_PACKAGE_CONTACT "burnstore maintainers <maintainers@users.noreply.a-seed-b015ea89.example>")
set(CPACK_DEBIAN_PACKAGE_RELEASE ${BS_DEB_REVISION})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# A shlibs file in every package with a shared library (the lib package):
# libburnstore 0.2 libburnstore0.2 (>= 0.2.0-1).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_BIN_PACKAGE_NAME burnstore)
set(CPACK_DEBIAN_BIN_PACKAGE_SECTION utils)
# The binary links the core statically (it calls private functions the
# library does not export), so it needs no libburnstore: fuse3 for fusermount3.
set(CPACK_DEBIAN_BIN_PACKAGE_DEPENDS "fuse3")
# https:// sources (hf://, s3://) verify TLS against the system's CA store.
set(CPACK_DEBIAN_BIN_PACKAGE_RECOMMENDS "ca-certificates")
set(CPACK_DEBIAN_LIB_PACKAGE_RECOMMENDS "ca-certificates")
set(CPACK_COMPONENT_BIN_DESCRIPTION "model checkpoints as directories of tensor files (FUSE)
burnstore mounts Burnpack, SafeTensors (also sharded), PyTorch and GGUF
checkpoints as directories of tensor files, read-only or writable (written
back on unmount), with mount -t burnstore and fstab support, and a
checkpoint CLI: burnstore ls, info, cat, diff and convert.")

# Until 0.1.0-1 one package, burnstore, held the library and the
# development files: the packages that hold them now take them over
# (Replaces) and make apt upgrade or remove that burnstore (Breaks), or dpkg
# refuses to overwrite its files. The version of the split, not the current.
set(BS_DEB_SPLIT "burnstore (<< 0.1.0-1)")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME ${BS_DEB_LIB})
set(CPACK_DEBIAN_LIB_PACKAGE_BREAKS ${BS_DEB_SPLIT})
set(CPACK_DEBIAN_LIB_PACKAGE_REPLACES ${BS_DEB_SPLIT})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# CPack's postinst and postrm call ldconfig; build-deb.sh replaces them with
# the ldconfig trigger (packaging/triggers) Debian uses.
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${BS_DEB_DIR}/symbols)
set(CPACK_COMPONENT_LIB_DESCRIPTION "model checkpoints as tensor catalogs (shared library)
libburnstore reads Burnpack, SafeTensors (also sharded), PyTorch and GGUF
checkpoints, local or by URL (HTTP range requests): it sniffs the format,
lists the tensors (name, dtype, shape, metadata), reads their bytes, raw or
decoded to F32, and writes checkpoints in any of those formats. A small C
API of opaque handles; the burnstore mount and CLI use the same core.
.
This package contains the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libburnstore-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${BS_DEB_LIB} (= ${BS_DEB_VERSION})")
set(CPACK_DEBIAN_DEV_PACKAGE_BREAKS ${BS_DEB_SPLIT})
set(CPACK_DEBIAN_DEV_PACKAGE_REPLACES ${BS_DEB_SPLIT})
set(CPACK_COMPONENT_DEV_DESCRIPTION "model checkpoints as tensor catalogs (development files)
libburnstore reads Burnpack, SafeTensors (also sharded), PyTorch and GGUF
checkpoints, local or by URL: it lists the tensors, reads their bytes, raw
or decoded to F32, and writes checkpoints in any of those formats.
.
This package contains the header (burnstore.h), the pkg-config file
(burnstore), the library's guide and three example programs.")

# The Python module: no compiled code (Architecture: all), on the library
# package of this SONAME (any release of it: the ABI is the SONAME's) and
# NumPy. Byte-compiled at install and cleaned at removal as dh_python3's
# maintainer scripts do (packaging/python3-burnstore/).
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-burnstore)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3:any, python3-numpy, ${BS_DEB_LIB} (>= ${BS_DEB_VERSION})")
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA
    "${CMAKE_SOURCE_DIR}/packaging/python3-burnstore/postinst;${CMAKE_SOURCE_DIR}/packaging/python3-burnstore/prerm")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "model checkpoints as NumPy arrays (Python 3)
The burnstore module opens Burnpack, SafeTensors (also sharded), PyTorch and
GGUF checkpoints, local or by URL, as read-only mappings of tensor names to
NumPy arrays (memory-mapped where a tensor is one range of a local file),
and saves mappings of arrays in any of those formats. It needs no FUSE: it
calls libburnstore through ctypes.")
include(CPack)
