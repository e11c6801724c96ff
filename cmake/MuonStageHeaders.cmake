# muon_stage_headers(<out_dir> <src_dir> [LEAVE_OUT <entry>...])
#
# Makes <out_dir> a view of <src_dir> without the entries named in LEAVE_OUT
# (files or folders directly under <src_dir>) and without its .cpp files: one
# symbolic link per other entry, so that edits to a header show through and
# the compiler's diagnostics and dependencies follow the links to the
# sources. Remade at every configure; a header added to <src_dir> reruns
# the configure (CONFIGURE_DEPENDS). Used to compile the core with an include
# path that holds no distributed header.
function(muon_stage_headers out_dir src_dir)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "LEAVE_OUT")
  file(GLOB entries CONFIGURE_DEPENDS LIST_DIRECTORIES true RELATIVE "${src_dir}" "${src_dir}/*")
  file(REMOVE_RECURSE "${out_dir}")  # removes the links, never what they point to
  file(MAKE_DIRECTORY "${out_dir}")
  foreach(entry IN LISTS entries)
    if(entry IN_LIST arg_LEAVE_OUT OR entry MATCHES "\\.cpp$")
      continue()
    endif()
    file(CREATE_LINK "${src_dir}/${entry}" "${out_dir}/${entry}" SYMBOLIC)
  endforeach()
endfunction()
