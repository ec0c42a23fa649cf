#!/bin/sh
# CMAKE_STRIP for the packages (build-deb.sh): strip as Debian's dh_strip
# does, also dropping the .comment and .note sections (compiler version
# strings; lintian: binary-has-unneeded-section). CMake's install calls it
# with the file as the last argument.
exec strip --remove-section=.comment --remove-section=.note "$@"
