// The deja-lab subcommands: collecting training rows, training the Deja Vu predictors and the
// Locret retaining heads, and the quality studies (perplexity, important-token loading). Each
// takes argv from the position after its name and returns the process exit code; errors are
// printed as "deja-lab <command>: <message>".
#pragma once

namespace deja::cli {

int RunCollect(int argc, char** argv, int first);
int RunTrainPredictors(int argc, char** argv, int first);
int RunTrainRetaining(int argc, char** argv, int first);
int RunPerplexity(int argc, char** argv, int first);
int RunPrefixEval(int argc, char** argv, int first);

}  // namespace deja::cli

#include "cli/log_setup.h"  // Fail
