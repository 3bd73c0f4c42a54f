// A reference SampleRowsOp for the CPU tests: backend/sample_rows.h's contract in double (the host
// sampler's arithmetic, engine/sampler.h, given the row's uniform), on host memory one row at a time,
// so an engine that samples "on the device" with it must give the host path's tokens and logprobs
// exactly. Counts what it was asked to do.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/sample_rows.h"

namespace beluga::engine_test {

class ReferenceSampleRows final : public SampleRowsOp {
 public:
  void sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks,
                   const SampleEdits& edits) override {
    const int R = int(logits.shape[0]), V = int(logits.shape[1]);
    const int words = (V + 31) / 32;
    calls++;
    for (int r = 0; r < R; ++r) {
      const DeviceSampleRow& p = rows.ptr<const DeviceSampleRow>()[r];
      const float* raw = logits.ptr<const float>() + int64_t(r) * logits.stride[0];
      std::vector<float> x(raw, raw + V);
      if (p.edit_count > 0) {  // the host sampler's float arithmetic, in its order
        edited_rows++;
        const auto* e = edits.edits.ptr<const DeviceLogitEdit>() + p.edit_begin;
        const bool counts = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
        for (int j = 0; j < p.edit_count; ++j) {
          const int t = e[j].token;
          if (t < 0 || t >= V) continue;
          float v = x[size_t(t)];
          if (e[j].flags & kEditBias) v += e[j].bias;
          if (e[j].flags & kEditRepeated) v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
          if (counts && e[j].count > 0) v -= p.presence_penalty + p.frequency_penalty * float(e[j].count);
          x[size_t(t)] = v;
        }
      }
      if (p.mask_row >= 0) {
        const auto* m = masks.ptr<const uint32_t>() + int64_t(p.mask_row) * words;
        for (int t = 0; t < V; ++t)
          if (!((m[t >> 5] >> (t & 31)) & 1)) x[size_t(t)] = -INFINITY;
        masked_rows++;
      }
      int token = int(std::max_element(x.begin(), x.end()) - x.begin());
      if (p.temperature > 0) token = draw(x, p);
      int32_t* o = out.ptr<int32_t>() + int64_t(r) * kSampleOutCols;
      o[0] = token;
      float lp = 0;
      int rank = 0;
      if (p.logprob) {
        const float mx = *std::max_element(raw, raw + V);
        double sum = 0;
        for (int t = 0; t < V; ++t) sum += std::exp(double(raw[t] - mx));
        const float lse = mx + float(std::log(sum));
        lp = raw[token] - lse;
        for (int t = 0; t < V; ++t) rank += raw[t] - lse >= lp;
      }
      std::memcpy(&o[1], &lp, 4);
      o[2] = rank;
      o[3] = 0;
      if (p.logprob && p.top_logprobs > 0) {  // the host's order: logprob descending, then id
        const float mx = *std::max_element(raw, raw + V);
        double sum = 0;
        for (int t = 0; t < V; ++t) sum += std::exp(double(raw[t] - mx));
        const float lse = mx + float(std::log(sum));
        std::vector<int> idx(static_cast<size_t>(V));
        std::iota(idx.begin(), idx.end(), 0);
        const int k = std::min(p.top_logprobs, V);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
          const float la = raw[a] - lse, lb = raw[b] - lse;
          return la > lb || (la == lb && a < b);
        });
        o[3] = k;
        for (int j = 0; j < k; ++j) {
          const float v = raw[idx[size_t(j)]] - lse;
          o[4 + 2 * j] = idx[size_t(j)];
          std::memcpy(&o[5 + 2 * j], &v, 4);
        }
        top_rows++;
      }
    }
  }
  int calls = 0, masked_rows = 0, edited_rows = 0, top_rows = 0;

 private:
  static int draw(const std::vector<float>& x, const DeviceSampleRow& p) {
    const int V = int(x.size());
    std::vector<int> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[size_t(a)] > x[size_t(b)]; });
    const bool topk = p.top_k > 0 && p.top_k < V;
    const int k = topk ? p.top_k : V;
    std::vector<double> prob(size_t(V), 0.0);
    double sum = 0;
    for (int i = 0; i < k; ++i) {
      const int t = idx[size_t(i)];
      sum += prob[size_t(t)] = std::exp(double(x[size_t(t)] - x[size_t(idx[0])]) / p.temperature);
    }
    if (!topk && p.top_p >= 1 && p.min_p <= 0) {  // id order, the mass summed in id order too
      double total = 0;
      for (int t = 0; t < V; ++t) total += prob[size_t(t)];
      const double u = p.u * total;
      double acc = 0;
      for (int t = 0; t < V; ++t)
        if (u < (acc += prob[size_t(t)])) return t;
      return V - 1;
    }
    int keep = k;
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      if (i > 0 && p.min_p > 0 && prob[size_t(idx[size_t(i)])] < p.min_p) {
        keep = i;
        break;
      }
      acc += prob[size_t(idx[size_t(i)])] / sum;
      if (p.top_p < 1 && acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept = 0;
    for (int i = 0; i < keep; ++i) kept += prob[size_t(idx[size_t(i)])];
    const double u = p.u * kept;
    acc = 0;
    for (int i = 0; i < keep; ++i)
      if (u < (acc += prob[size_t(idx[size_t(i)])])) return idx[size_t(i)];
    return idx[size_t(keep - 1)];
  }
};

}  // namespace beluga::engine_test
