// LineTagger: whole, prefixed lines whatever pieces the bytes arrive in.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "output.hpp"

namespace nodal::launcher {
namespace {

/// A sink the tagger writes to, read back as a string.
class Sink {
 public:
  Sink() {
    EXPECT_EQ(::pipe2(fds_, O_NONBLOCK), 0);
    ::fcntl(fds_[1], F_SETPIPE_SZ, 1 << 20);
  }
  ~Sink() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int fd() const { return fds_[1]; }
  std::string drain() {
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds_[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    return text;
  }

 private:
  int fds_[2];
};

TEST(LineTagger, JoinsPiecesIntoWholePrefixedLines) {
  Sink sink;
  LineTagger tagger("[3] ", sink.fd(), -1, 0);
  tagger.feed("hel");
  EXPECT_EQ(sink.drain(), "");  // nothing until the line is whole
  tagger.feed("lo\nwor");
  EXPECT_EQ(sink.drain(), "[3] hello\n");
  tagger.feed("ld\n\nlast");
  EXPECT_EQ(sink.drain(), "[3] world\n[3] \n");
  tagger.finish();
  EXPECT_EQ(sink.drain(), "[3] last\n");
  tagger.finish();
  EXPECT_EQ(sink.drain(), "");
}

TEST(LineTagger, CutsOverlongLinesIntoTaggedPieces) {
  Sink sink;
  LineTagger tagger("[0] ", sink.fd(), -1, 0);
  std::string huge(LineTagger::kMaxLine * 2 + 10, 'x');
  tagger.feed(huge);
  std::string out = sink.drain();
  EXPECT_EQ(out, "[0] " + std::string(LineTagger::kMaxLine, 'x') + "\n[0] " + std::string(LineTagger::kMaxLine, 'x') + "\n");
  tagger.feed("\n");
  EXPECT_EQ(sink.drain(), "[0] xxxxxxxxxx\n");
}

TEST(LineTagger, KeepsTheLastLinesForTheReport) {
  Sink sink;
  LineTagger tagger("[1] ", sink.fd(), -1, 2);
  tagger.feed("a\nb\nc\n");
  ASSERT_EQ(tagger.last_lines().size(), 2u);
  EXPECT_EQ(tagger.last_lines()[0], "b");
  EXPECT_EQ(tagger.last_lines()[1], "c");
}

TEST(LineTagger, CopiesRawBytesToTheFile) {
  Sink sink, file;
  LineTagger tagger("[1] ", sink.fd(), ::dup(file.fd()), 0);  // the tagger owns (closes) its file
  tagger.feed("one\ntw");
  tagger.feed("o");
  tagger.finish();
  EXPECT_EQ(file.drain(), "one\ntwo");
  EXPECT_EQ(sink.drain(), "[1] one\n[1] two\n");
}

}  // namespace
}  // namespace nodal::launcher
