# Generates the LuaJIT FFI declarations from the public headers at build time (DESIGN.md §3):
# the C preprocessor expands core/include/nibble/nibble.h with -DNB_FFI_CDEF, then
# cmake/nibble_cdef.lua keeps what came from our headers and checks it with ffi.cdef.
# The depfile makes any header that nibble.h includes (now or later) retrigger the generation.
function(nibble_generate_cdef target output)
  set(incdir ${CMAKE_SOURCE_DIR}/core/include)
  set(pre ${CMAKE_CURRENT_BINARY_DIR}/nibble_ffi.i)
  file(GLOB NIBBLE_PUBLIC_HEADERS CONFIGURE_DEPENDS ${incdir}/nibble/*.h)
  add_custom_command(
    OUTPUT ${pre}
    COMMAND ${CMAKE_C_COMPILER} -E -dD -DNB_FFI_CDEF -I${incdir} -MD -MF ${pre}.d -MT ${pre}
            ${incdir}/nibble/nibble.h -o ${pre}
    DEPENDS ${incdir}/nibble/nibble.h ${NIBBLE_PUBLIC_HEADERS}
    DEPFILE ${pre}.d
    COMMENT "Preprocessing the public headers for the Lua FFI"
    VERBATIM)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${LUAJIT_EXECUTABLE} ${CMAKE_SOURCE_DIR}/cmake/nibble_cdef.lua ${pre} ${incdir}/nibble ${output}
    DEPENDS ${pre} ${CMAKE_SOURCE_DIR}/cmake/nibble_cdef.lua
    COMMENT "Generating the LuaJIT FFI declarations ${output}"
    VERBATIM)
  add_custom_target(${target} ALL DEPENDS ${output})
endfunction()
