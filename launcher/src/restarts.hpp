// --max-restarts (torchrun's, on one node): when an attempt of the job fails, nodalrun stops every
// rank as always, drops the arena (the next attempt gets a fresh one) and starts the whole job
// again, up to N times. Ranks see NODAL_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT; the report
// lists every attempt. What is not restarted: a job that succeeded, was interrupted (SIGINT,
// SIGTERM, SIGHUP), passed --timeout (the whole job's), or could not start its program at all.
#pragma once

#include <string>

#include "options.hpp"

namespace nodal::launcher {

/// Runs the job, restarting it as --max-restarts allows; prints every attempt's failure report
/// and writes --report. Returns nodalrun's exit code: 0 once an attempt succeeds, else the last
/// attempt's code. Throws as Supervisor::run does.
int run_job(const Options& options, const std::string& program);

}  // namespace nodal::launcher
