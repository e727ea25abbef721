// Exit codes the deja commands share with the processes that supervise them.
#pragma once

namespace deja {

// A worker whose model (checkpoint, predictors, retaining heads, prefix-cache files) cannot be
// loaded: starting it again would fail the same way, so `deja serve` stops and exits.
inline constexpr int kExitCannotLoad = 3;

}  // namespace deja
