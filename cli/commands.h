// The deja subcommands. Each takes argv from the position after its name and returns the
// process exit code; errors are printed as "deja <command>: <message>".
#pragma once

namespace deja::cli {

int RunGenerate(int argc, char** argv, int first);
int RunPerplexity(int argc, char** argv, int first);
int RunPrefixEval(int argc, char** argv, int first);
int RunBench(int argc, char** argv, int first);
int RunBenchKv(int argc, char** argv, int first);
int RunWorker(int argc, char** argv, int first);
int RunServe(int argc, char** argv, int first);
int RunCoordinator(int argc, char** argv, int first);
int RunClient(int argc, char** argv, int first);
int RunCollect(int argc, char** argv, int first);
int RunTrainPredictors(int argc, char** argv, int first);
int RunTrainRetaining(int argc, char** argv, int first);
int RunQuantize(int argc, char** argv, int first);

// Prints the status to stderr and returns 1 (2 for usage errors).
}  // namespace deja::cli

#include "common/status.h"

namespace deja::cli {

int Fail(const char* command, const Status& status);

}  // namespace deja::cli
