// nodalrun's half of the fd broker: answers, parked requests, refusals, and no descriptor leaked.
// Also the control channel's descriptor handling the broker rides on.
#include <gtest/gtest.h>

#include <nodal/detail/control.hpp>

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "fd_registry.hpp"

namespace nodal::launcher {
namespace {

using detail::ControlKind;
using detail::ControlMessage;
using detail::OwnedFd;

int open_fds() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

/// A memfd holding `text`.
OwnedFd memfd_with(const std::string& text) {
  OwnedFd fd(::memfd_create("fd_registry_test", MFD_CLOEXEC));
  EXPECT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string content_of(int fd) {
  char buf[64] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

/// A request's reply socket as the runtime makes it: {ours, the one the registry gets}.
std::pair<OwnedFd, OwnedFd> reply_pair(int extra_flags = SOCK_NONBLOCK) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | extra_flags, 0, fds), 0);
  return {OwnedFd(fds[0]), OwnedFd(fds[1])};
}

/// The registry's answer on `ours`; nullopt when it closed the socket unanswered (or has not answered).
std::optional<ControlMessage> answer_on(const OwnedFd& ours, bool* closed = nullptr) {
  bool eof = false;
  std::optional<ControlMessage> reply = detail::receive_control(ours.get(), &eof);
  if (closed) *closed = eof;
  return reply;
}

TEST(FdRegistry, AnswersPublishedParkedAndRefusedRequestsWithoutLeaking) {
  const int before = open_fds();
  {
    FdRegistry registry(4);
    OwnedFd memfd = memfd_with("rank 1");
    registry.publish(1, 7, OwnedFd(::dup(memfd.get())));
    registry.publish(1, 7, memfd_with("second"));  // the first stays

    auto [ours, theirs] = reply_pair();
    registry.fetch(1, 7, std::move(theirs));
    std::optional<ControlMessage> reply = answer_on(ours);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->kind, ControlKind::fd_reply);
    ASSERT_GE(reply->fd.get(), 0);
    EXPECT_EQ(content_of(reply->fd.get()), "rank 1");
    bool closed = false;
    EXPECT_FALSE(answer_on(ours, &closed));
    EXPECT_TRUE(closed);  // one answer, then the registry lets the socket go

    // Before the publication: parked, answered when it comes.
    auto [early, early_theirs] = reply_pair();
    registry.fetch(2, 5, std::move(early_theirs));
    EXPECT_EQ(registry.parked(), 1u);
    EXPECT_FALSE(answer_on(early));
    registry.publish(2, 5, memfd_with("late"));
    EXPECT_EQ(registry.parked(), 0u);
    reply = answer_on(early);
    ASSERT_TRUE(reply && reply->fd.get() >= 0);
    EXPECT_EQ(content_of(reply->fd.get()), "late");

    // An owner outside the job.
    auto [outside, outside_theirs] = reply_pair();
    registry.fetch(4, 1, std::move(outside_theirs));
    reply = answer_on(outside);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->fd.get(), -1);
    EXPECT_EQ(reply->text, "there is no rank 4 in a job of 4 ranks");

    // An owner that exits without publishing: parked requests and later ones are told.
    auto [parked, parked_theirs] = reply_pair();
    registry.fetch(3, 9, std::move(parked_theirs));
    registry.rank_exited(3);
    reply = answer_on(parked);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->text, "rank 3 exited without publishing key 9");
    auto [later, later_theirs] = reply_pair();
    registry.fetch(3, 9, std::move(later_theirs));
    reply = answer_on(later);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->text, "rank 3 exited without publishing key 9");
    // ...but what an exited rank did publish stays fetchable.
    registry.rank_exited(1);
    auto [after_exit, after_exit_theirs] = reply_pair();
    registry.fetch(1, 7, std::move(after_exit_theirs));
    reply = answer_on(after_exit);
    ASSERT_TRUE(reply && reply->fd.get() >= 0);
    EXPECT_EQ(content_of(reply->fd.get()), "rank 1");

    // Still parked when the job ends: the requester reads end-of-file.
    auto [orphan, orphan_theirs] = reply_pair();
    registry.fetch(0, 1, std::move(orphan_theirs));
    { FdRegistry gone = std::move(registry); }
    EXPECT_FALSE(answer_on(orphan, &closed));
    EXPECT_TRUE(closed);
  }
  EXPECT_EQ(open_fds(), before);
}

TEST(FdRegistry, NeverBlocksOnARequesterThatCannotTakeTheAnswer) {
  const int before = open_fds();
  {
    FdRegistry registry(1);
    registry.publish(0, 1, memfd_with("x"));
    auto [ours, theirs] = reply_pair(0);  // a blocking socket, full
    const char byte = 0;
    while (::send(theirs.get(), &byte, 1, MSG_DONTWAIT) == 1) {
    }
    registry.fetch(0, 1, std::move(theirs));  // returns: the answer is dropped, the socket closed
  }
  EXPECT_EQ(open_fds(), before);
}

TEST(Control, CarriesOneDescriptorAndClosesAnyOther) {
  const int before = open_fds();
  {
    auto [supervisor_end, ranks_end] = detail::make_control_pair();
    OwnedFd supervisor(supervisor_end), ranks(ranks_end);
    OwnedFd memfd = memfd_with("payload");
    ASSERT_TRUE(detail::send_control(ranks.get(), {ControlKind::fd_publish, 2, 99, {}, 0xfeedULL, {}}, memfd.get()));
    std::optional<ControlMessage> message = detail::receive_control(supervisor.get());
    ASSERT_TRUE(message);
    EXPECT_EQ(message->kind, ControlKind::fd_publish);
    EXPECT_EQ(message->rank, 2);
    EXPECT_EQ(message->key, 0xfeedULL);
    ASSERT_GE(message->fd.get(), 0);
    EXPECT_NE(message->fd.get(), memfd.get());
    EXPECT_EQ(content_of(message->fd.get()), "payload");

    // Three descriptors on one message (nobody should, but a stray one must not leak): the first
    // is kept, the others closed; a message too short to be ours is dropped with its descriptors.
    int three[3] = {memfd.get(), memfd.get(), memfd.get()};
    for (std::size_t size : {std::size_t{64}, std::size_t{2}}) {
      char payload[64] = {};
      iovec part{payload, size};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof three)] = {};
      msghdr msg{};
      msg.msg_iov = &part;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* header = CMSG_FIRSTHDR(&msg);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof three);
      std::memcpy(CMSG_DATA(header), three, sizeof three);
      ASSERT_GT(::sendmsg(ranks.get(), &msg, 0), 0);
    }
    message.reset();
    const int queued = open_fds();
    message = detail::receive_control(supervisor.get());
    ASSERT_TRUE(message);
    EXPECT_GE(message->fd.get(), 0);
    EXPECT_EQ(open_fds(), queued + 1);  // of three received, one kept
    EXPECT_FALSE(detail::receive_control(supervisor.get()));  // the short one: dropped
    EXPECT_EQ(open_fds(), queued + 1);
  }
  EXPECT_EQ(open_fds(), before);
}

}  // namespace
}  // namespace nodal::launcher
