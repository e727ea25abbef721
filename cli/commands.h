// The deja subcommands. Each takes argv from the position after its name and returns the
// process exit code; errors are printed as "deja <command>: <message>".
#pragma once

namespace deja::cli {

int RunGenerate(int argc, char** argv, int first);
int RunBench(int argc, char** argv, int first);
int RunBenchKv(int argc, char** argv, int first);
int RunWorker(int argc, char** argv, int first);
int RunServe(int argc, char** argv, int first);
int RunCoordinator(int argc, char** argv, int first);
int RunClient(int argc, char** argv, int first);
int RunQuantize(int argc, char** argv, int first);

}  // namespace deja::cli

#include "cli/log_setup.h"  // Fail
