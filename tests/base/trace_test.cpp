// The trace-event sink (base/trace.h): off records nothing, spans nest on their thread's track,
// threads and virtual tracks get their own ids, args are kept, the cap drops and counts.
#include "paratrain/base/trace.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

namespace paratrain::trace {
namespace {

const Event* find(const Recording& r, const char* name) {
  for (const Event& e : r.events)
    if (std::strcmp(e.name, name) == 0) return &e;
  return nullptr;
}

std::string track_name(const Recording& r, uint32_t id) {
  for (const auto& [t, n] : r.tracks)
    if (t == id) return n;
  return "";
}

TEST(Trace, DisabledRecordsNothing) {
  stop();
  take();
  EXPECT_FALSE(enabled());
  {
    Span s("off", "test");
    EXPECT_FALSE(s.on());
    s.num("x", 1);
  }
  complete("off too", "test", track("comm off"), 1, 2);
  EXPECT_TRUE(take().events.empty());
}

TEST(Trace, SpansNestOnTheThreadsTrack) {
  start();
  set_thread_name("main test");
  {
    Span outer("outer", "test");
    Span inner("inner", "test");
  }
  stop();
  Recording r = take();
  ASSERT_EQ(r.events.size(), 2u);
  const Event* outer = find(r, "outer");
  const Event* inner = find(r, "inner");
  ASSERT_TRUE(outer && inner);
  EXPECT_EQ(outer->track, inner->track);
  EXPECT_EQ(outer->track, this_thread_track());
  EXPECT_LE(outer->start_ns, inner->start_ns);
  EXPECT_GE(outer->end_ns, inner->end_ns);
  EXPECT_STREQ(outer->cat, "test");
  EXPECT_EQ(track_name(r, outer->track), "main test");
  EXPECT_EQ(r.dropped, 0u);
}

TEST(Trace, ThreadsAndVirtualTracksGetTheirOwnIds) {
  start();
  uint32_t other = 0;
  std::thread t([&] {
    set_thread_name("worker");
    Span s("on worker", "test");
    other = this_thread_track();
  });
  t.join();
  { Span s("on main", "test"); }
  const uint32_t comm = track("comm world");
  EXPECT_EQ(track("comm world"), comm);
  EXPECT_NE(track("comm world/0"), comm);
  complete("allreduce", "comm", comm, 100, 300, Args().num("bytes", 4096).str("dtype", "f32"));
  stop();
  Recording r = take();
  ASSERT_EQ(r.events.size(), 3u);
  EXPECT_EQ(find(r, "on worker")->track, other);
  EXPECT_NE(find(r, "on main")->track, other);
  EXPECT_NE(comm, other);
  EXPECT_NE(comm, this_thread_track());
  EXPECT_EQ(track_name(r, other), "worker");
  EXPECT_EQ(track_name(r, comm), "comm world");
  const Event* a = find(r, "allreduce");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->track, comm);
  EXPECT_EQ(a->start_ns, 100);
  EXPECT_EQ(a->end_ns, 300);
  ASSERT_EQ(a->nargs, 2);
  EXPECT_STREQ(a->args[0].key, "bytes");
  EXPECT_EQ(a->args[0].num, 4096);
  EXPECT_EQ(a->args[0].str, nullptr);
  EXPECT_STREQ(a->args[1].key, "dtype");
  EXPECT_STREQ(a->args[1].str, "f32");
}

TEST(Trace, SpanArgsAndInternedNames) {
  start();
  {
    Span s(std::string("step ") + std::to_string(7), "train", true);
    s.num("step", 7).str("phase", intern("warm"));
  }
  stop();
  Recording r = take();
  const Event* e = find(r, "step 7");
  ASSERT_TRUE(e);
  EXPECT_EQ(intern("step 7"), e->name);  // the same stable pointer
  ASSERT_EQ(e->nargs, 2);
  EXPECT_EQ(e->args[0].num, 7);
  EXPECT_STREQ(e->args[1].str, "warm");
}

TEST(Trace, TheCapDropsAndCounts) {
  start(5);
  for (int i = 0; i < 12; ++i) Span s("e", "test");
  stop();
  Recording r = take();
  EXPECT_EQ(r.events.size(), 5u);
  EXPECT_EQ(r.dropped, 7u);
  EXPECT_EQ(r.max_events, 5u);
  start();  // a new start clears the count
  stop();
  EXPECT_EQ(take().dropped, 0u);
}

TEST(Trace, LabelAndCallTagScopesNestAndRestore) {
  EXPECT_EQ(current_label(), nullptr);
  {
    LabelScope a("block 0");
    EXPECT_STREQ(current_label(), "block 0");
    {
      LabelScope b("head");
      EXPECT_STREQ(current_label(), "head");
    }
    EXPECT_STREQ(current_label(), "block 0");
    std::thread([] { EXPECT_EQ(current_label(), nullptr); }).join();  // per thread
  }
  EXPECT_EQ(current_label(), nullptr);
  {
    CallTagScope t("bucket", 3);
    EXPECT_STREQ(current_call_tag().key, "bucket");
    EXPECT_EQ(current_call_tag().value, 3);
  }
  EXPECT_EQ(current_call_tag().key, nullptr);
}

}  // namespace
}  // namespace paratrain::trace
