# Compiler warnings for the project's own targets (LibTorch headers are
# system headers and stay quiet).
function(muon_set_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wnon-virtual-dtor
      -Woverloaded-virtual -Wno-unused-parameter)
    if(MUON_WARNINGS_AS_ERRORS)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  endif()
endfunction()
