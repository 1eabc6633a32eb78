#include "services/coordinator/stop_filter.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lede::coordinator {
namespace {

// Feeds `pieces` and returns everything sent, Flush() included unless stopped.
std::string Stream(StopStringFilter* f, const std::vector<std::string>& pieces) {
  std::string sent;
  for (const std::string& p : pieces) sent += f->Push(p);
  if (!f->stopped()) sent += f->Flush();
  return sent;
}

TEST(StopStringFilterTest, NoStopsPassesEverythingAtOnce) {
  StopStringFilter f({});
  EXPECT_EQ(f.Push("Once"), "Once");
  EXPECT_EQ(f.Push(" upon"), " upon");
  EXPECT_EQ(f.Flush(), "");
  EXPECT_FALSE(f.stopped());
}

TEST(StopStringFilterTest, HoldsBackTheLongestStopMinusOneBytes) {
  StopStringFilter f({"END"});
  EXPECT_EQ(f.Push("abcE"), "ab");  // "cE" could still become "END"
  EXPECT_EQ(f.Push("x"), "c");      // always 2 bytes held: "Ex"
  EXPECT_EQ(f.Flush(), "Ex");
}

TEST(StopStringFilterTest, StopAcrossPiecesCutsBeforeIt) {
  StopStringFilter f({"END"});
  EXPECT_EQ(Stream(&f, {"the E", "N", "D and more"}), "the ");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.Push("later"), "");
}

TEST(StopStringFilterTest, EarliestStopOverAllStopsWins) {
  // "cd" is listed first but "bc" starts earlier: the text ends before "bc".
  StopStringFilter f({"cd", "bc"});
  EXPECT_EQ(Stream(&f, {"xxabcd"}), "xxa");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStringFilterTest, NeverSplitsAUtf8Character) {
  StopStringFilter f({"zz"});
  // "é" is two bytes; keeping one byte back would split it, so both stay.
  EXPECT_EQ(f.Push("a\xC3\xA9"), "a");
  EXPECT_EQ(f.Flush(), "\xC3\xA9");
}

TEST(StopStringFilterTest, StopInTheFinalPieceIsFound) {
  StopStringFilter f({"</s>"});
  EXPECT_EQ(Stream(&f, {"done", "</s>"}), "done");
  EXPECT_TRUE(f.stopped());
}

}  // namespace
}  // namespace lede::coordinator
