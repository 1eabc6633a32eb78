// File: shared/model/cpu/worker_team.h
//
// The fused kernels' parallel loops run on one process-wide team of worker
// threads that spin briefly between loops and then sleep (docs/serving.md
// "Threads"), instead of OpenMP's teams.
//
// Why not OpenMP (at::parallel_for): libgomp keeps a team per calling
// thread, and the model services call from whichever gRPC handler thread
// took the request, so each step woke a team that had been asleep; and
// under OMP_WAIT_POLICY=PASSIVE (what scripts/run sets so that idle teams
// do not starve the coordinator) every one of a step's ~80 loops paid a
// futex wake-up. Measured on the 5x widening at q8_0, 2 threads, one
// autoregressive step: 4.5 ms spinning, 7.2 ms PASSIVE (one thread: 6.7
// ms), and through the services 7.6-8.1 ms. A team shared by every caller,
// spinning for a bounded time after each loop (the loops of a step follow
// each other within microseconds) and sleeping after it (the gap between
// two steps is a round trip through the coordinator), keeps the step's
// loops on warm threads and leaves the cores to the other processes between
// steps; llama.cpp's CPU backend polls its own thread pool the same way.
//
// Results do not depend on the team: a loop's parts are fixed by `parts`
// and the range alone, whichever threads run them.
#ifndef LEDE_SHARED_MODEL_CPU_WORKER_TEAM_H_
#define LEDE_SHARED_MODEL_CPU_WORKER_TEAM_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace lede::model::cpu {

// Runs fn(part, begin, end) for part in [0, parts) over [0, n) split into
// `parts` contiguous ranges (part p gets [n p / parts, n (p + 1) / parts);
// empty ranges are skipped), part 0 on the calling thread and the others on
// the team's workers, and returns when every part has run. Parts run on
// distinct threads at once, so `part` may index per-thread scratch.
//
// Threading: any thread may call it. One loop runs on the team at a time: a
// call made while another thread's loop holds the team (or from inside a
// part) runs its parts one after another on the calling thread, with the
// same ranges. parts <= 1 runs on the caller. The team grows to the largest
// parts - 1 asked for and lives until the process exits. fn must not throw.
void ParallelFor(int parts, int64_t n, absl::FunctionRef<void(int part, int64_t begin, int64_t end)> fn);

// Distinct threads that ran the parts of ParallelFor(parts, parts, ...)
// from the calling thread just now: `parts` when the team was free, 1 when
// it was held by another loop.
int ParallelForThreads(int parts);

}  // namespace lede::model::cpu

#endif  // LEDE_SHARED_MODEL_CPU_WORKER_TEAM_H_
