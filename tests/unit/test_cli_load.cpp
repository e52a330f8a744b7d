// The safetensors reader and `moe-ep --load`: every field of a file is checked against every
// other before any tensor byte is read, and a file that does not describe a consistent problem
// gets an error naming the tensor, the field, the value found and the value expected. The
// cases of issue 43 are here by name (HalfRowsW13, HiddenStatesH256VsWeightsH512,
// TopkWeightsShapeDisagreesWithTopkIds).
#include <cmath>
#include <cstring>
#include <limits>

#include "cli_test_util.h"

namespace moe_ep::cli::test {
namespace {

// Writes `f` (after the caller changed it) and returns the error of loading it.
std::string error_after(const TempDir& d, StFile f, const std::string& name = "bad.safetensors") {
  const std::string path = d.file(name);
  write_safetensors(path, f);
  return load_error(path);
}

void reshape(StFile& f, const std::string& name, std::vector<int64_t> shape) {
  StTensor& t = f.tensors.at(name);
  t.shape = std::move(shape);
  t.data.resize(size_t(t.numel()) * st_dtype_bytes(t.dtype));
}

// --- the reader -------------------------------------------------------------------------------

TEST(SafetensorsReader, RoundTripsEveryFieldAndReadsNoDataWithTheHeader) {
  TempDir d;
  StFile f;
  StTensor a;
  a.dtype = "F32";
  a.shape = {2, 3};
  a.data.resize(24);
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = uint8_t(i * 7);
  StTensor b;
  b.dtype = "I32";
  b.shape = {0, 5};  // empty tensors are legal
  f.tensors["a"] = a;
  f.tensors["b"] = b;
  f.metadata["recipe"] = "nvfp4";
  f.metadata["quote\"and\\slash\n"] = "v";
  const std::string path = d.file("x.safetensors");
  const uint64_t bytes = write_safetensors(path, f);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_EQ(uint64_t(in.tellg()), bytes);

  const StFile h = read_safetensors_header(path);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_FALSE(h.tensors.at("a").loaded);
  EXPECT_TRUE(h.tensors.at("a").data.empty());
  EXPECT_EQ(h.tensors.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.metadata.at("quote\"and\\slash\n"), "v");

  const StFile r = read_safetensors(path);
  EXPECT_EQ(r.tensors.at("a").data, a.data);
  EXPECT_EQ(r.tensors.at("b").shape, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(r.tensors.at("b").data.empty());
  EXPECT_EQ(r.metadata.at("recipe"), "nvfp4");
}

struct RawCase {
  const char* name;
  std::string header;
  size_t data_bytes;
  std::vector<const char*> mentions;
};

TEST(SafetensorsReader, RejectsEveryInconsistentHeaderWithTheFieldAndTheValues) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<RawCase> cases = {
      {"past the end",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       8,
       {"tensor 'a'", "data_offsets", "end 16", "past the end", "8 bytes"}},
      {"size vs shape",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})",
       8,
       {"tensor 'a'", "spans 8 bytes", "expected 16", "[4]", "F32"}},
      {"end before begin",
       R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})",
       8,
       {"tensor 'a'", "[8, 4]", "end is before begin"}},
      {"negative offset",
       R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})",
       8,
       {"tensor 'a'", "must be >= 0"}},
      {"three offsets",
       R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}})",
       8,
       {"tensor 'a'", "3 entries", "expected 2"}},
      {"unknown dtype",
       R"({"a":{"dtype":"F12","shape":[2],"data_offsets":[0,2]}})",
       8,
       {"tensor 'a'", "dtype", "'F12'"}},
      {"negative dim",
       R"({"a":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,2]}})",
       8,
       {"tensor 'a'", "shape [2, -1]", "dimension 1 is -1", ">= 0"}},
      {"element count overflow",
       R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]}})",
       8,
       {"tensor 'a'", "overflows"}},
      {"integer beyond 64 bits",
       R"({"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,2]}})",
       8,
       {"shape of tensor 'a'", "does not fit 64 bits"}},
      {"fraction",
       R"({"a":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})",
       8,
       {"shape of tensor 'a'", "fraction"}},
      {"overlap",
       "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       16,
       {"tensor 'b'", "[4, 12)", "overlaps tensor 'a'", "[0, 8)"}},
      {"duplicate tensor", "{" + ok_a + "," + ok_a + "}", 8, {"tensor 'a' appears twice"}},
      {"duplicate field",
       R"({"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
       8,
       {"tensor 'a'", "field 'dtype' twice"}},
      {"missing field",
       R"({"a":{"dtype":"U8","shape":[2]}})",
       8,
       {"tensor 'a'", "no field 'data_offsets'"}},
      {"unknown field",
       R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[1]}})",
       8,
       {"tensor 'a'", "unknown field 'x'"}},
      {"metadata not a string",
       R"({"__metadata__":{"recipe":5}})",
       0,
       {"metadata 'recipe' must be a string"}},
      {"unterminated string", R"({"a)", 0, {"malformed header", "not terminated"}},
      {"trailing text", "{" + ok_a + "}xyz", 8, {"malformed header", "after the header"}},
      {"control character", "{\"a\x01\":{}}", 0, {"malformed header", "control character"}},
      {"not an object", "[1,2]", 0, {"malformed header", "expected '{'"}},
  };
  TempDir d;
  for (const RawCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = d.file("raw.safetensors");
    write_raw(path, c.header, std::vector<uint8_t>(c.data_bytes, 0));
    std::string msg;
    try {
      read_safetensors(path);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      msg = e.what();
    }
    ASSERT_FALSE(msg.empty()) << "accepted";
    EXPECT_MENTIONS(msg, "safetensors file", "raw.safetensors");
    for (const char* m : c.mentions) EXPECT_MENTIONS(msg, m);
  }
}

TEST(SafetensorsReader, RejectsBadHeaderLengthsAndShortFiles) {
  TempDir d;
  const std::string path = d.file("len.safetensors");
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  write_raw(path, header, {1, 2}, int64_t(header.size()) + 100);
  std::string msg = load_error(path);
  const std::string length = "header length " + std::to_string(header.size() + 100);
  EXPECT_MENTIONS(msg, length.c_str(), "exceeds");
  write_raw(path, header, {1, 2}, int64_t(1) << 40);
  EXPECT_MENTIONS(load_error(path), "header length 1099511627776", "exceeds the limit");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "abc";
  EXPECT_MENTIONS(load_error(path), "3 bytes", "shorter than the 8-byte header length");
  EXPECT_MENTIONS(load_error(d.file("does-not-exist")), "cannot be opened");
}

TEST(SafetensorsReader, BufferParserAgreesWithTheFileReader) {
  TempDir d;
  const StFile f = small_problem_file(Recipe::kNvfp4, d.file("p.safetensors"));
  std::ifstream in(d.file("p.safetensors"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  const StFile b = parse_safetensors_buffer(bytes.data(), bytes.size(), "buf", true);
  ASSERT_EQ(b.tensors.size(), f.tensors.size());
  for (auto& [n, t] : f.tensors) EXPECT_EQ(b.tensors.at(n).data, t.data) << n;
  // Every truncation of the file is rejected (the last tensor's end lies past the data).
  for (size_t cut :
       {size_t(0), size_t(7), size_t(8), size_t(100), bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_THROW(parse_safetensors_buffer(bytes.data(), cut, "buf", true), Error) << cut;
  }
}

// --- problem files ----------------------------------------------------------------------------

TEST(ProblemFile, LoadsWhatSaveWroteForEveryRecipeAndRankCount) {
  TempDir d;
  for (Recipe r : kAllRecipes) {
    for (int W : {1, 2}) {
      SCOPED_TRACE(std::string(recipe_name(r)) + " W=" + std::to_string(W));
      Problem p = small_problem(r, W, 5);
      const std::string path = d.file("p.safetensors");
      const SaveSummary s = save_problem(path, p, nullptr);
      EXPECT_EQ(s.tensors, recipe_traits(r).weights_4bit ? 10u : 8u);
      std::vector<uint16_t> out;
      const Problem q = load_problem(path, &out);
      EXPECT_TRUE(out.empty());
      EXPECT_EQ(q.recipe, r);
      EXPECT_EQ(q.world_size, W);
      EXPECT_EQ(q.shape.E, 4);
      EXPECT_EQ(q.shape.H, 64);
      EXPECT_EQ(q.shape.I, 64);
      EXPECT_EQ(q.shape.K, 2);
      EXPECT_EQ(q.pack.w13, p.pack.w13);
      EXPECT_EQ(q.pack.w2_scale, p.pack.w2_scale);
      EXPECT_EQ(q.pack.fc2_alpha, p.pack.fc2_alpha);
      EXPECT_EQ(q.x, p.x);
      EXPECT_EQ(q.ids, p.ids);
      EXPECT_EQ(q.topk_w, p.topk_w);
    }
  }
}

// Issue 43: "F's w13 has half the rows its metadata implies" (segmentation fault before).
TEST(ProblemFile, HalfRowsW13) {
  TempDir d;
  const StFile good = small_problem_file(Recipe::kNvfp4, d.file("good.safetensors"));
  {
    // The header says [E, 2I, H/2] but the bytes are half of that: the reader stops.
    const StFile& f = good;
    std::ifstream in(d.file("good.safetensors"), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    const StTensor& w13 = f.tensors.at("w13");
    std::string header =
        "{\"__metadata__\":{\"recipe\":\"nvfp4\"},\"w13\":{\"dtype\":\"U8\","
        "\"shape\":[4,128,32],\"data_offsets\":[0," +
        std::to_string(w13.nbytes() / 2) + "]}}";
    write_raw(d.file("half.safetensors"), header,
              std::vector<uint8_t>(w13.data.begin(), w13.data.begin() + w13.nbytes() / 2));
    EXPECT_MENTIONS(load_error(d.file("half.safetensors")), "tensor 'w13'", "data_offsets",
                    "spans 8192 bytes", "expected 16384", "[4, 128, 32]");
  }
  {
    // A consistent tensor of half the rows: it disagrees with w2 and the scales.
    StFile f = good;
    reshape(f, "w13", {4, 64, 32});
    EXPECT_MENTIONS(error_after(d, f), "tensor 'w2'", "dimension 2 is 32", "expected I/2 = 16",
                    "from w13 [4, 64, 32]");
    // With w2 made to match, the scales still say I = 64.
    reshape(f, "w2", {4, 64, 16});
    EXPECT_MENTIONS(error_after(d, f), "tensor 'w13_scale'", "dimension 1 is 128",
                    "expected 2I = 64");
  }
}

// Issue 43: hidden_states with H = 256 while the weights say H = 512 (a heap over-read, NaN
// in the table and exit status 0 before).
TEST(ProblemFile, HiddenStatesH256VsWeightsH512) {
  TempDir d;
  Problem p = make_random_problem(ModelShape{"h512", 512, 64, 4, 2}, Recipe::kBf16, 1, {6}, 3,
                                  "uniform", false);
  const std::string path = d.file("good.safetensors");
  save_problem(path, p, nullptr);
  StFile f = read_safetensors(path);
  reshape(f, "hidden_states", {1, 6, 256});
  EXPECT_MENTIONS(error_after(d, f), "tensor 'hidden_states'", "shape [1, 6, 256]",
                  "dimension 2 is 256", "expected H = 512", "w13 [4, 128, 512]");
  // The command says so too, with exit status 2, for run and for check.
  write_safetensors(d.file("bad.safetensors"), f);
  for (const char* cmd : {"run", "check"}) {
    const CliResult r = run_cli({cmd, "--load", d.file("bad.safetensors")});
    EXPECT_EQ(r.status, 2) << cmd;
    EXPECT_MENTIONS(r.error, "--load", "tensor 'hidden_states'", "expected H = 512");
  }
}

// Issue 43: topk_weights [1, 64, 2] with topk_ids [64, 4] (it ran, copying T*K*4 bytes from
// the smaller tensor, before).
TEST(ProblemFile, TopkWeightsShapeDisagreesWithTopkIds) {
  TempDir d;
  Problem p = make_random_problem(ModelShape{"k4", 64, 64, 8, 4}, Recipe::kBf16, 1, {64}, 3,
                                  "uniform", false);
  save_problem(d.file("good.safetensors"), p, nullptr);
  const StFile good = read_safetensors(d.file("good.safetensors"));
  {
    StFile f = good;
    reshape(f, "topk_ids", {64, 4});
    reshape(f, "topk_weights", {1, 64, 2});
    EXPECT_MENTIONS(error_after(d, f), "tensor 'topk_ids'", "shape [64, 4]", "2 dimensions",
                    "expected 3 [W, T, K]");
  }
  {
    StFile f = good;
    reshape(f, "topk_weights", {1, 64, 2});
    EXPECT_MENTIONS(error_after(d, f), "tensor 'topk_weights'", "dimension 2 is 2",
                    "expected K = 4", "topk_ids [1, 64, 4]");
  }
  {
    StFile f = good;
    reshape(f, "topk_weights", {1, 32, 4});
    EXPECT_MENTIONS(error_after(d, f), "tensor 'topk_weights'", "dimension 1 is 32",
                    "expected T = 64");
  }
}

TEST(ProblemFile, RejectsEveryOtherInconsistency) {
  TempDir d;
  const StFile good = small_problem_file(Recipe::kNvfp4, d.file("good.safetensors"), 2, 4);
  auto expect = [&](const char* what, const std::function<void(StFile&)>& change,
                    std::vector<const char*> mentions) {
    SCOPED_TRACE(what);
    StFile f = good;
    change(f);
    const std::string msg = error_after(d, f);
    ASSERT_FALSE(msg.empty()) << "accepted";
    EXPECT_MENTIONS(msg, "--load", "bad.safetensors");
    for (const char* m : mentions) EXPECT_MENTIONS(msg, m);
  };
  expect("no recipe", [](StFile& f) { f.metadata.erase("recipe"); },
         {"metadata 'recipe' is missing"});
  expect("unknown recipe", [](StFile& f) { f.metadata["recipe"] = "fp2"; },
         {"metadata 'recipe' is 'fp2'", "expected one of"});
  expect("recipe vs weights", [](StFile& f) { f.metadata["recipe"] = "bf16"; },
         {"tensor 'w13' field dtype is U8", "expected BF16", "recipe bf16"});
  expect("swiglu_limit", [](StFile& f) { f.metadata["swiglu_limit"] = "-3"; },
         {"metadata 'swiglu_limit' is '-3'", "finite number > 0"});
  expect("swiglu_limit text", [](StFile& f) { f.metadata["swiglu_limit"] = "7x"; },
         {"metadata 'swiglu_limit' is '7x'"});
  expect("apply_topk_in_fc1", [](StFile& f) { f.metadata["apply_topk_in_fc1"] = "yes"; },
         {"metadata 'apply_topk_in_fc1' is 'yes'", "expected 0 or 1"});
  expect("missing tensor", [](StFile& f) { f.tensors.erase("topk_ids"); },
         {"tensor 'topk_ids' is missing"});
  expect("missing scales", [](StFile& f) { f.tensors.erase("w2_scale"); },
         {"tensor 'w2_scale' is missing"});
  expect("extra tensor", [](StFile& f) { f.tensors["bias"] = f.tensors.at("fc1_alpha"); },
         {"tensor 'bias' is not part of a problem file"});
  expect("ids dtype", [](StFile& f) { f.tensors.at("topk_ids").dtype = "F32"; },
         {"tensor 'topk_ids' field dtype is F32", "expected I32"});
  expect("scale dtype", [](StFile& f) { f.tensors.at("w13_scale").dtype = "F8_E5M2"; },
         {"tensor 'w13_scale' field dtype is F8_E5M2", "expected F8_E4M3 or U8"});
  expect("scale blocks",
         [](StFile& f) {
           reshape(f, "w2_scale", {4, 64, 8});
         },
         {"tensor 'w2_scale'", "dimension 2 is 8", "expected I/16 = 4"});
  expect("alpha length", [](StFile& f) { reshape(f, "fc2_alpha", {3}); },
         {"tensor 'fc2_alpha'", "dimension 0 is 3", "expected E = 4"});
  expect("out shape",
         [](StFile& f) {
           reshape(f, "out", {2, 4, 32});
         },
         {"tensor 'out'", "dimension 2 is 32", "expected H = 64"});
  expect("E vs W",
         [](StFile& f) {
           reshape(f, "hidden_states", {3, 4, 64});
           reshape(f, "topk_ids", {3, 4, 2});
           reshape(f, "topk_weights", {3, 4, 2});
           reshape(f, "out", {3, 4, 64});
         },
         {"E (experts) = 4", "not divisible by W (ranks) = 3"});
  expect("K > E",
         [](StFile& f) {
           reshape(f, "topk_ids", {2, 4, 5});
           reshape(f, "topk_weights", {2, 4, 5});
         },
         {"K (top-k) = 5", "outside [1, 4]"});
  expect("odd 2I",
         [](StFile& f) {
           reshape(f, "w13", {4, 127, 32});
         },
         {"tensor 'w13'", "dimension 1 is 127", "even"});
  expect("zero experts",
         [](StFile& f) {
           reshape(f, "w13", {0, 128, 32});
         },
         {"E (experts) = 0", "outside [1, 65536]"});
  expect("too many ranks",
         [](StFile& f) {
           reshape(f, "hidden_states", {65, 4, 64});
         },
         {"W (ranks) = 65", "outside [1, 64]"});
}

TEST(ProblemFile, RejectsWhatTheLibraryCannotBuildBeforeReadingData) {
  TempDir d;
  // H = 32: a consistent file, but the library takes H in multiples of 64.
  Problem p = small_problem(Recipe::kBf16, 1, 2);
  const std::string path = d.file("good.safetensors");
  save_problem(path, p, nullptr);
  StFile f = read_safetensors(path);
  reshape(f, "w13", {4, 128, 32});
  reshape(f, "w2", {4, 32, 64});
  reshape(f, "hidden_states", {1, 2, 32});
  EXPECT_MENTIONS(error_after(d, f), "cannot build", "H 32", "hidden size H = 32",
                  "multiple of 64");
}

TEST(ProblemFile, ChecksRoutingValuesAfterReadingThem) {
  TempDir d;
  const StFile good = small_problem_file(Recipe::kBf16, d.file("good.safetensors"), 1, 4);
  {
    StFile f = good;
    const int32_t bad = 9;
    std::memcpy(f.tensors.at("topk_ids").data.data() + 4 * 5, &bad, 4);  // [0, 2, 1]
    EXPECT_MENTIONS(error_after(d, f), "tensor 'topk_ids'[0, 2, 1] = 9",
                    "expected an expert id in [-1, E = 4)");
  }
  for (float v :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    StFile f = good;
    std::memcpy(f.tensors.at("topk_weights").data.data() + 4 * 3, &v, 4);  // [0, 1, 1]
    EXPECT_MENTIONS(error_after(d, f), "tensor 'topk_weights'[0, 1, 1]",
                    "expected a finite number");
  }
  {
    StFile f = good;
    const float v = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(f.tensors.at("fc1_alpha").data.data() + 4, &v, 4);
    EXPECT_MENTIONS(error_after(d, f), "tensor 'fc1_alpha'[1]", "expected a finite number");
  }
}

}  // namespace
}  // namespace moe_ep::cli::test
