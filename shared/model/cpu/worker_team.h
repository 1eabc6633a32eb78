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
// A loop's work is cut into chunks that the threads claim one at a time, so
// a worker that is late (still waking, or preempted by another process on a
// full machine) leaves its share to a thread done with its own instead of
// holding the loop up. Through the split deployment at 2 threads (5x
// widening, q8_0; 4 interleaved rounds), with one fixed range per thread
// autoregressive decoding ran 148-153 tok/s and LEDE 154-199; with a chunk
// per thread claimed in turn, 164-183 and 172-225. Keeping the workers
// from sleeping at all (a 3 ms poll) was no cure: the drafter's and the
// verifier's teams then spun against each other (docs/serving.md
// "Threads").
//
// Results do not depend on the team: the chunks are fixed by the range and
// the grain alone, whichever threads run them.
#ifndef LEDE_SHARED_MODEL_CPU_WORKER_TEAM_H_
#define LEDE_SHARED_MODEL_CPU_WORKER_TEAM_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace lede::model::cpu {

// Runs fn(thread, begin, end) for every chunk of [0, n): chunk c is
// [c grain, min(n, (c + 1) grain)), grain >= 1 (a smaller one is taken as
// 1; more than kMaxChunks chunks coarsen the grain to n / kMaxChunks
// rounded up). Up to `threads` threads run them, the caller and threads - 1
// team workers, each claiming the next chunk not yet claimed until none is
// left; returns when every chunk has run. `thread` in [0, threads) is
// distinct among the threads running chunks at once, so it may index
// per-thread scratch; which chunks a thread runs varies from call to call.
//
// Threading: any thread may call it. One loop runs on the team at a time: a
// call made while another thread's loop holds the team (or from inside a
// chunk) runs its chunks in order on the calling thread as thread 0.
// threads <= 1 runs on the caller. The team grows to the largest threads - 1
// asked for and lives until the process exits. fn must not throw.
inline constexpr int64_t kMaxChunks = 0xffff;
void ParallelFor(int threads, int64_t n, int64_t grain,
                 absl::FunctionRef<void(int thread, int64_t begin, int64_t end)> fn);

// Distinct threads that ran the chunks of ParallelFor(threads, threads, 1,
// ...) from the calling thread just now, each chunk waiting (up to 2 s in
// all) until `threads` threads have joined: `threads` when the team was
// free and the workers could run, 1 when it was held by another loop.
int ParallelForThreads(int threads);

}  // namespace lede::model::cpu

#endif  // LEDE_SHARED_MODEL_CPU_WORKER_TEAM_H_
