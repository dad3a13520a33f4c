// A multi-host job's links, measured before the first step. A host whose network is slow
// slows every collective, and so every rank equally: the step-time straggler detection
// (train/training_monitor.cc) cannot tell which host it is. This check can: in round k
// (1, 2, 3) every rank sends a block to rank r + k while receiving one from rank r - k,
// point to point, and times it. A slow host slows itself and its two partners of each
// round, but only itself in every round, since the partners change with k; with four
// ranks or more some rank is fast in every round, and a rank slower than `factor` times
// the round's fastest in all rounds is named. With two or three ranks every rank has the
// slow link in some round: the rates are logged, nobody is named.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace hyperion {

struct LinkCheck {
  int rounds = 0;
  std::vector<std::vector<double>> seconds;  // [round][rank]: this rank's exchange time
  std::vector<double> median;                // [round]
  std::vector<int> slow_ranks;               // above `factor` x the fastest, every round
  // Per rank: bits sent and received over its fastest round's time; and their median.
  std::vector<double> gbit;
  double gbit_median = 0;
};

// Collective: every rank calls it. `bytes` per exchange; a warm-up exchange per round
// first (Open MPI opens TCP connections on first use). Empty for a single host.
LinkCheck check_links(dist::Communicator& comm, size_t bytes = size_t(4) << 20,
                      double factor = 3.0);

// "host h3 (rank 2): 0.10 Gb/s to and from its peers against a median of 0.96 Gb/s";
// empty when no rank is slow.
std::string describe_slow_links(const dist::Communicator& comm, const LinkCheck& check);

}  // namespace hyperion
