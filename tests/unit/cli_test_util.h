// Helpers of the command-line tests: small problem files, raw safetensors bytes, and the
// command run in-process (main_impl) with its exit status, error message and output.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "commands.h"
#include "expect_mentions.h"
#include "moe_ep/status.h"
#include "problem.h"
#include "problem_io.h"

namespace moe_ep::cli::test {

// A fresh folder for one test's files, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/moe_ep_cli_test_XXXXXX";
    const char* p = mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// The smallest shape the library takes: H = I = 64, E = 4, K = 2.
inline ModelShape small_shape() { return ModelShape{"small", 64, 64, 4, 2}; }

inline Problem small_problem(Recipe r, int W = 1, int T = 8) {
  return make_random_problem(small_shape(), r, W, std::vector<int>(W, T), 7, "uniform", false);
}

// A problem file with outputs (run on the CPU backend), as `--save` writes it.
inline StFile small_problem_file(Recipe r, const std::string& path, int W = 1, int T = 8) {
  Problem p = small_problem(r, W, T);
  RunResult res = run_layers(p, Backend::kCPU, 1);
  save_problem(path, p, &res);
  return read_safetensors(path);
}

// A safetensors file from a header text and data bytes (any header, consistent or not).
inline void write_raw(const std::string& path, const std::string& header,
                      const std::vector<uint8_t>& data, int64_t length_field = -1) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length_field >= 0 ? uint64_t(length_field) : header.size();
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = uint8_t(n >> (8 * b));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

struct CliResult {
  int status = -1;    // main_impl's return value, or 2 when it threw
  std::string error;  // the message of the moe_ep::Error it threw ("" if none)
  std::string out;    // what it printed on stdout
};

inline CliResult run_cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"moe-ep"};
  argv.insert(argv.end(), args.begin(), args.end());
  CliResult r;
  ::testing::internal::CaptureStdout();
  try {
    r.status = main_impl(argv);
  } catch (const Error& e) {
    r.status = 2;
    r.error = e.what();
  }
  r.out = ::testing::internal::GetCapturedStdout();
  return r;
}

// The message of the error that loading `path` throws ("" when it loads).
inline std::string load_error(const std::string& path) {
  try {
    std::vector<uint16_t> out;
    load_problem(path, &out);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace moe_ep::cli::test
