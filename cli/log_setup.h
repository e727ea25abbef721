// Logging for every command (glog): to stderr always; with `--log-dir DIR` also to files there
// (one per process and severity, glog's naming); `-v N` (or `--v=N`) turns on VLOG(N) lines.
// These flags are taken out of argv before the command parses its own, and exported to the
// environment (DEJA_LOG_DIR, DEJA_VLOG) so that the workers `deja serve` starts log the same
// way. Each line's prefix names the process's part: `rank R/W` on workers, `coordinator` on
// serve and coordinator processes.
#pragma once

#include <string>

#include "common/status.h"

namespace deja::cli {

// Returns the new argc (argv compacted in place); exits with status 2 and a message on a bad
// value.
int SetUpLogging(int argc, char** argv);
// The binary's name as invoked (deja, deja-lab), for usage lines and errors.
const char* ProgramName();
std::string& ProgramNameStorage();
// Prints "<program> <command>: <status>" to stderr; returns the exit code (2 for
// INVALID_ARGUMENT, 1 otherwise).
int Fail(const char* command, const Status& status);

}  // namespace deja::cli
