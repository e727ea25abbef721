# FindGloo: Gloo (Debian's libgloo-dev) with its TCP transport, as the imported target Gloo::gloo.
# Debian ships a GlooConfig.cmake whose target only names a RelWithDebInfo location and does not
# say which transports were built, so this module finds the files itself and checks for TCP.
find_path(Gloo_INCLUDE_DIR gloo/transport/tcp/device.h)
find_library(Gloo_LIBRARY NAMES gloo PATHS /usr/lib /usr/lib/x86_64-linux-gnu)

set(Gloo_HAVE_TCP FALSE)
if(Gloo_INCLUDE_DIR AND EXISTS "${Gloo_INCLUDE_DIR}/gloo/config.h")
  file(STRINGS "${Gloo_INCLUDE_DIR}/gloo/config.h" _gloo_tcp
       REGEX "^#define GLOO_HAVE_TRANSPORT_TCP 1")
  if(_gloo_tcp)
    set(Gloo_HAVE_TCP TRUE)
  endif()
  unset(_gloo_tcp)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Gloo REQUIRED_VARS Gloo_LIBRARY Gloo_INCLUDE_DIR Gloo_HAVE_TCP)

if(Gloo_FOUND AND NOT TARGET Gloo::gloo)
  add_library(Gloo::gloo UNKNOWN IMPORTED)
  set_target_properties(Gloo::gloo PROPERTIES
    IMPORTED_LOCATION "${Gloo_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Gloo_INCLUDE_DIR}")
endif()
mark_as_advanced(Gloo_INCLUDE_DIR Gloo_LIBRARY)
