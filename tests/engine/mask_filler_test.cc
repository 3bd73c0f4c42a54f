// MaskFiller: every job filled exactly once by its own processor, with any number of workers, over
// many consecutive fills (each fill's jobs done before it returns); a processor that throws fails its
// job alone.
#include <gtest/gtest.h>

#include <stdexcept>

#include "engine/mask_filler.h"

namespace beluga {
namespace {

// Writes its id and the fill number into every word; throws on the fills `fail_every` divides.
class Stamp final : public LogitsProcessor {
 public:
  Stamp(uint32_t id, int fail_every) : id_(id), fail_every_(fail_every) {}
  void fill_mask(uint32_t* m, int vocab) override {
    ++fills_;
    if (fail_every_ > 0 && fills_ % fail_every_ == 0)
      throw std::runtime_error("stamp " + std::to_string(id_));
    for (int w = 0; w < (vocab + 31) / 32; ++w) m[w] = id_ * 1000u + uint32_t(fills_);
  }
  void accept(int) override {}
  void rollback(int) override {}
  bool is_accepting() const override { return false; }
  int fills() const { return fills_; }

 private:
  uint32_t id_;
  int fail_every_;
  int fills_ = 0;
};

TEST(MaskFiller, EveryJobIsFilledOnceByItsProcessor) {
  constexpr int kVocab = 1000, kWords = (kVocab + 31) / 32, kJobs = 37, kFills = 200;
  for (int workers : {0, 1, 3, 8}) {
    MaskFiller filler(workers);
    EXPECT_EQ(filler.workers(), workers);
    std::vector<std::unique_ptr<Stamp>> procs;
    for (int i = 0; i < kJobs; ++i) procs.push_back(std::make_unique<Stamp>(uint32_t(i), i % 5 == 4 ? 7 : 0));
    std::vector<uint32_t> masks(size_t(kJobs) * kWords);
    std::vector<MaskFiller::Job> jobs;
    for (int f = 1; f <= kFills; ++f) {
      // Fewer jobs on some fills: the inline path and the parallel one alternate.
      const int n = f % 3 == 0 ? 2 : kJobs;
      jobs.clear();
      for (int i = 0; i < n; ++i)
        jobs.push_back({procs[size_t(i)].get(), masks.data() + size_t(i) * kWords, {}});
      filler.fill(jobs, kVocab);
      for (int i = 0; i < n; ++i) {
        const Stamp& p = *procs[size_t(i)];
        const bool fails = i % 5 == 4 && p.fills() % 7 == 0;
        ASSERT_EQ(jobs[size_t(i)].error.empty(), !fails)
            << "workers " << workers << " fill " << f << " job " << i;
        if (fails) {
          EXPECT_EQ(jobs[size_t(i)].error, "stamp " + std::to_string(i));
          continue;
        }
        for (int w = 0; w < kWords; ++w)
          ASSERT_EQ(masks[size_t(i) * kWords + size_t(w)], uint32_t(i) * 1000u + uint32_t(p.fills()))
              << "workers " << workers << " fill " << f << " job " << i << " word " << w;
      }
    }
    // Each processor ran once per fill it was in: 200 fills, job i in all but the small ones beyond 2.
    for (int i = 0; i < kJobs; ++i)
      EXPECT_EQ(procs[size_t(i)]->fills(), i < 2 ? kFills : kFills - kFills / 3);
  }
}

TEST(MaskFiller, DefaultWorkersLeaveSmallMachinesAlone) {
  EXPECT_EQ(MaskFiller::default_workers(0), 0);  // unknown
  EXPECT_EQ(MaskFiller::default_workers(2), 0);
  EXPECT_EQ(MaskFiller::default_workers(4), 0);
  EXPECT_EQ(MaskFiller::default_workers(8), 3);
  EXPECT_EQ(MaskFiller::default_workers(16), 7);
  EXPECT_EQ(MaskFiller::default_workers(128), 7);
}

}  // namespace
}  // namespace beluga
