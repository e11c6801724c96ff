# Installs the built library into WORK_DIR/prefix, then configures, builds
# and runs examples/cmake_consumer against that prefix alone.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${MUON_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${MUON_SOURCE_DIR}/examples/cmake_consumer -B ${WORK_DIR}/build
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)

# The installed Python package imports from the prefix and runs on the
# installed libmuon.
if(PYTHON_EXECUTABLE AND PYTHON_PACKAGE_DIR)
  # One statement per line: a ';' would split the CMake argument.
  set(check "import torch, muon_cpp
assert muon_cpp.__file__.startswith('${WORK_DIR}/prefix'), muon_cpp.__file__
x = muon_cpp.newton_schulz(torch.randn(8, 16))
print('installed muon_cpp ok', tuple(x.shape))")
  run(${CMAKE_COMMAND} -E env PYTHONPATH=${WORK_DIR}/prefix/${PYTHON_PACKAGE_DIR} ${PYTHON_EXECUTABLE} -c "${check}")
endif()
