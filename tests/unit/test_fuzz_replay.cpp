// Replays the fuzz target's committed inputs through the same work as the fuzz target
// (tests/fuzz/load_one.h), in every build: the seed corpus must load as valid problems (and run),
// and every crash the fuzzer found (tests/fuzz/regressions) must now be rejected cleanly or run.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_load_one.h"
#include "cli_test_util.h"
#include "load_one.h"

namespace moe_ep::cli::test {
namespace {

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.' && std::string(e->d_name) != "README.md")
        out.push_back(dir + "/" + e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

TEST(FuzzReplay, SeedCorpusFilesAreValidProblemsThatRun) {
  const auto files = files_in(std::string(MOE_EP_FUZZ_DIR) + "/corpus");
  ASSERT_GE(files.size(), 8u) << "the seed corpus is missing";
  for (const auto& f : files) {
    const auto b = bytes_of(f);
    EXPECT_TRUE(fuzz::load_one(b.data(), b.size())) << f << " was rejected";
    EXPECT_EQ(load_error(f), "") << f;
  }
}

TEST(FuzzReplay, EveryFoundCrashIsNowHandled) {
  // Each file once crashed the reader or the loader; load_one aborts on a finding.
  const auto files = files_in(std::string(MOE_EP_FUZZ_DIR) + "/regressions");
  ASSERT_GE(files.size(), 3u) << "the regression files are missing";
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const auto b = bytes_of(f);
    const bool accepted = fuzz::load_one(b.data(), b.size());
    if (f.find("/reject-") != std::string::npos) {
      EXPECT_FALSE(accepted);
      EXPECT_NE(load_error(f), "");
    }
  }
}

TEST(CheckpointFuzzReplay, SeedsLoadOrAreRejectedCleanly) {
  // valid-* seeds describe the target's own model and must load; the others (other families'
  // configs, a ModelOpt quant config beside bf16 tensors) must be rejected with a moe_ep::Error.
  const auto files = files_in(std::string(MOE_EP_FUZZ_DIR) + "/checkpoint_corpus");
  ASSERT_GE(files.size(), 5u) << "the checkpoint seed corpus is missing";
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const auto b = bytes_of(f);
    const bool loaded = moe_ep::fuzz::checkpoint_load_one(b.data(), b.size());
    EXPECT_EQ(loaded, f.find("/valid-") != std::string::npos);
  }
  // Truncations and single-byte changes of the valid config: never anything but an Error.
  const auto seed =
      bytes_of(std::string(MOE_EP_FUZZ_DIR) + "/checkpoint_corpus/valid-qwen3-config");
  for (size_t cut = 0; cut < seed.size(); cut += 7)
    moe_ep::fuzz::checkpoint_load_one(seed.data(), cut);
  for (size_t i = 1; i < seed.size(); i += 3) {
    auto m = seed;
    m[i] = uint8_t(m[i] ^ 0x15);
    moe_ep::fuzz::checkpoint_load_one(m.data(), m.size());
  }
}

}  // namespace
}  // namespace moe_ep::cli::test
