add_library(deja_options INTERFACE)
target_compile_options(deja_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
target_include_directories(deja_options INTERFACE ${PROJECT_SOURCE_DIR})
