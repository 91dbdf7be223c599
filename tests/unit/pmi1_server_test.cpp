// nodalrun's PMI-1 server (launcher/src/pmi/pmi1_server.hpp) spoken to as MPICH's client speaks
// it, a line at a time over each rank's socketpair: the answers' exact words, the key-value space
// and its fence, MPI_Abort and an unknown command (an error line and a protocol event, never
// silence, which would hang the rank).
#include <gtest/gtest.h>

#include <poll.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "pmi/pmi1_server.hpp"

namespace nodal::launcher {
namespace {

/// Sends `line` as rank `rank` and serves it.
std::vector<MpiEvent> send(Pmi1Server& server, int rank, const std::string& line) {
  const std::string text = line + "\n";
  EXPECT_EQ(::write(server.client_fd(rank), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return server.on_readable(rank);
}

/// What the server answered rank `rank` ("" when nothing came within 100 ms).
std::string answer(Pmi1Server& server, int rank) {
  pollfd p{server.client_fd(rank), POLLIN, 0};
  if (::poll(&p, 1, 100) != 1) return "";
  char buffer[4096];
  const ssize_t n = ::read(server.client_fd(rank), buffer, sizeof buffer);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : "";
}

TEST(Pmi1Server, AnswersMpichsInitSequenceInHydrasWords) {
  Pmi1Server server("kvs_job", 2);
  EXPECT_EQ(server.environment(1), (std::vector<std::string>{"PMI_FD=" + std::to_string(server.client_fd(1)),
                                                               "PMI_RANK=1", "PMI_SIZE=2"}));
  std::vector<MpiEvent> events = send(server, 0, "cmd=init pmi_version=1 pmi_subversion=1");
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, MpiEvent::Kind::init);
  EXPECT_EQ(events[0].rank, 0);
  EXPECT_EQ(answer(server, 0), "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
  send(server, 0, "cmd=get_maxes");
  EXPECT_EQ(answer(server, 0), "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n");
  send(server, 0, "cmd=get_appnum");
  EXPECT_EQ(answer(server, 0), "cmd=appnum appnum=0\n");
  send(server, 0, "cmd=get_my_kvsname");
  EXPECT_EQ(answer(server, 0), "cmd=my_kvsname kvsname=kvs_job\n");
  send(server, 0, "cmd=get_universe_size");
  EXPECT_EQ(answer(server, 0), "cmd=universe_size size=2 rc=0\n");
  send(server, 0, "cmd=get kvsname=kvs_job key=PMI_process_mapping");
  EXPECT_EQ(answer(server, 0), "cmd=get_result rc=0 msg=success value=(vector,(0,1,2))\n");
}

TEST(Pmi1Server, PutsAreSeenByEveryRankAndTheBarrierWaitsForAll) {
  Pmi1Server server("kvs_job", 3);
  send(server, 1, "cmd=put kvsname=kvs_job key=-bcast-1-1 value=2F6465762F73686D");
  EXPECT_EQ(answer(server, 1), "cmd=put_result rc=0 msg=success\n");
  send(server, 0, "cmd=barrier_in");
  send(server, 1, "cmd=barrier_in");
  EXPECT_EQ(answer(server, 0), "") << "barrier_out before the last rank came in";
  send(server, 2, "cmd=barrier_in");
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(answer(server, rank), "cmd=barrier_out\n") << rank;
  send(server, 2, "cmd=get kvsname=kvs_job key=-bcast-1-1");
  EXPECT_EQ(answer(server, 2), "cmd=get_result rc=0 msg=success value=2F6465762F73686D\n");
  send(server, 2, "cmd=get kvsname=kvs_job key=nobody");
  EXPECT_EQ(answer(server, 2), "cmd=get_result rc=-1 msg=key_nobody_not_found value=unknown\n");
  // The next fence is a new one.
  send(server, 0, "cmd=barrier_in");
  EXPECT_EQ(answer(server, 0), "");
}

TEST(Pmi1Server, TwoCommandsInOneReadAndOneSplitAcrossReads) {
  Pmi1Server server("kvs_job", 1);
  const std::string text = "cmd=get_appnum\ncmd=get_my_";
  ASSERT_EQ(::write(server.client_fd(0), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  server.on_readable(0);
  EXPECT_EQ(answer(server, 0), "cmd=appnum appnum=0\n");
  send(server, 0, "kvsname");
  EXPECT_EQ(answer(server, 0), "cmd=my_kvsname kvsname=kvs_job\n");
}

TEST(Pmi1Server, AbortCarriesTheCodeAndTheWholeMessage) {
  Pmi1Server server("kvs_job", 2);
  std::vector<MpiEvent> events =
      send(server, 1, "cmd=abort exitcode=7 message=application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1");
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, MpiEvent::Kind::abort);
  EXPECT_EQ(events[0].rank, 1);
  EXPECT_EQ(events[0].code, 7);
  EXPECT_EQ(events[0].message, "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1");
}

TEST(Pmi1Server, FinalizeIsAcknowledged) {
  Pmi1Server server("kvs_job", 1);
  std::vector<MpiEvent> events = send(server, 0, "cmd=finalize");
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, MpiEvent::Kind::finalize);
  EXPECT_EQ(answer(server, 0), "cmd=finalize_ack\n");
}

TEST(Pmi1Server, UnknownCommandsGetAnErrorLineAndAreReported) {
  Pmi1Server server("kvs_job", 1);
  std::vector<MpiEvent> events = send(server, 0, "cmd=get_ranks2hosts");
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, MpiEvent::Kind::protocol);
  EXPECT_NE(events[0].message.find("\"get_ranks2hosts\", which nodalrun does not serve"), std::string::npos)
      << events[0].message;
  EXPECT_EQ(answer(server, 0), "cmd=get_ranks2hosts_result rc=-1 msg=nodalrun_does_not_serve_get_ranks2hosts\n");
  events = send(server, 0, "mcmd=spawn");
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, MpiEvent::Kind::protocol);
  events = send(server, 0, "cmd=init pmi_version=2 pmi_subversion=0");
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, MpiEvent::Kind::protocol);
  EXPECT_EQ(answer(server, 0), "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1\n");
}

TEST(Pmi1Server, PublishedNamesCanBeLookedUp) {
  Pmi1Server server("kvs_job", 1);
  send(server, 0, "cmd=publish_name service=ocean port=tag#0$");
  EXPECT_EQ(answer(server, 0), "cmd=publish_result rc=0 msg=success\n");
  send(server, 0, "cmd=lookup_name service=ocean");
  EXPECT_EQ(answer(server, 0), "cmd=lookup_result rc=0 msg=success port=tag#0$\n");
  send(server, 0, "cmd=unpublish_name service=ocean");
  EXPECT_EQ(answer(server, 0), "cmd=unpublish_result rc=0 msg=success\n");
  send(server, 0, "cmd=lookup_name service=ocean");
  EXPECT_EQ(answer(server, 0), "cmd=lookup_result rc=-1 msg=service_ocean_not_found\n");
}

}  // namespace
}  // namespace nodal::launcher
