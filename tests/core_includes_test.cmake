# The core includes nothing from the distributed layer: no
# `#include` of a path with a "distributed/" or "dist/" folder in it
# (muon/distributed/..., src/distributed/... reached from src/ by the including file's own
# folder, torch/csrc/distributed/...) in src/ outside src/distributed/, nor in the
# public headers outside include/muon/distributed/ (and the forwarding
# headers of its former path, include/muon/dist/) but the umbrella muon.h.
# The core target's include path (CMakeLists.txt, muon_core) already stops
# every form but the relative one at compile time; this names them all.
#
#   cmake -DMUON_SOURCE_DIR=<source dir> -P core_includes_test.cmake
if(NOT MUON_SOURCE_DIR)
  message(FATAL_ERROR "MUON_SOURCE_DIR is not set")
endif()
file(GLOB_RECURSE files RELATIVE "${MUON_SOURCE_DIR}"
  "${MUON_SOURCE_DIR}/src/*.h" "${MUON_SOURCE_DIR}/src/*.cpp"
  "${MUON_SOURCE_DIR}/include/muon/*.h")
set(checked 0)
set(found "")
foreach(f IN LISTS files)
  if(f MATCHES "^src/distributed/" OR f MATCHES "^include/muon/distributed/" OR
     f MATCHES "^include/muon/dist/" OR f STREQUAL "include/muon/muon.h")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${MUON_SOURCE_DIR}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]*/)?dist(ributed)?/")
  foreach(line IN LISTS lines)
    string(APPEND found "  ${f}: ${line}\n")
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no core source found under ${MUON_SOURCE_DIR}")
endif()
if(found)
  message(FATAL_ERROR "the core includes the distributed layer:\n${found}")
endif()
message(STATUS "${checked} core files include nothing from the distributed layer")
