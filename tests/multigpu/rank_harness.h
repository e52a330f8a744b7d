// One forked process per GPU for the multi-GPU layer tests: rank 0 creates the NCCL unique id
// and shares it through an anonymous shared mapping; each rank writes a report there. The parent
// never initializes CUDA (a forked child could not use it then). Skips without test_world() GPUs.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/comm/nccl_comm.h"

namespace moe_ep::mgtest {

constexpr int kMaxRanks = 8;

struct RankReport {
  int failed;
  int finished;
  char msg[4096];
  int nval;
  double val[256];
  void add(double v) {
    if (nval < 256) val[nval++] = v;
  }
};

struct RankShared {
  SharedUniqueId uid;
  RankReport rep[kMaxRanks];
};

inline int visible_gpus() {
  static int cached = -1;
  if (cached >= 0) return cached;
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return cached = 0;
  return cached = WEXITSTATUS(st);
}

using RankBody =
    std::function<void(int rank, int world, const NcclUniqueIdBytes& id, RankReport& rep)>;

struct RanksResult {
  bool hung = false;
  double seconds = 0;
  std::vector<RankReport> rep;
};

inline RanksResult run_ranks(int world, double timeout_s, const RankBody& fn) {
  using Clock = std::chrono::steady_clock;
  void* mem =
      mmap(nullptr, sizeof(RankShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("mmap failed");
  auto* sh = new (mem) RankShared();
  std::vector<pid_t> pids;
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink SHARP off; the ranks inherit it
  const auto t0 = Clock::now();
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      RankReport& rep = sh->rep[r];
      int rc = 0;
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        const NcclUniqueIdBytes id = sh->uid.exchange(r, 60000);
        fn(r, world, id, rep);
      } catch (const std::exception& e) {
        std::snprintf(rep.msg, sizeof(rep.msg), "rank %d: %s", r, e.what());
        rep.failed = 1;
        rc = 1;
      }
      rep.finished = 1;
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  RanksResult res;
  size_t left = pids.size();
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  while (left > 0) {
    int st = 0;
    const pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      --left;
      continue;
    }
    if (Clock::now() > deadline) {
      res.hung = true;
      for (pid_t q : pids) kill(q, SIGKILL);
      while (waitpid(-1, &st, 0) > 0) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  res.rep.assign(sh->rep, sh->rep + world);
  sh->~RankShared();
  munmap(mem, sizeof(RankShared));
  return res;
}

// The suite's world size W: MOE_EP_TEST_WORLD=2, 4 or 8 (scripts/gpu_round.sh multigpu runs
// each that the machine's GPUs allow), else 2. Every test runs W ranks (one per GPU) over
// E = 16 experts (256 for the DSV3 transfer), so W divides both.
inline int test_world() {
  static const int w = [] {
    const char* v = std::getenv("MOE_EP_TEST_WORLD");
    const int n = v ? std::atoi(v) : 2;
    return n == 2 || n == 4 || n == 8 ? n : 2;
  }();
  return w;
}

#define SKIP_UNLESS_WORLD_GPUS()                                                          \
  do {                                                                                    \
    const int gpus = ::moe_ep::mgtest::visible_gpus();                                    \
    const int need = ::moe_ep::mgtest::test_world();                                      \
    if (gpus < need) GTEST_SKIP() << "needs " << need << " CUDA devices, found " << gpus; \
  } while (0)

inline void expect_ranks_passed(const RanksResult& r) {
  EXPECT_FALSE(r.hung) << "ranks still running after the test's deadline (killed)";
  for (size_t i = 0; i < r.rep.size(); ++i) {
    EXPECT_EQ(r.rep[i].finished, 1) << "rank " << i << " did not finish";
    EXPECT_EQ(r.rep[i].failed, 0) << r.rep[i].msg;
  }
}

}  // namespace moe_ep::mgtest
