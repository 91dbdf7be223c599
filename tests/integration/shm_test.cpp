// Shared tensors under nodalrun: queues, file tensors and process-shared sync across real ranks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(SharedTensors, TensorsArriveBitExactThroughAQueue) {
  for (const char* method : {"spawn", "forkserver"}) {
    ChildResult r = run(nodalrun_command({"-n", "2", "--start-method", method, kShmProgram, "handoff", "300"}));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_TRUE(contains(r.out, "[1] verified 300")) << r.out;
  }
}

TEST(SharedTensors, FourProducersThreeConsumersEveryTensorExactlyOnce) {
  ChildResult r = run(nodalrun_command({"-n", "7", kShmProgram, "mpmc"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[4] exactly once 1000, not once 0")) << r.out;
  std::regex got(R"(\[(\d)\] consumer \d got (\d+))");
  int total = 0;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, got)) total += std::stoi(m[2]);
  }
  EXPECT_EQ(total, 1000);
}

TEST(SharedTensors, FileBackedTensorsAreSharedAndPersist) {
  std::string path = (std::filesystem::temp_directory_path() / ("nodal-file-tensor-" + std::to_string(::getpid()))).string();
  ChildResult r = run(nodalrun_command({"-n", "3", kShmProgram, "file_tensor", path}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank : {0, 1, 2}) EXPECT_TRUE(contains(r.out, "rank " + std::to_string(rank) + " read the file tensor"));
  // After the job: the bytes are on disk, 128 x 3 doubles i * 0.5.
  std::ifstream file(path, std::ios::binary);
  std::vector<double> values(384);
  file.read(reinterpret_cast<char*>(values.data()), 384 * sizeof(double));
  ASSERT_TRUE(file);
  for (int i = 0; i < 384; ++i) ASSERT_EQ(values[i], i * 0.5) << i;
  std::filesystem::remove(path);
}

TEST(SharedSync, LockValueBarrierAndEventAcrossRanks) {
  ChildResult r = run(nodalrun_command({"-n", "4", kShmProgram, "sync"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(contains(r.out, "rank " + std::to_string(rank) + " counter 4000 rounds 200 event 1")) << r.out;
  }
}

TEST(SharedSync, OversubscribedRanksStillMakeProgress) {
  ChildResult r = run(nodalrun_command({"-n", "8", kShmProgram, "sync"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[7] rank 7 counter 8000 rounds 200 event 1")) << r.out;
}

}  // namespace
}  // namespace nodal::testing
