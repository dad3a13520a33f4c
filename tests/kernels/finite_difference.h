// Central finite differences for the backward-pass tests of the kernels whose inputs are
// plain f32 arrays: the directional derivative of loss(x) = sum(dy * f(x)) (accumulated in
// double) at sampled coordinates of x, to compare with the analytic gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace hyperion::testing_util {

// f writes f(x) into its second argument (out has the size of dy). Returns d loss / d x[i]
// for each i in `coords`, with step h relative to max(1, |x[i]|).
inline std::vector<double> finite_difference(
    const std::function<void(const std::vector<float>&, std::vector<float>&)>& f,
    std::vector<float> x, const std::vector<float>& dy, const std::vector<size_t>& coords,
    double h = 1e-2) {
  std::vector<float> out(dy.size());
  auto loss = [&](const std::vector<float>& at) {
    f(at, out);
    double s = 0.0;
    for (size_t i = 0; i < dy.size(); ++i) s += double(dy[i]) * out[i];
    return s;
  };
  std::vector<double> grads;
  for (size_t i : coords) {
    const float x0 = x[i];
    const double step = h * std::max(1.0, double(std::fabs(x0)));
    x[i] = float(x0 + step);
    const double up = loss(x);
    x[i] = float(x0 - step);
    const double down = loss(x);
    x[i] = x0;
    grads.push_back((up - down) / (double(float(x0 + step)) - double(float(x0 - step))));
  }
  return grads;
}

// `count` distinct coordinates in [0, n), always including the first and the last.
inline std::vector<size_t> sample_coords(size_t n, size_t count, std::mt19937& rng) {
  std::vector<size_t> out = {0, n - 1};
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  while (out.size() < std::min(count, n)) out.push_back(pick(rng));
  return out;
}

}  // namespace hyperion::testing_util
