# Warnings are errors for our own C code under gcc and clang; sanitizers for the debug preset.
function(nibble_strict target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter>
    # snprintf into fixed path buffers is checked where it matters; gcc's guesses are noise
    $<$<AND:$<COMPILE_LANGUAGE:C>,$<C_COMPILER_ID:GNU>>:-Wno-format-truncation>)
  target_compile_definitions(${target} PRIVATE _GNU_SOURCE)
endfunction()

if(NIBBLE_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-fsanitize=address,undefined> $<$<COMPILE_LANGUAGE:C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=address,undefined)
  # ASan does not see reads of uninitialized stack; filling it with a pattern makes such a read
  # fail the same way on every machine (an unterminated path, a huge count) instead of by luck
  include(CheckCCompilerFlag)
  check_c_compiler_flag(-ftrivial-auto-var-init=pattern NIBBLE_HAVE_AUTO_VAR_INIT)
  if(NIBBLE_HAVE_AUTO_VAR_INIT)
    add_compile_options($<$<COMPILE_LANGUAGE:C>:-ftrivial-auto-var-init=pattern>)
  endif()
endif()
if(NIBBLE_NATIVE)
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-march=native>)
endif()
if(NIBBLE_FUZZ)
  # coverage instrumentation everywhere (the library included); the fuzz targets link libFuzzer itself
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "NIBBLE_FUZZ needs clang (libFuzzer): configure with the fuzz preset")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link>)
endif()
