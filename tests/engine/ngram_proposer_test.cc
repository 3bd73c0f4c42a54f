// Prompt-lookup drafting (engine/ngram_proposer.h) on hand-checked token sequences: the longest
// suffix that recurs wins, its most recent earlier occurrence proposes, proposals stop at the end of
// the sequence and at k, and nothing is proposed without a match of at least min_n tokens.
#include "engine/ngram_proposer.h"

#include <gtest/gtest.h>

#include <vector>

namespace beluga {
namespace {

std::vector<int> propose(const std::vector<int>& t, int min_n, int max_n, int k) {
  std::vector<int> out(8, -1);
  out.resize(size_t(propose_ngram(t, min_n, max_n, k, out)));
  return out;
}

TEST(NgramProposer, LongestRecurringSuffixProposesWhatFollowedIt) {
  // Suffix [2 3] occurs at 1 (followed by 4 5) and the 1-gram [3] at 6 (followed by 9): with n up to
  // 2 the 2-gram wins, with n = 1 only, the most recent [3] (position 6) proposes 9 then 2 3.
  const std::vector<int> t{1, 2, 3, 4, 5, 7, 3, 9, 2, 3};
  EXPECT_EQ(propose(t, 1, 2, 2), (std::vector<int>{4, 5}));
  EXPECT_EQ(propose(t, 1, 1, 3), (std::vector<int>{9, 2, 3}));
}

TEST(NgramProposer, MostRecentOccurrenceWins) {
  // [7 8] occurs at 0 (then 1) and at 3 (then 2): the later one proposes.
  EXPECT_EQ(propose({7, 8, 1, 7, 8, 2, 7, 8}, 2, 2, 1), (std::vector<int>{2}));
}

TEST(NgramProposer, StopsAtTheEndOfTheSequenceAndAtK) {
  // [5 6] at 0 is followed by 5 6 (the suffix itself): 2 tokens available, k = 4 asks for more.
  EXPECT_EQ(propose({5, 6, 5, 6}, 2, 2, 4), (std::vector<int>{5, 6}));
  EXPECT_EQ(propose({5, 6, 5, 6}, 2, 2, 1), (std::vector<int>{5}));
  std::vector<int> small(1);
  EXPECT_EQ(propose_ngram(std::vector<int>{5, 6, 5, 6}, 2, 2, 4, small), 1) << "bounded by out's size";
}

TEST(NgramProposer, NothingWithoutAMatchOfMinLength) {
  EXPECT_TRUE(propose({1, 2, 3, 4}, 1, 3, 3).empty());
  EXPECT_TRUE(propose({1, 2, 9, 2}, 2, 3, 3).empty()) << "only a 1-gram recurs";
  EXPECT_EQ(propose({1, 2, 9, 2}, 1, 3, 3), (std::vector<int>{9, 2}));
  EXPECT_TRUE(propose({}, 1, 3, 3).empty());
  EXPECT_TRUE(propose({4}, 1, 3, 3).empty());
  EXPECT_TRUE(propose({4, 4, 4}, 1, 3, 0).empty()) << "k = 0";
}

}  // namespace
}  // namespace beluga
