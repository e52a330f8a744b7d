// The `moe-ep` command run in-process: every number range-checked with the flag, the value and
// the allowed range in the message; memory checked before it is allocated; exit status 1 when a
// result is NaN, missing or outside its tolerance; failed writes are errors and "wrote" is
// printed only for what was written (issue 43).
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "cli_test_util.h"
#include "memory_budget.h"

namespace moe_ep::cli::test {
namespace {

struct FlagCase {
  std::vector<std::string> args;
  std::vector<const char*> mentions;
};

TEST(CliFlags, EveryNumberIsRangeCheckedWithFlagValueAndRange) {
  const std::vector<FlagCase> cases = {
      {{"run", "--ranks", "0"}, {"--ranks 0", "[1, 64]"}},
      {{"run", "--ranks", "-2"}, {"--ranks -2", "[1, 64]"}},
      {{"run", "--ranks", "65"}, {"--ranks 65", "[1, 64]"}},
      {{"run", "--ranks", "3x"}, {"--ranks", "'3x'", "integer"}},
      {{"run", "--ranks", "99999999999999999999"}, {"--ranks 99999999999999999999", "[1, 64]"}},
      {{"run", "--experts", "0"}, {"--experts 0", "[1, 65536]"}},
      {{"run", "--experts", "-16"}, {"--experts -16", "[1, 65536]"}},
      {{"run", "--experts", "2"}, {"--experts 2", "[4, 65536]", "K = 4"}},
      {{"run", "--experts", "16", "--ranks", "3"}, {"E = 16", "not divisible by --ranks 3"}},
      {{"run", "--iters", "0"}, {"--iters 0", "[1, 100000]"}},
      {{"run", "--iters", "-1"}, {"--iters -1", "[1, 100000]"}},
      {{"run", "--tokens", "100000000"}, {"--tokens 100000000", "[0, 16777216]"}},
      {{"run", "--tokens", "8,-1"}, {"--tokens -1", "[0, 16777216]"}},
      {{"run", "--tokens", ","}, {"--tokens", "no token count"}},
      {{"run", "--gpus", "0"}, {"--gpus 0", "[1, 64]"}},
      {{"run", "--seed", "-1"}, {"--seed", "'-1'"}},
      {{"run", "--swiglu-limit", "nan"}, {"--swiglu-limit nan", "finite number > 0"}},
      {{"run", "--swiglu-limit", "-1"}, {"--swiglu-limit -1", "finite number > 0"}},
      {{"run", "--shape", "huge"}, {"--shape 'huge'", "tiny"}},
      {{"run", "--recipe", "fp3"}, {"--recipe 'fp3'", "nvfp4"}},
      {{"run", "--backend", "tpu"}, {"--backend 'tpu'", "cpu"}},
      {{"run", "--routing", "random"}, {"--routing 'random'", "zipf"}},
      {{"run", "--ranks"}, {"--ranks needs a value"}},
      {{"run", "--frobnicate"}, {"unknown option '--frobnicate'"}},
      {{"run", "--load", "x.safetensors", "--experts", "8"}, {"--experts", "--load"}},
      {{"bench", "--save", "x.safetensors"}, {"--save", "not bench"}},
      {{"run", "--json", "x.json"}, {"--json", "for bench"}},
  };
  for (const FlagCase& c : cases) {
    std::string line;
    for (auto& a : c.args) line += a + " ";
    SCOPED_TRACE(line);
    const CliResult r = run_cli(c.args);
    EXPECT_EQ(r.status, 2);
    ASSERT_FALSE(r.error.empty()) << "no error; printed:\n" << r.out;
    for (const char* m : c.mentions) EXPECT_MENTIONS(r.error, m);
    EXPECT_EQ(r.out.find("wrote"), std::string::npos);
  }
}

TEST(CliFlags, UnknownCommandAndNoCommandAreUsageErrors) {
  EXPECT_EQ(run_cli({"frob"}).status, 2);
  EXPECT_EQ(run_cli({}).status, 2);
  const CliResult help = run_cli({"--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_MENTIONS(help.out, "usage: moe-ep", "exit status", "tokens per rank");
}

TEST(CliMemory, TooLargeForTheMachineSaysWhatNeedsHowMuchAndSuggestsExperts) {
  const CliResult r = run_cli({"run", "--shape", "dsv3", "--memory", "24000000000"});
  EXPECT_EQ(r.status, 2);
  EXPECT_MENTIONS(r.error, "shape dsv3", "E 256", "needs about", "fp32 master weights 45.1 GB",
                  "--memory allows 24.0 GB", "use --experts N with N <=");
  // The suggested N fits: the same check passes with it.
  const size_t at = r.error.find("N <= ");
  ASSERT_NE(at, std::string::npos);
  const int n = std::atoi(r.error.c_str() + at + 5);
  EXPECT_GE(n, 8);
  EXPECT_LT(n, 256);
  ModelShape s = *find_shape("dsv3");
  s.E = n;
  EXPECT_NO_THROW(check_memory_for(s, Recipe::kNvfp4, 1, 64, true, 24000000000ull));
  s.E = n + 1;
  EXPECT_THROW(check_memory_for(s, Recipe::kNvfp4, 1, 64, true, 24000000000ull), Error);
}

TEST(CliMemory, HugeTokenCountsAreCheckedBeforeAllocating) {
  const CliResult r =
      run_cli({"run", "--tokens", "4000000", "--recipe", "bf16", "--memory", "2000000000"});
  EXPECT_EQ(r.status, 2);
  EXPECT_MENTIONS(r.error, "4000000 tokens per rank", "needs about", "tokens and workspaces",
                  "--memory allows 2.0 GB", "fewer --tokens");
  const CliResult b =
      run_cli({"bench", "--tokens", "4000000", "--recipe", "bf16", "--memory", "2000000000"});
  EXPECT_EQ(b.status, 2);
  EXPECT_MENTIONS(b.error, "needs about");
}

TEST(CliMemory, OutOfMemoryMessageNamesTheStage) {
  memory_stage("generating the fp32 master weights of shape x (1.0 GB)");
  EXPECT_MENTIONS(out_of_memory_message(), "out of memory", "generating the fp32 master weights",
                  "1.0 GB", "--experts");
}

// --- exit status ------------------------------------------------------------------------------

TEST(CliExitStatus, CheckPassesAGoodFileAndItsSavedOutput) {
  TempDir d;
  small_problem_file(Recipe::kNvfp4, d.file("p.safetensors"), 2, 3);
  const CliResult r = run_cli({"check", "--load", d.file("p.safetensors")});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "PASS", "out == the file's out (bitwise)", "tok/rank");
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos);
}

TEST(CliExitStatus, CheckAndRunExitOneWhenTheOutputDiffersFromTheFile) {
  TempDir d;
  StFile f = small_problem_file(Recipe::kBf16, d.file("p.safetensors"), 1, 3);
  f.tensors.at("out").data[10] ^= 0x40;
  write_safetensors(d.file("q.safetensors"), f);
  for (const char* cmd : {"check", "run"}) {
    const CliResult r = run_cli({cmd, "--load", d.file("q.safetensors"), "--iters", "1"});
    EXPECT_EQ(r.status, 1) << cmd << r.error << r.out;
    EXPECT_MENTIONS(r.out, "FAIL", "out != the file's out", "exit status 1");
  }
}

TEST(CliExitStatus, NonFiniteOutputIsAFailure) {
  // fc2_alpha = 3e38 is finite, but the outputs overflow bf16 to Inf.
  TempDir d;
  Problem p = small_problem(Recipe::kNvfp4, 1, 4);
  std::fill(p.pack.fc2_alpha.begin(), p.pack.fc2_alpha.end(), 3e38f);
  save_problem(d.file("inf.safetensors"), p, nullptr);
  const CliResult r = run_cli({"check", "--load", d.file("inf.safetensors")});
  EXPECT_EQ(r.status, 1) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "FAIL", "NaN/Inf in the output");
}

TEST(CliExitStatus, RunOfTheDefaultShapePassesAndExplainsTheTable) {
  const CliResult r = run_cli({"run", "--recipe", "nvfp4,bf16", "--tokens", "4", "--iters", "1"});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "tok/rank", "tokens per rank", " E ", " H ", " I ", " K ", "PASS",
                  "err_vs_ref <= 5e-03", "err_vs_fp64 ~ 0.2 for 4-bit recipes is expected");
}

// --explain prints each forward's launch plan (the CPU reference's names only T; on a GPU the
// CUDA backend's kernels, tiles and rings).
TEST(CliExplain, RunPrintsTheLaunchPlanOfEachForward) {
  const CliResult r =
      run_cli({"run", "--recipe", "nvfp4", "--tokens", "3,5", "--iters", "1", "--explain"});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "launch plans (rank 0):", "T=3 ", "T=5 ");
  const bool cuda = r.out.find("cuda T=5") != std::string::npos;
  EXPECT_TRUE(cuda || r.out.find("cpu reference T=5") != std::string::npos) << r.out;
  EXPECT_EQ(run_cli({"run", "--recipe", "nvfp4", "--tokens", "3", "--iters", "1"})
                .out.find("launch plans"),
            std::string::npos);
}

// --- writes -----------------------------------------------------------------------------------

TEST(CliWrites, JsonAndSaveIntoAMissingFolderAreErrorsBeforeAnyWork) {
  const CliResult j = run_cli({"bench", "--json", "/nonexistent/dir/x.json", "--tokens", "1"});
  EXPECT_EQ(j.status, 2);
  EXPECT_MENTIONS(j.error, "--json /nonexistent/dir/x.json", "/nonexistent/dir", "not writable");
  EXPECT_EQ(j.out.find("wrote"), std::string::npos);
  const CliResult s = run_cli({"run", "--save", "/nonexistent/dir/x.safetensors"});
  EXPECT_EQ(s.status, 2);
  EXPECT_MENTIONS(s.error, "--save /nonexistent/dir/x.safetensors", "not writable");
  EXPECT_EQ(s.out.find("wrote"), std::string::npos);
}

TEST(CliWrites, WriteFailuresAreErrors) {
  // The folder check passes, the file itself cannot be opened (it is a folder).
  TempDir d;
  const std::string dir_as_file = d.file("sub");
  ASSERT_EQ(mkdir(dir_as_file.c_str(), 0700), 0);
  Problem p = small_problem(Recipe::kBf16, 1, 2);
  try {
    save_problem(dir_as_file, p, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "cannot write", dir_as_file.c_str());
  }
  const CliResult j = run_cli(
      {"bench", "--json", dir_as_file, "--tokens", "1", "--recipe", "bf16", "--iters", "1"});
  EXPECT_EQ(j.status, 2);
  EXPECT_MENTIONS(j.error, "--json", "cannot open");
  EXPECT_EQ(j.out.find("wrote"), std::string::npos);
}

TEST(CliWrites, SaveConfirmsEachFileAndTheFilesLoad) {
  TempDir d;
  const CliResult one = run_cli({"run", "--recipe", "nvfp4", "--tokens", "3", "--iters", "1",
                                 "--save", d.file("one.safetensors")});
  EXPECT_EQ(one.status, 0) << one.error;
  const std::string wrote_one = "wrote " + d.file("one.safetensors") + ": 11 tensors";
  EXPECT_MENTIONS(one.out, wrote_one.c_str(), "nvfp4, E 16, H 512, I 256, K 4", "W 1 x T 3 tokens",
                  "outputs");
  std::vector<uint16_t> out;
  EXPECT_EQ(load_problem(d.file("one.safetensors"), &out).shape.E, 16);
  EXPECT_EQ(out.size(), 3u * 512);

  const CliResult two = run_cli({"run", "--recipe", "bf16", "--tokens", "1,2", "--iters", "1",
                                 "--save", d.file("two.safetensors")});
  EXPECT_EQ(two.status, 0) << two.error;
  for (const char* name : {"two.bf16-t1.safetensors", "two.bf16-t2.safetensors"}) {
    const std::string wrote = "wrote " + d.file(name);
    EXPECT_MENTIONS(two.out, wrote.c_str());
    EXPECT_EQ(load_error(d.file(name)), "") << name;
  }
  // And it checks against what it wrote.
  const CliResult again = run_cli({"check", "--load", d.file("two.bf16-t2.safetensors")});
  EXPECT_EQ(again.status, 0) << again.error << again.out;
}

}  // namespace
}  // namespace moe_ep::cli::test
