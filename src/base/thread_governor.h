// The worker team under a busy neighbour. A team of N spinning OpenMP threads on N cores
// that other processes also want runs far slower than its share: at every barrier the
// team waits for whichever thread is preempted, while the others spin through their own
// time slices (one `yes` on one of two cores made a training step 3.3x slower, where
// two thirds of each core, 1.5x, would be fair). adapt_threads_to_contention(), called
// once a step by the stepping thread (a training step, a serving engine step, a generated
// token), measures how long this process's threads waited on a run queue for a CPU
// (/proc/self/task/*/schedstat) against how long they ran: when more than 15% of their
// runnable time was waiting, the team shrinks to the cores it actually gets; when
// waiting falls under 5%, it tries one thread more after 2 s (then 4, 8... up to 32 s
// while such tries keep failing), never past the configured count (--threads,
// HYPERION_THREADS, the cores). Our kernels' reductions are fixed by the data, not the
// team (docs/KERNELS.md), so a changed count changes no result of theirs; a GEMM left to
// oneDNN may differ in its last bits. HYPERION_ADAPT_THREADS=0 turns it off.
#pragma once

namespace hyperion {

// Looks at most every 200 ms; cheap otherwise (a clock read).
void adapt_threads_to_contention();

}  // namespace hyperion
