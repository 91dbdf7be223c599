// A trainer for tests/faults/dataloader_faults_test.cpp: a DataLoader with 2 workers (the start
// method in argv[1]), which prints "workers <pid> <pid>" once the first batch came and then waits
// forever, holding the batch, for the test to kill it.
#include <nodal/data/dataloader.hpp>

#include <unistd.h>

#include <cstdio>
#include <string>

namespace {

class Ones : public nodal::data::Dataset {
 public:
  std::int64_t size() const override { return 1000; }
  nodal::data::Sample get(std::int64_t) override {
    nodal::Tensor t = nodal::Tensor::empty({1024}, nodal::DType::f32);
    std::fill_n(t.data_ptr<float>(), 1024, 1.0F);
    nodal::data::Sample s;
    s.add("x", t);
    return s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool fork = argc > 1 && std::string(argv[1]) == "fork";
  nodal::data::DataLoader loader(std::make_shared<Ones>(),
                                 {.batch_size = 8,
                                  .num_workers = 2,
                                  .start_method = fork ? nodal::StartMethod::fork : nodal::StartMethod::forkserver});
  auto it = loader.begin();
  const std::vector<pid_t> pids = loader.worker_pids();
  std::printf("workers %d %d\n", pids.at(0), pids.at(1));
  std::fflush(stdout);
  for (;;) ::pause();
}
