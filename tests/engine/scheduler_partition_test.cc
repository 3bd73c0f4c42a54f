// The scheduler over a partitioned block manager (attention data parallelism): when a sequence's
// rank runs out of blocks, only sequences of the same rank are preempted for it.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/block_manager.h"
#include "engine/scheduler.h"
#include "model/batch.h"

namespace beluga {
namespace {

struct PartitionSim {
  std::string salt;
  BlockManager bm{8, false, nullptr, 2};  // partitions {0..3}, {4..7}
  std::vector<std::unique_ptr<Seq>> seqs;
  Scheduler sched{bm, 16, 4096, nullptr, 0, nullptr};
  Seq* add(int len) {
    auto s = std::make_unique<Seq>();
    s->order = int64_t(seqs.size());
    s->salt = &salt;
    s->traffic_class = &salt;
    for (int i = 0; i < len; ++i) s->tokens.push_back(3 + (i * 7 + int(seqs.size()) * 131) % 500);
    s->num_prompt = len;
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  void step() {
    std::vector<Chunk> chunks;
    Seq* stuck = nullptr;
    sched.schedule(chunks, &stuck, 0);
    sched.commit(chunks);
    for (const Chunk& c : chunks)
      if (c.sample) c.seq->tokens.push_back(9);
  }
};

TEST(SchedulerPartitions, OnlyTheSameRanksSequencesGiveWay) {
  PartitionSim sim;
  Seq* a = sim.add(3 * kKvBlockSize);  // partition 0 (ties go to the first): 3 of its 4 blocks
  Seq* b = sim.add(kKvBlockSize);      // partition 1, the younger
  Seq* c = sim.add(8);                 // partition 1 too (3 free there against 1), the youngest
  sim.step();
  ASSERT_EQ(sim.bm.partition_of(a->blocks.front()), 0);
  ASSERT_EQ(sim.bm.partition_of(b->blocks.front()), 1);
  ASSERT_EQ(sim.bm.partition_of(c->blocks.front()), 1);
  // a decodes until its 257th token needs a fifth block: partition 0 has none left and no other
  // sequence of its own to preempt, so a gives way itself; b and c (partition 1) keep running.
  for (int i = 0; i < 80 && sim.sched.preemptions() == 0; ++i) sim.step();
  ASSERT_EQ(sim.sched.preemptions(), 1);
  EXPECT_TRUE(a->blocks.empty()) << "a was preempted";
  EXPECT_FALSE(b->blocks.empty()) << "b's blocks are partition 1's: freeing them makes no room for a";
  EXPECT_FALSE(c->blocks.empty());
  EXPECT_EQ(sim.sched.num_running(), 2);
}

}  // namespace
}  // namespace beluga
