// Placeholder translation unit until the backends land (replaced by the kernels work).
#include "kernels/backend.h"
