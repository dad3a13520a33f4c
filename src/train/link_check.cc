#include "train/link_check.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace hyperion {

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sends `bytes` to rank + k and receives as much from rank - k (point to point: no other
// rank's link is waited for); returns the seconds.
double exchange(dist::Communicator& comm, int k, size_t bytes, std::vector<char>& send,
                std::vector<char>& recv) {
  const int n = comm.world_size(), r = comm.rank();
  const auto t0 = std::chrono::steady_clock::now();
  comm.sendrecv(send.data(), bytes, (r + k) % n, recv.data(), bytes, (r - k + n) % n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LinkCheck check_links(dist::Communicator& comm, size_t bytes, double factor) {
  LinkCheck out;
  const int n = comm.world_size();
  if (n < 2 || dist::hosts(comm).size() < 2) return out;
  out.rounds = std::min(3, n - 1);
  std::vector<char> send(bytes, 1), recv(bytes);
  out.seconds.assign(static_cast<size_t>(out.rounds), std::vector<double>(static_cast<size_t>(n)));
  for (int k = 1; k <= out.rounds; ++k) {
    exchange(comm, k, 4096, send, recv);  // connect
    comm.barrier();
    double mine = exchange(comm, k, bytes, send, recv);
    std::vector<double>& all = out.seconds[static_cast<size_t>(k - 1)];
    comm.all_gather(&mine, all.data(), sizeof mine);
    out.median.push_back(median_of(all));
  }
  // Slow in every round against that round's fastest rank: a slow host slows itself and
  // its two partners of each round, and only itself in all of them (the partners change
  // with k; four ranks or more leave a fast one in every round). Rates from each rank's
  // best round: a healthy rank's best is its real link speed.
  std::vector<double> rates;
  for (int r = 0; r < n; ++r) {
    bool slow = n >= 4;
    double best = 0;
    for (int k = 0; k < out.rounds; ++k) {
      const std::vector<double>& round = out.seconds[static_cast<size_t>(k)];
      const double s = round[static_cast<size_t>(r)];
      best = k == 0 ? s : std::min(best, s);
      slow = slow && s > factor * *std::min_element(round.begin(), round.end());
    }
    if (slow) out.slow_ranks.push_back(r);
    rates.push_back(best > 0 ? 2.0 * double(bytes) * 8 / best / 1e9 : 0.0);
  }
  out.gbit_median = median_of(rates);
  out.gbit = std::move(rates);
  return out;
}

std::string describe_slow_links(const dist::Communicator& comm, const LinkCheck& check) {
  std::string out;
  for (int r : check.slow_ranks)
    out += fmt::format("{}host {} (rank {}): {:.2f} Gb/s to and from its peers against a median "
                       "of {:.2f} Gb/s",
                       out.empty() ? "" : "; ", comm.host(r), r,
                       check.gbit[static_cast<size_t>(r)], check.gbit_median);
  return out;
}

}  // namespace hyperion
